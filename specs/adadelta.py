"""Adadelta, in the torch.optim.Adadelta form (with a learning rate).

    g         = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    acc_grad  = rho * acc_grad + (1 - rho) * g * g
    delta     = sqrt(acc_delta + eps) / sqrt(acc_grad + eps) * g     (acc_delta the old value)
    acc_delta = rho * acc_delta + (1 - rho) * delta * delta
    w         = w - lr * delta

lr = 1 is Zeiler's original rule.
Weight decay is L2 on the gradient (coupled), as in torch.optim.Adadelta.

Reference: M. D. Zeiler, "ADADELTA: An Adaptive Learning Rate Method", arXiv:1212.5701,
2012; torch.optim.Adadelta.
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, sqrt

spec = Spec("adadelta", __doc__, reference="arXiv:1212.5701")
lr = spec.hyper("lr", 1.0, "lr >= 0", "scales delta before it is applied")
rho = spec.hyper("rho", 0.9, "0 <= rho <= 1", "decay rate of both running averages")
eps = spec.hyper("eps", 1e-6, "eps > 0", "added inside both square roots")
preprocess = gradient_preprocessing(spec)
acc_grad = spec.state("acc_grad", 0.0, "running average of g*g")
acc_delta = spec.state("acc_delta", 0.0, "running average of delta*delta")


@spec.update
def adadelta(w, grad, flags):
    g = preprocess(w, grad)
    acc_grad_new = rho * acc_grad + (1 - rho) * g * g
    delta = sqrt(acc_delta + eps) / sqrt(acc_grad_new + eps) * g
    acc_delta_new = rho * acc_delta + (1 - rho) * delta * delta
    return {acc_grad: acc_grad_new, acc_delta: acc_delta_new, w: w - lr * delta}

"""Adadelta, in the torch.optim.Adadelta form (with a learning rate and maximize).

    g          = -grad if maximize else grad
    g          = g + weight_decay * w
    square_avg = rho * square_avg + (1 - rho) * g * g
    delta      = sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g     (acc_delta the old value)
    acc_delta  = rho * acc_delta + (1 - rho) * delta * delta
    w          = w - lr * delta

The seed adadelta.py has the same rule under other state names (acc_grad); this one has
torch's state names and maximize (a flag: torch's bool, its own kernel).

Reference: M. D. Zeiler, "ADADELTA: An Adaptive Learning Rate Method", arXiv:1212.5701;
torch.optim.Adadelta.
"""
from optgen.blocks import torch_gradient
from optgen.dsl import Spec, sqrt

spec = Spec("torch_adadelta", __doc__, reference="arXiv:1212.5701; torch.optim.Adadelta")
lr = spec.hyper("lr", 1.0, "lr >= 0", "scales delta before it is applied")
rho = spec.hyper("rho", 0.9, "0 <= rho <= 1", "decay rate of both running averages")
eps = spec.hyper("eps", 1e-6, "eps >= 0", "added inside both square roots")
gradient, _ = torch_gradient(spec)
square_avg = spec.state("square_avg", 0.0, "running average of g*g")
acc_delta = spec.state("acc_delta", 0.0, "running average of delta*delta")


@spec.update
def torch_adadelta(w, grad, flags):
    g = gradient(w, grad, flags)
    sq = rho * square_avg + (1 - rho) * g * g
    delta = sqrt(acc_delta + eps) / sqrt(sq + eps) * g
    acc = rho * acc_delta + (1 - rho) * delta * delta
    return {square_avg: sq, acc_delta: acc, w: w - lr * delta}

"""AdamW, in the torch.optim.AdamW form.

    g = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    w = w * (1 - lr * weight_decay)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    w = w - lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)

eps is added to the bias-corrected sqrt(v), as in torch (not to sqrt(v) as in the adam spec).
Weight decay is decoupled: w is first multiplied by 1 - lr * weight_decay, outside the
adaptive step and not through the gradient.

Reference: I. Loshchilov, F. Hutter, "Decoupled Weight Decay Regularization", ICLR 2019;
torch.optim.AdamW.
"""
from optgen.blocks import gradient_preprocessing, moments
from optgen.dsl import Spec, sqrt

spec = Spec("adamw", __doc__, reference="arXiv:1711.05101")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "decay rate of the first moment")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "decay rate of the second moment")
eps = spec.hyper("eps", 1e-8, "eps > 0", "added to the bias-corrected sqrt(v)")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
weight_decay = spec.hyper("weight_decay", 0.01, "weight_decay >= 0",
                          "decoupled decay: w is scaled by 1 - lr * weight_decay each step")
m = spec.state("m", 0.0, "first moment (mean of g)")
v = spec.state("v", 0.0, "second moment (mean of g*g)")
t = spec.t


@spec.update
def adamw(w, grad, flags):
    g = preprocess(w, grad)
    w_decayed = w * (1 - lr * weight_decay)
    m_new, v_new = moments(m, v, g, beta1, beta2)
    step = lr / (1 - beta1 ** t)
    denom = sqrt(v_new) / sqrt(1 - beta2 ** t) + eps
    return {m: m_new, v: v_new, w: w_decayed - step * m_new / denom}

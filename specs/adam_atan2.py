"""Adam-atan2: Adam with the division m / (sqrt(v) + eps) replaced by atan2, which is
bounded, scale invariant and needs no eps.

    m     = beta1 * m + (1 - beta1) * grad
    v     = beta2 * v + (1 - beta2) * grad * grad
    m_hat = m / (1 - beta1**t);   v_hat = v / (1 - beta2**t)
    U     = atan2(m_hat, b * sqrt(v_hat))
    w     = w * (1 - lr * weight_decay * mask) - lr * a * U
            mask = 1, or (cautious_wd) 1 where U * w > 0 and 0 elsewhere

Reference: K. Everett et al., "Scaling Exponents Across Parameterizations and
Optimizers", arXiv:2407.05872 (a = 1.27, b = 1; decoupled weight decay and the cautious
mask as in the authors' adam-atan2-pytorch, github.com/lucidrains/adam-atan2-pytorch).
"""
from optgen.dsl import Spec, atan2, sqrt, where

spec = Spec("adam_atan2", __doc__, reference="arXiv:2407.05872")
lr = spec.hyper("lr", 1e-4, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "decay rate of the first moment")
beta2 = spec.hyper("beta2", 0.99, "0 <= beta2 < 1", "decay rate of the second moment")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0", "decoupled decay")
a = spec.hyper("a", 1.27, "a > 0", "scale of the atan2 update")
b = spec.hyper("b", 1.0, "b > 0", "scale of the denominator")
spec.flag("cautious_wd", False, "decay only where the update has the sign of w")
m = spec.state("m", 0.0, "first moment")
v = spec.state("v", 0.0, "second moment")
t = spec.t


@spec.update
def adam_atan2(w, grad, flags):
    m_new = beta1 * m + (1 - beta1) * grad
    v_new = beta2 * v + (1 - beta2) * grad * grad
    m_hat = m_new / (1 - beta1 ** t)
    v_hat = v_new / (1 - beta2 ** t)
    u = atan2(m_hat, b * sqrt(v_hat))
    decay = lr * weight_decay
    if flags.cautious_wd:
        decay = where(u * w > 0, decay, 0.0)
    return {m: m_new, v: v_new, w: w * (1 - decay) - lr * a * u}

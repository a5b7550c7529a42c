"""Adam-atan2 with atan2 written out as a polynomial (no atan2 function): a plain
expression whose intermediates are each used several times.

    m     = beta1 * m + (1 - beta1) * grad
    v     = beta2 * v + (1 - beta2) * grad * grad
    y     = m / (1 - beta1**t);   x = b * sqrt(v / (1 - beta2**t))
    w     = w * (1 - lr * weight_decay) - lr * a * atan2(y, x)

atan2(y, x): the octant reduction to q = min(|x|, |y|) / max(|x|, |y|) in [0, 1], a
reduction at tan(pi/8) (q > tan(pi/8): (q - 1) / (q + 1), plus pi/4), Cephes' degree-9
odd polynomial for atan on [-tan(pi/8), tan(pi/8)], then the octant undone (pi/2 - r
where |y| > |x|, pi - r where x < 0, -r where y < 0).

Reference: K. Everett et al., "Scaling Exponents Across Parameterizations and
Optimizers", arXiv:2407.05872 (Adam-atan2; a = 1.27, b = 1 as in adam-atan2-pytorch).
"""
from optgen.dsl import Spec, maximum, minimum, sqrt, where

spec = Spec("adam_atan2_poly", __doc__, reference="arXiv:2407.05872")
lr = spec.hyper("lr", 1e-4, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "decay rate of the first moment")
beta2 = spec.hyper("beta2", 0.99, "0 <= beta2 < 1", "decay rate of the second moment")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0", "decoupled decay")
a = spec.hyper("a", 1.27, "a > 0", "scale of the atan2 update")
b = spec.hyper("b", 1.0, "b > 0", "scale of the denominator")
m = spec.state("m", 0.0, "first moment")
v = spec.state("v", 0.0, "second moment")
t = spec.t

TAN_PI_8 = 0.41421356237309503
PI = 3.141592653589793


def atan2(y, x):
    ax, ay = abs(x), abs(y)
    hi, lo = maximum(ax, ay), minimum(ax, ay)
    q = where(hi > 0, lo / hi, 0.0)
    big = q > TAN_PI_8
    r = where(big, (q - 1.0) / (q + 1.0), q)
    z = r * r
    p = (((0.0805374449538 * z - 0.138776856032) * z + 0.199777106478) * z
         - 0.333329491539) * z * r + r
    p = where(big, p + PI / 4, p)
    p = where(ay > ax, PI / 2 - p, p)
    p = where(x < 0, PI - p, p)
    return where(y < 0, -p, p)


@spec.update
def adam_atan2_poly(w, grad, flags):
    m_new = beta1 * m + (1 - beta1) * grad
    v_new = beta2 * v + (1 - beta2) * grad * grad
    y = m_new / (1 - beta1 ** t)
    x = b * sqrt(v_new / (1 - beta2 ** t))
    w_decayed = w * (1 - lr * weight_decay)
    return {m: m_new, v: v_new, w: w_decayed - lr * a * atan2(y, x)}

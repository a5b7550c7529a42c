"""D-Adaptation Adam: Adam whose step size d is estimated from the gradients.

    dlr   = d * lr * bc,   bc = sqrt(1 - beta2**t) / (1 - beta1**t)  (use_bias_correction;
                                                                      else 1)
    g     = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    g     = g + weight_decay * w                                      (not decouple)
    r     = sqrt(beta2)
    A     = dlr * sum_all(g * s / (sqrt(v) + eps))          (old s and v)
    m     = beta1 * m + dlr * (1 - beta1) * g
    v     = beta2 * v + (1 - beta2) * g * g
    s     = r * s + dlr * (1 - r) * g
    S     = sum_all(|s|)                                     (new s)
    when S > 0:
        nw = r * nw + (1 - r) * A
        d  = max(d, min(nw / ((1 - r) * S), growth_rate * d))   (when lr > 0)
        w  = w - weight_decay * dlr * w                      (decouple)
        w  = w - m / (sqrt(v) + eps)

sum_all sums over every element of every parameter the optimizer steps (global_sum); d
(initially d0) and nw (initially 0) are scalars shared by all parameters: every
parameter keeps its own copy, and all copies take the same values as long as every
parameter has a gradient at every step. The update uses d before the step's estimate.

Reference: A. Defazio, K. Mishchenko, "Learning-Rate-Free Learning by D-Adaptation",
ICML 2023 (arXiv:2301.07733); the authors' DAdaptAdam (github.com/facebookresearch/
dadaptation), whose lr is the largest of all groups' (here: each group's own).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, global_sum, maximum, minimum, sqrt, where

spec = Spec("dadapt_adam", __doc__, reference="arXiv:2301.07733")
lr = spec.hyper("lr", 1.0, "lr >= 0", "multiplier of the estimated step size d")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "decay rate of the first moment")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "decay rate of the second moment")
eps = spec.hyper("eps", 1e-8, "eps > 0", "added to sqrt(v) in the denominator")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "weight decay: added to the gradient, or decoupled (decouple)")
d0 = spec.hyper("d0", 1e-6, "d0 > 0", "initial estimate of the step size d")
growth_rate = spec.hyper("growth_rate", None, "growth_rate > 0",
                         "bound on the growth of d per step; None: unbounded",
                         optional=True, none_value=float("inf"))
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
spec.flag("decouple", False, "decoupled weight decay (AdamW style)")
spec.flag("use_bias_correction", False, "scale dlr by Adam's bias correction")
m = spec.state("m", 0.0, "first moment, scaled by dlr")
v = spec.state("v", 0.0, "second moment")
s = spec.state("s", 0.0, "weighted sum of the gradients")
d = spec.state("d", d0, "estimate of the step size", shape="scalar")
nw = spec.state("nw", 0.0, "weighted numerator of the estimate", shape="scalar")
t = spec.t


@spec.update
def dadapt_adam(w, grad, flags):
    r = sqrt(beta2)
    bc = sqrt(1 - beta2 ** t) / (1 - beta1 ** t) if flags.use_bias_correction else 1.0
    dlr = d * lr * bc
    g = preprocess(w, grad)
    g = g if flags.decouple else g + weight_decay * w
    a = dlr * global_sum(g * s / (sqrt(v) + eps))
    m_new = beta1 * m + dlr * (1 - beta1) * g
    v_new = beta2 * v + (1 - beta2) * g * g
    s_new = r * s + dlr * (1 - r) * g
    total = global_sum(abs(s_new))
    moved = total > 0
    nw_new = r * nw + (1 - r) * a
    d_hat = nw_new / ((1 - r) * maximum(total, 1e-300))     # (used only where total > 0)
    d_new = maximum(d, minimum(d_hat, growth_rate * d))
    w_new = w - weight_decay * dlr * w if flags.decouple else w
    w_new = w_new - m_new / (sqrt(v_new) + eps)
    return {m: m_new, v: v_new, s: s_new, nw: where(moved, nw_new, nw),
            d: where(moved & (lr > 0), d_new, d), w: where(moved, w_new, w)}

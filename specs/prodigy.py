"""Prodigy: D-Adaptation Adam whose estimate of the distance to the solution weighs each
gradient by the step size it was taken with.

    r     = beta3, or sqrt(beta2) when beta3 is None
    dlr   = d * lr * bc,   bc = sqrt(1 - beta2**t) / (1 - beta1**t)  (use_bias_correction;
                                                                      else 1)
    g     = grad + weight_decay * w                                  (not decouple)
    A     = (d / d0) * dlr * sum_all(g * (w0 - w))      w0: the parameter's initial value
    m     = beta1 * m + d * (1 - beta1) * g
    v     = beta2 * v + d**2 * (1 - beta2) * g * g
    s     = r * s + (d / d0) * dlr * g               (safeguard_warmup: d instead of dlr)
    S     = sum_all(|s|)
    when S > 0:
        nw    = r * nw + A;   d_hat = d_coef * nw / S                  (when lr > 0)
        d     = max(d, d_hat) if d == d0;   d_max = max(d_max, d_hat)
        d     = min(d_max, growth_rate * d)
        w     = w - weight_decay * dlr * w                             (decouple)
        w     = w - dlr * m / (sqrt(v) + d * eps)        (the new d; dlr of the old one)

sum_all sums over every element of every parameter the optimizer steps (global_sum); d
(initially d0), d_max (initially d0) and nw (initially 0) are scalars shared by all
parameters: every parameter keeps its own copy, equal as long as every parameter has a
gradient at every step. w0 is a copy of the parameter made with its states.

Reference: K. Mishchenko, A. Defazio, "Prodigy: An Expeditiously Adaptive
Parameter-Free Learner", ICML 2024 (arXiv:2306.06101); the authors' Prodigy (pip
prodigyopt, github.com/konstmish/prodigy), whose lr is the largest of all groups'.
"""
from optgen.dsl import Spec, eq, global_sum, maximum, minimum, sqrt, where

spec = Spec("prodigy", __doc__, reference="arXiv:2306.06101")
lr = spec.hyper("lr", 1.0, "lr >= 0", "multiplier of the estimated step size d")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "decay rate of the first moment",
                   tuple="betas")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "decay rate of the second moment",
                   tuple="betas")
beta3 = spec.hyper("beta3", None, "0 <= beta3 < 1",
                   "decay rate of s and nw; None: sqrt(beta2)", optional=True, none_value=-1.0)
eps = spec.hyper("eps", 1e-8, "eps > 0", "added to sqrt(v) in the denominator, times d")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "weight decay: decoupled (decouple), or added to the gradient")
d0 = spec.hyper("d0", 1e-6, "d0 > 0", "initial estimate of the step size d")
d_coef = spec.hyper("d_coef", 1.0, "d_coef > 0", "multiplier of the estimate d_hat")
growth_rate = spec.hyper("growth_rate", None, "growth_rate > 0",
                         "bound on the growth of d per step; None (or inf): unbounded",
                         optional=True, none_value=float("inf"))
spec.flag("decouple", True, "decoupled weight decay (AdamW style)")
spec.flag("use_bias_correction", False, "scale dlr by Adam's bias correction")
spec.flag("safeguard_warmup", False, "leave lr out of the weight of s (warm-up)")
m = spec.state("m", 0.0, "first moment, scaled by d")
v = spec.state("v", 0.0, "second moment, scaled by d**2")
s = spec.state("s", 0.0, "weighted sum of the gradients")
w0 = spec.state("w0", "w", "the parameter's initial value")
d = spec.state("d", d0, "estimate of the step size", shape="scalar")
d_max = spec.state("d_max", d0, "largest estimate d_hat so far", shape="scalar")
nw = spec.state("nw", 0.0, "weighted numerator of the estimate", shape="scalar")
t = spec.t


@spec.update
def prodigy(w, grad, flags):
    r = where(beta3 < 0, sqrt(beta2), beta3)
    bc = sqrt(1 - beta2 ** t) / (1 - beta1 ** t) if flags.use_bias_correction else 1.0
    dlr = d * lr * bc
    g = grad if flags.decouple else grad + weight_decay * w
    a = (d / d0) * dlr * global_sum(g * (w0 - w))
    m_new = beta1 * m + d * (1 - beta1) * g
    v_new = beta2 * v + d * d * (1 - beta2) * g * g
    s_new = r * s + (d / d0) * (d if flags.safeguard_warmup else dlr) * g
    total = global_sum(abs(s_new))
    moved = total > 0
    estimate = moved & (lr > 0)
    nw_new = r * nw + a
    d_hat = d_coef * nw_new / maximum(total, 1e-300)     # (used only where total > 0)
    d_max_new = maximum(d_max, d_hat)
    d_new = minimum(d_max_new, growth_rate * where(eq(d, d0), maximum(d, d_hat), d))
    d_next = where(estimate, d_new, d)
    w_new = w - weight_decay * dlr * w if flags.decouple else w
    w_new = w_new - dlr * m_new / (sqrt(v_new) + d_next * eps)
    return {m: m_new, v: v_new, s: s_new, nw: where(estimate, nw_new, nw), d: d_next,
            d_max: where(estimate, d_max_new, d_max), w: where(moved, w_new, w), w0: w0}

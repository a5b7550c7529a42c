"""ADOPT: Adam whose second moment excludes the current gradient, which converges for
any beta2.

    g = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
        + weight_decay * w                             (not decouple; else below)
    w = w * (1 - lr * weight_decay)                    (decouple; every step)
    t == 1:  v = g * g                                 (m and the step wait)
    t > 1:   n = g / max(sqrt(v), eps)                 (v: the previous steps' moment)
             n = clip(n, -t**clip_power, t**clip_power)   (clip_power None: no clip)
             m = beta1 * m + (1 - beta1) * n
             w = w - lr * m
             v = beta2 * v + (1 - beta2) * g * g

The clip bound is the authors' default clip_lambda, step**0.25, with the step counted
from 1 (their clip_lambda=None is clip_power=None). No bias correction.

Reference: S. Taniguchi et al., "ADOPT: Modified Adam Can Converge with Any beta2 with
the Optimal Rate", NeurIPS 2024 (arXiv:2411.02853); the authors' ADOPT
(github.com/iShohei220/adopt).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, clip, eq, maximum, sqrt, where

spec = Spec("adopt", __doc__, reference="arXiv:2411.02853")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "betas[0]: decay rate of m")
beta2 = spec.hyper("beta2", 0.9999, "0 <= beta2 < 1", "betas[1]: decay rate of v")
eps = spec.hyper("eps", 1e-6, "eps > 0", "floor of sqrt(v)")
clip_power = spec.hyper("clip_power", 0.25, "clip_power >= 0",
                        "the normalized gradient is clipped to +-t**clip_power; None: no clip",
                        optional=True, none_value=-1.0)
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "L2 on the gradient, or w * (1 - lr * weight_decay) (decouple)")
spec.flag("decouple", False, "decoupled weight decay (AdamW style)")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
m = spec.state("exp_avg", 0.0, "first moment of the normalized gradient")
v = spec.state("exp_avg_sq", 0.0, "second moment of the gradient (up to the last step)")
t = spec.t


@spec.update
def adopt(w, grad, flags):
    g = preprocess(w, grad)
    w_dec = w * (1 - lr * weight_decay) if flags.decouple else w
    g = g if flags.decouple else g + weight_decay * w
    first = eq(t, 1)
    bound = where(clip_power < 0, 3e38, t ** maximum(clip_power, 0.0))
    n = clip(g / maximum(sqrt(v), eps), -bound, bound)
    m_new = beta1 * m + (1 - beta1) * n
    return {v: where(first, g * g, beta2 * v + (1 - beta2) * g * g),
            m: where(first, m, m_new), w: where(first, w_dec, w_dec - lr * m_new)}

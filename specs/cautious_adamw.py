"""Cautious AdamW (C-AdamW): AdamW whose step is kept only where it agrees in sign with
the gradient, rescaled by the share of elements kept.

    g     = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    w     = w * (1 - lr * weight_decay)                         (decoupled)
    m     = beta1 * m + (1 - beta1) * g
    v     = beta2 * v + (1 - beta2) * g * g
    phi   = 1 where m * g > 0, else 0                           (m: the new value)
    phi   = phi / max(mean(phi), 1e-3)                          (mean over the whole tensor)
    s     = lr * sqrt(1 - beta2**t) / (1 - beta1**t)            (correct_bias; else s = lr)
    w     = w - s * phi * m / (sqrt(v) + eps)

This is the authors' per-parameter rule (C-Optim, c_adamw.py): the transformers AdamW
form, eps added to sqrt(v) before the bias correction, and the mask divided by its mean
clamped below at 1e-3. The mean is one value per parameter tensor, accumulated in
float64 in a pass of its own before the update.

Reference: K. Liang, L. Chen, B. Liu, Q. Liu, "Cautious Optimizers: Improving Training
with One Line of Code", arXiv:2411.16085 (2024); github.com/kyleliang919/C-Optim.
"""
from optgen.blocks import gradient_preprocessing, moments
from optgen.dsl import Spec, maximum, mean, sqrt, where

spec = Spec("cautious_adamw", __doc__, reference="arXiv:2411.16085")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "decay rate of the first moment")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "decay rate of the second moment")
eps = spec.hyper("eps", 1e-6, "eps >= 0", "added to sqrt(v), before the bias correction")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "decoupled decay: w is scaled by 1 - lr * weight_decay each step")
spec.flag("correct_bias", True, "scale the step by sqrt(1 - beta2**t) / (1 - beta1**t)")
m = spec.state("m", 0.0, "first moment (exp_avg)")
v = spec.state("v", 0.0, "second moment (exp_avg_sq)")
t = spec.t


@spec.update
def cautious_adamw(w, grad, flags):
    g = preprocess(w, grad)
    m_new, v_new = moments(m, v, g, beta1, beta2)
    agree = where(m_new * g > 0, 1.0, 0.0)
    mask = agree / maximum(mean(agree), 1e-3)
    step = lr * sqrt(1 - beta2 ** t) / (1 - beta1 ** t) if flags.correct_bias else lr
    w_decayed = w * (1 - lr * weight_decay)
    return {m: m_new, v: v_new, w: w_decayed - step * mask * m_new / (sqrt(v_new) + eps)}

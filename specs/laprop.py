"""LaProp: momentum of the gradient already divided by its RMS, which separates the
momentum from the adaptivity (Adam's order reversed).

    g  = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    v  = beta2 * v + (1 - beta2) * g * g
    m  = beta1 * m + (1 - beta1) * lr * g / (sqrt(v / (1 - beta2**t)) + eps)
    L  = beta1 * L + (1 - beta1) * lr                 (scalar: the average lr in m)
    w  = (w - m * lr / L) * (1 - lr * weight_decay)

The learning rate enters the momentum, as in the authors' code: m / L is the bias
correction 1 - beta1**t while lr is constant, and under an lr schedule each past step
keeps the lr it was taken with (with lr == 0 the step is m itself, as theirs). Weight decay is decoupled and applied after the step.

Reference: L. Ziyin, Z. T. Wang, M. Ueda, "LaProp: Separating Momentum and Adaptivity
in Adam", arXiv:2002.04839; the authors' LaProp (github.com/Z-T-WANG/LaProp-Optimizer).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, eq, sqrt, where

spec = Spec("laprop", __doc__, reference="arXiv:2002.04839")
lr = spec.hyper("lr", 4e-4, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "betas[0]: decay rate of m")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "betas[1]: decay rate of v")
eps = spec.hyper("eps", 1e-15, "eps >= 0", "added to the bias-corrected sqrt(v)")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "decoupled: w is scaled by 1 - lr * weight_decay after the step")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
m = spec.state("exp_avg", 0.0, "momentum of lr * g / sqrt(v)")
v = spec.state("exp_avg_sq", 0.0, "second moment (mean of g*g)")
lr_avg = spec.state("exp_avg_lr", 0.0, "EMA of lr with beta1 (m's bias correction)",
                    shape="scalar")
t = spec.t


@spec.update
def laprop(w, grad, flags):
    g = preprocess(w, grad)
    v_new = beta2 * v + (1 - beta2) * g * g
    m_new = beta1 * m + (1 - beta1) * lr * g / (sqrt(v_new / (1 - beta2 ** t)) + eps)
    lr_avg_new = beta1 * lr_avg + (1 - beta1) * lr
    # (the authors': a step of 1 * m where lr == 0)
    step = where(eq(lr, 0.0), 1.0, lr / where(lr_avg_new > 0, lr_avg_new, 1.0))
    return {v: v_new, m: m_new, lr_avg: lr_avg_new,
            w: (w - step * m_new) * (1 - lr * weight_decay)}

"""Grams: Adam's step size with the sign of the current gradient.

    g = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    u = |m / (1 - beta1**t) / (sqrt(v / (1 - beta2**t)) + eps)| * sign(g)
    w = w * (1 - lr * weight_decay) - lr * u                         (decoupled)

Reference: Y. Cao, X. Li, Z. Song, "Grams: Gradient Descent with Adaptive Momentum
Scaling", arXiv:2412.17107; pytorch_optimizer.Grams (its defaults).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, sign, sqrt

spec = Spec("grams", __doc__, reference="arXiv:2412.17107")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "betas[0]: decay rate of m")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "betas[1]: decay rate of v")
eps = spec.hyper("eps", 1e-6, "eps >= 0", "added to the bias-corrected sqrt(v)")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "decoupled: w is scaled by 1 - lr * weight_decay")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
m = spec.state("exp_avg", 0.0, "first moment (mean of g)")
v = spec.state("exp_avg_sq", 0.0, "second moment (mean of g*g)")
t = spec.t


@spec.update
def grams(w, grad, flags):
    g = preprocess(w, grad)
    m_new = beta1 * m + (1 - beta1) * g
    v_new = beta2 * v + (1 - beta2) * g * g
    u = m_new / (1 - beta1 ** t) / (sqrt(v_new / (1 - beta2 ** t)) + eps)
    return {m: m_new, v: v_new, w: w * (1 - lr * weight_decay) - lr * abs(u) * sign(g)}

"""Yogi: Adam whose second moment moves additively, by at most (1 - beta2) * g * g a step.

    g = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    w = w * (1 - lr * weight_decay)                               (decoupled)
    m = beta1 * m + (1 - beta1) * g
    v = v - (1 - beta2) * sign(v - g * g) * g * g
    w = w - lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)

m and v start at initial_accumulator. The paper leaves out Adam's bias correction "for
clarity"; it is applied here as in pytorch-optimizer's Yogi, whose defaults these are.

Reference: M. Zaheer, S. Reddi, D. Sachan, S. Kale, S. Kumar, "Adaptive Methods for
Nonconvex Optimization", NeurIPS 2018 (Algorithm 2); pytorch_optimizer.Yogi.
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, sign, sqrt

spec = Spec("yogi", __doc__, reference="NeurIPS 2018 (Zaheer et al.)")
lr = spec.hyper("lr", 1e-2, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "betas[0]: decay rate of m")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "betas[1]: rate of v's additive move")
eps = spec.hyper("eps", 1e-3, "eps >= 0", "added to the bias-corrected sqrt(v)")
initial_accumulator = spec.hyper("initial_accumulator", 1e-6, "initial_accumulator >= 0",
                                 "initial value of m and v")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "decoupled: w is scaled by 1 - lr * weight_decay")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
m = spec.state("exp_avg", initial_accumulator, "first moment (mean of g)")
v = spec.state("exp_avg_sq", initial_accumulator, "second moment, moved additively",
               nonneg=True)
t = spec.t


@spec.update
def yogi(w, grad, flags):
    g = preprocess(w, grad)
    g2 = g * g
    m_new = beta1 * m + (1 - beta1) * g
    v_new = v - (1 - beta2) * sign(v - g2) * g2
    denom = sqrt(v_new) / sqrt(1 - beta2 ** t) + eps
    return {m: m_new, v: v_new,
            w: w * (1 - lr * weight_decay) - lr / (1 - beta1 ** t) * m_new / denom}

"""AdEMAMix: Adam with a second, slow EMA of the gradient added to the fast one.

    g     = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    m1    = beta1 * m1 + (1 - beta1) * g                     (fast EMA, bias-corrected)
    m2    = beta3_t * m2 + (1 - beta3_t) * g                 (slow EMA, not corrected)
    v     = beta2 * v + (1 - beta2) * g * g
    w     = w * (1 - lr * weight_decay)
            - lr * (m1 / (1 - beta1**t) + alpha_t * m2) / (sqrt(v / (1 - beta2**t)) + eps)

The warm-ups (None: none) reach their final values at step T:

    alpha_t = alpha * min(1, t / alpha_warmup)
    beta3_t = exp(ln(beta1) ln(beta3) / ((1 - f) ln(beta3) + f ln(beta1))), f = t / beta3_warmup,
              while t < beta3_warmup; beta3 after

(beta3_t interpolates the half-life 1 / ln(beta) linearly from beta1's to beta3's: the
paper's scheduler, the authors' linear_hl_warmup_scheduler.) Weight decay is
decoupled, as in the authors' code.

Reference: M. Pagliardini, P. Ablin, D. Grangier, "The AdEMAMix Optimizer: Better,
Faster, Older", arXiv:2409.03137; the authors' AdEMAMix (github.com/apple/ml-ademamix).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, exp, log, maximum, minimum, sqrt, where

spec = Spec("ademamix", __doc__, reference="arXiv:2409.03137")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 < beta1 < 1", "betas[0]: decay rate of the fast EMA m1")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "betas[1]: decay rate of v")
beta3 = spec.hyper("beta3", 0.9999, "beta1 <= beta3 < 1",
                   "betas[2]: decay rate of the slow EMA m2 (after its warm-up)")
alpha = spec.hyper("alpha", 2.0, "alpha >= 0", "weight of the slow EMA (after its warm-up)")
beta3_warmup = spec.hyper("beta3_warmup", None, "beta3_warmup > 0",
                          "steps of beta3's warm-up from beta1; None: none",
                          optional=True, none_value=0.0)
alpha_warmup = spec.hyper("alpha_warmup", None, "alpha_warmup > 0",
                          "steps of alpha's linear warm-up from 0; None: none",
                          optional=True, none_value=0.0)
eps = spec.hyper("eps", 1e-8, "eps >= 0", "added to the bias-corrected sqrt(v)")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "decoupled: w is scaled by 1 - lr * weight_decay")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
m1 = spec.state("exp_avg_fast", 0.0, "fast EMA of g")
m2 = spec.state("exp_avg_slow", 0.0, "slow EMA of g")
v = spec.state("exp_avg_sq", 0.0, "second moment (mean of g*g)")
t = spec.t


def warmup_beta3():
    f = t / maximum(beta3_warmup, 1e-300)
    lb1, lb3 = log(beta1), log(beta3)
    scheduled = exp(lb1 * lb3 / ((1 - f) * lb3 + f * lb1))
    return where(t < beta3_warmup, scheduled, beta3)


@spec.update
def ademamix(w, grad, flags):
    g = preprocess(w, grad)
    alpha_t = where(alpha_warmup > 0, alpha * minimum(1.0, t / maximum(alpha_warmup, 1e-300)),
                    alpha)
    b3 = warmup_beta3()
    m1_new = beta1 * m1 + (1 - beta1) * g
    m2_new = b3 * m2 + (1 - b3) * g
    v_new = beta2 * v + (1 - beta2) * g * g
    denom = sqrt(v_new / (1 - beta2 ** t)) + eps
    u = (m1_new / (1 - beta1 ** t) + alpha_t * m2_new) / denom
    return {m1: m1_new, m2: m2_new, v: v_new, w: w * (1 - lr * weight_decay) - lr * u}

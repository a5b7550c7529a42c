"""Adan: adaptive Nesterov momentum, in the form of the authors' reference code.

    g      = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    diff   = g - g_prev                      (0 on the first step, where g_prev = g)
    m      = beta1 * m + (1 - beta1) * g
    v      = beta2 * v + (1 - beta2) * diff
    s      = beta3 * s + (1 - beta3) * (g + beta2 * diff)**2
    u      = (m / (1 - beta1**t) + beta2 * v / (1 - beta2**t)) / (sqrt(s / (1 - beta3**t)) + eps)
    w      = (w - lr * u) / (1 + lr * weight_decay)
    g_prev = g

This is Algorithm 1 of the paper with its betas written as decay rates, as the official
code does: the paper's beta_k is 1 - beta_k here, so its (0.02, 0.08, 0.01) are (0.98,
0.92, 0.99). The paper's n is s here (n is reserved in specs). As in the official code
(github.com/sail-sg/Adan, no_prox=False): the moments start at zero and are
bias-corrected; eps is added to the bias-corrected sqrt(s); weight decay is the paper's
proximal step, decoupled from g; the first step takes g_prev = g, so diff is 0 there.
The official max_grad_norm is the runtime's clip_global_norm.

Reference: X. Xie, P. Zhou, H. Li, Z. Lin, S. Yan, "Adan: Adaptive Nesterov Momentum
Algorithm for Faster Optimizing Deep Models", arXiv:2208.06677.
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, sqrt, where

spec = Spec("adan", __doc__, reference="arXiv:2208.06677")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate (eta)")
beta1 = spec.hyper("beta1", 0.98, "0 <= beta1 < 1", "decay rate of m, the mean of g")
beta2 = spec.hyper("beta2", 0.92, "0 <= beta2 < 1", "decay rate of v, the mean of g - g_prev")
beta3 = spec.hyper("beta3", 0.99, "0 <= beta3 < 1", "decay rate of s, the mean square")
eps = spec.hyper("eps", 1e-8, "eps > 0", "added to the bias-corrected sqrt(s)")
wd = spec.hyper("weight_decay", 0.0, "weight_decay >= 0", "proximal: w / (1 + lr * wd)")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)  # rescale_grad, clip
m, v, s, g_prev = spec.state("m"), spec.state("v"), spec.state("s"), spec.state("g_prev")


@spec.update
def adan(w, grad, flags):
    g, t = preprocess(w, grad), spec.t
    diff = where(t > 1, g - g_prev, 0.0)           # the first step takes g_prev = g
    m_t, v_t = beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * diff
    s_t = beta3 * s + (1 - beta3) * (g + beta2 * diff) ** 2
    u = (m_t / (1 - beta1**t) + beta2 * v_t / (1 - beta2**t)) / (sqrt(s_t / (1 - beta3**t)) + eps)
    return {m: m_t, v: v_t, s: s_t, g_prev: g, w: (w - lr * u) / (1 + lr * wd)}

"""OrthoLaProp and LaPropOrtho: LaProp with OrthoGrad's projection off the weight, of the
gradient before it (heavyball's OrthoLaProp) or of LaProp's step after it (``after``:
heavyball's LaPropOrtho).

    ortho(x) = y * ||x|| / max(||y||, 1e-6),  y = x - (sum(w * x) / (sum(w * w) + eps)) * w
               (x without its component along w, at x's norm; one sum per parameter)
    g   = clip(rescale_grad * grad, -clip_gradient, clip_gradient);  g = ortho(g)  (not after)
    v   = beta2_t * v + (1 - beta2_t) * g * g          beta_t = 1 - (1 - beta) / (1 - beta**t):
    m   = beta1_t * m + (1 - beta1_t) * g / max(sqrt(v), eps)     v, m are the bias-corrected
                                                                  averages (heavyball's)
    u   = ortho(m) if after else m
    w   = w * (1 - lr * weight_decay) - lr * u

eps bounds sqrt(v) from below and is added to sum(w * w), as heavyball's.

References: heavyball.OrthoLaProp, heavyball.LaPropOrtho (github.com/HomebrewML/HeavyBall);
L. Prieto, M. Barsbey, P. A. M. Mediano, T. Birdal, "Grokking at the Edge of Numerical
Stability", arXiv:2501.04697 (OrthoGrad); L. Ziyin, Z. T. Wang, M. Ueda, "LaProp",
arXiv:2002.04839.
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, maximum, norm, sqrt, sum

spec = Spec("ortho_laprop", __doc__, reference="arXiv:2501.04697; heavyball.OrthoLaProp")
lr = spec.hyper("lr", 0.0025, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "betas[0]: decay rate of m")
beta2 = spec.hyper("beta2", 0.99, "0 <= beta2 < 1", "betas[1]: decay rate of v")
eps = spec.hyper("eps", 1e-8, "eps > 0", "lower bound of sqrt(v); added to sum(w * w)")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "decoupled: w is scaled by 1 - lr * weight_decay")
spec.flag("after", False, "project LaProp's step, not the gradient (LaPropOrtho)")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
m = spec.state("exp_avg", 0.0, "bias-corrected average of g / max(sqrt(v), eps)")
v = spec.state("exp_avg_sq", 0.0, "bias-corrected average of g * g")
t = spec.t


def debiased(beta):
    """heavyball's beta_debias: an average with this decay is its own bias correction."""
    return 1 - (1 - beta) / (1 - beta ** t)


def ortho(w, x):
    """x without its component along w, rescaled to x's norm (OrthoGrad, grafted)."""
    y = x - sum(w * x) / (sum(w * w) + eps) * w
    return y * (norm(x) / maximum(norm(y), 1e-6))


@spec.update
def ortho_laprop(w, grad, flags):
    g = preprocess(w, grad)
    if not flags.after:
        g = ortho(w, g)
    b1, b2 = debiased(beta1), debiased(beta2)
    v_new = b2 * v + (1 - b2) * g * g
    m_new = b1 * m + (1 - b1) * g / maximum(sqrt(v_new), eps)
    u = ortho(w, m_new) if flags.after else m_new
    return {m: m_new, v: v_new, w: w * (1 - lr * weight_decay) - lr * u}

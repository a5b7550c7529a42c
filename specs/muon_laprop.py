"""MuonLaProp: LaProp's momentum of the normalized gradient, orthogonalized as Muon's on
2-D parameters (heavyball's MuonLaProp).

    g   = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    v   = beta2_t * v + (1 - beta2_t) * g * g          beta_t = 1 - (1 - beta) / (1 - beta**t):
    m   = beta1_t * m + (1 - beta1_t) * g / max(sqrt(v), eps)     v, m are the bias-corrected
                                                                  averages (heavyball's)
    2-D (R x C):  X = m / max(||m||_F, ns_eps), then ns_steps Newton-Schulz iterations
                  (Muon's, specs/muon.py; R > C: on the C x C Gram matrix)
                  w = w * (1 - lr * weight_decay) - lr * sqrt(max(1, R / C)) * X
    otherwise:    w = w * (1 - lr * weight_decay) - lr * m

The momentum is of the gradient already divided by its RMS (LaProp), not Adam's order.
Parameters of 3 or more dimensions take the second form; heavyball orthogonalizes them
unfolded to (R, everything else). heavyball iterates with five per-step coefficient
triples (bfloat16, stochastically rounded, except in float64) where the matrix is not
square; this form runs Muon's single triple (ns_a, ns_b, ns_c) in the parameter's dtype
(heavyball's ``zeroth_power_mode="legacy_newtonschulz"`` on square matrices).
``orthogonalize(laprop)`` (optgen.transforms) is the same step on 2-D parameters, on the
LaProp authors' form of the momentum (lr inside it, eps added, not a lower bound).

References: heavyball.MuonLaProp (github.com/HomebrewML/HeavyBall); L. Ziyin, Z. T. Wang,
M. Ueda, "LaProp: Separating Momentum and Adaptivity in Adam", arXiv:2002.04839;
K. Jordan et al., "Muon" (2024), kellerjordan.github.io/posts/muon.
"""
from optgen import blocks
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, maximum, sqrt

spec = Spec("muon_laprop", __doc__, reference="heavyball.MuonLaProp; arXiv:2002.04839")
lr = spec.hyper("lr", 0.0025, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "betas[0]: decay rate of m")
beta2 = spec.hyper("beta2", 0.99, "0 <= beta2 < 1", "betas[1]: decay rate of v")
eps = spec.hyper("eps", 1e-8, "eps > 0", "lower bound of sqrt(v)")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "decoupled: w is scaled by 1 - lr * weight_decay")
ns_steps, (ns_a, ns_b, ns_c), ns_eps = blocks.newton_schulz_hypers(spec, "m")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
spec.shape_flag("matrix", "ndim == 2", "2-D parameters: the orthogonalized step")
spec.shape_flag("tall", "rows > cols", "R > C: iterate on the C x C Gram matrix (2-D)")
m = spec.state("exp_avg", 0.0, "bias-corrected average of g / max(sqrt(v), eps)")
v = spec.state("exp_avg_sq", 0.0, "bias-corrected average of g * g")
t = spec.t


def debiased(beta):
    """heavyball's beta_debias: an average with this decay is its own bias correction."""
    return 1 - (1 - beta) / (1 - beta ** t)


@spec.update
def muon_laprop(w, grad, flags):
    g = preprocess(w, grad)
    b1, b2 = debiased(beta1), debiased(beta2)
    v_new = b2 * v + (1 - b2) * g * g
    m_new = b1 * m + (1 - b1) * g / maximum(sqrt(v_new), eps)
    step = m_new
    if flags.matrix:
        x = blocks.newton_schulz(m_new, flags.tall, (ns_a, ns_b, ns_c), ns_steps, ns_eps)
        step = sqrt(maximum(1.0, spec.rows / spec.cols)) * x
    return {m: m_new, v: v_new, w: w * (1 - lr * weight_decay) - lr * step}

"""SOAP: Adam in the eigenbasis of Shampoo's preconditioner (Vyas et al. 2024, Algorithm 1).

For a 2-D parameter W (R x C), at step t:

    g    = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    every precondition_frequency steps (a parameter's steps 1, 1 + f, ...), on the host:
        Q_L = QR(L Q_L)        Q_R = QR(R Q_R)       (one power iteration, float64)
    g'   = Q_L^T g Q_R                                (the gradient in the eigenbasis)
    m    = beta1 * m + (1 - beta1) * g                (kept in the original space)
    m'   = Q_L^T m Q_R
    v    = beta2 * v + (1 - beta2) * g' * g'          (kept in the eigenbasis)
    lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)     (correct_bias; else lr)
    W    = (W - lr_t * Q_L (m' / (sqrt(v) + eps)) Q_R^T) * (1 - lr * weight_decay)
    L    = shampoo_beta * L + (1 - shampoo_beta) * g g^T
    R    = shampoo_beta * R + (1 - shampoo_beta) * g^T g

Parameters of any other rank take the same Adam (Q = I), as the paper's code does for
1-D parameters. The defaults are the paper's: lr 3e-3, betas (0.95, 0.95), shampoo_beta
= beta2 (None), eps 1e-8, weight_decay 0.01, precondition_frequency 10. The bias
correction, the eps outside it and the weight decay after the step are the paper's code
(its Algorithm omits them).

The first basis: a refresh runs before the step's update, so step 1's sees L = 0 and
keeps the identity (steps 1 .. f are Adam); the first refresh with statistics (step
f + 1) fits the basis by eigh, and the following ones take one QR power iteration from
the current basis. The paper's code fits by eigh at step 1 and skips that step's update.
The basis is not re-sorted by estimated eigenvalue before the power iteration (the
paper's code does, permuting v with it).

Reference: N. Vyas et al., "SOAP: Improving and Stabilizing Shampoo using Adam",
arXiv:2409.11321 (2024); github.com/nikhilvyas/SOAP.
"""
from optgen.blocks import gradient_preprocessing, moments
from optgen.dsl import Spec, matmul, power_qr, sqrt, where

spec = Spec("soap", __doc__, reference="arXiv:2409.11321")
lr = spec.hyper("lr", 3e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.95, "0 <= beta1 < 1", "decay of the first moment m")
beta2 = spec.hyper("beta2", 0.95, "0 <= beta2 < 1", "decay of the second moment v")
eps = spec.hyper("eps", 1e-8, "eps > 0", "added to sqrt(v) in the denominator")
weight_decay = spec.hyper("weight_decay", 0.01, "weight_decay >= 0", "decoupled weight decay")
shampoo_beta = spec.hyper("shampoo_beta", None, "0 <= shampoo_beta < 1",
                          "decay of L and R; None: beta2", optional=True, none_value=-1.0)
frequency = spec.hyper("precondition_frequency", 10, "precondition_frequency >= 1",
                       "steps between power iterations of the basis", type="int")
spec.flag("correct_bias", True, "Adam's bias correction, folded into the step size")
spec.shape_flag("matrix", "ndim == 2", "2-D parameters run Adam in the eigenbasis")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
m = spec.state("m", 0.0, "first moment (original space)")
v = spec.state("v", 0.0, "second moment (eigenbasis)")
L = spec.state("L", 0.0, "left statistic: EMA of g g^T", shape="rr", when="matrix")
R = spec.state("R", 0.0, "right statistic: EMA of g^T g", shape="cc", when="matrix")
Q_L = spec.state("Q_L", 0.0, "eigenbasis of L", shape="rr", when="matrix")
Q_R = spec.state("Q_R", 0.0, "eigenbasis of R", shape="cc", when="matrix")
t = spec.t


@spec.refresh(every=frequency)
def refresh(w, flags):
    if not flags.matrix:
        return {}
    return {Q_L: power_qr(L, Q_L), Q_R: power_qr(R, Q_R)}


def rotate(x):
    """x in the eigenbasis: Q_L^T x Q_R."""
    return matmul(matmul(Q_L.T, x), Q_R)


@spec.update
def soap(w, grad, flags):
    g = preprocess(w, grad)
    lr_t = lr * sqrt(1 - beta2 ** t) / (1 - beta1 ** t) if flags.correct_bias else lr
    if not flags.matrix:
        m_new, v_new = moments(m, v, g, beta1, beta2)
        step = m_new / (sqrt(v_new) + eps)
        return {m: m_new, v: v_new, w: (w - lr_t * step) * (1 - lr * weight_decay)}
    g_rot = rotate(g)
    m_new = beta1 * m + (1 - beta1) * g
    v_new = beta2 * v + (1 - beta2) * g_rot * g_rot
    n_rot = rotate(m_new) / (sqrt(v_new) + eps)
    step = matmul(matmul(Q_L, n_rot), Q_R.T)
    sb = where(shampoo_beta >= 0, shampoo_beta, beta2)
    return {m: m_new, v: v_new, w: (w - lr_t * step) * (1 - lr * weight_decay),
            L: sb * L + (1 - sb) * matmul(g, g.T),
            R: sb * R + (1 - sb) * matmul(g.T, g)}

"""SOAP: Adam in the eigenbasis of Shampoo's preconditioner, as its authors' code runs it
(Vyas et al. 2024; github.com/nikhilvyas/SOAP, soap.py).

For a 2-D parameter W (R x C) with both sides preconditioned, on its k-th step:

    g    = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    L    = sb * L + (1 - sb) * g g^T       R = sb * R + (1 - sb) * g^T g
           (sb = shampoo_beta, or beta2 when shampoo_beta < 0; every step, after the update)
    k = 1: Q_L, Q_R = eigenvectors of L, R by descending eigenvalue (eigh);
           nothing else changes (the step only fits the basis).
    k > 1, t = k - 1:
        g'   = Q_L^T g Q_R                            (the gradient in the eigenbasis)
        m    = beta1 * m + (1 - beta1) * g'           (m and v are kept in the eigenbasis)
        v    = beta2 * v + (1 - beta2) * g' * g'
        N    = Q_L (m / (sqrt(v) + eps)) Q_R^T        (normalize_grads: N / (1e-30 + rms(N)))
        lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)     (correct_bias; else lr)
        W    = (W - lr_t * N) * (1 - lr * weight_decay)
    after the steps k = 1 + f, 1 + 2f, ... (f = precondition_frequency):
        P_L  = the permutation sorting Q_L's columns by descending q^T L q;  P_R alike
        Q_L' = QR(L Q_L P_L),  Q_R' = QR(R Q_R P_R)       (one power iteration)
        v    = P_L^T v P_R                                (v follows its coordinates)
        m    = Q_L'^T (Q_L m Q_R^T) Q_R'                  (m moves to the new basis)

The refresh (eigh, ordering, QR, m's rotation) runs in the kernel's dtype, float32 for
float32 and low-precision parameters, as the authors' code (``dtype="kernel"``).
A side longer than ``max_precond_dim`` (the authors' name and default, 10000) is not
preconditioned: its Q is the identity and its statistic is not kept. Parameters that are not 2-D take the same
rule with Q = I (Adam, whose first step only counts), as the authors' code does for 1-D
parameters by default; it preconditions every dimension of a tensor of more than two,
which this spec does not (optgen.torch.SOAP refuses those).

Defaults are the authors': lr 3e-3, betas (0.95, 0.95), shampoo_beta -1 (beta2), eps
1e-8, weight_decay 0.01, precondition_frequency 10, correct_bias, no normalize_grads.
The basis is refreshed before the step that first uses it: a refresh before the
parameter's steps 2, 2 + f, 2 + 2f, ... (``start=2``). The authors rotate m back and
forth on every step; here it is rotated when the basis changes, which is the same map.

Reference: N. Vyas et al., "SOAP: Improving and Stabilizing Shampoo using Adam",
arXiv:2409.11321 (2024); github.com/nikhilvyas/SOAP.
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, eigen_order, matmul, maximum, power_qr, rms, sqrt, where

MAX_PRECOND_DIM = 10000   # the authors' default: longer sides keep Q = I

spec = Spec("soap", __doc__, reference="arXiv:2409.11321")
lr = spec.hyper("lr", 3e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.95, "0 <= beta1 < 1", "decay of the first moment m")
beta2 = spec.hyper("beta2", 0.95, "0 <= beta2 < 1", "decay of the second moment v")
eps = spec.hyper("eps", 1e-8, "eps > 0", "added to sqrt(v) in the denominator")
weight_decay = spec.hyper("weight_decay", 0.01, "weight_decay >= 0",
                          "decoupled weight decay, after the step")
shampoo_beta = spec.hyper("shampoo_beta", -1.0, "shampoo_beta < 1",
                          "decay of L and R; negative: beta2")
frequency = spec.hyper("precondition_frequency", 10, "precondition_frequency >= 1",
                       "steps between power iterations of the basis", type="int")
spec.flag("correct_bias", True, "Adam's bias correction, folded into the step size")
spec.flag("normalize_grads", False, "divide the step direction by its RMS")
spec.hyper("max_precond_dim", MAX_PRECOND_DIM, "max_precond_dim >= 0",
           "a side longer than this is not preconditioned (Q = I, no statistic); fixed "
           "when the optimizer is made", type="int")
# (an empty matrix, a side of 0, has nothing to precondition: its eigenbasis would be
# fit from an empty statistic)
spec.shape_flag("left", "ndim == 2 and rows <= max_precond_dim and rows * cols > 0",
                "the rows are preconditioned (L, Q_L)")
spec.shape_flag("right", "ndim == 2 and cols <= max_precond_dim and rows * cols > 0",
                "the columns are preconditioned (R, Q_R)")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
m = spec.state("m", 0.0, "first moment (eigenbasis)")
v = spec.state("v", 0.0, "second moment (eigenbasis)", nonneg=True)
L = spec.state("L", 0.0, "left statistic: EMA of g g^T", shape="rr", when="left")
R = spec.state("R", 0.0, "right statistic: EMA of g^T g", shape="cc", when="right")
Q_L = spec.state("Q_L", 0.0, "eigenbasis of L (zero until fit)", shape="rr", when="left")
Q_R = spec.state("Q_R", 0.0, "eigenbasis of R (zero until fit)", shape="cc", when="right")
t = spec.t


def rotate(x, left, right):
    """left^T x right, a side without a basis (None) left as it is."""
    x = x if left is None else matmul(left.T, x)
    return x if right is None else matmul(x, right)


def bases(flags):
    return (Q_L if flags.left else None), (Q_R if flags.right else None)


@spec.refresh(every=frequency, start=2, dtype="kernel")
def refresh(w, flags):
    q_l, q_r = bases(flags)
    p_l = eigen_order(L, Q_L) if flags.left else None
    p_r = eigen_order(R, Q_R) if flags.right else None
    new_l = power_qr(L, matmul(Q_L, p_l)) if flags.left else None
    new_r = power_qr(R, matmul(Q_R, p_r)) if flags.right else None
    if new_l is None and new_r is None:
        return {}
    back = rotate(m, None if q_l is None else q_l.T, None if q_r is None else q_r.T)
    out = {m: rotate(back, new_l, new_r), v: rotate(v, p_l, p_r)}
    out.update({Q_L: new_l} if flags.left else {})
    out.update({Q_R: new_r} if flags.right else {})
    return out


@spec.update
def soap(w, grad, flags):
    g = preprocess(w, grad)
    q_l, q_r = bases(flags)
    n = maximum(t - 1, 1)     # the Adam step count (step 1 only fits the basis)
    lr_t = lr * sqrt(1 - beta2 ** n) / (1 - beta1 ** n) if flags.correct_bias else lr
    g_rot = rotate(g, q_l, q_r)
    m_new = beta1 * m + (1 - beta1) * g_rot
    v_new = beta2 * v + (1 - beta2) * g_rot * g_rot
    step = rotate(m_new / (sqrt(v_new) + eps), None if q_l is None else q_l.T,
                  None if q_r is None else q_r.T)
    if flags.normalize_grads:
        step = step / (1e-30 + rms(step))
    first = t <= 1
    out = {m: where(first, m, m_new), v: where(first, v, v_new),
           w: where(first, w, (w - lr_t * step) * (1 - lr * weight_decay))}
    sb = where(shampoo_beta >= 0, shampoo_beta, beta2)
    if flags.left:
        out[L] = sb * L + (1 - sb) * matmul(g, g.T)
    if flags.right:
        out[R] = sb * R + (1 - sb) * matmul(g.T, g)
    return out

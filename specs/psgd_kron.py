"""PSGD-Kron: preconditioned SGD with a Kronecker-factored preconditioner P = Q^T Q (Li
2015/2018), as heavyball 3.2.1's ``PSGDKron`` steps it with its defaults.

For a 2-D parameter W (R x C) on step t (the per-step update, one fused kernel):

    beta_t = 1 - (1 - beta1) / (1 - beta1^t)                 (a debiased EMA)
    m      = m + (1 - beta_t) * (g - m)
    P m    = Q_L^T Q_L m Q_R^T Q_R      (a diagonal side d: m * d^2 along it)
    u      = trust_clip(P m)  = clamp(1.5 * (0.9 tanh(x) + 0.1 sign(x) log1p|x|), -2, 2),
             x = P m / 1.5                          (heavyball's default update clipping)
    lr_t   = lr * t / max(t, warmup_steps + 1)
    W      = W * (1 - lr_t * weight_decay) - lr_t * u

Q_L (R x R) and Q_R (C x C) are upper triangular. A side longer than
``max_size_triangular`` (2048), every side when ``min_ndim_triangular`` > 2, and the
sides ``diag_mode`` names (heavyball's memory_save_mode: 1 one_diag, 2 smart_one_diag,
3 one_triu, 4 all_diag; 0 None) keep a diagonal Q, d_L or d_R; the kernel reads them as
one parameter-shaped state D[i, j] = d_L[i] d_R[j] (1 on a triangular side), since a
diagonal side's scaling commutes with the other side's product: P m = Q_L^T Q_L (D^2 m)
Q_R^T Q_R (the fit recovers the factors from D: balanced, they are unique). Parameters
that are not 2-D, or have a side of 1 (heavyball squeezes those), keep one diagonal Q of
their own shape (D): P m = D^2 m.

Q is fitted on the host before each step's update, with the step's m, on the steps the
preconditioner-update schedule picks (optgen.torch.PSGDKron does it: Li's whitening
rule, optgen/torch/psgd_fit.py; docs/matrix.md). This spec holds the states and the
per-step update; the scalar states ``lb_L``/``lb_R`` are the fit's running lower bounds.

Reference: X.-L. Li, "Preconditioned Stochastic Gradient Descent", IEEE TNNLS 2018
(arXiv:1512.04202); github.com/lixilinx/psgd_torch; E. Walters, kron_torch.
"""
from optgen.dsl import Spec, clip, copysign, lerp, log1p, matmul, maximum, tanh

spec = Spec("psgd_kron", __doc__, reference="arXiv:1512.04202")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "decay of the momentum m (debiased)")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "decoupled weight decay, scaled by lr_t")
warmup = spec.hyper("warmup_steps", 0, "warmup_steps >= 0",
                    "linear learning-rate warm-up over this many steps", type="int")
spec.hyper("max_size_triangular", 2048, "max_size_triangular >= 1",
           "a side longer than this keeps a diagonal Q; fixed when the optimizer is made",
           type="int")
spec.hyper("min_ndim_triangular", 2, "min_ndim_triangular >= 0",
           "above 2, every side keeps a diagonal Q; fixed when the optimizer is made",
           type="int")
spec.hyper("diag_mode", 0, "0 <= diag_mode <= 4",
           "heavyball's memory_save_mode: 0 None, 1 one_diag, 2 smart_one_diag, 3 "
           "one_triu, 4 all_diag; fixed when the optimizer is made", type="int")
MAT = "ndim == 2 and rows > 1 and cols > 1"
TRI = f"{MAT} and min_ndim_triangular <= 2 and diag_mode != 4"
spec.shape_flag("tri_l", f"{TRI} and rows <= max_size_triangular and not "
                "(diag_mode >= 1 and rows > cols)", "Q_L is triangular")
spec.shape_flag("tri_r", f"{TRI} and cols <= max_size_triangular and not "
                "(diag_mode == 2 and cols > rows) and not "
                "((diag_mode == 1 or diag_mode == 3) and cols >= rows)", "Q_R is triangular")
m = spec.state("m", 0.0, "momentum (a debiased EMA of the gradient)")
Q_L = spec.state("Q_L", 0.0, "left factor, upper triangular (host-fitted)", shape="rr",
                 when="tri_l")
Q_R = spec.state("Q_R", 0.0, "right factor, upper triangular (host-fitted)", shape="cc",
                 when="tri_r")
D = spec.state("D", 0.0, "the diagonal factors, elementwise: d_L[i] d_R[j] (1 on a "
               "triangular side); q itself for a parameter that is not a matrix",
               when="not (tri_l and tri_r)")
lb_L = spec.state("lb_L", 0.0, "running lower bound of the left (or only) factor's fit",
           shape="scalar")
lb_R = spec.state("lb_R", 0.0, "running lower bound of the right factor's fit (matrices)",
                  shape="scalar")
t = spec.t


def trust_clip(x):
    """heavyball's trust_region_clip_ (lerp 0.9, scale 1.5): tanh near 0, log beyond."""
    y = x / 1.5
    th = tanh(y)
    return clip((copysign(log1p(abs(y)), th) * 0.1 + th * 0.9) * 1.5, -2.0, 2.0)


def precondition(x, flags):
    """P x = Q^T Q x along each side (diagonal sides: x * D^2, which commutes)."""
    if not (flags.tri_l and flags.tri_r):
        x = D * D * x                  # (a diagonal side scales rows or columns)
    if flags.tri_l:
        x = matmul(Q_L.T, matmul(Q_L, x))
    return matmul(matmul(x, Q_R.T), Q_R) if flags.tri_r else x


@spec.update
def psgd_kron(w, grad, flags):
    beta_t = 1 - (1 - beta1) / (1 - beta1 ** t)
    m_new = lerp(m, grad, 1 - beta_t)
    lr_t = lr * t / maximum(t, warmup + 1)
    u = trust_clip(precondition(m_new, flags))
    out = {m: m_new, w: w * (1 - lr_t * weight_decay) - lr_t * u}
    # (the factors and bounds change only in the host's fit: the kernel keeps them)
    kept = [lb_L, lb_R] + [Q_L] * flags.tri_l + [Q_R] * flags.tri_r \
        + [D] * (not (flags.tri_l and flags.tri_r))
    out.update({s: s for s in kept})
    return out

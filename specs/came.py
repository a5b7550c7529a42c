"""CAME: Adafactor's factored second moment, with the first moment weighed by the
confidence of each update (a factored moment of its residual).

    G     = g * g + eps1
    1-D:   v   = beta2 * v + (1 - beta2) * G;                     U = g / sqrt(v)
    2+-D:  row = beta2 * row + (1 - beta2) * row_mean(G)          (shape [..., R])
           col = beta2 * col + (1 - beta2) * col_mean(G)          (shape [..., C])
           U   = g / sqrt(row / mean_R(row) * col)
    U     = U / max(1, RMS(U) / clip_threshold)
    m     = beta1 * m + (1 - beta1) * U
    1-D:   U = m
    2+-D:  R     = (U - m)**2 + eps2
           res_row = beta3 * res_row + (1 - beta3) * row_mean(R)
           res_col = beta3 * res_col + (1 - beta3) * col_mean(R)
           U     = m / sqrt(res_row / mean_R(res_row) * res_col)
    w     = w - weight_decay * lr * w - lr * U

A tensor of two or more dimensions is factored over its last two axes (leading axes are
a batch), as the authors' code does; the ``factored`` flag is set per parameter from its
shape. The authors' class has no default lr (it must be given); the spec's is 1e-4.

Reference: Y. Luo et al., "CAME: Confidence-guided Adaptive Memory Efficient
Optimization", ACL 2023 (arXiv:2307.02047); the authors' CAME (pip came-pytorch,
github.com/yangluo7/CAME).
"""
from optgen.dsl import Spec, maximum, mean, rms, row_mean, col_mean, sqrt

spec = Spec("came", __doc__, reference="arXiv:2307.02047")
lr = spec.hyper("lr", 1e-4, "lr > 0", "learning rate")
eps1 = spec.hyper("eps1", 1e-30, "eps1 > 0", "added to the squared gradient", tuple="eps")
eps2 = spec.hyper("eps2", 1e-16, "eps2 > 0", "added to the squared residual (instability)",
                  tuple="eps")
clip_threshold = spec.hyper("clip_threshold", 1.0, "clip_threshold > 0",
                            "the update is scaled down so that its RMS is at most this")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 <= 1", "decay rate of the first moment")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 <= 1", "decay rate of the second moment")
beta3 = spec.hyper("beta3", 0.9999, "0 <= beta3 <= 1", "decay rate of the residual's moment")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "decoupled weight decay, scaled by lr")
spec.shape_flag("factored", "ndim >= 2",
                "second moment and residual factored into row and column means (2+-D)")
exp_avg = spec.state("exp_avg", 0.0, "first moment of the update")
exp_avg_sq = spec.state("exp_avg_sq", 0.0, "second moment (1-D tensors)", when="not factored")
row = spec.state("exp_avg_sq_row", 0.0, "row means of the second moment (2+-D)",
                 shape="row", when="factored")
col = spec.state("exp_avg_sq_col", 0.0, "column means of the second moment (2+-D)",
                 shape="col", when="factored")
res_row = spec.state("exp_avg_res_row", 0.0, "row means of the residual's moment (2+-D)",
                     shape="row", when="factored")
res_col = spec.state("exp_avg_res_col", 0.0, "column means of the residual's moment (2+-D)",
                     shape="col", when="factored")


def factored_root(r, c):
    """sqrt of the factored estimate row / mean_R(row) * col."""
    return sqrt(r / mean(r, "r") * c)


@spec.update
def came(w, grad, flags):
    sq = grad * grad + eps1
    new = {}
    if flags.factored:
        row_new = beta2 * row + (1 - beta2) * row_mean(sq)
        col_new = beta2 * col + (1 - beta2) * col_mean(sq)
        u = grad / factored_root(row_new, col_new)
        new.update({row: row_new, col: col_new})
    else:
        v_new = beta2 * exp_avg_sq + (1 - beta2) * sq
        u = grad / sqrt(v_new)
        new[exp_avg_sq] = v_new
    u = u / maximum(1.0, rms(u) / clip_threshold)
    m_new = beta1 * exp_avg + (1 - beta1) * u
    if flags.factored:
        res = (u - m_new) * (u - m_new) + eps2
        res_row_new = beta3 * res_row + (1 - beta3) * row_mean(res)
        res_col_new = beta3 * res_col + (1 - beta3) * col_mean(res)
        u = m_new / factored_root(res_row_new, res_col_new)
        new.update({res_row: res_row_new, res_col: res_col_new})
    else:
        u = m_new
    return {**new, exp_avg: m_new, w: w - weight_decay * lr * w - lr * u}

"""Adafactor, in the torch.optim.Adafactor form (beta2_decay, d, eps = (eps1, eps2), maximize).

    g      = -grad if maximize else grad
    b      = t ** beta2_decay                              (1 - beta2_t)
    rho    = min(lr, 1 / sqrt(t))
    alpha  = max(eps2, RMS(w)) * rho                       (RMS of the old w)
    w      = w * (1 - lr * weight_decay)                   (decoupled, scaled by lr)
    2+-D:  row_var = row_var + b * (row_mean(g*g) - row_var)        (shape[:-1])
           col_var = col_var + b * (col_mean(g*g) - col_var)        (shape[:-2] + shape[-1:])
           V = row_var * col_var / max(mean_R(row_var), eps1)
    else:  variance = variance + b * (g*g - variance);  V = variance
    U      = g / sqrt(max(V, eps1 * eps1))
    w      = w - alpha / max(1, RMS(U) / d) * U

The seed adafactor.py is fairseq's / MindSpore's form (relative step, eps1 added to g*g,
update clipping by clip_threshold, beta1); this is torch's. torch's eps is (eps1, eps2);
eps1 None is torch.finfo(dtype).eps, which a spec cannot see: None here is float32's
eps, and torch's drop-in passes finfo(dtype).eps for other dtypes. torch keeps row_var
as [..., R, 1] and col_var as [..., 1, C]; the states here are their squeezed shapes.
maximize is a flag (torch's bool: its own kernel); factored is set from the shape.

Reference: N. Shazeer, M. Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory
Cost", ICML 2018 (arXiv:1804.04235); torch.optim.Adafactor.
"""
from optgen.blocks import torch_gradient
from optgen.dsl import Spec, col_mean, maximum, mean, minimum, rms, row_mean, rsqrt, sqrt

FLOAT32_EPS = 1.1920928955078125e-07

spec = Spec("torch_adafactor", __doc__, reference="arXiv:1804.04235; torch.optim.Adafactor")
lr = spec.hyper("lr", 1e-2, "lr >= 0", "learning rate: the relative step is min(lr, 1/sqrt(t))")
beta2_decay = spec.hyper("beta2_decay", -0.8, "beta2_decay <= 0",
                         "1 - beta2_t = t ** beta2_decay")
eps1 = spec.hyper("eps1", None, "eps1 >= 0", "eps[0]: lower bound of the variance estimate "
                  "(squared) and of mean_R(row_var); None: float32's eps",
                  optional=True, none_value=FLOAT32_EPS)
eps2 = spec.hyper("eps2", 1e-3, "eps2 >= 0", "eps[1]: lower bound of RMS(w) in the step size")
d = spec.hyper("d", 1.0, "d >= 1", "the update is scaled down so that its RMS is at most d")
gradient, _ = torch_gradient(spec, decoupled=True)
weight_decay = spec.hypers["weight_decay"].node
spec.shape_flag("factored", "ndim >= 2", "row and column variances (2+-D tensors)")
row_var = spec.state("row_var", 0.0, "row means of g*g (2+-D)", shape="row", when="factored")
col_var = spec.state("col_var", 0.0, "column means of g*g (2+-D)", shape="col",
                     when="factored")
variance = spec.state("variance", 0.0, "mean of g*g (0-D and 1-D)", when="not factored")
t = spec.t


@spec.update
def torch_adafactor(w, grad, flags):
    g = gradient(w, grad, flags)
    b = t ** beta2_decay
    alpha = maximum(eps2, rms(w)) * minimum(lr, 1 / sqrt(t))
    sq = g * g
    if flags.factored:
        row = row_var + b * (row_mean(sq) - row_var)
        col = col_var + b * (col_mean(sq) - col_var)
        var, new = row * col / maximum(mean(row, "r"), eps1), {row_var: row, col_var: col}
    else:
        var = variance + b * (sq - variance)
        new = {variance: var}
    u = g * rsqrt(maximum(var, eps1 * eps1))
    # (w - lr * weight_decay * w: the mixed-precision kernels then round as the float32 ones)
    return {**new, w: w - lr * weight_decay * w - alpha / maximum(1.0, rms(u) / d) * u}

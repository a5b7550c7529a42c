"""Adafactor: adaptive learning rates with sublinear memory (fairseq / MindSpore AdaFactor).

    g     = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    rho   = min(1e-2, 1/sqrt(t))  (warmup_init: min(1e-6 * t, 1/sqrt(t)))  if relative_step
            lr                                                             otherwise
    alpha = max(eps2, RMS(w)) * rho  if scale_parameter  else  rho       (RMS of the old w)
    beta2t = 1 - t**(-decay_rate)
    G     = g*g + eps1
    1-D:   v   = beta2t * v + (1 - beta2t) * G;                       V = v
    2+-D:  row = beta2t * row + (1 - beta2t) * row_mean(G)            (shape [..., R])
           col = beta2t * col + (1 - beta2t) * col_mean(G)            (shape [..., C])
           V   = row / mean_R(row) * col
    U     = g / sqrt(V);   U = U / max(1, RMS(U) / clip_threshold);   U = alpha * U
    m     = beta1 * m + (1 - beta1) * U;   U = m                       (beta1 set)
    w     = w - weight_decay * alpha * w - U

A tensor of two or more dimensions is factored over its last two axes (leading axes are
a batch), as in fairseq and MindSpore; the ``factored`` flag is set per parameter from
its shape. Weight decay is decoupled and scaled by alpha, as in fairseq/MindSpore. With
beta1 unset the exp_avg state still exists (it then equals U: beta1 = 0 is the same
rule), so the memory saving is in the second moment only. With ``compression`` (MindSpore)
the running averages are stored as float16 (rounded once per step) and computed in the
parameter's dtype.

Reference: N. Shazeer, M. Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory
Cost", ICML 2018 (arXiv:1804.04235).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, maximum, mean, minimum, rms, row_mean, col_mean, sqrt

spec = Spec("adafactor", __doc__, reference="arXiv:1804.04235")
lr = spec.hyper("lr", None, "lr > 0", "external learning rate; used when relative_step is off",
                optional=True, none_value=0.0)
eps1 = spec.hyper("eps1", 1e-30, "eps1 > 0", "added to the squared gradient")
eps2 = spec.hyper("eps2", 1e-3, "eps2 > 0", "lower bound of the parameter scale RMS(w)")
clip_threshold = spec.hyper("clip_threshold", 1.0, "clip_threshold > 0",
                            "the update is scaled down so that its RMS is at most this")
decay_rate = spec.hyper("decay_rate", 0.8, "0 <= decay_rate <= 1",
                        "second-moment decay: beta2t = 1 - t**(-decay_rate)")
beta1 = spec.hyper("beta1", None, "0 < beta1 < 1",
                   "first-moment decay of the update; None: no first moment",
                   optional=True, none_value=0.0)
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "decoupled weight decay, scaled by the step size alpha")
spec.flag("scale_parameter", True, "scale the step by max(eps2, RMS(w))")
spec.flag("relative_step", True, "time-dependent step size min(1e-2, 1/sqrt(t)) instead of lr")
spec.flag("warmup_init", False, "relative step min(1e-6 * t, 1/sqrt(t)) (warm-up)")
spec.flag("compression", False, "store the running averages as float16")
spec.require("relative_step or lr > 0", "lr must be set when relative_step is False")
spec.require("relative_step or not warmup_init", "warmup_init needs relative_step")
spec.shape_flag("factored", "ndim >= 2",
                "second moment factored into row and column means (2+-D tensors)")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
exp_avg = spec.state("exp_avg", 0.0, "first moment of the update (beta1)",
                     half_when="compression")
exp_avg_sq = spec.state("exp_avg_sq", 0.0, "second moment (1-D tensors)", when="not factored",
                        half_when="compression")
row = spec.state("exp_avg_sq_row", 0.0, "row means of the second moment (2+-D)",
                 shape="row", when="factored", half_when="compression")
col = spec.state("exp_avg_sq_col", 0.0, "column means of the second moment (2+-D)",
                 shape="col", when="factored", half_when="compression")
t = spec.t


@spec.update
def adafactor(w, grad, flags):
    g = preprocess(w, grad)
    if flags.relative_step:
        start = 1e-6 * t if flags.warmup_init else 1e-2
        rho = minimum(start, 1 / sqrt(t))
    else:
        rho = lr
    alpha = maximum(eps2, rms(w)) * rho if flags.scale_parameter else rho
    beta2t = 1 - t ** (-decay_rate)
    sq = g * g + eps1
    new = {}
    if flags.factored:
        row_new = beta2t * row + (1 - beta2t) * row_mean(sq)
        col_new = beta2t * col + (1 - beta2t) * col_mean(sq)
        u = g / sqrt(row_new / mean(row_new, "r") * col_new)
        new.update({row: row_new, col: col_new})
    else:
        v_new = beta2t * exp_avg_sq + (1 - beta2t) * sq
        u = g / sqrt(v_new)
        new[exp_avg_sq] = v_new
    u = alpha * (u / maximum(1.0, rms(u) / clip_threshold))
    m_new = beta1 * exp_avg + (1 - beta1) * u
    return {**new, exp_avg: m_new, w: w - weight_decay * alpha * w - m_new}

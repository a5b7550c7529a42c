"""LAMB: layer-wise adaptive moments (MXNet LAMB / MindSpore Lamb).

    g     = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    m     = beta1 * m + (1 - beta1) * g
    v     = beta2 * v + (1 - beta2) * g * g
    m_hat = m / (1 - beta1**t),  v_hat = v / (1 - beta2**t)     (bias_correction; else m, v)
    r     = m_hat / (sqrt(v_hat) + eps) + weight_decay * w
    n_w   = min(max(||w||, lower_bound), upper_bound)           (bounds only where set)
    n_r   = ||r||
    ratio = n_w / n_r  if n_w > 0 and n_r > 0  else 1
    w     = w - lr * ratio * r

Norms are L2 norms over the whole tensor (w before the update), computed in a first pass
in float64; the update is the second pass. Weight decay is decoupled: it enters r, not g.
The seed (MindSpore) writes the bias correction as m / beta1**t, a known typo for
1 - beta1**t.

Reference: Y. You et al., "Large Batch Optimization for Deep Learning: Training BERT in
76 minutes", ICLR 2020 (arXiv:1904.00962).
"""
from optgen.blocks import gradient_preprocessing, moments
from optgen.dsl import Spec, maximum, minimum, norm, sqrt, where

spec = Spec("lamb", __doc__, reference="arXiv:1904.00962")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 < beta1 < 1", "decay rate of the first moment")
beta2 = spec.hyper("beta2", 0.999, "0 < beta2 < 1", "decay rate of the second moment")
eps = spec.hyper("eps", 1e-6, "eps > 0", "added to sqrt(v_hat) in the denominator")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "decoupled weight decay, added to the update direction r")
lower_bound = spec.hyper("lower_bound", None, "lower_bound > 0",
                         "lower bound on ||w|| in the trust ratio; None: no bound",
                         optional=True, none_value=0.0)
upper_bound = spec.hyper("upper_bound", None, "upper_bound > 0",
                         "upper bound on ||w|| in the trust ratio; None: no bound",
                         optional=True, none_value=float("inf"))
spec.flag("bias_correction", True, "divide m and v by 1 - beta**t")
spec.require("not (lower_bound > upper_bound)",  # an unset bound is NaN: no conflict
             "lower_bound must not exceed upper_bound")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
m = spec.state("m", 0.0, "first moment")
v = spec.state("v", 0.0, "second moment")
t = spec.t


@spec.update
def lamb(w, grad, flags):
    g = preprocess(w, grad)
    m_new, v_new = moments(m, v, g, beta1, beta2)
    if flags.bias_correction:
        r = (m_new / (1 - beta1 ** t)) / (sqrt(v_new / (1 - beta2 ** t)) + eps)
    else:
        r = m_new / (sqrt(v_new) + eps)
    r = r + weight_decay * w
    n_w = minimum(maximum(norm(w), lower_bound), upper_bound)
    n_r = norm(r)
    ratio = where((n_w > 0) & (n_r > 0), n_w / n_r, 1.0)
    return {m: m_new, v: v_new, w: w - lr * ratio * r}

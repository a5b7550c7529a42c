"""MARS-AdamW: AdamW on a variance-reduced gradient (the authors' mars_type="mars-adamw").

    g = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    2-D parameters (and every parameter with optimize_1d):
        c = g + gamma * beta1 / (1 - beta1) * (g - last_grad)
        c = c / max(||c||, 1)                                   (L2 norm of the tensor)
        m = beta1 * m + (1 - beta1) * c
        v = beta2 * v + (1 - beta2) * c * c
        w = w - lr * (weight_decay * w
                      + m / ((sqrt(v) / sqrt(1 - beta2**t) + eps) * (1 - beta1**t)))
    other parameters (ndim != 2) without optimize_1d: AdamW on g with beta1_1d, beta2_1d,
    weight_decay_1d and the learning rate lr * lr_1d_factor:
        m = beta1_1d * m + (1 - beta1_1d) * g
        v = beta2_1d * v + (1 - beta2_1d) * g * g
        w = w - lr * lr_1d_factor * (weight_decay_1d * w
                      + m / ((sqrt(v) / sqrt(1 - beta2_1d**t) + eps) * (1 - beta1_1d**t)))
    last_grad = g                                               (every parameter)

last_grad starts at 0, so the first step's c is (1 + gamma * beta1 / (1 - beta1)) * g
before the clip, as in the authors' code. The clip divides c by its norm where the norm
exceeds 1 (one norm per parameter tensor, a float64 pass of its own). "2-D" is the
authors' test, ndim == 2: convolution kernels (4-D) take the AdamW branch unless
optimize_1d. The authors' lr_1d is lr * lr_1d_factor (they fix lr_1d / lr at
construction, so the 1-D learning rate follows an lr schedule); the default factor 1 is
their lr_1d = lr = 3e-3. Their exact variant (is_approx=False, a second gradient at the
previous weights), amsgrad and the Lion and Shampoo types are not built.

Reference: H. Yuan, Y. Liu, S. Wu, X. Zhou, Q. Gu, "MARS: Unleashing the Power of
Variance Reduction for Training Large Models", arXiv:2411.10438 (2024);
github.com/AGI-Arena/MARS.
"""
from optgen.blocks import gradient_preprocessing, moments
from optgen.dsl import Spec, maximum, norm, sqrt

spec = Spec("mars_adamw", __doc__, reference="arXiv:2411.10438")
lr = spec.hyper("lr", 3e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.95, "0 <= beta1 < 1", "decay rate of the first moment")
beta2 = spec.hyper("beta2", 0.99, "0 <= beta2 < 1", "decay rate of the second moment")
eps = spec.hyper("eps", 1e-8, "eps >= 0", "added to the bias-corrected sqrt(v)")
gamma = spec.hyper("gamma", 0.025, "gamma >= 0", "strength of the gradient correction")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "decoupled decay of the MARS branch: lr * weight_decay * w")
lr_1d_factor = spec.hyper("lr_1d_factor", 1.0, "lr_1d_factor >= 0",
                          "the AdamW branch's learning rate is lr * lr_1d_factor")
beta1_1d = spec.hyper("beta1_1d", 0.9, "0 <= beta1_1d < 1", "beta1 of the AdamW branch")
beta2_1d = spec.hyper("beta2_1d", 0.95, "0 <= beta2_1d < 1", "beta2 of the AdamW branch")
weight_decay_1d = spec.hyper("weight_decay_1d", 0.1, "weight_decay_1d >= 0",
                             "decoupled decay of the AdamW branch")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
spec.flag("optimize_1d", False, "the MARS rule for every parameter, not only 2-D ones")
spec.shape_flag("matrix", "ndim == 2", "2-D parameters take the MARS rule")
m = spec.state("m", 0.0, "first moment (exp_avg)")
v = spec.state("v", 0.0, "second moment (exp_avg_sq)")
last_grad = spec.state("last_grad", 0.0, "the previous step's gradient")
t = spec.t


def adamw_step(w, x, b1, b2, decay, step_lr):
    """The authors' AdamW form: w - step_lr * (decay * w + m / denom), m and v of x."""
    m_new, v_new = moments(m, v, x, b1, b2)
    denom = (sqrt(v_new) / sqrt(1 - b2 ** t) + eps) * (1 - b1 ** t)
    return {m: m_new, v: v_new, w: w - step_lr * (decay * w + m_new / denom)}


@spec.update
def mars_adamw(w, grad, flags):
    g = preprocess(w, grad)
    if flags.optimize_1d or flags.matrix:
        c = g + gamma * beta1 / (1 - beta1) * (g - last_grad)
        c = c / maximum(norm(c), 1.0)
        new = adamw_step(w, c, beta1, beta2, weight_decay, lr)
    else:
        new = adamw_step(w, g, beta1_1d, beta2_1d, weight_decay_1d, lr * lr_1d_factor)
    return {**new, last_grad: g}

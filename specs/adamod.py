"""AdaMod: Adam whose per-element step size is capped by its own long-term average.

    g   = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    m   = beta1 * m + (1 - beta1) * g
    v   = beta2 * v + (1 - beta2) * g * g
    eta = lr * sqrt(1 - beta2**t) / (1 - beta1**t) / (sqrt(v) + eps)
    s   = beta3 * s + (1 - beta3) * eta
    w   = w - min(eta, s) * m

Reference: J. Ding, X. Ren, R. Luo, X. Sun, "An Adaptive and Momental Bound Method for
Stochastic Learning", arXiv:1910.12249; the authors' AdaMod (pip adamod,
github.com/lancopku/AdaMod).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, minimum, sqrt

spec = Spec("adamod", __doc__, reference="arXiv:1910.12249")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "betas[0]: decay rate of m", tuple="betas")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "betas[1]: decay rate of v",
                   tuple="betas")
beta3 = spec.hyper("beta3", 0.999, "0 <= beta3 < 1", "decay rate of the step-size average")
eps = spec.hyper("eps", 1e-8, "eps >= 0", "added to sqrt(v)")
preprocess = gradient_preprocessing(spec)
m = spec.state("exp_avg", 0.0, "first moment (mean of g)")
v = spec.state("exp_avg_sq", 0.0, "second moment (mean of g*g)")
s = spec.state("exp_avg_lr", 0.0, "average of the step sizes eta", nonneg=True)
t = spec.t


@spec.update
def adamod(w, grad, flags):
    g = preprocess(w, grad)
    m_new = beta1 * m + (1 - beta1) * g
    v_new = beta2 * v + (1 - beta2) * g * g
    eta = lr * sqrt(1 - beta2 ** t) / (1 - beta1 ** t) / (sqrt(v_new) + eps)
    s_new = beta3 * s + (1 - beta3) * eta
    return {m: m_new, v: v_new, s: s_new, w: w - minimum(eta, s_new) * m_new}

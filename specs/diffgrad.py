"""diffGrad: Adam whose momentum is damped where the gradient changes little.

    g   = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    m   = beta1 * m + (1 - beta1) * g
    v   = beta2 * v + (1 - beta2) * g * g
    xi  = 1 / (1 + exp(-|g_prev - g|))               (the friction; g_prev starts at 0)
    w   = w - lr * sqrt(1 - beta2**t) / (1 - beta1**t) * xi * m / (sqrt(v) + eps)
    g_prev = g

Reference: S. R. Dubey et al., "diffGrad: An Optimization Method for Convolutional
Neural Networks", IEEE TNNLS 2020 (arXiv:1909.11015); the authors' diffGrad
(github.com/shivram1987/diffGrad).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, exp, sqrt

spec = Spec("diffgrad", __doc__, reference="arXiv:1909.11015")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "betas[0]: decay rate of m")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "betas[1]: decay rate of v")
eps = spec.hyper("eps", 1e-8, "eps >= 0", "added to sqrt(v)")
preprocess = gradient_preprocessing(spec)
m = spec.state("exp_avg", 0.0, "first moment (mean of g)")
v = spec.state("exp_avg_sq", 0.0, "second moment (mean of g*g)")
g_prev = spec.state("previous_grad", 0.0, "the last step's g")
t = spec.t


@spec.update
def diffgrad(w, grad, flags):
    g = preprocess(w, grad)
    m_new = beta1 * m + (1 - beta1) * g
    v_new = beta2 * v + (1 - beta2) * g * g
    xi = 1 / (1 + exp(-abs(g_prev - g)))
    step = lr * sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
    return {m: m_new, v: v_new, g_prev: g, w: w - step * xi * m_new / (sqrt(v_new) + eps)}

"""Adamax: Adam with the infinity norm, in the torch.optim.Adamax form.

    g = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    m = beta1 * m + (1 - beta1) * g
    u = max(beta2 * u, |g| + eps)
    w = w - lr / (1 - beta1**t) * m / u

u needs no bias correction. eps (inside the max, as in torch) may be 0; then an element
whose gradient has been 0 since the start gives 0 / 0.
Weight decay is L2 on the gradient (coupled), as in torch.optim.Adamax.

Reference: D. P. Kingma, J. Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015
(section 7.1); torch.optim.Adamax.
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, maximum

spec = Spec("adamax", __doc__, reference="arXiv:1412.6980")
lr = spec.hyper("lr", 0.002, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "decay rate of the first moment")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "decay rate of the infinity norm")
eps = spec.hyper("eps", 1e-8, "eps >= 0", "added to |g| inside the max")
preprocess = gradient_preprocessing(spec)
m = spec.state("m", 0.0, "first moment (mean of g)")
u = spec.state("u", 0.0, "exponentially weighted infinity norm of g")
t = spec.t


@spec.update
def adamax(w, grad, flags):
    g = preprocess(w, grad)
    m_new = beta1 * m + (1 - beta1) * g
    u_new = maximum(beta2 * u, abs(g) + eps)
    return {m: m_new, u: u_new, w: w - lr / (1 - beta1 ** t) * m_new / u_new}

"""RAdam: rectified Adam, in the torch.optim.RAdam form.

    g       = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    m       = beta1 * m + (1 - beta1) * g
    v       = beta2 * v + (1 - beta2) * g * g
    m_hat   = m / (1 - beta1**t)
    rho_inf = 2 / (1 - beta2) - 1
    rho_t   = rho_inf - 2 * t * beta2**t / (1 - beta2**t)
    if rho_t > 5:
        r = sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
        w = w - lr * m_hat * r * sqrt(1 - beta2**t) / (sqrt(v) + eps)
    else:
        w = w - lr * m_hat

rho_t and r depend only on t and the hyperparameters: they are host scalars, and the
branch is a per-step choice (the unused branch may be NaN on the host and is discarded).
eps is added to sqrt(v) and the bias correction of v sits in the step size, as in torch.
Weight decay is L2 on the gradient (coupled), as in torch.optim.RAdam without
decoupled_weight_decay.

Reference: L. Liu et al., "On the Variance of the Adaptive Learning Rate and Beyond",
ICLR 2020; torch.optim.RAdam.
"""
from optgen.blocks import gradient_preprocessing, moments
from optgen.dsl import Spec, sqrt, where

spec = Spec("radam", __doc__, reference="arXiv:1908.03265")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "decay rate of the first moment")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "decay rate of the second moment")
eps = spec.hyper("eps", 1e-8, "eps > 0", "added to sqrt(v) in the denominator")
preprocess = gradient_preprocessing(spec)
m = spec.state("m", 0.0, "first moment (mean of g)")
v = spec.state("v", 0.0, "second moment (mean of g*g)")
t = spec.t


@spec.update
def radam(w, grad, flags):
    g = preprocess(w, grad)
    m_new, v_new = moments(m, v, g, beta1, beta2)
    m_hat = m_new / (1 - beta1 ** t)
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 * t * beta2 ** t / (1 - beta2 ** t)
    r = sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
    adaptive = lr * m_hat * (r * sqrt(1 - beta2 ** t)) / (sqrt(v_new) + eps)
    return {m: m_new, v: v_new, w: w - where(rho_t > 5, adaptive, lr * m_hat)}

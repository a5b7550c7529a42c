"""RAdam, in the torch.optim.RAdam form (decoupled_weight_decay, maximize).

    g          = -grad if maximize else grad
    g          = g + weight_decay * w                  (coupled, torch's default)
    w          = w * (1 - lr * weight_decay)           (decoupled_weight_decay)
    exp_avg    = beta1 * exp_avg + (1 - beta1) * g
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * g * g
    m_hat      = exp_avg / (1 - beta1**t)
    rho_inf    = 2 / (1 - beta2) - 1
    rho_t      = rho_inf - 2 * t * beta2**t / (1 - beta2**t)
    rho_t > 5: r = sqrt((rho_t - 4) (rho_t - 2) rho_inf / ((rho_inf - 4) (rho_inf - 2) rho_t))
               w = w - m_hat * lr * sqrt(1 - beta2**t) / (sqrt(exp_avg_sq) + eps) * r
    else:      w = w - m_hat * lr

The rectification switch rho_t > 5 is torch's: rho_t and r depend only on t and the
hyperparameters, so they are host scalars and the switch is a per-step choice (the
unused branch may be NaN on the host and is discarded). decoupled_weight_decay and
maximize are flags (bools in torch: each its own kernel).

Reference: L. Liu et al., "On the Variance of the Adaptive Learning Rate and Beyond",
ICLR 2020; torch.optim.RAdam.
"""
from optgen.blocks import moments, torch_gradient
from optgen.dsl import Spec, sqrt, where

spec = Spec("torch_radam", __doc__, reference="arXiv:1908.03265; torch.optim.RAdam")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "betas[0]: decay rate of exp_avg")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "betas[1]: decay rate of exp_avg_sq")
eps = spec.hyper("eps", 1e-8, "eps >= 0", "added to sqrt(exp_avg_sq)")
gradient, decay = torch_gradient(spec, decoupled=None)
exp_avg = spec.state("exp_avg", 0.0, "first moment (mean of g)")
exp_avg_sq = spec.state("exp_avg_sq", 0.0, "second moment (mean of g*g)")
t = spec.t


@spec.update
def torch_radam(w, grad, flags):
    g = gradient(w, grad, flags)
    m, v = moments(exp_avg, exp_avg_sq, g, beta1, beta2)
    m_hat = m / (1 - beta1 ** t)
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 * t * beta2 ** t / (1 - beta2 ** t)
    r = sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
    adaptive = m_hat * (lr * sqrt(1 - beta2 ** t) * r) / (sqrt(v) + eps)
    return {exp_avg: m, exp_avg_sq: v,
            w: decay(w, flags) - where(rho_t > 5, adaptive, m_hat * lr)}

"""Adamax, in the torch.optim.Adamax form (maximize).

    g       = -grad if maximize else grad
    g       = g + weight_decay * w
    exp_avg = beta1 * exp_avg + (1 - beta1) * g
    exp_inf = max(beta2 * exp_inf, |g| + eps)
    w       = w - lr / (1 - beta1**t) * exp_avg / exp_inf

The seed adamax.py has the same rule under other state names (m, u); this one has
torch's state names and maximize (a flag: torch's bool, its own kernel).

Reference: D. P. Kingma, J. Ba, "Adam", ICLR 2015 (section 7.1); torch.optim.Adamax.
"""
from optgen.blocks import torch_gradient
from optgen.dsl import Spec, maximum

spec = Spec("torch_adamax", __doc__, reference="arXiv:1412.6980; torch.optim.Adamax")
lr = spec.hyper("lr", 2e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "betas[0]: decay rate of exp_avg")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "betas[1]: decay rate of exp_inf")
eps = spec.hyper("eps", 1e-8, "eps >= 0", "added to |g| inside the max")
gradient, _ = torch_gradient(spec)
exp_avg = spec.state("exp_avg", 0.0, "first moment (mean of g)")
exp_inf = spec.state("exp_inf", 0.0, "exponentially weighted infinity norm of g")
t = spec.t


@spec.update
def torch_adamax(w, grad, flags):
    g = gradient(w, grad, flags)
    m = beta1 * exp_avg + (1 - beta1) * g
    u = maximum(beta2 * exp_inf, abs(g) + eps)
    return {exp_avg: m, exp_inf: u, w: w - lr / (1 - beta1 ** t) * m / u}

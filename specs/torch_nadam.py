"""NAdam, in the torch.optim.NAdam form (momentum_decay, decoupled_weight_decay, maximize).

    g          = -grad if maximize else grad
    g          = g + weight_decay * w                  (coupled, torch's default)
    w          = w * (1 - lr * weight_decay)           (decoupled_weight_decay)
    mu_t       = beta1 * (1 - 0.5 * 0.96**(t * momentum_decay))
    mu_next    = beta1 * (1 - 0.5 * 0.96**((t + 1) * momentum_decay))
    mu_product = mu_product * mu_t
    exp_avg    = beta1 * exp_avg + (1 - beta1) * g
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * g * g
    denom      = sqrt(exp_avg_sq / (1 - beta2**t)) + eps
    w          = w - lr * (1 - mu_t) / (1 - mu_product) * g / denom
                   - lr * mu_next / (1 - mu_product * mu_next) * exp_avg / denom

mu_product (torch's per-parameter state, starting at 1) is a scalar state updated on the
host; the new product is used in the step, as torch. decoupled_weight_decay and maximize
are flags (bools in torch: each its own kernel).

Reference: T. Dozat, "Incorporating Nesterov Momentum into Adam", ICLR 2016 workshop;
torch.optim.NAdam.
"""
from optgen.blocks import moments, torch_gradient
from optgen.dsl import Spec, sqrt

spec = Spec("torch_nadam", __doc__, reference="Dozat 2016; torch.optim.NAdam")
lr = spec.hyper("lr", 2e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "betas[0]: decay rate of exp_avg")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "betas[1]: decay rate of exp_avg_sq")
eps = spec.hyper("eps", 1e-8, "eps >= 0", "added to the bias-corrected sqrt(exp_avg_sq)")
momentum_decay = spec.hyper("momentum_decay", 4e-3, "momentum_decay >= 0",
                            "speed of the momentum schedule mu_t")
gradient, decay = torch_gradient(spec, decoupled=None)
exp_avg = spec.state("exp_avg", 0.0, "first moment (mean of g)")
exp_avg_sq = spec.state("exp_avg_sq", 0.0, "second moment (mean of g*g)")
mu_product = spec.state("mu_product", 1.0, "product of the momentum schedule mu_1 .. mu_t",
                        shape="scalar")
t = spec.t


@spec.update
def torch_nadam(w, grad, flags):
    g = gradient(w, grad, flags)
    mu_t = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))
    mu_next = beta1 * (1 - 0.5 * 0.96 ** ((t + 1) * momentum_decay))
    product = mu_product * mu_t
    m, v = moments(exp_avg, exp_avg_sq, g, beta1, beta2)
    denom = sqrt(v / (1 - beta2 ** t)) + eps
    w_new = (decay(w, flags) - lr * (1 - mu_t) / (1 - product) * g / denom
             - lr * mu_next / (1 - product * mu_next) * m / denom)
    return {exp_avg: m, exp_avg_sq: v, mu_product: product, w: w_new}

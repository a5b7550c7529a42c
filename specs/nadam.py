"""NAdam: Adam with Nesterov momentum, in the torch.optim.NAdam form (momentum schedule).

    g        = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    mu_t     = beta1 * (1 - 0.5 * 0.96**(t * momentum_decay))
    mu_next  = beta1 * (1 - 0.5 * 0.96**((t + 1) * momentum_decay))
    mu_product = mu_product * mu_t
    m        = beta1 * m + (1 - beta1) * g
    v        = beta2 * v + (1 - beta2) * g * g
    denom    = sqrt(v / (1 - beta2**t)) + eps
    w        = w - lr * (1 - mu_t) / (1 - mu_product) * g / denom
                 - lr * mu_next / (1 - mu_product * mu_next) * m / denom

mu_product (the product of mu_1 .. mu_t, starting at 1) is a scalar state, updated on
the host; the new product is used in the step, as in torch.
Weight decay is L2 on the gradient (coupled), as in torch.optim.NAdam without
decoupled_weight_decay.

Reference: T. Dozat, "Incorporating Nesterov Momentum into Adam", ICLR 2016 workshop;
torch.optim.NAdam.
"""
from optgen.blocks import gradient_preprocessing, moments
from optgen.dsl import Spec, sqrt

spec = Spec("nadam", __doc__, reference="Dozat 2016")
lr = spec.hyper("lr", 0.002, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "decay rate of the first moment")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "decay rate of the second moment")
eps = spec.hyper("eps", 1e-8, "eps > 0", "added to the bias-corrected sqrt(v)")
momentum_decay = spec.hyper("momentum_decay", 0.004, "momentum_decay >= 0",
                            "speed of the momentum schedule mu_t")
preprocess = gradient_preprocessing(spec)
m = spec.state("m", 0.0, "first moment (mean of g)")
v = spec.state("v", 0.0, "second moment (mean of g*g)")
mu_product = spec.state("mu_product", 1.0, "product of the momentum schedule mu_1 .. mu_t",
                        shape="scalar")
t = spec.t


@spec.update
def nadam(w, grad, flags):
    g = preprocess(w, grad)
    mu_t = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))
    mu_next = beta1 * (1 - 0.5 * 0.96 ** ((t + 1) * momentum_decay))
    product = mu_product * mu_t
    m_new, v_new = moments(m, v, g, beta1, beta2)
    denom = sqrt(v_new / (1 - beta2 ** t)) + eps
    w_new = (w - lr * (1 - mu_t) / (1 - product) * g / denom
             - lr * mu_next / (1 - product * mu_next) * m_new / denom)
    return {m: m_new, v: v_new, mu_product: product, w: w_new}

"""QHAdam: quasi-hyperbolic Adam, whose step averages the moments with the current
gradient and its square.

    g  = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
         + weight_decay * w                          (not decouple_weight_decay)
    w  = w * (1 - lr * weight_decay)                 (decouple_weight_decay)
    W1 = 1 + beta1 * W1;   W2 = 1 + beta2 * W2       (scalars from 0: the bias corrections)
    m  = m + (g - m) / W1;  v = v + (g * g - v) / W2
    w  = w - lr * ((1 - nu1) * g + nu1 * m) / (sqrt((1 - nu2) * g * g + nu2 * v) + eps)

m and v are bias-corrected averages (1 / W is Adam's (1 - beta) / (1 - beta**t)); with
nus = (1, 1) this is Adam.

Reference: J. Ma, D. Yarats, "Quasi-hyperbolic momentum and Adam for deep learning",
ICLR 2019 (arXiv:1810.06801); the authors' QHAdam (pip qhoptim,
github.com/facebookresearch/qhoptim).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, sqrt

spec = Spec("qhadam", __doc__, reference="arXiv:1810.06801")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "betas[0]: decay rate of m")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "betas[1]: decay rate of v")
nu1 = spec.hyper("nu1", 1.0, "0 <= nu1 <= 1", "nus[0]: weight of m against g", tuple="nus")
nu2 = spec.hyper("nu2", 1.0, "0 <= nu2 <= 1", "nus[1]: weight of v against g*g", tuple="nus")
eps = spec.hyper("eps", 1e-8, "eps >= 0", "added to the square root")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "L2 on the gradient, or w * (1 - lr * weight_decay) (decoupled)")
spec.flag("decouple_weight_decay", False, "decoupled weight decay (AdamW style)")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
m = spec.state("exp_avg", 0.0, "bias-corrected mean of g")
v = spec.state("exp_avg_sq", 0.0, "bias-corrected mean of g*g")
w1 = spec.state("beta1_weight", 0.0, "1 + beta1 + ... + beta1**(t-1)", shape="scalar")
w2 = spec.state("beta2_weight", 0.0, "1 + beta2 + ... + beta2**(t-1)", shape="scalar")


@spec.update
def qhadam(w, grad, flags):
    g = preprocess(w, grad)
    decoupled = flags.decouple_weight_decay
    g = g if decoupled else g + weight_decay * w
    w1_new, w2_new = 1 + beta1 * w1, 1 + beta2 * w2
    m_new = m + (g - m) / w1_new
    v_new = v + (g * g - v) / w2_new
    u = ((1 - nu1) * g + nu1 * m_new) / (sqrt((1 - nu2) * g * g + nu2 * v_new) + eps)
    w_dec = w * (1 - lr * weight_decay) if decoupled else w
    return {w1: w1_new, w2: w2_new, m: m_new, v: v_new, w: w_dec - lr * u}

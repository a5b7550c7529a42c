"""AdaBelief: Adam with the second moment of the gradient's deviation from its mean.

    g = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    m = beta1 * m + (1 - beta1) * g
    s = beta2 * s + (1 - beta2) * (g - m)**2 + eps        (m the new value)
    w = w - lr / (1 - beta1**t) * m / (sqrt(s / (1 - beta2**t)) + eps)

eps enters twice, inside s and in the denominator, as in the paper's Algorithm 2.
Weight decay is L2 on the gradient (coupled).

Reference: J. Zhuang et al., "AdaBelief Optimizer: Adapting Stepsizes by the Belief in
Observed Gradients", NeurIPS 2020.
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, sqrt

spec = Spec("adabelief", __doc__, reference="arXiv:2010.07468")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "decay rate of the first moment")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "decay rate of the belief (s)")
eps = spec.hyper("eps", 1e-16, "eps > 0", "added to s and to the denominator")
preprocess = gradient_preprocessing(spec)
m = spec.state("m", 0.0, "first moment (mean of g)")
s = spec.state("s", 0.0, "second moment of g - m (the belief)")
t = spec.t


@spec.update
def adabelief(w, grad, flags):
    g = preprocess(w, grad)
    m_new = beta1 * m + (1 - beta1) * g
    dev = g - m_new
    s_new = beta2 * s + (1 - beta2) * dev * dev + eps
    denom = sqrt(s_new / (1 - beta2 ** t)) + eps
    return {m: m_new, s: s_new, w: w - lr / (1 - beta1 ** t) * m_new / denom}

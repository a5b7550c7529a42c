"""AdamWeightDecay, in the MindSpore form (no bias correction, decay added to the update).

    g = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    u = m / (sqrt(v) + eps) + weight_decay * w
    w = w - lr * u

There is no bias correction of m or v (as in MindSpore and BERT's original optimizer).
Weight decay is decoupled: weight_decay * w (the old w) is added to the Adam direction,
after the adaptive scaling, so the parameter shrinks by lr * weight_decay * w per step.

Reference: MindSpore AdamWeightDecay (seed 001); I. Loshchilov, F. Hutter, "Decoupled
Weight Decay Regularization", ICLR 2019.
"""
from optgen.blocks import gradient_preprocessing, moments
from optgen.dsl import Spec, sqrt

spec = Spec("adamweightdecay", __doc__, reference="MindSpore AdamWeightDecay; arXiv:1711.05101")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 < beta1 < 1", "decay rate of the first moment")
beta2 = spec.hyper("beta2", 0.999, "0 < beta2 < 1", "decay rate of the second moment")
eps = spec.hyper("eps", 1e-6, "eps > 0", "added to sqrt(v) in the denominator")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "decoupled decay: weight_decay * w is added to the update direction")
m = spec.state("m", 0.0, "first moment (mean of g)")
v = spec.state("v", 0.0, "second moment (mean of g*g)")


@spec.update
def adamweightdecay(w, grad, flags):
    g = preprocess(w, grad)
    m_new, v_new = moments(m, v, g, beta1, beta2)
    u = m_new / (sqrt(v_new) + eps) + weight_decay * w
    return {m: m_new, v: v_new, w: w - lr * u}

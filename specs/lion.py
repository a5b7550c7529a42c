"""Lion: evolved sign momentum.

    g = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    c = beta1 * m + (1 - beta1) * g
    w = w * (1 - lr * weight_decay) - lr * sign(c)
    m = beta2 * m + (1 - beta2) * g

The step interpolates with beta1, the momentum is tracked with beta2; sign(0) is 0.
Weight decay is decoupled: w is multiplied by 1 - lr * weight_decay, outside the sign.

Reference: X. Chen et al., "Symbolic Discovery of Optimization Algorithms", NeurIPS 2023.
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, sign

spec = Spec("lion", __doc__, reference="arXiv:2302.06675")
lr = spec.hyper("lr", 1e-4, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 <= 1", "interpolation factor of the step")
beta2 = spec.hyper("beta2", 0.99, "0 <= beta2 <= 1", "decay rate of the momentum")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "decoupled decay: w is scaled by 1 - lr * weight_decay each step")
m = spec.state("m", 0.0, "momentum (moving average of g)")


@spec.update
def lion(w, grad, flags):
    g = preprocess(w, grad)
    c = beta1 * m + (1 - beta1) * g
    w_new = w * (1 - lr * weight_decay) - lr * sign(c)
    return {m: beta2 * m + (1 - beta2) * g, w: w_new}

"""Padam: partially adaptive Adam, dividing by a power of the second moment's root.

    g = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    v' = vmax = max(vmax, v)                      (amsgrad, the authors' default; else v)
    w = w - lr * sqrt(1 - beta2**t) / (1 - beta1**t) * m / (sqrt(v') + eps)**(2 * partial)

partial = 1/2 is Adam (AMSGrad), partial -> 0 SGD with momentum.

Reference: J. Chen, D. Zhou, Y. Tang, Z. Yang, Y. Cao, Q. Gu, "Closing the
Generalization Gap of Adaptive Gradient Methods in Training Deep Neural Networks",
IJCAI 2020 (arXiv:1806.06763); the authors' Padam (github.com/uclaml/Padam).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, maximum, sqrt

spec = Spec("padam", __doc__, reference="arXiv:1806.06763")
lr = spec.hyper("lr", 0.1, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "betas[0]: decay rate of m")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "betas[1]: decay rate of v")
eps = spec.hyper("eps", 1e-8, "eps > 0", "added to sqrt(v)")
partial = spec.hyper("partial", 0.25, "0 <= partial <= 0.5", "the adaptive power p")
spec.flag("amsgrad", True, "divide by the running maximum of v (AMSGrad)")
preprocess = gradient_preprocessing(spec)
m = spec.state("exp_avg", 0.0, "first moment (mean of g)")
v = spec.state("exp_avg_sq", 0.0, "second moment (mean of g*g)")
vmax = spec.state("max_exp_avg_sq", 0.0, "running maximum of v", when="amsgrad")
t = spec.t


@spec.update
def padam(w, grad, flags):
    g = preprocess(w, grad)
    m_new = beta1 * m + (1 - beta1) * g
    v_new = beta2 * v + (1 - beta2) * g * g
    new = {m: m_new, v: v_new}
    if flags.amsgrad:
        v_new = new[vmax] = maximum(vmax, v_new)
    step = lr * sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
    return {**new, w: w - step * m_new / (sqrt(v_new) + eps) ** (2 * partial)}

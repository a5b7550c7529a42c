"""AdaBound: Adam whose per-element step size is clipped to bounds that close in on a
final SGD learning rate.

    g  = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    m  = beta1 * m + (1 - beta1) * g
    v  = beta2 * v + (1 - beta2) * g * g
    v' = vmax = max(vmax, v)         (amsbound; else v' = v)
    f  = final_lr * lr / base_lr     (the final lr follows the lr schedule)
    lo = f * (1 - 1 / (gamma * t + 1));   hi = f * (1 + 1 / (gamma * t))
    w  = w - clip(lr * sqrt(1 - beta2**t) / (1 - beta1**t) / (sqrt(v') + eps), lo, hi) * m

base_lr is the group's initial lr (the authors' class records it at construction).

Reference: L. Luo, Y. Xiong, Y. Liu, X. Sun, "Adaptive Gradient Methods with Dynamic
Bound of Learning Rate", ICLR 2019 (arXiv:1902.09843); the authors' AdaBound
(github.com/Luolc/AdaBound).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, clip, maximum, sqrt

spec = Spec("adabound", __doc__, reference="arXiv:1902.09843")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "Adam learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "betas[0]: decay rate of m")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "betas[1]: decay rate of v")
final_lr = spec.hyper("final_lr", 0.1, "final_lr >= 0", "final (SGD) learning rate")
gamma = spec.hyper("gamma", 1e-3, "0 < gamma < 1", "convergence speed of the bounds")
eps = spec.hyper("eps", 1e-8, "eps >= 0", "added to sqrt(v)")
base_lr = spec.hyper("base_lr", 1e-3, "base_lr > 0",
                     "the lr final_lr belongs to (the group's initial lr)")
spec.flag("amsbound", False, "divide by the running maximum of v (AMSBound)")
preprocess = gradient_preprocessing(spec)
m = spec.state("exp_avg", 0.0, "first moment (mean of g)")
v = spec.state("exp_avg_sq", 0.0, "second moment (mean of g*g)")
vmax = spec.state("max_exp_avg_sq", 0.0, "running maximum of v", when="amsbound")
t = spec.t


@spec.update
def adabound(w, grad, flags):
    g = preprocess(w, grad)
    m_new = beta1 * m + (1 - beta1) * g
    v_new = beta2 * v + (1 - beta2) * g * g
    new = {m: m_new, v: v_new}
    if flags.amsbound:
        v_new = new[vmax] = maximum(vmax, v_new)
    f = final_lr * lr / base_lr
    lo, hi = f * (1 - 1 / (gamma * t + 1)), f * (1 + 1 / (gamma * t))
    step = lr * sqrt(1 - beta2 ** t) / (1 - beta1 ** t) / (sqrt(v_new) + eps)
    return {**new, w: w - clip(step, lo, hi) * m_new}

"""Adam, in the MXNet / MindSpore form.

    g    = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    m    = beta1 * m + (1 - beta1) * g
    v    = beta2 * v + (1 - beta2) * g * g
    lr_t = lr * sqrt(1 - beta2**t) / (1 - beta1**t)
    w    = w - lr_t * m / (sqrt(v) + eps)
    w    = w - lr_t * (beta1 * m + (1 - beta1) * g) / (sqrt(v) + eps)   with use_nesterov

The bias correction is folded into the step size and eps is *not* bias-corrected, as in
MXNet's adam_update and MindSpore's Adam. torch.optim.Adam adds eps to sqrt(v / (1 -
beta2**t)) instead: the two agree when torch's eps equals eps / sqrt(1 - beta2**t).
use_nesterov is MindSpore's (ApplyAdam with use_nesterov=True): the step uses the new m
and v, with the current gradient mixed in once more.
Weight decay is L2 on the gradient (coupled), as in both seeds and torch.optim.Adam.

Reference: D. P. Kingma, J. Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015;
MindSpore Adam (seed 001) for use_nesterov.
"""
from optgen.blocks import gradient_preprocessing, moments
from optgen.dsl import Spec, sqrt

spec = Spec("adam", __doc__, reference="arXiv:1412.6980")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate (alpha)")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "decay rate of the first moment")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "decay rate of the second moment")
eps = spec.hyper("eps", 1e-8, "eps > 0", "added to sqrt(v) in the denominator")
spec.flag("use_nesterov", False,
          "Nesterov form (MindSpore): step along beta1 * m + (1 - beta1) * g")
preprocess = gradient_preprocessing(spec)
m = spec.state("m", 0.0, "first moment (mean of g)")
v = spec.state("v", 0.0, "second moment (mean of g*g)")
t = spec.t


@spec.update
def adam(w, grad, flags):
    g = preprocess(w, grad)
    m_new, v_new = moments(m, v, g, beta1, beta2)
    lr_t = lr * sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
    direction = beta1 * m_new + (1 - beta1) * g if flags.use_nesterov else m_new
    return {m: m_new, v: v_new, w: w - lr_t * direction / (sqrt(v_new) + eps)}

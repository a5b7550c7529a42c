"""Signum: sign of the momentum (MXNet Signum).

    g = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    s = momentum * s + (1 - momentum) * g
    w = (1 - lr * wd_lh) * w - lr * sign(s)

With momentum == 0 this is signSGD (s = g). sign(0) is 0.
Weight decay comes twice, as in MXNet: weight_decay is L2 on the gradient (coupled, so
it passes through the sign), wd_lh is decoupled and shrinks w directly by lr * wd_lh.

Reference: J. Bernstein, Y.-X. Wang, K. Azizzadenesheli, A. Anandkumar, "signSGD:
Compressed Optimisation for Non-Convex Problems", ICML 2018; MXNet mxnet.optimizer.Signum.
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, sign

spec = Spec("signum", __doc__, reference="arXiv:1802.04434")
lr = spec.hyper("lr", 0.01, "lr >= 0", "learning rate")
momentum = spec.hyper("momentum", 0.9, "0 <= momentum < 1", "decay rate of the momentum")
wd_lh = spec.hyper("wd_lh", 0.0, "wd_lh >= 0",
                   "decoupled weight decay: w is scaled by 1 - lr * wd_lh each step")
preprocess = gradient_preprocessing(spec)
buf = spec.state("momentum_buffer", 0.0, "exponential moving average of g")


@spec.update
def signum(w, grad, flags):
    g = preprocess(w, grad)
    s = momentum * buf + (1 - momentum) * g
    return {buf: s, w: (1 - lr * wd_lh) * w - lr * sign(s)}

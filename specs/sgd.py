"""SGD with momentum, dampening and Nesterov momentum (torch.optim / MindSpore form).

    g = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    b = g                                     on the first step (t == 1)
    b = momentum * b + (1 - dampening) * g    afterwards
    d = g + momentum * b   if nesterov else   b
    w = w - lr * d

With momentum == 0 there is no buffer: d = g and dampening has no effect (as in
torch.optim.SGD; the MindSpore formula would scale g by 1 - dampening). Nesterov
momentum needs momentum > 0 and dampening == 0.

Reference: I. Sutskever et al., "On the importance of initialization and momentum in
deep learning", ICML 2013.
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, where

spec = Spec("sgd", __doc__, reference="Sutskever et al. 2013")
lr = spec.hyper("lr", 0.01, "lr >= 0", "learning rate")
momentum = spec.hyper("momentum", 0.0, "momentum >= 0", "momentum factor")
dampening = spec.hyper("dampening", 0.0, "0 <= dampening <= 1",
                       "scales down the gradient's share of the momentum buffer")
nesterov = spec.flag("nesterov", False, "use Nesterov momentum")
spec.require("not nesterov or (momentum > 0 and dampening == 0)",
             "Nesterov momentum requires a momentum and zero dampening")
preprocess = gradient_preprocessing(spec)
buf = spec.state("momentum_buffer", 0.0, "velocity")
t = spec.t


@spec.update
def sgd(w, grad, flags):
    g = preprocess(w, grad)
    # the buffer starts at 0, so scaling g by 1 on step 1 makes b = g there
    g_share = where((t > 1) & (momentum > 0), 1 - dampening, 1.0)
    b = momentum * buf + g_share * g
    d = g + momentum * b if flags.nesterov else b
    return {buf: b, w: w - lr * d}

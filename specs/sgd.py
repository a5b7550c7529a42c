"""SGD with momentum, dampening and Nesterov momentum (torch.optim / MindSpore form).

    g = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    b = g                                     on the first step with momentum > 0
    b = momentum * b + (1 - dampening) * g    afterwards
    d = g + momentum * b   if nesterov else   b
    w = w - lr * d

With momentum == 0 there is no buffer: d = g, dampening has no effect and the buffer
is left as it was (as in torch.optim.SGD; the MindSpore formula would scale g by
1 - dampening). The buffer starts on the first step that has momentum > 0, also when
momentum is switched on later. Nesterov momentum needs momentum > 0 and dampening == 0.

Reference: I. Sutskever et al., "On the importance of initialization and momentum in
deep learning", ICML 2013.
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, maximum, where

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
started = spec.state("buffer_started", 0.0, "1 once a step with momentum > 0 has run",
                     shape="scalar")


@spec.update
def sgd(w, grad, flags):
    g = preprocess(w, grad)
    on = momentum > 0
    # a fresh buffer is 0, so scaling g by 1 there makes its first value b = g
    g_share = where(on & (started > 0), 1 - dampening, 1.0)
    b = momentum * buf + g_share * g
    d = g + momentum * b if flags.nesterov else b
    return {buf: where(on, b, buf), started: maximum(started, where(on, 1.0, 0.0)),
            w: w - lr * d}

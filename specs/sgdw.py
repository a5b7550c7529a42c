"""SGDW: torch.optim.SGD with decoupled weight decay.

    g = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    w = w * (1 - lr * weight_decay)                            (decoupled)
    b = momentum * b + (1 - dampening) * g     (momentum > 0; the first step: b = g)
    d = g + momentum * b if nesterov else b    (d = g without momentum)
    w = w - lr * d

Reference: I. Loshchilov, F. Hutter, "Decoupled Weight Decay Regularization", ICLR 2019
(arXiv:1711.05101, Algorithm 1); pytorch_optimizer.SGDW (torch.optim.SGD's momentum).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, maximum, ne, where

spec = Spec("sgdw", __doc__, reference="arXiv:1711.05101")
lr = spec.hyper("lr", 1e-4, "lr >= 0", "learning rate")
momentum = spec.hyper("momentum", 0.0, "momentum >= 0", "momentum factor")
dampening = spec.hyper("dampening", 0.0, doc="scales down g's share of the momentum buffer")
spec.flag("nesterov", False, "Nesterov momentum")
spec.require("not nesterov or (momentum > 0 and dampening == 0)",
             "Nesterov momentum requires a momentum and zero dampening")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "decoupled: w is scaled by 1 - lr * weight_decay")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
buf = spec.state("momentum_buffer", 0.0, "velocity")
started = spec.state("buffer_started", 0.0, "1 once a step with momentum != 0 has run",
                     shape="scalar")


@spec.update
def sgdw(w, grad, flags):
    g = preprocess(w, grad)
    on = ne(momentum, 0.0)
    b = momentum * buf + where(on & (started > 0), 1 - dampening, 1.0) * g
    d = g + momentum * b if flags.nesterov else where(on, b, g)
    return {buf: where(on, b, buf), started: maximum(started, where(on, 1.0, 0.0)),
            w: w * (1 - lr * weight_decay) - lr * d}

"""SGD, in the torch.optim.SGD form (momentum, dampening, nesterov, maximize).

    g = -grad if maximize else grad
    g = g + weight_decay * w
    b = g                                          first step with momentum != 0
    b = momentum * b + (1 - dampening) * g         afterwards
    d = g + momentum * b  if nesterov  else  b     (momentum == 0: d = g, no buffer)
    w = w - lr * d

torch creates momentum_buffer as a clone of g on the first step that has momentum != 0;
the scalar state buffer_started (0 <=> torch's momentum_buffer None) marks it, so
momentum switched on later also starts from g. While momentum == 0 the buffer is left
as it is. Nesterov needs momentum > 0 and dampening == 0, as torch. maximize is a flag
(a bool in torch: its own kernel, no per-element cost). The rule is the seed sgd's
(specs/sgd.py) with torch's defaults (lr 1e-3) and maximize.

Reference: I. Sutskever et al., "On the importance of initialization and momentum in
deep learning", ICML 2013; torch.optim.SGD.
"""
from optgen.blocks import torch_gradient
from optgen.dsl import Spec, maximum, ne, where

spec = Spec("torch_sgd", __doc__, reference="torch.optim.SGD")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
momentum = spec.hyper("momentum", 0.0, "momentum >= 0", "momentum factor")
dampening = spec.hyper("dampening", 0.0, doc="scales down g's share of the momentum buffer")
spec.flag("nesterov", False, "Nesterov momentum")
spec.require("not nesterov or (momentum > 0 and dampening == 0)",
             "Nesterov momentum requires a momentum and zero dampening")
gradient, _ = torch_gradient(spec)
buf = spec.state("momentum_buffer", 0.0, "velocity")
started = spec.state("buffer_started", 0.0, "1 once a step with momentum != 0 has run "
                     "(torch: momentum_buffer is not None)", shape="scalar")


@spec.update
def torch_sgd(w, grad, flags):
    g = gradient(w, grad, flags)
    on = ne(momentum, 0.0)
    # a fresh buffer is 0, so scaling g by 1 there makes its first value b = g
    b = momentum * buf + where(on & (started > 0), 1 - dampening, 1.0) * g
    d = g + momentum * b if flags.nesterov else where(on, b, g)
    return {buf: where(on, b, buf), started: maximum(started, where(on, 1.0, 0.0)),
            w: w - lr * d}

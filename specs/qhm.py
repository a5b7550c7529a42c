"""QHM: quasi-hyperbolic momentum, a weighted average of the momentum and the gradient.

    g = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    b = momentum * b + (1 - momentum) * g
    w = w - lr * ((1 - nu) * g + nu * b)

nu = 1 is SGD with (normalized) momentum, nu = 0 plain SGD; nu = momentum is Nesterov's
momentum. The paper recommends nu = 0.7, momentum = 0.999 (the defaults here; the
authors' class requires all three of lr, momentum and nu).

Reference: J. Ma, D. Yarats, "Quasi-hyperbolic momentum and Adam for deep learning",
ICLR 2019 (arXiv:1810.06801); the authors' QHM (pip qhoptim).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec

spec = Spec("qhm", __doc__, reference="arXiv:1810.06801")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
momentum = spec.hyper("momentum", 0.999, "0 <= momentum < 1", "decay rate of the buffer")
nu = spec.hyper("nu", 0.7, "0 <= nu <= 1", "weight of the buffer against g")
preprocess = gradient_preprocessing(spec)
buf = spec.state("momentum_buffer", 0.0, "mean of g")


@spec.update
def qhm(w, grad, flags):
    g = preprocess(w, grad)
    b = momentum * buf + (1 - momentum) * g
    return {buf: b, w: w - lr * ((1 - nu) * g + nu * b)}

"""RMSprop, in the torch.optim.RMSprop form (alpha, eps outside the root, centered, momentum).

    g          = -grad if maximize else grad
    g          = g + weight_decay * w
    square_avg = alpha * square_avg + (1 - alpha) * g * g
    centered:    grad_avg = grad_avg + (1 - alpha) * (g - grad_avg)
                 avg = sqrt(square_avg - grad_avg * grad_avg) + eps
    else:        avg = sqrt(square_avg) + eps
    momentum > 0:    momentum_buffer = momentum * momentum_buffer + g / avg
                     w = w - lr * momentum_buffer
    else:            w = w - lr * g / avg

eps is added outside the square root and lr multiplies the buffer, as torch; the seed
rmsprop.py is MindSpore's form (decay, epsilon inside the root). The centered variance
is not clamped, as torch. momentum_buffer is held always and stays as it is while
momentum == 0 (torch holds it only when momentum > 0). centered and maximize are flags
(bools in torch); grad_avg exists in the centered kernels only.

Reference: T. Tieleman, G. Hinton, "Lecture 6.5 - RMSProp", COURSERA 2012; A. Graves,
"Generating Sequences With Recurrent Neural Networks", 2013; torch.optim.RMSprop.
"""
from optgen.blocks import torch_gradient
from optgen.dsl import Spec, sqrt, where

spec = Spec("torch_rmsprop", __doc__, reference="torch.optim.RMSprop")
lr = spec.hyper("lr", 1e-2, "lr >= 0", "learning rate")
alpha = spec.hyper("alpha", 0.99, "alpha >= 0", "smoothing constant of the averages")
eps = spec.hyper("eps", 1e-8, "eps >= 0", "added to the square root")
momentum = spec.hyper("momentum", 0.0, "momentum >= 0", "momentum factor")
spec.flag("centered", False, "divide by the estimated variance of g")
gradient, _ = torch_gradient(spec)
square_avg = spec.state("square_avg", 0.0, "running average of g*g")
buf = spec.state("momentum_buffer", 0.0, "momentum of g / avg (momentum > 0)")
grad_avg = spec.state("grad_avg", 0.0, "running average of g (centered)", when="centered")


@spec.update
def torch_rmsprop(w, grad, flags):
    g = gradient(w, grad, flags)
    sq = alpha * square_avg + (1 - alpha) * g * g
    new = {square_avg: sq}
    if flags.centered:
        ga = new[grad_avg] = grad_avg + (1 - alpha) * (g - grad_avg)
        avg = sqrt(sq - ga * ga) + eps
    else:
        avg = sqrt(sq) + eps
    on = momentum > 0
    b = momentum * buf + g / avg
    new[buf] = where(on, b, buf)
    new[w] = w - lr * where(on, b, g / avg)
    return new

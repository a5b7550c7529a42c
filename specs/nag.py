"""Nesterov accelerated gradient, in the MXNet 2 form (the learning rate inside the buffer).

    g = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    s = momentum * s + lr * g
    w = w - (momentum * s + lr * g)

s is the new buffer value in the weight step. Because lr sits inside the buffer, changing
lr between steps does not rescale the momentum already accumulated (unlike the
momentum spec, whose buffer holds raw gradients).
Weight decay is L2 on the gradient (coupled), as in MXNet's NAG.

Reference: MXNet 2 mxnet.optimizer.NAG; Y. Nesterov, "A method of solving a convex
programming problem with convergence rate O(1/k^2)", 1983; Sutskever et al., ICML 2013.
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec

spec = Spec("nag", __doc__, reference="MXNet NAG; Nesterov 1983")
lr = spec.hyper("lr", 0.1, "lr >= 0", "learning rate")
momentum = spec.hyper("momentum", 0.9, "momentum >= 0", "momentum factor")
preprocess = gradient_preprocessing(spec)
buf = spec.state("momentum_buffer", 0.0, "velocity, with the learning rate folded in")


@spec.update
def nag(w, grad, flags):
    g = preprocess(w, grad)
    step = lr * g
    s = momentum * buf + step
    return {buf: s, w: w - (momentum * s + step)}

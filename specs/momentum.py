"""Momentum (heavy ball), with optional Nesterov momentum, in the MindSpore form.

    g = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    v = momentum * v + g
    w = w - lr * (g + momentum * v)   if use_nesterov
    w = w - lr * v                    otherwise

The learning rate is outside the moment (v accumulates raw gradients), as in MindSpore's
ApplyMomentum; the buffer starts at 0, so the first v is g.
Weight decay is L2 on the gradient (coupled), as in MindSpore's Momentum.

Reference: MindSpore Momentum (seed 001); I. Sutskever et al., "On the importance of
initialization and momentum in deep learning", ICML 2013.
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec

spec = Spec("momentum", __doc__, reference="MindSpore Momentum; Sutskever et al. 2013")
lr = spec.hyper("lr", 0.1, "lr >= 0", "learning rate")
momentum = spec.hyper("momentum", 0.9, "momentum >= 0", "momentum factor")
spec.flag("use_nesterov", False, "use Nesterov momentum: step along g + momentum * v")
preprocess = gradient_preprocessing(spec)
moment = spec.state("moment", 0.0, "velocity: decayed sum of gradients")


@spec.update
def momentum_update(w, grad, flags):
    g = preprocess(w, grad)
    v = momentum * moment + g
    d = g + momentum * v if flags.use_nesterov else v
    return {moment: v, w: w - lr * d}

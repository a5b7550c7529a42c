"""RMSProp, optionally centered, in the MindSpore form (momentum on the scaled step).

    g           = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    mean_square = decay * mean_square + (1 - decay) * g * g
    centered:
        mean_grad = decay * mean_grad + (1 - decay) * g
        denom     = sqrt(max(mean_square - mean_grad * mean_grad, 0) + epsilon)
    else:
        denom     = sqrt(mean_square + epsilon)
    moment      = momentum * moment + lr * g / denom
    w           = w - moment

epsilon is inside the square root and the learning rate inside the moment, as in
MindSpore's ApplyRMSProp / ApplyCenteredRMSProp. mean_grad is only used (and only
changes) when centered. The variance estimate mean_square - mean_grad**2 is never
negative in exact arithmetic (Cauchy-Schwarz, zero-initialized averages); rounding — a
fused multiply-add in the kernel — can make it a few ulps negative when the gradient
barely varies (decay=0: exactly 0), which would make the square root NaN. The max(., 0)
clamps that rounding and changes nothing else (MindSpore's formula has no clamp).
Weight decay is L2 on the gradient (coupled), as in MindSpore's RMSProp.

Reference: T. Tieleman, G. Hinton, "Lecture 6.5 - RMSProp", COURSERA 2012; A. Graves,
"Generating Sequences With Recurrent Neural Networks", 2013 (centered); MindSpore
RMSProp (seed 001).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, maximum, sqrt

spec = Spec("rmsprop", __doc__, reference="MindSpore RMSProp; Graves 2013")
lr = spec.hyper("lr", 0.1, "lr >= 0", "learning rate")
decay = spec.hyper("decay", 0.9, "0 <= decay < 1", "decay rate of the running averages")
momentum = spec.hyper("momentum", 0.0, "momentum >= 0", "momentum factor of the step")
epsilon = spec.hyper("epsilon", 1e-10, "epsilon > 0", "added inside the square root")
spec.flag("centered", False, "divide by the estimated variance of g instead of its second moment")
preprocess = gradient_preprocessing(spec)
mean_square = spec.state("mean_square", 0.0, "running average of g*g")
moment = spec.state("moment", 0.0, "the step: momentum-averaged lr * g / denom")
mean_grad = spec.state("mean_grad", 0.0, "running average of g (centered only)")


@spec.update
def rmsprop(w, grad, flags):
    g = preprocess(w, grad)
    ms = decay * mean_square + (1 - decay) * g * g
    if flags.centered:
        mg = decay * mean_grad + (1 - decay) * g
        denom = sqrt(maximum(ms - mg * mg, 0.0) + epsilon)
    else:
        mg = mean_grad
        denom = sqrt(ms + epsilon)
    mom = momentum * moment + lr * g / denom
    return {mean_square: ms, moment: mom, mean_grad: mg, w: w - mom}

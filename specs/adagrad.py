"""Adagrad, in the MindSpore form (ApplyAdagrad), with an optional eps.

    g     = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    accum = accum + g * g                      if update_slots
    w     = w - lr * g / (sqrt(accum) + eps)

accum starts at initial_accum (MindSpore's accum = 0.1 default). The seed writes h + g;
the accumulator is the sum of squared gradients (h + g^2), as in ApplyAdagrad. With
update_slots off the accumulator is frozen and only w moves.
Weight decay is L2 on the gradient (coupled), as in MindSpore's Adagrad.

Reference: J. Duchi, E. Hazan, Y. Singer, "Adaptive Subgradient Methods for Online
Learning and Stochastic Optimization", JMLR 2011; MindSpore Adagrad (seed 001).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, sqrt

spec = Spec("adagrad", __doc__, reference="Duchi, Hazan & Singer, JMLR 2011")
lr = spec.hyper("lr", 0.001, "lr >= 0", "learning rate")
initial_accum = spec.hyper("initial_accum", 0.1, "initial_accum >= 0",
                           "starting value of the accumulator")
eps = spec.hyper("eps", 0.0, "eps >= 0", "added to sqrt(accum) in the denominator")
spec.flag("update_slots", True, "accumulate g*g (off: the accumulator stays as it is)")
preprocess = gradient_preprocessing(spec)
accum = spec.state("accum", initial_accum, "sum of g*g, from initial_accum")


@spec.update
def adagrad(w, grad, flags):
    g = preprocess(w, grad)
    accum_new = accum + g * g if flags.update_slots else accum
    return {accum: accum_new, w: w - lr * g / (sqrt(accum_new) + eps)}

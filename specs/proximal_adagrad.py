"""Proximal Adagrad, in the MindSpore form (ApplyProximalAdagrad).

    g     = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    accum = accum + g * g
    prox  = w - lr * g / sqrt(accum)
    w     = sign(prox) / (1 + lr * l2) * max(|prox| - lr * l1, 0)

accum starts at initial_accum. The last line is the proximal step of l1 * |w| +
l2 / 2 * w^2 (soft thresholding, then shrinking); with l1 = 0 it is prox / (1 + lr * l2).
Weight decay is L2 on the gradient (coupled), as in MindSpore's ProximalAdagrad.

Reference: J. Duchi, Y. Singer, "Efficient Online and Batch Learning Using Forward
Backward Splitting", JMLR 2009; MindSpore ProximalAdagrad (seed 001).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, maximum, sign, sqrt

spec = Spec("proximal_adagrad", __doc__, reference="Duchi & Singer, JMLR 2009")
lr = spec.hyper("lr", 0.001, "lr >= 0", "learning rate")
l1 = spec.hyper("l1", 0.0, "l1 >= 0", "L1 regularization strength (soft threshold lr * l1)")
l2 = spec.hyper("l2", 0.0, "l2 >= 0", "L2 regularization strength")
initial_accum = spec.hyper("initial_accum", 0.1, "initial_accum >= 0",
                           "starting value of the accumulator")
preprocess = gradient_preprocessing(spec)
accum = spec.state("accum", initial_accum, "sum of g*g, from initial_accum")


@spec.update
def proximal_adagrad(w, grad, flags):
    g = preprocess(w, grad)
    accum_new = accum + g * g
    prox = w - lr * g / sqrt(accum_new)
    w_new = sign(prox) / (1 + lr * l2) * maximum(abs(prox) - lr * l1, 0.0)
    return {accum: accum_new, w: w_new}

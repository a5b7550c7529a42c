"""FTRL-Proximal, in the MindSpore form (ApplyFtrl).

    g          = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    accum_new  = accum + g * g
    linear     = linear + g - (accum_new**(-lr_power) - accum**(-lr_power)) / lr * w
    w          = (sign(linear) * l1 - linear) / (accum_new**(-lr_power) / lr + 2 * l2)
                     if |linear| > l1 else 0
    accum      = accum_new

accum starts at initial_accum, linear at 0; w in the linear update is the old w.
lr_power = -0.5 is the usual per-coordinate 1/sqrt(accum) schedule; lr_power = 0 is a
fixed learning rate. lr_power > 0 is rejected (ValueError). With lr_power = -0.5 the
powers are computed with sqrt, as TensorFlow's ApplyFtrl kernel does.
Weight decay is L2 on the gradient (coupled), as in MindSpore's FTRL.

Reference: H. B. McMahan et al., "Ad Click Prediction: a View from the Trenches", KDD
2013; MindSpore FTRL (seed 001).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, eq, sign, sqrt, where

spec = Spec("ftrl", __doc__, reference="McMahan et al., KDD 2013")
lr = spec.hyper("lr", 0.001, "lr > 0", "learning rate (alpha)")
lr_power = spec.hyper("lr_power", -0.5, "lr_power <= 0",
                      "the step scales as accum**lr_power; 0 keeps the learning rate fixed")
l1 = spec.hyper("l1", 0.0, "l1 >= 0", "L1 regularization strength (sparsifies w)")
l2 = spec.hyper("l2", 0.0, "l2 >= 0", "L2 regularization strength")
initial_accum = spec.hyper("initial_accum", 0.1, "initial_accum >= 0",
                           "starting value of the accumulator")
preprocess = gradient_preprocessing(spec)
accum = spec.state("accum", initial_accum, "sum of g*g, from initial_accum")
linear = spec.state("linear", 0.0, "the linear term z of FTRL-Proximal")


def power(x):
    """x ** (-lr_power), through sqrt for the usual lr_power = -0.5 (as TensorFlow's
    ApplyFtrl does): the linear update divides a difference of two powers by
    lr, which magnifies any rounding in them, and sqrt is correctly rounded."""
    return where(eq(lr_power, -0.5), sqrt(x), x ** (-lr_power))


@spec.update
def ftrl(w, grad, flags):
    g = preprocess(w, grad)
    accum_new = accum + g * g
    power_new = power(accum_new)
    linear_new = linear + (g - (power_new - power(accum)) / lr * w)
    w_new = where(abs(linear_new) > l1,
                  (sign(linear_new) * l1 - linear_new) / (power_new / lr + 2 * l2), 0.0)
    return {accum: accum_new, linear: linear_new, w: w_new}

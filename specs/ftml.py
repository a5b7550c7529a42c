"""FTML: Follow the Moving Leader, in the MXNet form.

    g   = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w
    v   = beta2 * v + (1 - beta2) * g * g
    d_t = (1 - beta1**t) / lr * (sqrt(v / (1 - beta2**t)) + epsilon)
    z   = beta1 * z + (1 - beta1) * g - (d_t - beta1 * d_{t-1}) * w
    w   = -z / d_t

The state d stores d_t for the next step (d_0 = 0); w in the z update is the old w.
Weight decay is L2 on the gradient (coupled), as in MXNet's FTML.

Reference: S. Zheng, J. T. Kwok, "Follow the Moving Leader in Deep Learning", ICML 2017;
MXNet mxnet.optimizer.FTML (seed 000).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, sqrt

spec = Spec("ftml", __doc__, reference="Zheng & Kwok, ICML 2017")
lr = spec.hyper("lr", 0.0025, "lr > 0", "learning rate")
beta1 = spec.hyper("beta1", 0.6, "0 < beta1 < 1", "decay rate of z and of d")
beta2 = spec.hyper("beta2", 0.999, "0 < beta2 < 1", "decay rate of the second moment")
epsilon = spec.hyper("epsilon", 1e-8, "epsilon > 0", "added to the bias-corrected sqrt(v)")
preprocess = gradient_preprocessing(spec)
d = spec.state("d", 0.0, "d_t of the previous step")
v = spec.state("v", 0.0, "second moment (mean of g*g)")
z = spec.state("z", 0.0, "the moving leader's linear term")
t = spec.t


@spec.update
def ftml(w, grad, flags):
    g = preprocess(w, grad)
    v_new = beta2 * v + (1 - beta2) * g * g
    d_t = (1 - beta1 ** t) / lr * (sqrt(v_new / (1 - beta2 ** t)) + epsilon)
    z_new = beta1 * z + (1 - beta1) * g - (d_t - beta1 * d) * w
    return {d: d_t, v: v_new, z: z_new, w: -z_new / d_t}

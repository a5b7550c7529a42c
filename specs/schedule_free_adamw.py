"""Schedule-Free AdamW: no learning-rate schedule; the step interpolates between the
iterate z and a weighted average x of the iterates, and w holds y, the point where the
gradient is taken (the authors' AdamWScheduleFree in train mode).

    g          = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    k          = this parameter's steps before this one (a scalar state)
    lr_t       = lr * min(1, (k + 1) / warmup_steps)          (warmup_steps = 0: lr)
    lr_max     = max(lr_max, lr_t)                           (starts at -1)
    weight     = (k + 1)**r * lr_max**weight_lr_power
    weight_sum = weight_sum + weight
    ckp1       = weight / weight_sum                         (0 while weight_sum is 0)
    z          = w                                           (before the first step)
    v          = beta2 * v + (1 - beta2) * g * g
    u          = g / (sqrt(v / (1 - beta2**(k + 1))) + eps) + weight_decay * w
    w          = (1 - ckp1) * w + ckp1 * z + lr_t * (beta1 * (1 - ckp1) - 1) * u
    z          = z - lr_t * u

w is y = (1 - beta1) * z + beta1 * x; the average x, the point to evaluate, is
(w - (1 - beta1) * z) / beta1. optgen.torch's class for this spec (optgen.torch.make,
optgen/torch/schedule_free.py) has the authors' train() and eval(), which move the
parameters between y and x. Weight decay is taken at y, as the authors do; there is no
first moment and no bias correction of the step, only of v. k, lr_max and weight_sum
are the authors' group values k, lr_max and weight_sum, kept per parameter: they are
equal while every parameter of a group gets a gradient at every step.

Reference: A. Defazio, X. Yang, H. Mehta, K. Mishchenko, A. Khaled, A. Cutkosky, "The
Road Less Scheduled", NeurIPS 2024 (arXiv:2405.15682); github.com/facebookresearch/
schedule_free (schedulefree.AdamWScheduleFree).
"""
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, maximum, minimum, sqrt, where

spec = Spec("schedule_free_adamw", __doc__, reference="arXiv:2405.15682")
lr = spec.hyper("lr", 0.0025, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 < beta1 < 1", "interpolation between z and x (momentum)")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "decay rate of the second moment")
eps = spec.hyper("eps", 1e-8, "eps >= 0", "added to the bias-corrected sqrt(v)")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "weight_decay * y is added to the normalized gradient")
warmup_steps = spec.hyper("warmup_steps", 0, "warmup_steps >= 0",
                          "linear warm-up of the learning rate over this many steps")
r = spec.hyper("r", 0.0, "r >= 0", "the average weights step k by k**r")
weight_lr_power = spec.hyper("weight_lr_power", 2.0, "weight_lr_power >= 0",
                             "the average weights a step by lr_max**weight_lr_power")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
z = spec.state("z", 0.0, "the iterate z (w itself before the first step)")
v = spec.state("exp_avg_sq", 0.0, "second moment (mean of g*g)")
k = spec.state("k", 0.0, "steps taken", shape="scalar")
lr_max = spec.state("lr_max", -1.0, "largest warmed-up learning rate so far", shape="scalar")
weight_sum = spec.state("weight_sum", 0.0, "sum of the average's weights", shape="scalar")


@spec.update
def schedule_free_adamw(w, grad, flags):
    g = preprocess(w, grad)
    step = k + 1
    lr_t = lr * minimum(1.0, step / maximum(warmup_steps, 1))
    lr_max_new = maximum(lr_max, lr_t)
    weight = step ** r * lr_max_new ** weight_lr_power
    sum_new = weight_sum + weight
    ckp1 = where(sum_new > 0, weight / sum_new, 0.0)
    z_old = where(k > 0, z, w)
    v_new = beta2 * v + (1 - beta2) * g * g
    u = g / (sqrt(v_new / (1 - beta2 ** step)) + eps) + weight_decay * w
    y_new = (1 - ckp1) * w + ckp1 * z_old + lr_t * (beta1 * (1 - ckp1) - 1) * u
    return {v: v_new, z: z_old - lr_t * u, w: y_new,
            k: step, lr_max: lr_max_new, weight_sum: sum_new}

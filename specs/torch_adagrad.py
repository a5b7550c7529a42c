"""Adagrad, in the torch.optim.Adagrad form (lr_decay, initial_accumulator_value, maximize).

    g    = -grad if maximize else grad
    g    = g + weight_decay * w
    clr  = lr / (1 + (t - 1) * lr_decay)
    sum  = sum + g * g                           (starts at initial_accumulator_value)
    w    = w - clr * g / (sqrt(sum) + eps)

eps is outside the square root, as torch; the seed adagrad.py is MindSpore's form (lr
1e-3, accumulator 0.1, no eps). maximize is a flag (a bool in torch: its own kernel).

Reference: J. Duchi, E. Hazan, Y. Singer, "Adaptive Subgradient Methods", JMLR 2011;
torch.optim.Adagrad.
"""
from optgen.blocks import torch_gradient
from optgen.dsl import Spec, sqrt

spec = Spec("torch_adagrad", __doc__, reference="torch.optim.Adagrad")
lr = spec.hyper("lr", 1e-2, "lr >= 0", "learning rate")
lr_decay = spec.hyper("lr_decay", 0.0, "lr_decay >= 0", "clr = lr / (1 + (t - 1) * lr_decay)")
initial = spec.hyper("initial_accumulator_value", 0.0, "initial_accumulator_value >= 0",
                     "starting value of sum")
eps = spec.hyper("eps", 1e-10, "eps >= 0", "added to sqrt(sum)")
gradient, _ = torch_gradient(spec)
acc = spec.state("sum", initial, "sum of g*g, from initial_accumulator_value")
t = spec.t


@spec.update
def torch_adagrad(w, grad, flags):
    g = gradient(w, grad, flags)
    acc_new = acc + g * g
    clr = lr / (1 + (t - 1) * lr_decay)
    return {acc: acc_new, w: w - clr * g / (sqrt(acc_new) + eps)}

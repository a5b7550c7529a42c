"""Rprop, in the torch.optim.Rprop form (per-element step sizes from the sign of g * prev).

    g         = -grad if maximize else grad
    f         = etaplus if g * prev > 0,  etaminus if g * prev < 0,  1 otherwise
    step_size = clip(step_size * f, step_size_min, step_size_max)
    g         = 0 where f == etaminus                       (a sign change: no step)
    w         = w - sign(g) * step_size
    prev      = g

step_size starts at lr, prev at 0, as torch. torch's etas are (etaminus, etaplus) and its
step_sizes (step_size_min, step_size_max). maximize is a flag (torch's bool: its own
kernel). Rprop has no weight decay.

Reference: M. Riedmiller, H. Braun, "A Direct Adaptive Method for Faster Backpropagation
Learning: The RPROP Algorithm", ICNN 1993; torch.optim.Rprop.
"""
from optgen.blocks import torch_gradient
from optgen.dsl import Spec, clip, eq, sign, where

spec = Spec("torch_rprop", __doc__, reference="Riedmiller & Braun 1993; torch.optim.Rprop")
lr = spec.hyper("lr", 1e-2, "lr >= 0", "initial step size")
etaminus = spec.hyper("etaminus", 0.5, "0 < etaminus < 1", "etas[0]: step size factor "
                      "after a sign change")
etaplus = spec.hyper("etaplus", 1.2, "etaplus > 1", "etas[1]: step size factor otherwise")
step_size_min = spec.hyper("step_size_min", 1e-6, doc="step_sizes[0]: smallest step size")
step_size_max = spec.hyper("step_size_max", 50.0, doc="step_sizes[1]: largest step size")
gradient, _ = torch_gradient(spec, weight_decay_default=None)
prev = spec.state("prev", 0.0, "the previous step's g (0 after a sign change)")
step_size = spec.state("step_size", lr, "per-element step size")


@spec.update
def torch_rprop(w, grad, flags):
    g = gradient(w, grad, flags)
    p = g * prev
    f = where(p > 0, etaplus, where(p < 0, etaminus, 1.0))
    s = clip(step_size * f, step_size_min, step_size_max)
    g = where(eq(f, etaminus), 0.0, g)
    return {step_size: s, prev: g, w: w - sign(g) * s}

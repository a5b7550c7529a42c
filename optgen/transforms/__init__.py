"""Modifiers as spec transforms: a spec in, a spec out, whose update is the transformed
rule in one fused kernel::

    from optgen.transforms import cautious, mars
    import optgen.torch
    CMarsAdamW = optgen.torch.make(cautious(mars("adamw")))   # a torch.optim.Optimizer

A transform takes a Spec, a catalog name or a spec file, and returns a new Spec (named
``<transform>_<base>``) with the base's hyperparameters and states plus its own:

* ``cautious``: C-AdamW's sign-agreement mask and rescale (optgen.transforms.step);
* ``trust_ratio``: LAMB's layer-wise ||w|| / ||u|| (step);
* ``graft(direction, magnitude)``: one rule's step at another's norm (step);
* ``mars``: the variance-reduced gradient (optgen.transforms.momentum);
* ``ema``: the rule fed an exponential moving average of its gradient (momentum);
* ``nesterov``: the first moment looked one step ahead (momentum);
* ``schedule_free``: Defazio et al.'s interpolation and averaging in place of the
  momentum (optgen.transforms.averaging);
* ``lookahead``: Zhang et al.'s slow weights (averaging);
* ``orthogonalize``: Muon's Newton-Schulz orthogonalization of the 2-D step
  (optgen.transforms.orthogonal).

A rule a transform does not accept raises ``TransformError`` (a ValueError) naming the
rule and what the transform needs. ``spec_file(spec)`` writes a transformed spec as a
spec file (``optgen build``, ``optgen.create``); ``optgen.torch.make`` calls it.
docs/transforms.md has the rules and what each accepts.
"""
from .averaging import lookahead, schedule_free
from .files import spec_file
from .momentum import ema, mars, nesterov
from .orthogonal import orthogonalize
from .rewrite import TransformError, load_file
from .step import cautious, graft, trust_ratio

__all__ = ["TransformError", "cautious", "ema", "graft", "load_file", "lookahead", "mars",
           "nesterov", "orthogonalize", "schedule_free", "spec_file", "trust_ratio"]

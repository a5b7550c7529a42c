"""Launch strategies: how the optimizer's parameters are launched, one small class per
mode, chosen once when the kernels are prepared and run every step.

    PerTensor     one parameter, its kernel's passes over the whole tensor
    Lazy          a row-sparse gradient updates only its rows (lazy_update)
    Split         a parameter split across ranks: passes with reductions summed between
    FlatRun       parameters back to back: one elementwise call over the span
    SegmentedRun  the same with whole-tensor reductions: segmented passes

Every strategy has ``indices`` (the parameters it steps) and ``run(step)``
(``StepInputs``: gradients, extra inputs, scalar environments, ...), which returns
False when a run declines this step, and its members step alone. The Optimizer keeps a
parameter's own strategy in its slot (``choose``) and the runs (``find_runs``) until
flags, multipliers or states change.

May import: base, launch, runs, single, slots.
"""
from __future__ import annotations

from ..launch import Launcher
from ..slots import ParamSlot
from .base import StepInputs, Strategy
from .runs import FlatRun, SegmentedRun, find as find_runs
from .single import Lazy, PerTensor, Split


def choose(launcher: Launcher, slot: ParamSlot, lazy_update: bool) -> Strategy:
    """The strategy of ``slot`` alone under its prepared kernel: split across ranks,
    row-sparse (its kernel has a lazy variant and ``lazy_update`` is on), or per
    tensor."""
    if slot.split is not None:
        return Split(launcher, slot)
    if lazy_update and slot.kernel.lazy is not None:
        return Lazy(launcher, slot)
    return PerTensor(launcher, slot)


__all__ = ["FlatRun", "Lazy", "PerTensor", "SegmentedRun", "Split", "StepInputs",
           "Strategy", "choose", "find_runs"]

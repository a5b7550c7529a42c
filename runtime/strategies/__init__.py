"""Launch strategies: how the optimizer's parameters are launched, one small class per
mode, chosen once when the kernels are prepared and run every step.

    PerTensor     one parameter, its kernel's passes over the whole tensor
    Lazy          a row-sparse gradient updates only its rows (lazy_update)
    Split         a parameter split across ranks: passes with reductions summed between
    FlatRun       parameters back to back: one elementwise call over the span
    SegmentedRun  the same with whole-tensor reductions: segmented passes
    MultiTensor   loose parameters with one elementwise kernel: one call through a
                  table of their pointers (the default for what no flat run steps)

Every strategy has ``indices`` (the parameters it steps) and ``run(step)``
(``StepInputs``: gradients, extra inputs, scalar environments, ...), which returns
False when a run declines this step, and its members step alone. The Optimizer keeps a
parameter's own strategy in its slot (``choose``) and the runs (``find_runs``) until
flags, multipliers or states change.

May import: base, launch, multi, runs, single, slots.
"""
from __future__ import annotations

from typing import Sequence

from ..launch import Launcher
from ..slots import ParamSlot
from .base import Checked, StepInputs, Strategy
from .multi import MultiTensor, find as find_multi
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


def find_launches(launcher: Launcher, slots: Sequence[ParamSlot],
                  chains: Sequence[tuple[int, int]], has_inputs: bool, multi: bool
                  ) -> dict[int, Strategy]:
    """First parameter -> the launch that steps several parameters at once: flat runs
    (``find_runs``), then (``multi``) multi-tensor launches of the parameters no run
    steps (``find_multi``)."""
    runs: dict[int, Strategy] = dict(find_runs(launcher, slots, chains, has_inputs))
    if multi:   # (a run of one tensor and empty ones is no better than a list entry)
        runs = {i: r for i, r in runs.items() if sum(slots[j].numel > 0 for j in r.indices) > 1}
        taken = {i for r in runs.values() for i in r.indices}
        runs.update(find_multi(launcher, slots, taken, has_inputs))
    return runs


__all__ = ["Checked", "FlatRun", "Lazy", "MultiTensor", "PerTensor", "SegmentedRun", "Split",
           "StepInputs", "Strategy", "choose", "find_launches", "find_multi", "find_runs"]

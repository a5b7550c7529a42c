"""Launch strategies: how the optimizer's parameters are launched, one small class per
mode, chosen once when the kernels are prepared and run every step.

    PerTensor     one parameter, its kernel's passes over the whole tensor
    Lazy          a row-sparse gradient updates only its rows (lazy_update)
    Split         a parameter split across ranks: passes with reductions summed between
    Gathered      a rule that sums over all parameters: every such parameter's first
                  passes, the totals, then the rest
    FlatRun       parameters back to back: one elementwise call over the span
    SegmentedRun  the same with whole-tensor reductions: segmented passes
    MultiTensor   loose parameters with one elementwise kernel: one call through a
                  table of their pointers (the default for what no flat run steps)

Every strategy has ``indices`` (the parameters it steps) and ``run(step)``
(``StepInputs``: gradients, extra inputs, scalar environments, ...), which returns
False when a run declines this step, and its members step alone. FlatRun,
SegmentedRun and MultiTensor are runs (base.py ``Fused``: one ``run``, their verdicts
kept by runtime/gradcache.py); each says only where its gradients go. The Optimizer
keeps a parameter's own strategy in its slot (``choose``) and the step's launches
(``launches``: a ``Launches`` of the runs ``find_launches`` finds) until flags,
multipliers, states or parameters' data change.

May import: base, gradcache, launch, multi, runs, single, slots.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ..gradcache import GradCache
from ..launch import Launcher
from ..slots import ParamSlot
from .base import Fused, Launches, StepInputs, Strategy
from .multi import MultiTensor, find as find_multi
from .runs import FlatRun, SegmentedRun, find as find_runs
from .single import Gathered, Lazy, PerTensor, Split


def choose(launcher: Launcher, slot: ParamSlot, lazy_update: bool) -> Strategy:
    """The strategy of ``slot`` alone under its prepared kernel: split across ranks,
    row-sparse (its kernel has a lazy variant and ``lazy_update`` is on), or per
    tensor."""
    if slot.split is not None:
        return Split(launcher, slot)
    if slot.kernel.global_sums:
        return Gathered(launcher, slot)
    if lazy_update and slot.kernel.lazy is not None:
        return Lazy(launcher, slot)
    return PerTensor(launcher, slot)


def find_launches(launcher: Launcher, slots: Sequence[ParamSlot],
                  chains: Sequence[tuple[int, int]], has_inputs: bool, multi: bool,
                  cache: GradCache) -> dict[int, Strategy]:
    """First parameter -> the launch that steps several parameters at once: flat runs
    (``find_runs``), then (``multi``) multi-tensor launches of the parameters no run
    steps (``find_multi``); their verdicts on the gradients are kept in ``cache``."""
    runs: dict[int, Strategy] = dict(find_runs(launcher, slots, chains, has_inputs, cache))
    if multi:   # (a run of one tensor and empty ones is no better than a list entry)
        runs = {i: r for i, r in runs.items() if sum(slots[j].numel > 0 for j in r.indices) > 1}
        taken = {i for r in runs.values() for i in r.indices}
        runs.update(find_multi(launcher, slots, taken, has_inputs, cache))
    return runs


def launches(launcher: Launcher, slots: Sequence[ParamSlot],
             chains: Sequence[tuple[int, int]], prepare: Callable[[int], Any],
             cache: GradCache, *, has_inputs: bool, multi: bool, shards: Any) -> Launches:
    """A step's launches under the current kernels: the runs ``find_launches`` finds
    (every kernel prepared first, ``prepare(i)``; none for the reference backend, whose
    interpreter steps each tensor alone), each other parameter by its own strategy,
    the split ones' passes over ``shards``."""
    runs: dict[int, Strategy] = {}
    if launcher.compiled and (chains or multi):
        for i in range(len(slots)):
            prepare(i)
        runs = find_launches(launcher, slots, chains, has_inputs, multi, cache)
    return Launches(slots, runs, prepare, shards)


__all__ = ["FlatRun", "Fused", "Gathered", "Launches", "Lazy", "MultiTensor", "PerTensor", "SegmentedRun",
           "Split", "StepInputs", "Strategy", "choose", "find_launches", "find_multi",
           "find_runs", "launches"]

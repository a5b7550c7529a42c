"""Strategies that step a flat run: parameters back to back in memory (with their
states) that one call per pass updates over the whole span (runtime/flat.py finds
them). ``FlatRun``: an elementwise kernel's one launch over the span. ``SegmentedRun``:
a kernel with whole-tensor reductions (LAMB, LARS), each pass's segmented variant
with the run's offsets and one reduction buffer per tensor.

A run is found when every parameter's kernel is prepared (compiled backend only: the
reference interpreter is the oracle and steps each tensor alone). ``run`` is a run's
(strategies/base.py ``Fused``): on a step where its gradients are not back to back, or
not all present, or its step counts or scalar states differ, it declines and its
members step alone with their own strategies.

May import: base, flat, gradcache, launch, artifact, slots, views.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from .. import flat
from ..artifact import bfloat16_tensor
from ..flat import GRAD
from ..gradcache import GradCache
from ..launch import Launcher
from ..slots import ParamSlot
from .base import Fused, StepInputs
from optgen.core import views


class FlatRun(Fused):
    """A run whose kernel is one elementwise launch: one call over the span."""
    segmented = False

    def __init__(self, launcher: Launcher, slots: Sequence[ParamSlot],
                 calls: list[tuple[Callable, list]], every: list[Any], cache: GradCache):
        super().__init__(launcher, slots, calls, cache)
        self.every = every        # every argument of its calls (the gradient's overlaps)

    @classmethod
    def build(cls, launcher: Launcher, slots: Sequence[ParamSlot]) -> list | None:
        """The run's calls (``flat.run_calls``), or None: some persistent array (a
        state) is not back to back with its neighbour's."""
        k, first = slots[0].kernel, slots[0]
        return flat.run_calls(launcher.artifact, k, first.lib, first.array,
                              [launcher.arrays(s.index, k, None, {}) for s in slots],
                              [s.numel for s in slots], segmented=cls.segmented)

    def bind(self, step: StepInputs) -> Any:
        """The span of the run's gradients (its calls' ``GRAD``), or None when they are
        not back to back or overlap the run's other arrays (``flat.grad_span``)."""
        return flat.grad_span([step.grads[i] for i in self.indices], self.slots[0].lib,
                              self.every)


class SegmentedRun(FlatRun):
    """A run whose kernel's passes each have a segmented variant (whole-tensor
    reductions, per tensor, over one span)."""
    segmented = True


def find(launcher: Launcher, slots: Sequence[ParamSlot], chains: Sequence[tuple[int, int]],
         has_inputs: bool, cache: GradCache) -> dict[int, FlatRun]:
    """First parameter -> its run, under the prepared kernels: stretches of a chain with
    one group, one fusable kernel and equal multipliers whose persistent arrays are
    back to back."""
    def same(i: int) -> tuple | None:
        s = slots[i]
        if not flat.fusable(s.kernel, has_inputs, views.AXES):
            return None
        return s.group, s.kernel.symbol, s.lr_mult, s.wd_mult

    def kind(i: int) -> type[FlatRun]:
        return SegmentedRun if "seg_symbol" in slots[i].kernel.launches[0] else FlatRun

    found = flat.find_runs(chains, same, lambda i, j: kind(i).build(launcher, slots[i:j]))
    # numpy bfloat16 spans (state formats) pass as tvm_ffi views; the run's list of
    # every argument keeps the arrays (gradient overlap checks read their addresses)
    return {i: kind(i)(launcher, slots[i:end],
                       [(fn, [a if a is GRAD else bfloat16_tensor(a) for a in args])
                        for fn, args in calls], every, cache)
            for i, (end, calls, every) in found.items()}

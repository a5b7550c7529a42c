"""Strategies that step one parameter: per tensor, row-sparse (lazy) and split across
ranks. A parameter's strategy is chosen when its kernel is prepared (``choose`` in
runtime/strategies/__init__.py) and kept in its slot.

May import: base, launch, slots, sparse.
"""
from __future__ import annotations

from typing import Any, Generator

from ..launch import Launcher
from ..slots import ParamSlot
from ..sparse import RowSparse
from .base import StepInputs


class PerTensor:
    """One parameter, one launch plan: its kernel's passes over the whole tensor."""

    def __init__(self, launcher: Launcher, slot: ParamSlot):
        self.launcher, self.slot = launcher, slot
        self.indices = (slot.index,)

    def run(self, step: StepInputs) -> bool:
        s = self.slot
        packed = step.place(self.indices, s.kernel, step.advance(s, s.kernel), s)
        if s.numel:                   # (an empty parameter counts its step, runs nothing)
            self.launcher.run(s.index, s.kernel, step.grads[s.index], packed,
                              step.extra[s.index])
        return True


class Lazy(PerTensor):
    """A parameter whose kernel has a lazy variant, with ``lazy_update`` on: a row-sparse
    gradient (``RowSparse``, coalesced by the checks) updates only the rows it names
    and their states; a dense one steps the whole tensor as ``PerTensor`` does."""

    def run(self, step: StepInputs) -> bool:
        s, g = self.slot, step.grads[self.slot.index]
        if not isinstance(g, RowSparse):
            return super().run(step)
        packed = step.place(self.indices, s.kernel, step.advance(s, s.kernel), s)
        if len(g.indices) and s.array.size:
            self.launcher.run_lazy(s.index, s.kernel, g, packed)
        return True


class Gathered(PerTensor):
    """A parameter whose rule reads sums over all parameters (``global_sum``): its
    launches up to the sums run first, for every such parameter (``step.gathered``),
    then each takes the totals, its scalar states' updates and its other launches
    (``base.sum_all``)."""

    def run(self, step: StepInputs) -> bool:
        s = self.slot
        if step.parts is not None or step.scalar_buffers is not None:
            raise ValueError(f"parameter {s.index}: its rule sums over all parameters "
                             f"(global_sum: {', '.join(s.kernel.global_sums)}), so it is "
                             "stepped with all of them, not in parts (step_in_backward), "
                             "and its host reads the sums (not capturable)")
        packed = step.place(self.indices, s.kernel, step.advance(s, s.kernel), s)
        step.gathered.append(self._passes(step, packed))
        return True

    def _passes(self, step: StepInputs, packed: Any) -> Generator:
        s, k = self.slot, self.slot.kernel
        g, extra = step.grads[s.index], step.extra[s.index]
        totals = yield self.launcher.gather(s.index, k, g, packed, extra)
        step.settle(s, k, totals)
        self.launcher.finish(s.index, k, g, packed, extra, totals)


class Split(PerTensor):
    """A parameter split across ranks (FSDP2 shards): its passes are collected in
    ``step.pending``, and the optimizer drives every split parameter's passes together,
    summing reduction buffers across ranks between them (runtime/shards.py)."""

    def run(self, step: StepInputs) -> bool:
        s = self.slot
        packed = step.advance(s, s.kernel)
        step.pending.append(self.launcher.passes(s.index, s.kernel, step.grads[s.index],
                                                 packed, step.extra[s.index], s.split))
        return True

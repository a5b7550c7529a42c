"""What every launch strategy shares: the interface, and one step's inputs.

A strategy steps some parameters (``indices``) by one update with the step's inputs
(``StepInputs``): it counts their steps, computes their host scalars (``advance``) and
makes the launcher's calls (runtime/launch.py). It is chosen once, when the
parameters' kernels are prepared (runtime/strategies/__init__.py), and run every step.

May import: numpy, refresh, scalars, slots.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Protocol, Sequence

import numpy as np

from .. import refresh, scalars
from ..slots import ParamSlot


@dataclass
class Checked:
    """A step that ``Optimizer.check_step`` checked, for ``run_step``: the gradients
    and extra inputs as checked, the due statistics, each used group's lr; the grad
    scale and global norm where the check computed them (``skips``: a non-finite
    gradient under ``nonfinite="skip"``)."""
    grads: list[Any]
    extra: list[dict[str, Any]]
    due: Mapping[int, dict[str, np.ndarray]]
    lrs: Mapping[int, float | None]
    scale: float | None = None
    norm: float | None = None
    skips: bool = False


@dataclass
class StepInputs:
    """One step's inputs, as the strategies read them: gradients and extra inputs by
    parameter, the statistics of the parameters whose refresh rule is due, each used
    group's scalar environment and lr, and the optimizer's update count ``t`` (this
    step's). ``shared`` keeps host scalars computed once for parameters alike;
    ``pending`` collects the passes of parameters split across ranks (``Split``), which
    the optimizer drives together after the others (runtime/shards.py)."""
    grads: list[Any]
    extra: list[dict[str, Any]]
    due: Mapping[int, dict[str, np.ndarray]]
    envs: Mapping[int, dict[str, Any]]
    lrs: Mapping[int, float | None]
    t: int
    seed: int                                 # of stochastic rounding
    statistics: Mapping[str, str]             # the spec's statistics and their shapes
    shared: dict[tuple, tuple] = field(default_factory=dict)
    pending: list[Iterator[list]] = field(default_factory=list)
    rows: Any = None                          # capturable: runtime.capture.ScalarRows

    def place(self, indices: Sequence[int], k: Any, packed: np.ndarray,
              slot: ParamSlot) -> Any:
        """The scalars a launch of ``indices`` passes: ``packed`` itself, or (capturable)
        its fixed device row holding them (runtime/capture.py)."""
        if self.rows is None:
            return packed
        return self.rows.place((tuple(indices), k.symbol), packed, slot.array, slot.lib)

    def advance(self, slot: ParamSlot, k: Any) -> np.ndarray:
        """Count ``slot``'s step and return kernel ``k``'s packed scalars for it: computed
        once for parameters with one kernel, group, step and multipliers unless they
        read scalar states or the shape; its refresh rule runs first when due, and its
        scalar states take their updates."""
        slot.steps += 1
        gi = slot.group
        key = (k.symbol, gi, slot.steps, slot.lr_mult, slot.wd_mult)
        hit = self.shared.get(key)
        if hit is None:
            hit = self.shared[key] = scalars.step_values(
                k, self.envs[gi], step=slot.steps, t=self.t, lr_mult=slot.lr_mult,
                wd_mult=slot.wd_mult, has_lr=self.lrs[gi] is not None)
        values, packed = hit
        if slot.index in self.due:
            refresh.run(k, slot, values, self.due[slot.index], kinds=self.statistics)
            slot.refreshed = slot.steps
        if k.scalar_state_updates or packed is None:  # scalar states, shape scalars
            packed = scalars.param_values(   # (a shard's: its whole parameter's shape)
                k, values, slot.state, slot.dims if slot.split is None else slot.split.dims,
                packed)
        if k.stochastic:                              # (a key per parameter and step)
            packed = scalars.keyed(k, packed, self.seed, slot.steps, slot.index)
        return packed


class Strategy(Protocol):
    """How some parameters are launched; one instance per parameter or per run."""

    indices: Sequence[int]      # the parameters it steps, in order

    def run(self, step: StepInputs) -> bool:
        """Step this step's parameters (those with a gradient). False: not now (a run
        whose gradients do not lie back to back); its members then step alone."""
        ...

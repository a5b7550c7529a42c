"""What every launch strategy shares: one step's inputs, the interface, the part of a
run that steps several parameters at once, and the table of a step's launches.

A strategy steps some parameters (``indices``) by one update with the step's inputs
(``StepInputs``): it counts their steps, computes their host scalars (``advance``) and
makes the launcher's calls (runtime/launch.py). It is chosen once, when the
parameters' kernels are prepared (runtime/strategies/__init__.py), and run every step
by ``Launches.run``.

May import: numpy, gradcache, owned, refresh, scalars, shards, slots.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterator, Mapping, Protocol, Sequence

import numpy as np

from .. import owned, refresh, scalars, shards as shards_
from ..gradcache import GradCache, Verdict
from ..slots import ParamSlot


@dataclass
class StepInputs:
    """One step's inputs, gathered and checked by ``Optimizer.check_step``: gradients
    and extra inputs by parameter (checked), the statistics of the parameters whose
    refresh rule is due, each used group's lr; the grad scale and global norm where the
    check computed them (``skips``: a non-finite gradient under ``nonfinite="skip"``).
    ``Optimizer.run_step`` adds what the strategies read besides: each used group's
    scalar environment, the update count ``t`` (this step's), the seed of stochastic
    rounding, the spec's statistics, the capturable scalar rows. ``shared`` keeps host
    scalars computed once for parameters alike; ``pending`` collects the passes of
    parameters split across ranks (``Split``), which the optimizer drives together
    after the others (runtime/shards.py)."""
    grads: list[Any]
    extra: list[dict[str, Any]]
    due: Mapping[int, dict[str, np.ndarray]]
    lrs: Mapping[int, float | None]
    scale: float | None = None
    norm: float | None = None
    skips: bool = False
    envs: Mapping[int, dict[str, Any]] = field(default_factory=dict)
    t: int = 0
    seed: int = 0                             # of stochastic rounding
    statistics: Mapping[str, str] = field(default_factory=dict)   # (and their shapes)
    rows: Any = None                          # capturable: runtime.capture.ScalarBuffers
    shared: dict[tuple, tuple] = field(default_factory=dict)
    pending: list[Iterator[list]] = field(default_factory=list)
    gathered: list[Generator] = field(default_factory=list)   # parameters whose rule
    # sums over all parameters (``Gathered``): their passes, driven together
    parts: Sequence[int] | None = None        # a part of a step: its parameters, in
    # order (a run's members among them launched together: ``Launches``)

    def place(self, indices: Sequence[int], k: Any, packed: np.ndarray,
              slot: ParamSlot) -> Any:
        """The scalars a launch of ``indices`` passes: ``packed`` itself, or (capturable)
        its fixed device row holding them (runtime/capture.py)."""
        if self.scalar_buffers is None:
            return packed
        return self.scalar_buffers.place((tuple(indices), k.symbol), packed, slot.array, slot.lib)

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
            if owned.refreshes_here(slot.split):   # (split: its owner rank's, owned.py)
                refresh.run(k, slot, values, self.due[slot.index], kinds=self.statistics)
            slot.refreshed = slot.steps
        if k.scalar_state_updates or packed is None:  # scalar states, shape scalars
            packed = self._per_param(key, slot, k, lambda st, dims: scalars.param_values(
                k, values, st, dims, packed))
        if k.stochastic:                              # (a key per parameter and step)
            packed = scalars.keyed(k, packed, self.seed, slot.steps, slot.index)
        return packed


    def settle(self, slot: ParamSlot, k: Any, sums: Mapping[str, float]) -> None:
        """``slot``'s scalar-state updates, which read the totals ``sums`` of the sums
        over all parameters (after ``advance`` counted its step)."""
        key = (k.symbol, slot.group, slot.steps, slot.lr_mult, slot.wd_mult)
        values, _ = self.shared[key]
        self._per_param((*key, *sorted(sums.items())), slot, k, lambda st, dims: scalars.
                        param_values(k, values, st, dims, np.empty(0), sums))

    def _per_param(self, key: tuple, slot: ParamSlot, k: Any, compute: Callable) -> Any:
        """``compute(state, dims)``'s result and its scalar-state updates, once for the
        parameters of one ``key`` whose scalar states and dims are equal (the others
        take the first one's result and new scalar states)."""
        dims = slot.dims if slot.split is None else slot.split.dims   # (a shard's: whole)
        names = tuple(k.scalar_state_updates)
        memo = (*key, dims, tuple(slot.state[n] for n in names))
        hit = self.shared.get(memo)
        if hit is None:
            out = compute(slot.state, dims)
            hit = self.shared[memo] = out, {n: slot.state[n] for n in names}
        slot.state.update(hit[1])
        return hit[0]


class Strategy(Protocol):
    """How some parameters are launched; one instance per parameter or per run."""

    indices: Sequence[int]      # the parameters it steps, in order

    def run(self, step: StepInputs) -> bool:
        """Step this step's parameters (those with a gradient). False: not now (a run
        whose gradients do not lie back to back); its members then step alone."""
        ...


class Fused:
    """A run: parameters with one kernel, group and multipliers stepped by one call per
    pass (``calls``: a flat run's over their span, a multi-tensor list's through its
    pointer table). A subclass says where its gradients go (``bind``). ``run``
    declines, and the members step alone, when a member has no dense gradient, step
    counts or scalar states differ, or ``bind`` refuses the gradients' layout; the
    verdict, and what ``bind`` made, hold while the members' gradients, step counts
    and data do (runtime/gradcache.py). Otherwise the first member's scalars are the
    run's: its step is counted and its scalars packed once, and the others take its
    count and scalar states."""

    def __init__(self, launcher: Any, slots: Sequence[ParamSlot],
                 calls: list[tuple[Callable, list]], cache: GradCache):
        self.launcher, self.slots, self.calls = launcher, list(slots), calls
        self.indices = [s.index for s in slots]
        self.cache = cache
        self.verdict = Verdict(cache, self.indices, self._decide)

    def bind(self, step: StepInputs) -> Any:
        """The run's gradients this step as its calls take them (a flat run's span, or
        the multi-tensor table with their addresses written); None: not as they lie."""
        raise NotImplementedError

    def part(self, indices: Sequence[int]) -> Fused | None:
        """A run of some of its members (``indices``, two or more, in order) that steps
        them alone, for a step in parts; None: this kind of run cannot (a flat run's
        members are one span)."""
        return None

    def _decide(self, step: StepInputs) -> Any:
        first = self.slots[0]
        if not self.cache.dense(self.indices) or \
                any(s.steps != first.steps for s in self.slots):
            return None
        return self.bind(step)

    def run(self, step: StepInputs) -> bool:
        v = self.verdict
        bound = v.value if v.version == self.cache.version else v.update(step)
        if bound is None:
            return False
        first, rest = self.slots[0], self.slots[1:]
        k = first.kernel
        names = k.scalar_state_updates
        if names and not all(s.state[n] == first.state[n] for s in rest for n in names):
            return False
        for s in rest:
            s.steps += 1
        packed = step.place(self.indices, k, step.advance(first, k), first)
        for s in rest if names else ():   # (the members had the same values)
            s.state.update((n, first.state[n]) for n in names)
        self.launcher.run_fused(self.indices, self.calls, bound, packed)
        return True


class Launches:
    """A step's launches: the runs (flat runs, multi-tensor lists) by their first
    member, each other parameter with a gradient by its own strategy (``prepare(i)``
    readies one not prepared yet), in parameter order; a run that declines leaves its
    members to their own strategies. A step in parts (``step.parts``) launches the
    part's members of each run together (the run's ``part``, kept while these launches
    are: the torch drop-ins' step inside backward steps the same buckets every step).
    Then the passes of parameters split across ranks (``shards``), together
    (runtime/shards.py)."""

    KEPT_PARTS = 256   # (parts' launches kept; more, and the kept ones are dropped)

    def __init__(self, slots: Sequence[ParamSlot], runs: Mapping[int, Strategy],
                 prepare: Callable[[int], Any], shards: Any = None):
        self.slots, self.runs, self.prepare, self.shards = slots, dict(runs), prepare, shards
        self.member = {i: first for first, r in self.runs.items() for i in r.indices}
        self.parts: dict[tuple[int, ...], dict[int, Strategy]] = {}

    def _part_runs(self, step: StepInputs) -> dict[int, Strategy]:
        """First member -> the launch of a part's members of one run (two or more), for
        the part's parameters with a gradient (kept for the next step of that part)."""
        present = tuple([i for i in step.parts if step.grads[i] is not None])
        found = self.parts.get(present)
        if found is None:
            if len(self.parts) >= self.KEPT_PARTS:
                self.parts.clear()
            by: dict[int, list[int]] = {}
            for i in present:
                if i in self.member:
                    by.setdefault(self.member[i], []).append(i)
            made = {members[0]: self.runs[first].part(members)
                    for first, members in by.items() if len(members) > 1}
            found = self.parts[present] = {i: r for i, r in made.items() if r is not None}
        return found

    def run(self, step: StepInputs) -> None:
        slots, stepped = self.slots, set()
        runs = self.runs if step.parts is None else self._part_runs(step)
        order = enumerate(step.grads) if step.parts is None else \
            ((i, step.grads[i]) for i in step.parts)
        for i, g in order:
            if g is None or i in stepped:
                continue
            run = runs.get(i)
            if run is not None and run.run(step):
                stepped.update(run.indices)
                continue
            s = slots[i]
            if s.strategy is None:
                self.prepare(i)
            s.strategy.run(step)
        if step.gathered:
            sum_all(step.gathered)
        if step.pending:
            shards_.run(self.shards, step.pending)


def sum_all(items: Sequence[Generator]) -> None:
    """Drive the passes of the parameters whose rule sums over all of them (one
    generator each, from ``Gathered``): each yields its parts (buffer -> float64),
    the parts are added in parameter order, and each is sent the totals."""
    parts = [next(it) for it in items]
    names = set(parts[0])
    if any(set(p) != names for p in parts):
        raise ValueError(f"the parameters' kernels sum different values over all "
                         f"parameters ({sorted(names)} vs others): global_sum() must sum "
                         "the same values under every flag combination")
    totals = {n: float(np.sum([p[n] for p in parts], dtype=np.float64)) for n in sorted(names)}
    for it in items:
        with contextlib.suppress(StopIteration):
            it.send(totals)

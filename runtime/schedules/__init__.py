"""Learning-rate schedules: pure functions of the step, composable, validated.

A schedule is called as ``schedule(step)`` where ``step`` is the number of updates
already applied (0 for the first update) and returns the learning rate of that update
as a Python float. Schedules hold no mutable state, so resuming at step k gives the
same learning rate as an uninterrupted run.

    lr = schedules.cosine(1e-3, 1000, warmup_steps=100)
    opt = optgen.create("adam", params, lr=lr)

What a user may pass as a learning rate (a float, a per-step sequence, a schedule or any
callable step -> lr) is normalized by ``as_schedule``. docs/schedules.md states each
formula and its relation to MXNet, torch.optim.lr_scheduler and optax.

This module is the public face: the constructors below. The classes behind them (and
``as_schedule``, which builds them) are in runtime/schedules/kinds.py, the argument
checks in runtime/schedules/args.py.
"""
from __future__ import annotations

from typing import Any, Sequence

from .kinds import (Schedule, _Constant, _Cosine, _Factor, _Join, _LinearWarmup,
                             _MultiFactor, _OneCycle, _Polynomial, _Sequence, as_schedule)

__all__ = ["Schedule", "as_schedule", "constant", "cosine", "factor", "join", "linear_warmup",
           "multi_factor", "one_cycle", "polynomial", "sequence", "step_decay"]


# -- the public constructors ---------------------------------------------------------------
def constant(lr: float) -> Schedule:
    """``lr`` at every step."""
    return _Constant(lr)


def factor(base_lr: float, step_size: int, factor: float,
           stop_factor_lr: float = 1e-8) -> Schedule:
    """``max(base_lr * factor ** (step // step_size), stop_factor_lr)`` (MXNet
    FactorScheduler, torch StepLR). The floor never exceeds base_lr."""
    return _Factor(base_lr, step_size, factor, stop_factor_lr)


step_decay = factor


def multi_factor(base_lr: float, milestones: Sequence[int], factor: float) -> Schedule:
    """``base_lr * factor ** (number of milestones <= step)`` (MXNet MultiFactorScheduler,
    torch MultiStepLR). Milestones are strictly increasing ints > 0."""
    return _MultiFactor(base_lr, milestones, factor)


def polynomial(base_lr: float, max_steps: int, final_lr: float = 0.0, power: float = 2.0,
               warmup_steps: int = 0, warmup_begin_lr: float = 0.0) -> Schedule:
    """Linear warm-up from warmup_begin_lr over warmup_steps, then
    ``final_lr + (base_lr - final_lr) * (1 - p) ** power`` with
    ``p = (step - warmup_steps) / (max_steps - warmup_steps)``; final_lr from max_steps on
    (MXNet PolyScheduler, optax polynomial_schedule, torch PolynomialLR)."""
    return _Polynomial(base_lr, max_steps, final_lr, power, warmup_steps, warmup_begin_lr)


def cosine(base_lr: float, max_steps: int, final_lr: float = 0.0, warmup_steps: int = 0,
           warmup_begin_lr: float = 0.0) -> Schedule:
    """Linear warm-up from warmup_begin_lr over warmup_steps, then
    ``final_lr + (base_lr - final_lr) * (1 + cos(pi * p)) / 2`` with
    ``p = (step - warmup_steps) / (max_steps - warmup_steps)``; final_lr from max_steps on
    (MXNet CosineScheduler, optax warmup_cosine_decay_schedule, torch CosineAnnealingLR)."""
    return _Cosine(base_lr, max_steps, final_lr, warmup_steps, warmup_begin_lr)


def linear_warmup(warmup_steps: int, after: Any, begin_lr: float = 0.0) -> Schedule:
    """``begin_lr + (after(0) - begin_lr) * step / warmup_steps`` for the first
    warmup_steps steps, then ``after(step - warmup_steps)``: the following schedule starts
    at its own step 0 (optax join_schedules). ``after`` is anything ``as_schedule`` takes."""
    return _LinearWarmup(warmup_steps, after, begin_lr)


def one_cycle(max_lr: float, total_steps: int, pct_start: float = 0.3,
              div_factor: float = 25.0, final_div_factor: float = 1e4, anneal: str = "cos",
              three_phase: bool = False) -> Schedule:
    """torch.optim.lr_scheduler.OneCycleLR's learning rates for steps 0..total_steps-1
    (from max_lr / div_factor up to max_lr, then down to max_lr / div_factor /
    final_div_factor); from total_steps on, the value of step total_steps - 1."""
    return _OneCycle(max_lr, total_steps, pct_start, div_factor, final_div_factor, anneal,
                     three_phase)


def join(schedules: Sequence[Any], boundaries: Sequence[int]) -> Schedule:
    """``schedules[0](step)`` before ``boundaries[0]``; from boundary ``b = boundaries[i]``
    on, ``schedules[i + 1](step - b)`` (optax join_schedules). Boundaries are strictly
    increasing ints > 0, one fewer than the schedules."""
    return _Join(schedules, boundaries)


def sequence(values: Any, *, owner: str = "sequence") -> Schedule:
    """The i-th value at step i (MindSpore dynamic learning rate). ``values``: a 1-D array,
    list, tuple or any finite iterable of real numbers >= 0, copied once; a step past the
    end is a ValueError. ``owner`` prefixes error messages."""
    return _Sequence(values, owner)

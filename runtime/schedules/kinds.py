"""The schedule classes behind runtime/schedules.py's constructors: the ``Schedule`` base
(call checks, products) and one class per kind. Pure functions of the step, no mutable
state. Imports schedules.args (the checks)."""
from __future__ import annotations

import abc
import math
from collections.abc import Iterable
from typing import Any, Callable, Sequence

import numpy as np

from .args import (_increasing_ints, _int_arg, _is_real, _lr_result, _materialize,
                            _real_arg, _shown, _step_arg)


# -- the base class ---------------------------------------------------------------------
class Schedule(abc.ABC):
    """A learning rate as a pure function of the step (updates already applied).

    ``schedule(step)`` checks the step (an int >= 0) and the result (a finite float
    >= 0). ``s * x`` and ``x * s`` (x a real number >= 0 or another schedule) are the
    pointwise product."""

    kind = "schedule"
    __array_ufunc__ = None  # numpy scalars defer to __rmul__ instead of broadcasting

    def __call__(self, step: int) -> float:
        step = _step_arg(self._where, step)
        return _lr_result(self._where, self._lr(step), step)

    @property
    def _where(self) -> str:
        """The prefix of this schedule's error messages."""
        return self.kind

    @abc.abstractmethod
    def _lr(self, step: int) -> float:
        """The learning rate at a checked step."""

    def __mul__(self, other: Any) -> "Schedule":
        if isinstance(other, Schedule):
            return _Product(self, other)
        return _Product(self, _factor_arg(other))

    def __rmul__(self, other: Any) -> "Schedule":
        return _Product(_factor_arg(other), self)


def _factor_arg(other: Any) -> float:
    """The real-number side of a product with a schedule."""
    if not _is_real(other):
        raise TypeError(f"product: a schedule multiplies a real number >= 0 or another "
                        f"schedule, got {type(other).__name__} {_shown(other)}")
    return _real_arg("product", "factor", other)


class _Constant(Schedule):
    kind = "constant"

    def __init__(self, lr: float):
        self.lr = _real_arg(self.kind, "lr", lr)

    def _lr(self, step: int) -> float:
        return self.lr

    def __repr__(self) -> str:
        return f"constant({self.lr!r})"


class _Factor(Schedule):
    kind = "factor"

    def __init__(self, base_lr: float, step_size: int, factor: float, stop_factor_lr: float):
        self.base_lr = _real_arg(self.kind, "base_lr", base_lr)
        self.step_size = _int_arg(self.kind, "step_size", step_size, 1)
        self.factor = _real_arg(self.kind, "factor", factor, high=1.0)
        self.stop_factor_lr = _real_arg(self.kind, "stop_factor_lr", stop_factor_lr)

    def _lr(self, step: int) -> float:
        floor = min(self.stop_factor_lr, self.base_lr)
        return max(self.base_lr * self.factor ** (step // self.step_size), floor)

    def __repr__(self) -> str:
        return (f"factor(base_lr={self.base_lr!r}, step_size={self.step_size}, "
                f"factor={self.factor!r}, stop_factor_lr={self.stop_factor_lr!r})")


class _MultiFactor(Schedule):
    kind = "multi_factor"

    def __init__(self, base_lr: float, milestones: Sequence[int], factor: float):
        self.base_lr = _real_arg(self.kind, "base_lr", base_lr)
        self.milestones = _increasing_ints(self.kind, "milestones", milestones)
        if not self.milestones:
            raise ValueError(f"{self.kind}: milestones must not be empty")
        self.factor = _real_arg(self.kind, "factor", factor, high=1.0)

    def _lr(self, step: int) -> float:
        passed = sum(1 for m in self.milestones if m <= step)
        return self.base_lr * self.factor ** passed

    def __repr__(self) -> str:
        return (f"multi_factor(base_lr={self.base_lr!r}, milestones={list(self.milestones)}, "
                f"factor={self.factor!r})")


def _warmup_lr(step: int, warmup_steps: int, begin_lr: float, target_lr: float) -> float:
    """Linear ramp: begin_lr at step 0, reaching target_lr at step warmup_steps."""
    return begin_lr + (target_lr - begin_lr) * step / warmup_steps


class _Decay(Schedule):
    """Warm-up, then a decay from base_lr at step warmup_steps to final_lr at max_steps,
    then final_lr (the shape shared by polynomial and cosine)."""

    def __init__(self, base_lr: float, max_steps: int, final_lr: float, warmup_steps: int,
                 warmup_begin_lr: float):
        self.base_lr = _real_arg(self.kind, "base_lr", base_lr)
        self.max_steps = _int_arg(self.kind, "max_steps", max_steps, 1)
        self.final_lr = _real_arg(self.kind, "final_lr", final_lr)
        self.warmup_steps = _int_arg(self.kind, "warmup_steps", warmup_steps, 0)
        self.warmup_begin_lr = _real_arg(self.kind, "warmup_begin_lr", warmup_begin_lr)
        if self.warmup_steps >= self.max_steps:
            raise ValueError(f"{self.kind}: warmup_steps must be < max_steps, got "
                             f"warmup_steps={self.warmup_steps}, max_steps={self.max_steps}")

    def _lr(self, step: int) -> float:
        if step < self.warmup_steps:
            return _warmup_lr(step, self.warmup_steps, self.warmup_begin_lr, self.base_lr)
        if step >= self.max_steps:
            return self.final_lr
        progress = (step - self.warmup_steps) / (self.max_steps - self.warmup_steps)
        return self.final_lr + (self.base_lr - self.final_lr) * self._shape(progress)

    @abc.abstractmethod
    def _shape(self, progress: float) -> float:
        """The decay's weight of base_lr: 1 at progress 0, 0 at progress 1."""

    def _fields(self) -> str:
        return (f"base_lr={self.base_lr!r}, max_steps={self.max_steps}, "
                f"final_lr={self.final_lr!r}")

    def _warmup_fields(self) -> str:
        return (f", warmup_steps={self.warmup_steps}, warmup_begin_lr={self.warmup_begin_lr!r}"
                if self.warmup_steps else "")


class _Polynomial(_Decay):
    kind = "polynomial"

    def __init__(self, base_lr, max_steps, final_lr, power, warmup_steps, warmup_begin_lr):
        super().__init__(base_lr, max_steps, final_lr, warmup_steps, warmup_begin_lr)
        self.power = _real_arg(self.kind, "power", power, low_open=True)

    def _shape(self, progress: float) -> float:
        return (1.0 - progress) ** self.power

    def __repr__(self) -> str:
        return f"polynomial({self._fields()}, power={self.power!r}{self._warmup_fields()})"


class _Cosine(_Decay):
    kind = "cosine"

    def _shape(self, progress: float) -> float:
        return (1.0 + math.cos(math.pi * progress)) / 2.0

    def __repr__(self) -> str:
        return f"cosine({self._fields()}{self._warmup_fields()})"


class _LinearWarmup(Schedule):
    kind = "linear_warmup"

    def __init__(self, warmup_steps: int, after: Any, begin_lr: float):
        self.warmup_steps = _int_arg(self.kind, "warmup_steps", warmup_steps, 0)
        self.after = as_schedule(after, owner=f"{self.kind}: after")
        self.begin_lr = _real_arg(self.kind, "begin_lr", begin_lr)

    def _lr(self, step: int) -> float:
        if step < self.warmup_steps:
            return _warmup_lr(step, self.warmup_steps, self.begin_lr, self.after(0))
        return self.after(step - self.warmup_steps)

    def __repr__(self) -> str:
        return f"linear_warmup({self.warmup_steps}, {self.after!r}, begin_lr={self.begin_lr!r})"


class _OneCycle(Schedule):
    """torch.optim.lr_scheduler.OneCycleLR's phases and arithmetic, as a function of step."""

    kind = "one_cycle"

    def __init__(self, max_lr, total_steps, pct_start, div_factor, final_div_factor, anneal,
                 three_phase):
        self.max_lr = _real_arg(self.kind, "max_lr", max_lr)
        self.total_steps = _int_arg(self.kind, "total_steps", total_steps, 1)
        self.pct_start = _real_arg(self.kind, "pct_start", pct_start, high=1.0)
        self.div_factor = _real_arg(self.kind, "div_factor", div_factor, low_open=True)
        self.final_div_factor = _real_arg(self.kind, "final_div_factor", final_div_factor,
                                          low_open=True)
        if anneal not in ("cos", "linear"):
            raise ValueError(f"{self.kind}: anneal must be 'cos' or 'linear', got {anneal!r}")
        self.anneal = anneal
        if not isinstance(three_phase, (bool, np.bool_)):
            raise TypeError(f"{self.kind}: three_phase must be a bool, got "
                            f"{type(three_phase).__name__} {three_phase!r}")
        self.three_phase = bool(three_phase)
        initial = self.max_lr / self.div_factor
        minimum = initial / self.final_div_factor
        warm_end = float(self.pct_start * self.total_steps) - 1
        if warm_end == 0:
            raise ValueError(f"{self.kind}: pct_start * total_steps must not be 1 (the warm-up "
                             f"phase would last zero steps), got pct_start={self.pct_start!r}, "
                             f"total_steps={self.total_steps}")
        last = self.total_steps - 1
        if self.three_phase:
            self._phases = ((warm_end, initial, self.max_lr),
                            (float(2 * self.pct_start * self.total_steps) - 2, self.max_lr,
                             initial),
                            (last, initial, minimum))
        else:
            self._phases = ((warm_end, initial, self.max_lr), (last, self.max_lr, minimum))

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _lr(self, step: int) -> float:
        step = min(step, self.total_steps - 1)
        start_step = 0.0
        for i, (end_step, start_lr, end_lr) in enumerate(self._phases):
            if step <= end_step or i == len(self._phases) - 1:
                return self._anneal(start_lr, end_lr, (step - start_step) / (end_step - start_step))
            start_step = end_step
        raise AssertionError("the last phase always answers")

    def __repr__(self) -> str:
        return (f"one_cycle(max_lr={self.max_lr!r}, total_steps={self.total_steps}, "
                f"pct_start={self.pct_start!r}, div_factor={self.div_factor!r}, "
                f"final_div_factor={self.final_div_factor!r}, anneal={self.anneal!r}, "
                f"three_phase={self.three_phase})")


class _Join(Schedule):
    kind = "join"

    def __init__(self, schedules: Sequence[Any], boundaries: Sequence[int]):
        if isinstance(schedules, (str, bytes)) or not isinstance(schedules, Iterable):
            raise TypeError(f"{self.kind}: schedules must be a list of schedules, got "
                            f"{type(schedules).__name__} {_shown(schedules)}")
        self.schedules = tuple(as_schedule(s, owner=f"{self.kind}: schedules[{i}]")
                               for i, s in enumerate(schedules))
        self.boundaries = _increasing_ints(self.kind, "boundaries", boundaries)
        if not self.schedules:
            raise ValueError(f"{self.kind}: schedules must not be empty")
        if len(self.boundaries) != len(self.schedules) - 1:
            raise ValueError(f"{self.kind}: boundaries must have one value fewer than "
                             f"schedules, got {len(self.schedules)} schedules and "
                             f"{len(self.boundaries)} boundaries")

    def _lr(self, step: int) -> float:
        schedule, start = self.schedules[0], 0
        for boundary, following in zip(self.boundaries, self.schedules[1:]):
            if step < boundary:
                break
            schedule, start = following, boundary
        return schedule(step - start)

    def __repr__(self) -> str:
        inner = ", ".join(repr(s) for s in self.schedules)
        return f"join([{inner}], boundaries={list(self.boundaries)})"


class _Sequence(Schedule):
    kind = "sequence"

    def __init__(self, values: Any, owner: str):
        self.owner = owner
        self.values = _materialize(values, owner)

    @property
    def _where(self) -> str:
        return self.owner

    def _lr(self, step: int) -> float:
        if step >= len(self.values):
            raise ValueError(f"{self.owner}: lr sequence has {len(self.values)} values and "
                             f"step {step} was requested (steps 0..{len(self.values) - 1} "
                             "are defined)")
        return float(self.values[step])

    def __repr__(self) -> str:
        v = [repr(float(x)) for x in self.values]
        shown = ", ".join(v if len(v) <= 6 else v[:3] + ["..."] + v[-2:])
        return f"sequence([{shown}])" if len(v) <= 6 else f"sequence({len(v)} values: [{shown}])"


class _Function(Schedule):
    """A user's callable step -> lr, its results checked."""

    kind = "function"

    def __init__(self, fn: Callable[[int], Any], owner: str):
        self.fn = fn
        self.owner = owner

    @property
    def _where(self) -> str:
        return self.owner

    def _lr(self, step: int) -> Any:
        return self.fn(step)

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", None) or repr(self.fn)
        return f"as_schedule({name})"


class _Product(Schedule):
    kind = "product"

    def __init__(self, left: Schedule | float, right: Schedule | float):
        self.left = left
        self.right = right

    @staticmethod
    def _value(term: Schedule | float, step: int) -> float:
        return term(step) if isinstance(term, Schedule) else term

    def _lr(self, step: int) -> float:
        return self._value(self.left, step) * self._value(self.right, step)

    def __repr__(self) -> str:
        return f"({self.left!r} * {self.right!r})"


def as_schedule(lr: Any, owner: str = "optimizer") -> Schedule:
    """A Schedule from what a user passes as a learning rate.

    A real number (not bool) -> ``constant``; a Schedule -> itself; a numpy array, list,
    tuple or other non-callable iterable -> ``sequence``; any other callable step -> lr ->
    wrapped so each result is checked (a finite real number >= 0). Errors name ``owner``."""
    if isinstance(lr, Schedule):
        return lr
    if isinstance(lr, (bool, np.bool_)):
        raise TypeError(f"{owner}: lr must be a real number, a sequence, a schedule or a "
                        f"callable step -> lr, got bool {lr!r}")
    if _is_real(lr):
        v = float(lr)
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{owner}: lr must be a finite real number >= 0, got {_shown(lr)}")
        return _Constant(v)
    if isinstance(lr, (np.ndarray, list, tuple)):
        return _Sequence(lr, owner)
    if callable(lr):
        return _Function(lr, owner)
    if isinstance(lr, Iterable) and not isinstance(lr, (str, bytes, bytearray)):
        return _Sequence(lr, owner)
    raise TypeError(f"{owner}: lr must be a real number, a sequence, a schedule or a "
                    f"callable step -> lr, got {type(lr).__name__} {_shown(lr)}")

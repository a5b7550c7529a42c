"""Argument and result checks of the learning-rate schedules (runtime/schedules.py): each
takes the value it checks and the names its error message shows, and raises TypeError or
ValueError naming the schedule, the argument and the rule. Imports numpy only."""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np


# -- argument checks ----------------------------------------------------------------------
def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _shown(value: Any) -> str:
    """A value as messages show it: numpy scalars as the Python number they hold."""
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


def _int_arg(kind: str, name: str, value: Any, minimum: int) -> int:
    """``value`` as an int >= minimum (TypeError for a non-int, ValueError below it)."""
    rule = "an int > 0" if minimum == 1 else f"an int >= {minimum}"
    if not _is_int(value):
        raise TypeError(f"{kind}: {name} must be {rule}, got {type(value).__name__} "
                        f"{_shown(value)}")
    if value < minimum:
        raise ValueError(f"{kind}: {name} must be {rule}, got {_shown(value)}")
    return int(value)


def _real_arg(kind: str, name: str, value: Any, low: float = 0.0, low_open: bool = False,
              high: float | None = None) -> float:
    """``value`` as a finite float with ``low <= value`` (``<`` when ``low_open``) and,
    when ``high`` is given, ``value <= high``."""
    if high is None:
        rule = f"a finite real number {'>' if low_open else '>='} {low:g}"
    else:
        rule = f"a finite real number with {low:g} {'<' if low_open else '<='} {name} <= {high:g}"
    if not _is_real(value):
        raise TypeError(f"{kind}: {name} must be {rule}, got {type(value).__name__} "
                        f"{_shown(value)}")
    v = float(value)
    in_range = (v > low if low_open else v >= low) and (high is None or v <= high)
    if not (math.isfinite(v) and in_range):
        raise ValueError(f"{kind}: {name} must be {rule}, got {_shown(value)}")
    return v


def _increasing_ints(kind: str, name: str, values: Any) -> tuple[int, ...]:
    """A strictly increasing sequence of ints > 0 (milestones, boundaries)."""
    rule = "a strictly increasing sequence of ints > 0"
    if isinstance(values, (str, bytes)) or not isinstance(values, (Iterable, np.ndarray)):
        raise TypeError(f"{kind}: {name} must be {rule}, got {type(values).__name__} "
                        f"{_shown(values)}")
    values = list(values)
    for v in values:
        if not _is_int(v):
            raise TypeError(f"{kind}: {name} must be {rule}, got {type(v).__name__} "
                            f"{_shown(v)} in {values!r}")
    values = [int(v) for v in values]
    if any(v < 1 for v in values) or any(b <= a for a, b in zip(values, values[1:])):
        raise ValueError(f"{kind}: {name} must be {rule}, got {values!r}")
    return tuple(values)


def _step_arg(where: str, step: Any) -> int:
    if not _is_int(step):
        raise TypeError(f"{where}: step must be an int >= 0, got {type(step).__name__} "
                        f"{_shown(step)}")
    if step < 0:
        raise ValueError(f"{where}: step must be an int >= 0, got {_shown(step)}")
    return int(step)


def _lr_result(where: str, value: Any, step: int) -> float:
    """A schedule's value as a float: a finite real number >= 0 (0-d real arrays allowed)."""
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iuf":
        value = value.item()
    if not _is_real(value):
        raise TypeError(f"{where}: lr schedule returned {type(value).__name__} "
                        f"{_shown(value)} at step {step}: must be a finite real number")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{where}: lr schedule returned {v!r} at step {step}: "
                         "must be a finite real number")
    if v < 0:
        raise ValueError(f"{where}: lr schedule returned {v!r} at step {step}: must be >= 0")
    return v


def _materialize(values: Any, owner: str) -> np.ndarray:
    """A finite iterable of real numbers >= 0 as a read-only 1-D float64 array (a copy)."""
    if isinstance(values, (str, bytes, bytearray, Mapping, set, frozenset)):
        raise TypeError(f"{owner}: lr sequence must be an ordered 1-D sequence of real "
                        f"numbers, got {type(values).__name__}")
    if not isinstance(values, np.ndarray) and not hasattr(values, "__array__"):
        values = list(values)
        for v in values:
            if isinstance(v, (bool, np.bool_)):
                raise TypeError(f"{owner}: lr sequence must hold real numbers, got bool {v!r}")
    try:
        arr = np.array(values, copy=True)
    except (ValueError, TypeError) as e:
        raise TypeError(f"{owner}: lr sequence must be a 1-D sequence of real numbers; "
                        f"numpy could not read it: {e}") from None
    if arr.ndim != 1:
        raise ValueError(f"{owner}: lr sequence must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{owner}: lr sequence must hold real numbers, got dtype {arr.dtype}")
    if len(arr) == 0:
        raise ValueError(f"{owner}: lr sequence is empty: it needs one value per step")
    arr = arr.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(arr))
    if len(bad):
        raise ValueError(f"{owner}: lr sequence value {bad[0]} is {float(arr[bad[0]])!r}: "
                         "must be a finite real number")
    bad = np.flatnonzero(arr < 0)
    if len(bad):
        raise ValueError(f"{owner}: lr sequence value {bad[0]} is {float(arr[bad[0]])!r}: "
                         "must be >= 0")
    arr.flags.writeable = False
    return arr

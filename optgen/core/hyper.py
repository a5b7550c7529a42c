"""Hyperparameter descriptions and their validation (shared by compiler and runtime).

Every message names the optimizer, the hyperparameter, the bad value and the rule, in
the manner of torch.optim: ``adam: invalid beta1=1.0: must satisfy 0 <= beta1 < 1``.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np

from . import scalar_expr

TYPES = ("float", "int", "bool")


@dataclass(frozen=True)
class HyperInfo:
    """One hyperparameter as a manifest records it.

    ``type == "bool"`` marks a compile-time flag (each value has its own kernel); float and
    int hyperparameters are run-time kernel arguments. ``optional`` ones accept None, which
    the kernel sees as ``none_value`` (e.g. clip_gradient=None is +inf: no clipping); an
    infinite value equal to ``none_value`` is taken as None (``growth_rate=float("inf")``).
    ``tuple`` names the torch-style tuple that holds it (``"eps"``: ``eps=(eps1, eps2)``);
    the spec's hyperparameters of one tuple form it in the order they are declared.
    """

    name: str
    default: Any
    type: str = "float"
    constraint: str | None = None
    doc: str = ""
    optional: bool = False
    none_value: float | None = None
    tuple: str | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        if d["none_value"] is not None:
            d["none_value"] = repr(float(d["none_value"]))  # "inf" survives JSON
        return d

    @classmethod
    def from_json(cls, d: Mapping) -> "HyperInfo":
        d = dict(d)
        if d.get("none_value") is not None:
            d["none_value"] = float(d["none_value"])
        return cls(**d)

    @property
    def is_flag(self) -> bool:
        return self.type == "bool"


@dataclass(frozen=True)
class Requirement:
    """A rule over several hyperparameters, e.g. nesterov needs momentum > 0."""

    expr: str
    message: str

    def to_json(self) -> dict:
        return asdict(self)


def coerce(owner: str, info: HyperInfo, value: Any) -> Any:
    """Check the type of one value and normalize it (float / int / bool / None)."""
    where = f"{owner}: hyperparameter {info.name}"
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()   # a 0-d numpy array or torch tensor holds one number
    if value is None:
        if info.optional:
            return None
        raise TypeError(f"{where} must be a {info.type}, got None (it is not optional)")
    if info.type == "bool":
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise TypeError(f"{where} is a flag and must be a bool, got {type(value).__name__} {value!r}")
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{where} must be a {info.type}, got bool {value!r}")
    if info.type == "int":
        if isinstance(value, numbers.Integral):
            return int(value)
        raise TypeError(f"{where} must be an int, got {type(value).__name__} {value!r}")
    if not isinstance(value, numbers.Real):
        raise TypeError(f"{where} must be a float, got {type(value).__name__} {value!r}")
    try:
        value = float(value)
    except OverflowError:   # an int beyond the float range (10**400)
        raise ValueError(f"{where} must be finite, got an int of {value.bit_length()} bits") from None
    if math.isinf(value) and info.optional and value == info.none_value:
        return None   # (the value None stands for: growth_rate=float("inf") is unbounded)
    if not math.isfinite(value):
        raise ValueError(f"{where} must be finite, got {value!r}")
    return value


def check_constraint(owner: str, info: HyperInfo, value: Any, env: Mapping[str, Any]) -> None:
    if info.constraint is None or value is None:
        return
    if not scalar_expr.evaluate(info.constraint, {**env, info.name: value}):
        raise ValueError(f"{owner}: invalid {info.name}={value!r}: must satisfy {info.constraint}")


def check_requirements(owner: str, reqs, env: Mapping[str, Any]) -> None:
    for req in reqs:
        if not scalar_expr.evaluate(req.expr, env):
            used = sorted(scalar_expr.names(req.expr))
            shown = ", ".join(f"{n}={env.get(n)!r}" for n in used)
            raise ValueError(f"{owner}: invalid hyperparameters ({shown}): {req.message} "
                             f"(rule: {req.expr})")


def resolve(owner: str, infos: Mapping[str, HyperInfo], reqs, current: Mapping[str, Any],
            changes: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``current`` updated by ``changes``, or raise without changing anything."""
    unknown = [k for k in changes if k not in infos]
    if unknown:
        raise TypeError(f"{owner}: unknown hyperparameter {unknown[0]!r}; "
                        f"known: {', '.join(infos)}")
    new = dict(current)
    for k, v in changes.items():
        new[k] = coerce(owner, infos[k], v)
    for k in changes:
        check_constraint(owner, infos[k], new[k], new)
    check_requirements(owner, reqs, new)
    return new


# -- a setting that exercises a spec: optgen check and the kernel-vs-reference tests ------
EXERCISE_CANDIDATES = [0.5, 0.9, 0.1, 0.03, 0.7, 1e-3, 2.0, -0.5, -2.0]   # (< 0: x <= 0)
# integers: small counts, so that a refresh interval or an iteration count runs within
# the few steps a check takes (and stays cheap)
INT_CANDIDATES = [2, 3, 1, 4, 0]


def valid(art, hyper: Mapping[str, Any]) -> bool:
    """Whether ``hyper`` passes every constraint and requirement of ``art``'s spec."""
    try:
        resolve(art.name, art.hypers, art.requirements,
                {n: h.default for n, h in art.hypers.items()}, hyper)
        return True
    except ValueError:
        return False


def candidates(info: HyperInfo) -> list[Any]:
    """Values off ``info``'s default to try, by its kind: an optional hyperparameter
    with a value goes to None first (the path its ``none_value`` takes); one at None,
    an int or a float takes a number of its type. Flags have none: a caller runs both
    values (``optgen check`` steps every combination)."""
    if info.is_flag:
        return []
    pool = INT_CANDIDATES if info.type == "int" else EXERCISE_CANDIDATES
    first = [None] if info.optional and info.default is not None else []
    return first + [c for c in pool if c != info.default]


def busy_hypers(art, flags: Mapping[str, bool]) -> dict[str, Any]:
    """Every hyperparameter moved off its default to a valid value, found generically
    from the constraints: floats and ints to another number (so momentum, weight decay,
    clipping and refresh intervals are exercised), optional ones between None and a
    value; ``flags`` as given (``optgen check`` runs each flag at both values). Where a
    requirement rejects the mix, one change is undone."""
    values = {n: h.default for n, h in art.hypers.items()}
    values.update(flags)
    heads = {ln["heads"] for k in art.kernels for ln in k.launches if "heads" in ln}
    for name, info in art.hypers.items():   # (a number of heads must divide R: kept)
        for c in candidates(info) if name not in heads else ():
            try:
                values = resolve(art.name, art.hypers, [], values, {name: c})
                break
            except (TypeError, ValueError):
                continue
    if not valid(art, values):  # a requirement rejects the mix: undo one change
        for name, info in art.hypers.items():
            trial = {**values, name: info.default}
            if not info.is_flag and valid(art, trial):
                return trial
    return values

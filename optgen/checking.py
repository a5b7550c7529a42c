"""``optgen check``: a spec's compiled kernels stepped side by side with the reference
interpreter on random data, every dtype and flag combination, with the default
hyperparameters and with every one moved off its default; the largest error of the
parameters and of every state against the tolerance, and where it is (optgen/cli.py
prints it; optgen.commands has these names too).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from optgen.core import hyper as hyper_rules
from optgen.core import progress
from optgen.runtime.artifact import Artifact

SHAPES = [(37, 23), (1009,), (16,), (1,)]   # rows/columns, a prime, a vector width, one
STEPS = 5
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}   # relative to the tensor's scale (tests/helpers.py)


PARAM = "w"          # the parameters' entry in CheckResult.errors (states by their names)


@dataclass
class CheckResult:
    dtype: str
    setting: str                  # "default" or "busy" hyperparameters
    flags: dict[str, bool]
    max_abs: float                # the absolute error where max_rel is
    max_rel: float
    skipped: str | None = None    # why this combination was not run (a requirement)
    nonfinite: int = 0            # NaN/inf elements in the reference's result (a spec bug?)
    worst: str = PARAM            # where max_rel is: PARAM or a state's name
    errors: dict[str, float] = field(default_factory=dict)   # PARAM / state -> max_rel
    hyper: dict[str, Any] = field(default_factory=dict)      # the setting's values

    @property
    def ok(self) -> bool:
        return self.skipped is not None or self.max_rel <= TOLERANCE[self.dtype]

    @property
    def failed(self) -> list[str]:
        """What differs beyond the tolerance: PARAM and the states' names."""
        tol = TOLERANCE[self.dtype]
        return [n for n, e in self.errors.items() if not e <= tol] or \
            ([] if self.ok else [self.worst])


def describe(name: str) -> str:
    """An entry of ``CheckResult.errors`` in words: "the parameters", "state m"."""
    return "the parameters" if name == PARAM else f"state {name}"


def random_statistics(opt, rng: np.random.Generator) -> dict[str, list]:
    """Statistics for a spec that reads them (THOR's A and G) on a step that refreshes:
    for each 2-D parameter a random symmetric positive definite matrix, x^T x as a
    batch of inputs would give; {} on other steps and for other specs."""
    art = opt.artifact
    if not art.statistics or not opt.refresh_due:
        return {}
    out = {}
    for name, shape in art.statistics.items():
        mats = []
        for p in opt.params:
            n = None if p.ndim != 2 else p.shape[0] if shape == "rr" else p.shape[1]
            x = None if n is None else rng.standard_normal((n + 3, n))
            mats.append(None if x is None else x.T @ x)
        out[name] = mats
    return out


def check(art: Artifact, seed: int = 0) -> list[CheckResult]:
    """Step the compiled kernels and the reference interpreter side by side, STEPS steps
    on SHAPES, for every dtype and every combination of the spec's flags, with the
    default hyperparameters and with every one moved off its default ("busy": momentum,
    weight decay, clipping on, integers changed, optional ones between None and a
    value: ``optgen.core.hyper.busy_hypers``); then compare the parameters and every
    state (tensor and scalar): the largest error relative to max(1, the array's largest
    |reference value|) and where it is. ``check_each`` gives them one by one."""
    return list(check_each(art, seed))


def check_each(art: Artifact, seed: int = 0) -> Iterator[CheckResult]:
    """``check``'s results as each is computed (dtype by dtype, flags by flags, default
    then busy): each variant is built when its first result needs it, so the first
    comes before the last variant is built. Reports its progress (optgen.core.progress:
    the variant k of n, its build's stages, then verify)."""
    user_flags = sorted(art.flags)
    combos = [(dtype, dict(zip(user_flags, bits))) for dtype in art.dtypes
              for bits in itertools.product([False, True], repeat=len(user_flags))]
    for k, (dtype, flags) in enumerate(combos, 1):
        names = [v for v, d in art.variants.items()
                 if d["param_dtype"] == dtype and d["flags"] == flags]
        progress.task(f"check {art.name}, variant {names[0] if names else dtype} "
                      f"({k} of {len(combos)})")
        art.ensure(names)
        progress.stage("verify")
        for setting in ("default", "busy"):
            yield _check_one(art, dtype, flags, setting, seed)


def _check_one(art: Artifact, dtype: str, flags: dict[str, bool], setting: str,
               seed: int) -> CheckResult:
    """One line of ``check``: one dtype, flag values and setting."""
    import optgen
    hyper = hyper_rules.busy_hypers(art, flags) if setting == "busy" else flags
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    try:
        twins = [optgen.create(art, [p.copy() for p in params], backend=b, **hyper)
                 for b in ("compiled", "reference")]
    except ValueError as e:      # a requirement rules this combination out
        return CheckResult(dtype, setting, flags, 0.0, 0.0, skipped=str(e), hyper=dict(hyper))
    for _ in range(STEPS):
        grads = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
        extra = {n: [rng.standard_normal(s).astype(dtype) for s in SHAPES]
                 for n in art.inputs}
        extra.update(random_statistics(twins[0], rng))
        for opt in twins:
            opt.step([g.copy() for g in grads],
                     **{n: [None if a is None else a.copy() for a in v]
                        for n, v in extra.items()})
    return compare(twins[0], twins[1], dtype, setting, flags, dict(hyper))


def compare(got, want, dtype: str, setting: str, flags: dict[str, bool],
            hyper: dict[str, Any]) -> CheckResult:
    """The parameters and every state of optimizer ``got`` against ``want``'s."""
    pairs = [(PARAM, a, b) for a, b in zip(got.params, want.params)]
    for sg, sw in zip(got.state, want.state):   # (a state one side lacks: inf)
        pairs += [(n, sg.get(n), sw.get(n)) for n in sorted({*sg, *sw})]
    errors: dict[str, float] = {}
    absolute: dict[str, float] = {}
    nonfinite = 0
    for name, a, b in pairs:
        err_abs, err_rel, bad = _error(a, b)
        nonfinite += bad
        absolute[name] = max(absolute.get(name, 0.0), err_abs)
        errors[name] = max(errors.get(name, 0.0), err_rel)
    worst = max(errors, key=lambda n: errors[n], default=PARAM)
    if errors.get(PARAM, 0.0) == errors.get(worst, 0.0):
        worst = PARAM                # (ties: the parameters)
    return CheckResult(dtype, setting, flags, absolute.get(worst, 0.0),
                       errors.get(worst, 0.0), nonfinite=nonfinite, worst=worst,
                       errors=errors, hyper=hyper)


def _error(got: Any, want: Any) -> tuple[float, float, int]:
    """(largest absolute error, largest relative to max(1, max|want|), NaN/inf
    elements of ``want``) of one array or scalar; inf where ``got`` has NaN/inf where
    ``want`` has none (or another inf)."""
    if got is None or want is None:
        return math.inf, math.inf, 0
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    nonfinite = int(np.count_nonzero(~np.isfinite(want)))
    if got.shape != want.shape or not np.array_equal(np.isnan(got), np.isnan(want)) or \
            not np.array_equal(got[np.isinf(want)], want[np.isinf(want)]):
        return math.inf, math.inf, nonfinite
    finite = np.isfinite(want)
    err = np.abs(got[finite] - want[finite])
    if not err.size:
        return 0.0, 0.0, nonfinite
    scale = max(1.0, float(np.max(np.abs(want[finite]), initial=0.0)))
    return float(err.max()), float(err.max()) / scale, nonfinite

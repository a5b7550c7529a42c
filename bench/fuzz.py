#!/usr/bin/env python
"""Robustness fuzzing of the trainer-side runtime: random optimizer calls against every
catalog spec, each checked against the rules of docs/runtime.md.

    python bench/fuzz.py                                # 10,000 calls, seed 0
    python bench/fuzz.py --calls 2000 --seed 7 --json fuzz.json
    python bench/fuzz.py --replay 0:1234                # call 1234 of seed 0, in-process, verbose

One *call* is: construct a compiled optimizer and a ``backend="reference"`` twin from
identical copies of random parameters (shapes with 0, 1, 15, 16, 17 and prime sizes,
0-d to 4-D; float32/float64, float16/bfloat16 with and without multi_precision, and
invalid dtypes: int, bool, complex, big-endian, long double), laid out plainly, at byte
offsets inside a bigger buffer (element-aligned or not), strided, transposed, Fortran
ordered, read-only, broadcast, ndarray subclasses; random hyperparameters (valid and
invalid: 0, -0, 1e-38, 1e38, 1e-310, 5e-324, NaN, inf, negatives, str, None, lists,
0-d arrays, numpy scalars, lr sequences, callables and schedules), runtime options and
parameter groups; 0-2 warm-up steps; maybe a ``set_hyper``; then one step with random
gradients (extremes, NaN/Inf, wrong dtype/shape/layout, aliasing the parameter, a
state or another parameter, row-sparse, None, wrong count) and, for SVRG, extra inputs.

Each phase must either succeed or raise a TypeError or ValueError (FloatingPointError
where ``nonfinite``/``clip_global_norm`` ask for it). A failed phase must leave
parameters, states and step counts bit-identical, the reference twin must fail the same
way, and the optimizer must go on as if the call never happened (one more good step,
compared). A successful phase must give what the reference interpreter gives (the same
states, dtypes and shapes; in calls whose numbers stay in [1e-30, 1e12], see TAME, NaN
and ±inf at the same places and finite values within the tests' tolerances, float32
rounding noise judged against a float64 run, see ``compare``) and must not write to its
gradients. Inputs the rules call invalid must be rejected; valid ones accepted.

The generator is written against a tiny ``Draw`` interface (``integer(lo, hi)``), so the
same code runs from a numpy RNG here and from hypothesis in tests/test_fuzz.py, which
imports this file. Calls run in child processes (``--chunk`` calls each): a child that
dies (a segfault) is counted as a crash of the call it was running, with the seed and
call index to replay, and the rest of its chunk goes on in a new child.
"""
from __future__ import annotations

import abc
import argparse
import decimal
import fractions
import json
import math
import os
import subprocess
import sys
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import optgen
from optgen.commands import random_statistics
from optgen.runtime import RowSparse, catalog, schedules, tensors
from optgen.runtime import hyper as hyper_rules

# -- what is checked -------------------------------------------------------------------
TYPED = (TypeError, ValueError)
BUG_KINDS = ("crash", "partial", "mismatch", "divergent", "accepted-invalid",
             "rejected-valid", "grad-written", "param-written", "harness")
# float32/float64/float16 tolerances of tests/helpers.py (TOL, SCALE_ATOL); bench/ does not
# import tests/, so the numbers are repeated here (tests/test_fuzz.py passes helpers'
# assert_close itself). bfloat16 (only w_low, the rounded master) gets 2 of its ulps.
TOL = {"float32": (1e-5, 1e-6, 1e-5), "float64": (1e-12, 1e-13, 1e-12),
       "float16": (2.5e-3, 1e-6, 1e-3), "bfloat16": (2 ** -6, 1e-6, 2 ** -6)}


def assert_close(actual, expected, dtype: str, msg: str) -> None:
    """tests/helpers.assert_close: rtol, and atol scaled by the largest finite value."""
    expected = np.asarray(expected)
    if expected.dtype == np.float16:
        dtype = "float16"
    rtol, atol, scale_atol = TOL[dtype]
    scale = float(np.max(np.abs(expected[np.isfinite(expected)]), initial=0.0))
    np.testing.assert_allclose(actual, expected, rtol=rtol,
                               atol=max(atol, scale_atol * scale), err_msg=msg)


# -- the draw interface ----------------------------------------------------------------
class Draw(abc.ABC):
    """Random choices. Subclasses give ``integer(lo, hi)`` (inclusive); shrinking
    (hypothesis) goes towards ``lo``, so the first option of every choice is the plain one."""

    @abc.abstractmethod
    def integer(self, lo: int, hi: int) -> int:
        """A random integer in [lo, hi]."""

    def choice(self, options, weights=None):
        options = list(options)
        if weights is None:
            return options[self.integer(0, len(options) - 1)]
        total = sum(weights)
        x = self.integer(0, total - 1)
        for o, w in zip(options, weights):
            if x < w:
                return o
            x -= w
        return options[-1]

    def chance(self, percent: int) -> bool:
        """True with ``percent`` % probability (False is the simple value)."""
        return self.integer(0, 99) >= 100 - percent

    def seed(self) -> int:
        return self.integer(0, 2 ** 32 - 1)


class RngDraw(Draw):
    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))


# -- the specs -------------------------------------------------------------------------
def spec_list(bases: bool = False) -> list[tuple[str, str | None]]:
    """(catalog name, base) for every catalog spec; ``bases`` adds LARS(adam), SVRG(adam)."""
    out = [(n, None) for n in catalog.list_specs()]
    return out + ([("lars", "adam"), ("svrg", "adam")] if bases else [])


_ARTIFACTS: dict[tuple, Any] = {}


def artifact(name: str, base: str | None = None):
    key = (name, base)
    if key not in _ARTIFACTS:
        _ARTIFACTS[key] = optgen.get_artifact(name, base=base)
    return _ARTIFACTS[key]


# -- arrays ----------------------------------------------------------------------------
SHAPES = [(7,), (1,), (0,), (), (15,), (16,), (17,), (2,), (31,), (64,), (101,), (1009,),
          (4099,), (3, 5), (1, 7), (7, 1), (1, 1), (16, 17), (0, 5), (5, 0), (31, 33),
          (2, 3, 4), (2, 0, 5), (3, 1, 7), (4, 5, 6), (2, 3, 2, 2)]
SHAPE_WEIGHTS = [8, 4, 3, 4, 4, 4, 4, 2, 3, 2, 3, 2, 1, 4, 2, 2, 2, 2, 1, 1, 1, 3, 1, 1, 1, 2]
GOOD_DTYPES = ("float32", "float64")
LOW = ("float16", "bfloat16")
BAD_DTYPES = ("int32", "int64", "bool", "complex64", "complex128", ">f4", ">f8", "longdouble",
              "uint8")
VALUE_KINDS = ("normal", "zeros", "tiny", "huge", "mixed", "extreme", "nonfinite")
EXTREMES = [0.0, -0.0, 5e-324, -5e-324, 1e-310, 1e-45, 1e-40, 1.1754944e-38, 1e-38, 6e-8,
            1.0, -1.0, 65504.0, 1e38, -3.4028235e38, 3.4028235e38, 1e300,
            1.7976931348623157e308, math.inf, -math.inf, math.nan]
# layouts: plain and offset are always fine; the rest depends on the array (array_rule)
LAYOUTS = ("plain", "offset", "misaligned", "strided", "reversed", "transposed", "fortran",
           "readonly", "frombuffer", "broadcast", "subclass", "size1-strides")


class _Sub(np.ndarray):
    """An ndarray subclass (numpy.matrix-like containers reach the runtime too)."""


def np_dtype(name: str) -> np.dtype:
    return tensors.numpy_dtype(name) if name == "bfloat16" else np.dtype(name)


@dataclass
class ArraySpec:
    shape: tuple
    dtype: str
    values: str = "normal"
    seed: int = 0
    layout: str = "plain"
    k: int = 0              # byte offset (offset, misaligned) or step (strided)

    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def make_values(a: ArraySpec) -> np.ndarray:
    """The array's values, C-contiguous, in its dtype."""
    rng = np.random.default_rng(a.seed)
    n = a.numel()
    base = rng.standard_normal(n)
    dt = np_dtype(a.dtype)
    wide = dt.kind == "f" and dt.itemsize >= 8
    floating = dt.kind in "fc" or a.dtype in LOW
    if a.values == "zeros":
        v = np.zeros(n)
    elif a.values == "tiny":
        v = base * (1e-310 if wide else 1e-40)
    elif a.values == "huge":
        v = base * (1e305 if wide else 1e37)
    elif a.values == "mixed":
        v = base * 10.0 ** rng.uniform(-45, 38, n)
    elif a.values == "extreme":
        v = np.array(EXTREMES)[rng.integers(0, len(EXTREMES), n)]
    elif a.values == "nonfinite":
        v = base.copy()
        if n:
            k = min(n, 3)
            v[rng.integers(0, n, k)] = rng.choice([math.nan, math.inf, -math.inf], k)
    else:
        v = base
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not floating:
            v = np.nan_to_num(v, nan=0.0, posinf=1.0, neginf=-1.0).clip(-100, 100)
        return v.astype(dt).reshape(a.shape)


def place(values: np.ndarray, layout: str, k: int) -> np.ndarray:
    """``values`` in memory laid out as ``layout`` (a new array every call)."""
    dt, shape, nbytes = values.dtype, values.shape, values.nbytes
    nd = len(shape)
    if layout in ("offset", "misaligned"):
        raw = np.zeros(nbytes + 80 + k, np.uint8)
        start = (-raw.ctypes.data) % 64 + k
        out = np.frombuffer(raw.data, dtype=dt, count=values.size, offset=start).reshape(shape)
        out[...] = values
        return out
    if layout == "strided" and nd:
        out = np.zeros(shape[:-1] + (shape[-1] * k,), dt)[..., ::k]
    elif layout == "reversed" and nd:
        out = np.zeros(shape, dt)[..., ::-1]
    elif layout == "transposed" and nd >= 2:
        out = np.zeros(shape[::-1], dt).T
    elif layout == "fortran" and nd >= 2:
        out = np.asfortranarray(np.zeros(shape, dt))
    elif layout == "frombuffer":
        return np.frombuffer(values.tobytes(), dtype=dt).reshape(shape)
    elif layout == "broadcast":
        first = values.reshape(-1)[:1] if values.size else np.zeros(1, dt)
        return np.broadcast_to(first.reshape((1,) * nd), shape)
    elif layout == "subclass":
        return values.copy().view(_Sub)
    elif layout == "size1-strides":
        c = values.copy()
        strides = tuple(s * (k + 2) if n == 1 else s for s, n in zip(c.strides, shape))
        return np.lib.stride_tricks.as_strided(c, shape, strides)
    else:
        out = values.copy()
    out[...] = values
    if layout == "readonly":
        out.flags.writeable = False
    return out


def materialize(a: ArraySpec) -> np.ndarray:
    return place(make_values(a), a.layout, a.k)


def _compact(arr: np.ndarray) -> bool:
    """Whether the strides are exactly the C-order strides of the shape."""
    expect, s = [], arr.itemsize
    for n in reversed(arr.shape):
        expect.append(s)
        s *= n
    return tuple(reversed(expect)) == arr.strides


def array_rule(a: ArraySpec, role: str) -> tuple[str, str]:
    """("ok" | "bad" | "either", why) for the layout and byte order of a parameter or a
    gradient (its dtype and shape are judged by the caller). The intended rules
    (docs/runtime.md): C-contiguous (numpy's flag), element-aligned, native byte order,
    writeable (gradients too: DLPack cannot pass read-only numpy arrays)."""
    dt = np_dtype(a.dtype)
    if not dt.isnative:
        return "bad", "byte-order"
    arr = materialize(a)
    size = arr.size
    if a.layout == "misaligned" and dt.itemsize > 1 and a.k % dt.itemsize:
        return ("either", "misaligned-empty") if size == 0 else ("bad", "misaligned")
    if not arr.flags.c_contiguous:
        return "bad", "not-contiguous"
    if not arr.flags.writeable:
        return "bad", "read-only"
    if not _compact(arr):
        return "either", "odd-strides"   # numpy calls it C-contiguous (size-1 or 0 axes)
    if a.layout == "subclass":
        return "either", "subclass"
    return "ok", ""


def finite(a: ArraySpec) -> bool:
    v = make_values(a)
    if v.dtype.kind == "c":
        return bool(np.isfinite(v).all())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return v.dtype.kind in "iub" or bool(np.isfinite(v.astype(np.float64)).all())


# -- learning-rate sources -------------------------------------------------------------
PAST_END = object()


class ConstFn:
    """A callable lr: step -> value (always the same)."""

    def __init__(self, value):
        self.value = value

    def __call__(self, step):
        return self.value

    def __repr__(self):
        return f"ConstFn({self.value!r})"


@dataclass
class LrSource:
    """An lr given as a sequence (list, tuple or 1-D array), a callable or a schedule."""
    kind: str                   # "list", "tuple", "array", "fn", "cosine"
    values: list

    def make(self):
        if self.kind == "list":
            return list(self.values)
        if self.kind == "tuple":
            return tuple(self.values)
        if self.kind == "array":
            return np.array(self.values, dtype=np.float64)
        if self.kind == "fn":
            return ConstFn(self.values[0])
        return schedules.cosine(self.values[0], 3)

    def materializes(self) -> bool:
        """Whether the runtime's sequence check (finite real numbers >= 0) passes."""
        if self.kind not in ("list", "tuple", "array"):
            return True
        return bool(self.values) and all(isinstance(v, float) and math.isfinite(v) and v >= 0
                                         for v in self.values)

    def value(self, t: int):
        if self.kind in ("list", "tuple", "array"):
            return self.values[t] if t < len(self.values) else PAST_END
        if self.kind == "fn":
            return self.values[0]
        return float(self.make()(t))


# -- hyperparameter values -------------------------------------------------------------
EXTREME_HYPERS = [1e-38, 1e38, 1e-310, 5e-324, 1e308]


def hyper_pool(info) -> list:
    """Candidate values for one (non-flag) hyperparameter, valid and invalid mixed:
    typical values and spellings (numpy scalars, 0-d arrays, ints, fractions) first, then
    EXTREME_HYPERS, then values of the wrong type or out of range."""
    d = info.default
    return [d, 0.5, 0.9, 0.1, 1e-3, 2.0, 0.0, -0.0, 1.0, 0.999999, 1, 3, np.float32(0.25),
            np.float64(1e-3), np.float16(0.1), np.int64(2), np.array(0.5),
            np.array(1e-3, np.float32), fractions.Fraction(1, 3), None] + EXTREME_HYPERS + [
            -1.0, -1e-310, math.nan, math.inf, -math.inf, "0.1", [0.1], (0.1,), {}, b"1",
            complex(1, 0), decimal.Decimal("0.1"), True, 10 ** 400, np.array([0.5]),
            np.float64(math.nan)]


def lr_numbers(info) -> list:
    """The pool without what the runtime reads as an lr sequence or rejects as one
    (lists, tuples, 1-D arrays, dicts, bytes): those come as LrSource."""
    return [v for v in hyper_pool(info) if not isinstance(v, (list, tuple, dict, bytes))
            and not (isinstance(v, np.ndarray) and v.ndim)]


FLAG_POOL = [True, False, np.bool_(True), np.bool_(False), 1, 0, "True", None, 1.0]


def _resolve_ok(art, current: dict, changes: dict) -> tuple[bool, dict | None]:
    """Whether the runtime's own rules accept ``changes`` (any error: no; an untyped one
    then shows up as a crash when the call runs). One intended rule is applied here rather
    than read from the runtime: a 0-d array (numpy, torch) stands for the number it holds."""
    changes = {k: v.item() if getattr(v, "ndim", None) == 0 and hasattr(v, "item") else v
               for k, v in changes.items()}
    try:
        return True, hyper_rules.resolve(art.name, art.hypers, art.requirements, current, changes)
    except Exception:   # noqa: BLE001
        return False, None


def lr_ok(art, hyper: dict, value) -> bool:
    """Whether ``value`` is a valid lr for a group with hyperparameters ``hyper`` (the
    spec's constraint and requirements with lr = value)."""
    if value is PAST_END:
        return False
    return _resolve_ok(art, hyper, {"lr": value})[0]


# -- the case --------------------------------------------------------------------------
@dataclass
class GradSpec:
    kind: str                          # array, none, alias-param, alias-view, alias-state,
    array: ArraySpec | None = None     # alias-other-param, same-as, list, memoryview, rowsparse
    ref: int = 0
    rs: dict | None = None


@dataclass
class Case:
    spec: str
    base: str | None
    params: list                       # ArraySpec, or ("alias", j) for a view of param j
    container: str = "list"            # list, dict, groups
    names: list | None = None
    group_of: list | None = None
    group_extra: dict = field(default_factory=dict)   # group 1's own keys
    options: dict = field(default_factory=dict)       # create(**options), lr sources made
    warmup: int = 0
    set_hyper: dict | None = None
    set_group: Any = None
    grads: Any = None                  # list[GradSpec], or ("count", n) / ("single",)
    inputs: Any = None                 # {name: list[GradSpec]} / ("missing",) / ("unexpected",)
    expect: dict = field(default_factory=dict)        # phase -> ok | bad | either | fpe | skip
    why: dict = field(default_factory=dict)
    fpe_allowed: bool = False

    def short(self) -> str:
        params = [(p.shape, p.dtype, p.layout, p.values) if isinstance(p, ArraySpec) else p
                  for p in self.params]
        return (f"{self.spec}{'+' + self.base if self.base else ''} params={params}"
                f" container={self.container} options={self.options!r} warmup={self.warmup}"
                f" set_hyper={self.set_hyper!r} group={self.set_group!r} grads={self.grads!r}"
                f" inputs={self.inputs!r} expect={self.expect} why={self.why}")


def _worst(*verdicts: str) -> str:
    order = {"ok": 0, "either": 1, "bad": 2}
    return max(verdicts, key=lambda v: order[v]) if verdicts else "ok"


class _Judge:
    """Collects a phase's verdict: bad (must raise), either, ok (must succeed)."""

    def __init__(self):
        self.verdict, self.why = "ok", []

    def add(self, verdict: str, why: str) -> None:
        if verdict != "ok":
            self.verdict = _worst(self.verdict, verdict)
            self.why.append(f"{verdict}:{why}")


def _draw_value(draw: Draw, art, name: str, current: dict, want: str):
    """A value for hyperparameter ``name``: ``want`` "valid" picks from the candidates the
    rules accept (with the others as they are), "any" from all of them."""
    pool = hyper_pool(art.hypers[name])
    if want == "valid":   # an extreme value one time in ten (it makes the call not tame)
        extreme = draw.chance(10)
        pool = [v for v in pool if _resolve_ok(art, current, {name: v})[0] and
                (_is_extreme(v) == extreme)] or [art.hypers[name].default]
    return draw.choice(pool)


def _is_extreme(v) -> bool:
    return any(v is x for x in EXTREME_HYPERS)


def _draw_lr(draw: Draw, art, current: dict, want: str):
    """An lr: a number (from the pool) or a source (sequence, callable, schedule)."""
    kind = draw.choice(["number", "list", "tuple", "array", "fn", "cosine"], [6, 1, 1, 1, 1, 1])
    if kind == "number":
        pool = lr_numbers(art.hypers["lr"])
        if want == "valid":
            extreme = draw.chance(10)
            pool = [v for v in pool if _resolve_ok(art, current, {"lr": v})[0] and
                    _is_extreme(v) == extreme] or [art.hypers["lr"].default]
        return draw.choice(pool)
    floats = [1e-3, 0.5, 0.0, 2.0, 1e-38, 1e38, 5e-324]
    bad = [-1.0, math.nan, math.inf]
    if kind in ("list", "tuple", "array"):
        vals = [draw.choice(floats, [4, 4, 2, 2, 1, 1, 1])
                for _ in range(draw.integer(0 if want == "any" else 1, 5))]
        if want == "any" and vals and draw.chance(30):
            vals[draw.integer(0, len(vals) - 1)] = draw.choice(bad)
        return LrSource(kind, vals)
    if kind == "fn":
        return LrSource("fn", [draw.choice(floats + (bad + ["x", None] if want == "any" else []))])
    return LrSource("cosine", [draw.choice(floats[:3])])


def _bad_hyper_value(draw: Draw, art, name: str, current: dict):
    every = (lr_numbers if name == "lr" else hyper_pool)(art.hypers[name])
    pool = [v for v in every if not _resolve_ok(art, current, {name: v})[0]]
    return draw.choice(pool or every)


def _hyper_changes(draw: Draw, art, current: dict, focus: bool, n_max: int) -> dict:
    """Random hyperparameter changes (spec names, lr maybe a source); with ``focus`` one of
    them is drawn from the whole pool (likely invalid)."""
    names = [n for n, h in art.hypers.items()]
    changes: dict = {}
    trial = dict(current)
    for _ in range(draw.integer(0, n_max)):
        name = draw.choice(names)
        info = art.hypers[name]
        if info.is_flag:
            value = draw.choice(FLAG_POOL[:4] if not focus else FLAG_POOL)
        elif name == "lr":
            value = _draw_lr(draw, art, trial, "any" if focus else "valid")
        else:
            value = _draw_value(draw, art, name, trial, "any" if focus else "valid")
        changes[name] = value
        if not isinstance(value, LrSource):
            ok, new = _resolve_ok(art, trial, {name: value})
            if ok:
                trial = new
    if focus and draw.chance(70):
        name = draw.choice([n for n in names if not art.hypers[n].is_flag])
        changes[name] = _bad_hyper_value(draw, art, name, trial)
    return changes


def _judge_hypers(art, judge: _Judge, current: dict, current_lr, changes: dict, t: int):
    """Optimizer._resolve under the intended rules: a group's new hyperparameters and lr
    source, judged into ``judge``. A sequence, callable or schedule lr must give a valid lr
    at the current step ``t``, and the spec's requirements see that value. Returns
    (hyper, lr source), or (None, None) when the change is invalid."""
    plain = {k: v for k, v in changes.items() if not isinstance(v, LrSource)}
    src = current_lr
    if "lr" in changes:
        src = changes["lr"] if isinstance(changes["lr"], LrSource) else None
        if isinstance(src, LrSource) and not src.materializes():
            judge.add("bad", "lr-sequence-values")
            return None, None
    ok, new = _resolve_ok(art, current, plain)
    if not ok:
        judge.add("bad", "hyper")
        return None, None
    if isinstance(src, LrSource):
        value = src.value(t)
        if value is PAST_END or not lr_ok(art, new, value):
            judge.add("bad", "lr-past-end" if value is PAST_END else "lr-at-step")
            return None, None
    return new, src


def _aliased(draw: Draw, art, changes: dict) -> dict:
    """Some spec names replaced by aliases (learning_rate, wd, betas), maybe both."""
    out = dict(changes)
    if "lr" in out and draw.chance(20):
        out["learning_rate"] = out.pop("lr")
        if draw.chance(10):
            out["lr"] = 0.1   # both: a TypeError
    if "weight_decay" in out and draw.chance(20):
        out["wd"] = out.pop("weight_decay")
    if "beta1" in out and "beta2" in out and "betas" not in art.hypers and draw.chance(30):
        out["betas"] = (out.pop("beta1"), out.pop("beta2"))
    return out


def _unalias(art, given: dict) -> tuple[dict | None, str]:
    """Spec names for ``given``; None when the aliases clash."""
    out = {}
    for k, v in given.items():
        if k == "betas":
            pairs = [("beta1", v[0]), ("beta2", v[1])]
        elif k == "learning_rate":
            pairs = [("lr", v)]
        elif k == "wd":
            pairs = [("weight_decay", v)]
        else:
            pairs = [(k, v)]
        for n, x in pairs:
            if n in out:
                return None, "alias-clash"
            out[n] = x
    return out, ""


def _made(options: dict) -> dict:
    return {k: (v.make() if isinstance(v, LrSource) else v) for k, v in options.items()}


def generate(draw: Draw, specs: list[tuple[str, str | None]]) -> Case:
    """A random call against one of ``specs`` (with its verdicts)."""
    name, base = draw.choice(specs)
    art = artifact(name, base)
    focus = draw.choice(["valid", "grad", "hyper", "param", "options", "set_hyper", "values"],
                        [30, 22, 12, 10, 8, 10, 8])
    case = Case(name, base, [])
    cons, step = _Judge(), _Judge()

    # options (runtime)
    opts: dict = {}
    mp = draw.chance(25)
    if mp or draw.chance(5):
        opts["multi_precision"] = mp if focus != "options" or draw.chance(50) else \
            draw.choice([1, None, "yes"])
    if draw.chance(20):
        opts["nonfinite"] = draw.choice(["skip", "raise"] +
                                        (["ignore", 1, True] if focus == "options" else []))
    if draw.chance(15):
        bad = [0.0, -1.0, math.nan, math.inf, "1", True] if focus == "options" else []
        opts["clip_global_norm"] = draw.choice([1.0, 0.5, 1e-30, 1e38, 5e-324] + bad,
                                               [5, 5, 1, 1, 1] + [2] * len(bad))
    if draw.chance(10):
        bad = [0.0, -1.0, math.nan, "8", None] if focus == "options" else []
        opts["loss_scale"] = draw.choice([1024.0, 2, 0.5, 1e-30, 1e38] + bad,
                                         [4, 4, 4, 1, 1] + [3] * len(bad))
    if draw.chance(10):
        opts["begin_num_update"] = draw.choice([5, 1000, 2 ** 31, 2 ** 53 + 1, 2 ** 63, 10 ** 30,
                                                np.int64(7)]
                                               + ([-1, 1.5, True, "3"]
                                                  if focus == "options" else []))
    if draw.chance(10):
        opts["lazy_update"] = draw.choice([True, False] + ([1] if focus == "options" else []))
    mp_on = opts.get("multi_precision") is True
    # the validity of the options (mirrors docs/runtime.md "Construction")
    for k, v in opts.items():
        ok = True
        if k in ("multi_precision", "lazy_update"):
            ok = isinstance(v, (bool, np.bool_))
        elif k == "nonfinite":
            ok = v in (None, "skip", "raise") and not isinstance(v, bool)
        elif k in ("clip_global_norm", "loss_scale"):
            ok = (v is None and k == "clip_global_norm") or (
                not isinstance(v, (bool, str)) and v is not None and math.isfinite(v) and v > 0)
        elif k == "begin_num_update":
            ok = isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0
        cons.add("ok" if ok else "bad", f"option-{k}")
    t0 = int(opts["begin_num_update"]) if cons.verdict == "ok" and "begin_num_update" in opts else 0

    # parameters
    n = draw.choice([1, 2, 3], [5, 4, 1])
    for i in range(n):
        shape = draw.choice(SHAPES, SHAPE_WEIGHTS)
        if focus == "param" and draw.chance(60):
            dtype = draw.choice(BAD_DTYPES + LOW)
        elif draw.chance(12 if mp else 2):
            dtype = draw.choice(LOW)
        else:
            dtype = draw.choice(GOOD_DTYPES, [3, 2])
        layout, k = "plain", 0
        if draw.chance(30):
            layout = "offset"
        if focus == "param" and draw.chance(50):
            layout = draw.choice(LAYOUTS)
        itemsize = np_dtype(dtype).itemsize
        if layout == "offset":
            k = itemsize * draw.integer(1, 15)
        elif layout == "misaligned":
            k = draw.choice([1, 2, 3, 5, itemsize + 1, 4 if itemsize == 8 else 1])
        elif layout == "strided":
            k = draw.choice([2, 3])
        elif layout == "size1-strides":
            k = draw.integer(0, 3)
        values = draw.choice(VALUE_KINDS, [10, 2, 2, 2, 2, 2, 2] if focus == "values"
                             else [40, 2, 1, 1, 1, 1, 2])
        if i and focus == "param" and draw.chance(15):
            case.params.append(("alias", draw.integer(0, i - 1)))
            prev = case.params[case.params[-1][1]]
            if isinstance(prev, ArraySpec) and prev.numel():
                cons.add("bad", "params-share-memory")
            else:
                cons.add("either", "alias-of-empty")
            continue
        a = ArraySpec(tuple(shape), dtype, values, draw.seed(), layout, k)
        case.params.append(a)
        if dtype in LOW and not mp_on:
            cons.add("bad", f"param-{dtype}")
        elif dtype not in GOOD_DTYPES + LOW:
            cons.add("bad", f"param-dtype-{dtype}")
        else:
            cons.add(*array_rule(a, "param"))
    arrays = []   # the ArraySpec behind each parameter (an alias: the one it views)
    for p in case.params:
        arrays.append(p if isinstance(p, ArraySpec) else arrays[p[1]])

    # container, names, groups
    case.container = draw.choice(["list", "dict", "groups"], [6, 2, 2])
    names_pool = ["w", "fc.weight", "fc.bias", "LayerNorm.gamma", "bn.beta", "emb", "conv"]
    names = [f"{draw.choice(names_pool)}{i}" for i in range(n)]
    if case.container == "dict":
        case.names = names
    elif case.container == "list" and draw.chance(10):
        case.names = names if draw.chance(80) else names[:-1]
        opts["param_names"] = case.names
        if len(case.names) != n:
            cons.add("bad", "param-names-count")
    # hyperparameters at the top
    defaults = {k: h.default for k, h in art.hypers.items()}
    top = _hyper_changes(draw, art, defaults, focus == "hyper", 4)
    given = _aliased(draw, art, top)
    spec_names, why = _unalias(art, given)
    if spec_names is None:
        cons.add("bad", why)
        top_hyper, top_lr = None, None
    else:
        top_hyper, top_lr = _judge_hypers(art, cons, defaults, None, spec_names, t0)
    opts.update(given)
    group_hyper = [top_hyper]
    group_lr = [top_lr]
    case.group_of = [0] * n
    if case.container == "groups":
        if n >= 2 and draw.chance(70):
            cut = draw.integer(1, n - 1)
            case.group_of = [0] * cut + [1] * (n - cut)
            extra = _hyper_changes(draw, art, top_hyper or defaults, focus == "hyper", 2)
            if draw.chance(15):
                extra["grad_centralization"] = True
                if not all(len(arrays[i].shape) == 4 for i in range(cut, n)):
                    cons.add("bad", "grad-centralization-shape")
            if focus == "hyper" and draw.chance(10):
                extra["no_such_key"] = 1.0
                cons.add("bad", "group-unknown-key")
            case.group_extra = extra
            hyp = {k: v for k, v in extra.items()
                   if k not in ("grad_centralization", "no_such_key")}
            h1, l1 = _judge_hypers(art, cons, top_hyper, top_lr, hyp, t0) \
                if top_hyper is not None else (None, None)
            group_hyper.append(h1)
            group_lr.append(l1)
    # lr_mult / wd_mult
    if draw.chance(8):
        key = draw.choice(["lr_mult", "wd_mult"])
        idx = draw.choice([0, n - 1, n, "fc.bias0", -1])
        bad = [-1.0, math.nan, "x"] if focus == "options" else []
        val = draw.choice([0.5, 0.0, 2, 1e38] + bad, [3, 3, 3, 1] + [3] * len(bad))
        opts[key] = {idx: val}
        named = case.names if case.names and len(case.names) == n else None
        key_ok = (isinstance(idx, int) and 0 <= idx < n) or \
            (isinstance(idx, str) and bool(named) and idx in named)
        val_ok = not isinstance(val, (str, bool)) and math.isfinite(val) and val >= 0
        cons.add("ok" if key_ok and val_ok else "bad", f"{key}")
    case.options = opts
    case.expect["construct"] = cons.verdict
    case.why["construct"] = cons.why

    # warm-up steps (good gradients); a sequence lr may run out
    case.warmup = draw.choice([0, 1, 2], [3, 4, 2])
    t = t0
    for w in range(case.warmup):
        j = _Judge()
        for gi, (h, src) in enumerate(zip(group_hyper, group_lr)):
            if h is not None and isinstance(src, LrSource) and gi in case.group_of:
                value = src.value(t)
                if value is PAST_END or not lr_ok(art, h, value):
                    j.add("bad", "lr-at-step")
        case.expect[f"warmup{w}"] = j.verdict
        case.why[f"warmup{w}"] = j.why
        t += 1

    # set_hyper
    if focus == "set_hyper" or draw.chance(10):
        j = _Judge()
        changes = _hyper_changes(draw, art, top_hyper or defaults, focus == "set_hyper", 3)
        n_groups = len(group_hyper)
        case.set_group = draw.choice([None, 0, n_groups - 1, n_groups, -1, "0"],
                                     [6, 2, 2] + ([1, 1, 1] if focus == "set_hyper" else [0, 0, 0]))
        case.set_hyper = _aliased(draw, art, changes)
        sn, why = _unalias(art, case.set_hyper)
        if sn is None:
            j.add("bad", why)
        elif case.set_group is not None and not (isinstance(case.set_group, int)
                                                 and 0 <= case.set_group < n_groups):
            j.add("bad", "set-hyper-group")
        elif all(h is not None for h in group_hyper):
            targets = range(n_groups) if case.set_group is None else [case.set_group]
            for gi in targets:
                h, src = _judge_hypers(art, j, group_hyper[gi], group_lr[gi], sn, t)
                if h is not None:
                    group_hyper[gi], group_lr[gi] = h, src
            if case.set_group is None and top_hyper is not None:
                _judge_hypers(art, j, top_hyper, top_lr, sn, t)
        case.expect["set_hyper"] = j.verdict
        case.why["set_hyper"] = j.why

    # the fuzzed step
    grads = []
    for i, p in enumerate(arrays):
        grads.append(_draw_grad(draw, art, case, i, p, arrays, grads, focus == "grad", step, mp_on))
    if focus == "grad" and draw.chance(8):
        case.grads = draw.choice([("count", n + 1), ("count", max(n - 1, 0)), ("single",),
                                  ("tuple", grads), ("generator", grads)])
        if case.grads[0] in ("count", "single"):
            step.add("bad", f"grads-{case.grads[0]}")
    else:
        case.grads = grads
    glist = case.grads if isinstance(case.grads, list) else \
        (case.grads[1] if case.grads[0] in ("tuple", "generator") else [])
    used = {case.group_of[i] for i, g in enumerate(glist) if g.kind != "none"}
    for gi in used:
        h, src = group_hyper[gi], group_lr[gi]
        if h is not None and isinstance(src, LrSource):
            value = src.value(t)
            if value is PAST_END or not lr_ok(art, h, value):
                step.add("bad", "lr-at-step")
    # extra inputs (SVRG)
    if art.inputs:
        if focus == "grad" and draw.chance(8):
            case.inputs = ("missing",)
            step.add("bad", "inputs-missing")
        else:
            case.inputs = {}
            for nm in art.inputs:
                lst = []
                for i, p in enumerate(arrays):
                    g = glist[i] if i < len(glist) else None
                    if g is not None and g.kind == "rowsparse":   # densified (no lazy kernel)
                        step.add("either", "row-sparse-with-inputs")
                    if draw.chance(90) or focus != "grad":
                        kind = draw.choice(VALUE_KINDS, [40, 2, 1, 1, 1, 1, 2])
                        a = ArraySpec(p.shape, p.dtype, kind, draw.seed(),
                                      draw.choice(["plain", "offset"]), 0)
                        if a.layout == "offset":
                            a.k = np_dtype(p.dtype).itemsize * 3
                        lst.append(GradSpec("array", a))
                    else:
                        lst.append(_draw_grad(draw, art, case, i, p, arrays, lst, True, step,
                                              mp_on, extra=True))
                    if lst[-1].kind == "none" and g is not None and g.kind != "none":
                        step.add("bad", "input-none")
                case.inputs[nm] = lst
    elif focus == "grad" and draw.chance(5):
        case.inputs = ("unexpected",)
        step.add("bad", "unexpected-input")
    # non-finite gradients: FloatingPointError or a skipped step
    nf = opts.get("nonfinite") if cons.verdict != "bad" else None
    cg = opts.get("clip_global_norm") if cons.verdict != "bad" else None
    nonfinite_grad = any(g.kind in ("array", "rowsparse") and not finite(g.array) or
                         g.kind == "alias-other-param"   # (its values after the warm-up)
                         for g in glist)
    if (nf in ("raise", "skip") or cg is not None) and nonfinite_grad:
        case.fpe_allowed = True
        if step.verdict == "ok":
            step.verdict = "skip" if nf == "skip" else "fpe"
    case.expect["step"] = step.verdict
    case.why["step"] = step.why
    return case


def _draw_grad(draw: Draw, art, case: Case, i: int, p: ArraySpec, arrays: list, sofar: list,
               focus: bool, judge: _Judge, mp_on: bool, extra: bool = False) -> GradSpec:
    """The gradient (or extra input) of parameter ``i``, judged into ``judge``."""
    kinds = ["array", "none", "alias-param", "alias-view", "alias-state", "alias-other-param",
             "same-as", "list", "memoryview", "rowsparse", "wrong-dtype", "wrong-shape", "layout"]
    if focus:
        kind = draw.choice(kinds, [10, 3, 2, 2, 2, 2, 2, 1, 1, 4, 2, 2, 10])
    else:
        kind = draw.choice(kinds[:2] + ["rowsparse"], [40, 2, 3 if not extra else 0])
    values = draw.choice(VALUE_KINDS, [30, 2, 1, 1, 1, 2, 4])
    empty = p.numel() == 0
    if kind == "none":
        return GradSpec("none")
    if kind in ("alias-param", "alias-view", "alias-state"):
        judge.add("either" if empty else "bad", kind)
        return GradSpec(kind)
    if kind == "alias-other-param":
        others = [j for j, q in enumerate(arrays)
                  if j != i and q.shape == p.shape and q.dtype == p.dtype]
        if others:
            judge.add("either", kind)   # accepted today; read after param j was stepped
            return GradSpec(kind, ref=draw.choice(others))
        kind = "array"
    if kind == "same-as":
        others = [j for j, g in enumerate(sofar) if g.kind == "array" and g.array.shape == p.shape
                  and g.array.dtype == p.dtype and g.array.layout in ("plain", "offset")]
        if others:
            return GradSpec(kind, ref=draw.choice(others))
        kind = "array"
    if kind in ("list", "memoryview"):
        judge.add("bad", kind)
        return GradSpec(kind, ArraySpec(p.shape, p.dtype, values, draw.seed()))
    if kind == "rowsparse":
        if extra:
            judge.add("bad", "row-sparse-input")
        return _draw_rowsparse(draw, case, i, p, focus, judge, values)
    shape, dtype, layout, k = p.shape, p.dtype, "plain", 0
    if draw.chance(30):
        layout, k = "offset", np_dtype(dtype).itemsize * draw.integer(1, 15)
    if kind == "wrong-dtype":
        dtype = draw.choice([d for d in GOOD_DTYPES + LOW + (">f4", "int32") if d != p.dtype])
        judge.add("bad", "grad-dtype")
    elif kind == "wrong-shape":
        size = p.numel()
        cands = [s for s in [(size + 1,), (size,), (1, size), (), tuple(shape) + (1,), (0,)]
                 if tuple(s) != tuple(shape)]
        shape = draw.choice(cands)
        judge.add("bad", "grad-shape")
    elif kind == "layout":
        layout = draw.choice(LAYOUTS)
        itemsize = np_dtype(dtype).itemsize
        k = {"offset": itemsize * draw.integer(1, 15),
             "misaligned": draw.choice([1, 2, 3, itemsize + 1]),
             "strided": draw.choice([2, 3]), "size1-strides": draw.integer(0, 3)}.get(layout, 0)
    a = ArraySpec(tuple(shape), dtype, values, draw.seed(), layout, k)
    verdict, why = array_rule(a, "grad")
    judge.add(verdict, f"grad-{why}")
    return GradSpec("array", a)


def _draw_rowsparse(draw: Draw, case: Case, i: int, p: ArraySpec, focus: bool, judge: _Judge,
                    values: str) -> GradSpec:
    rows0 = p.shape[0] if p.shape else 0
    count = draw.integer(0, 6)
    idx_kind = draw.choice(["ok", "out-of-range", "negative", "float", "2d"] if focus else ["ok"])
    rows_kind = draw.choice(["ok", "shape", "dtype"] if focus else ["ok"])
    seed = draw.seed()
    if not p.shape:
        judge.add("bad", "row-sparse-0d")
    if idx_kind == "ok" and rows0 == 0 and count:
        idx_kind = "out-of-range"
    if idx_kind in ("out-of-range", "negative") and count == 0:
        idx_kind = "ok"
    if idx_kind == "2d" and count == 0:
        count = 1
    if idx_kind != "ok" or rows_kind != "ok":
        judge.add("bad", f"row-sparse-{idx_kind}-{rows_kind}")
    if case.container == "groups" and case.group_extra.get("grad_centralization") \
            and case.group_of[i] == 1:
        judge.add("bad", "row-sparse-grad-centralization")
    rshape = (count,) + tuple(p.shape[1:])
    if rows_kind == "shape":
        rshape = (count,) + tuple(s + 1 for s in p.shape[1:]) if len(p.shape) > 1 else (count, 2)
    rdtype = p.dtype if rows_kind != "dtype" else ("float64" if p.dtype != "float64" else "float32")
    return GradSpec("rowsparse", ArraySpec(rshape, rdtype, values, seed),
                    rs={"count": count, "idx": idx_kind, "rows0": rows0, "seed": seed})


# -- running a case --------------------------------------------------------------------
@dataclass
class Outcome:
    kind: str                       # ok | typed | skipped | one of BUG_KINDS
    phase: str = ""
    exc: str = ""
    category: str = ""
    message: str = ""
    detail: str = ""
    notes: list = field(default_factory=list)   # typed errors worth a look (no name prefix)
    values_compared: bool = False   # whether every step of the call was tame (see TAME)

    @property
    def bug(self) -> bool:
        return self.kind in BUG_KINDS

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v not in ("", [], False)}


CATEGORIES = [
    ("not C-contiguous", "contiguity"), ("not aligned", "alignment"), ("read-only", "read-only"),
    ("byte order", "byte-order"), ("share memory|shares memory", "aliasing"),
    ("NaN or Inf", "nonfinite-gradient"),
    ("row index|RowSparse|row-sparse|has no rows", "row-sparse"),
    ("lr sequence|past the end|lr must be|lr schedule", "lr-schedule"),
    ("gradients for|arrays for|list of arrays|grads must", "grad-count"),
    ("must be a numpy|must be an array|parameters must be arrays|got a single array",
     "not-an-array"),
    ("grad_centralization", "grad-centralization"), ("has shape|expected \\(", "shape"),
    ("low-precision parameters need", "low-precision"),
    ("has dtype|dtype", "dtype"), ("must be finite", "hyper-nonfinite"),
    ("invalid hyperparameters", "hyper-requirement"), ("must satisfy", "hyper-constraint"),
    ("unknown hyperparameter|both set|betas must", "hyper-name"),
    ("hyperparameter .* must be|is a flag", "hyper-type"),
    ("needs .*=\\[|unexpected input|is None but", "inputs"),
    ("group", "groups"),
    ("param_names|lr_mult|wd_mult", "names-mults"),
    ("nonfinite|clip_global_norm|loss_scale|begin_num_update|lazy_update|must be a bool", "option"),
]


def categorize(message: str) -> str:
    import re
    for pattern, cat in CATEGORIES:
        if re.search(pattern, message):
            return cat
    return "other"


class World:
    """One side (compiled or reference): its arrays and optimizer, built from the case.
    ``promote``: the float64 oracle, every float32 array (parameters, gradients, inputs)
    widened to float64 from the same float32 values (see ``compare``)."""

    def __init__(self, case: Case, backend: str, promote: bool = False):
        self.case, self.backend, self.promote = case, backend, promote
        arrays = []
        for p in case.params:
            if isinstance(p, ArraySpec):
                arrays.append(self.up(materialize(p)))
            else:   # a view sharing memory with an earlier parameter
                src = arrays[p[1]]
                arrays.append(src.reshape(-1)[: max(src.size // 2, 1)] if src.size else src)
        self.arrays = arrays
        self.before = [a.tobytes() for a in arrays]
        self.dtypes = [a.dtype for a in (materialize(p) if isinstance(p, ArraySpec) else None
                                         for p in case.params) if a is not None]
        self.opt = None

    def up(self, x):
        """float32 -> float64 in the oracle (a plain copy), anything else as it is."""
        if self.promote and isinstance(x, np.ndarray) and x.dtype == np.float32:
            return np.array(x, dtype=np.float64)
        if self.promote and isinstance(x, RowSparse):
            return RowSparse(x.indices, self.up(x.rows))
        return x

    def params_arg(self):
        c = self.case
        if c.container == "dict":
            return dict(zip(c.names, self.arrays))
        if c.container == "groups":
            groups = []
            for gi in sorted(set(c.group_of)):
                members = [a for a, g in zip(self.arrays, c.group_of) if g == gi]
                d = {"params": members}
                if gi == 1:
                    d.update(_made(c.group_extra))
                groups.append(d)
            return groups
        return list(self.arrays)

    def construct(self):
        art = artifact(self.case.spec, self.case.base)
        self.opt = optgen.create(art, self.params_arg(), backend=self.backend,
                                 **_made(self.case.options))

    def good_grads(self, seed: int) -> tuple[list, dict]:
        rng = np.random.default_rng(seed)
        dts = self.dtypes if self.promote else [p.dtype for p in self.opt.params]
        grads = [self.up(rng.standard_normal(p.shape).astype(d))
                 for p, d in zip(self.opt.params, dts)]
        inputs = {n: [self.up(rng.standard_normal(p.shape).astype(d))
                      for p, d in zip(self.opt.params, dts)]
                  for n in self.opt.artifact.inputs}
        return grads, {**inputs, **self.statistics(seed)}

    def statistics(self, seed: int) -> dict:
        """Valid statistics (THOR's A and G) for every 2-D parameter on a step that
        refreshes, so that such a step is a good call."""
        return random_statistics(self.opt, np.random.default_rng(seed + 1))

    def grad(self, g: GradSpec, i: int, sofar: list):
        opt = self.opt
        if g.kind == "none":
            return None
        if g.kind == "alias-param":
            return opt.params[i]
        if g.kind == "alias-view":
            return opt.params[i].view()
        if g.kind == "alias-state":
            states = [v for k, v in sorted(opt.state[i].items()) if isinstance(v, np.ndarray)]
            return states[0] if states else opt.params[i]
        if g.kind == "alias-other-param":
            return opt.params[g.ref]
        if g.kind == "same-as":
            return sofar[g.ref]
        if g.kind == "list":
            return make_values(g.array).tolist()
        if g.kind == "memoryview":
            return memoryview(make_values(g.array).reshape(-1).view(np.uint8))
        if g.kind == "rowsparse":
            rs = g.rs
            rng = np.random.default_rng(rs["seed"])
            cnt, rows0 = rs["count"], rs["rows0"]
            idx = rng.integers(0, max(rows0, 1), cnt)
            if rs["idx"] == "out-of-range":
                idx[rng.integers(0, cnt)] = rows0
            elif rs["idx"] == "negative":
                idx[rng.integers(0, cnt)] = -1
            elif rs["idx"] == "float":
                idx = idx.astype(np.float64) + 0.5
            elif rs["idx"] == "2d":
                idx = idx.reshape(1, -1)
            return self.up(RowSparse(idx, make_values(g.array)))
        return self.up(materialize(g.array))

    def step_args(self) -> tuple[Any, dict]:
        c = self.case
        if isinstance(c.grads, tuple) and c.grads[0] == "count":
            grads = self.good_grads(1)[0]
            grads = (grads + grads)[: c.grads[1]]
        elif isinstance(c.grads, tuple) and c.grads[0] == "single":
            grads = self.good_grads(1)[0][0]
        else:
            specs = c.grads if isinstance(c.grads, list) else c.grads[1]
            grads = []
            for i, g in enumerate(specs):
                grads.append(self.grad(g, i, grads))
            if isinstance(c.grads, tuple) and c.grads[0] == "tuple":
                grads = tuple(grads)
            elif isinstance(c.grads, tuple) and c.grads[0] == "generator":
                grads = (g for g in list(grads))
        inputs: dict = {}
        if c.inputs == ("missing",):
            inputs = {}
        elif c.inputs == ("unexpected",):
            inputs = {"grad_snapshot": self.good_grads(2)[0]}
        elif isinstance(c.inputs, dict):
            for nm, lst in c.inputs.items():
                arrs = []
                for i, g in enumerate(lst):
                    arrs.append(self.grad(g, i, arrs))
                inputs[nm] = arrs
        return grads, {**inputs, **self.statistics(5)}


def snapshot(opt) -> dict:
    """Everything a failed call must leave bit-identical."""
    def b(x):
        return (np.asarray(x).dtype.str, np.shape(x), np.asarray(x).tobytes())
    return {"t": opt.t, "steps": list(getattr(opt, "_steps", [])),
            "skipped": opt.skipped_steps, "hyper": repr(opt.hyper),
            "groups": repr([{k: v for k, v in g.items() if k != "params"}
                            for g in opt.param_groups]),
            "params": [b(p) for p in opt.params],
            "state": [{k: b(v) for k, v in st.items()} for st in opt.state]}


def _diff(a: dict, b: dict) -> str:
    for k in a:
        if a[k] != b[k]:
            if k in ("params", "state"):
                for i, (x, y) in enumerate(zip(a[k], b[k])):
                    if x != y:
                        keys = [n for n in x if x.get(n) != y.get(n)] if k == "state" else ""
                        return f"{k}[{i}] changed {keys}"
            return f"{k}: {str(a[k])[:200]} -> {str(b[k])[:200]}"
    return ""


# Values are compared only in "tame" steps: every finite number the step reads
# (parameters, states, gradients, extra inputs, hyperparameters, lr, 1/loss_scale,
# clip_global_norm, multipliers) is 0 or within [1e-30, 1e12] in magnitude. Past that the
# rules are ill-conditioned and the two backends legitimately round apart: LLVM contracts
# a*b+c into FMAs, so near overflow the kernel keeps a product finite where the reference
# rounds it to inf (rmsprop centered with g = 1e30: ms - mg*mg is inf - inf = NaN in the
# reference, fma(-mg, mg, inf) = inf in the kernel), and with denormal hyperparameters a
# result can be rounding noise over a denormal (ftml with epsilon = 1e-38 and a zero
# gradient: w = -z / d with z the FMA residue 3e-14 and d = 2.6e-36, -1.2e22 in the
# kernel, exactly -0.0 in the reference). A step that is not tame, and every later step
# of the call (its states carry the difference), still has every other check (typed
# errors, state untouched on failure, accepted/rejected as the rules say, gradients not
# written, the same state names, dtypes and shapes); only the values are not compared.
# NaN and inf *inputs* keep a step tame: NaN must propagate as in the reference.
TAME = (1e-30, 1e12)


def _tame(values) -> bool:
    for x in values:
        if x is None or isinstance(x, (bool, np.bool_, str)):
            continue
        try:
            a = np.asarray(x)
            if a.dtype.kind not in "fiu" and a.dtype.name not in LOW:
                continue
            a = np.abs(a.astype(np.float64)).reshape(-1)
        except (TypeError, ValueError):
            continue
        a = a[np.isfinite(a) & (a != 0)]
        if a.size and (a.min() < TAME[0] or a.max() > TAME[1]):
            return False
    return True


def step_is_tame(opt, case: Case, grads) -> bool:
    """Whether the next step of ``opt`` with ``grads`` is tame (see TAME)."""
    values = list(opt.params)
    for st in opt.state:
        values += list(st.values())
    gl, ins = grads if grads is not None else ([], {})
    for g in list(gl) if isinstance(gl, (list, tuple)) else []:
        values.append(g.rows if isinstance(g, RowSparse) else g)
    for lst in ins.values():
        values += list(lst) if isinstance(lst, (list, tuple)) else []
    for g in opt.param_groups:
        for k, v in g.items():
            if k in ("params", "names"):
                continue
            if callable(v):
                try:
                    v = v(opt.t)
                except Exception:   # noqa: BLE001 - an lr sequence past its end: the step fails
                    continue
            values.append(v)
    for k in ("loss_scale", "clip_global_norm"):
        v = case.options.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v:
            values += [v, 1.0 / v]    # gradients are multiplied by 1 / loss_scale
    for k in ("lr_mult", "wd_mult"):
        if isinstance(case.options.get(k), dict):
            values += [v for v in case.options[k].values() if isinstance(v, (int, float))]
    return _tame([v for v in values if not isinstance(v, (list, memoryview))])


def _arrays_of(opt) -> dict:
    out = {f"param {i}": p for i, p in enumerate(opt.params)}
    for i, st in enumerate(opt.state):
        out.update({f"state {i}.{k}": v for k, v in st.items()})
    return out


def _classes(x: np.ndarray) -> np.ndarray:
    return np.select([np.isnan(x), np.isposinf(x), np.isneginf(x)], [0, 1, 2], 3)


def compare(comp, ref, close: Callable, what: str, values: bool = True,
            oracle: Callable | None = None) -> str:
    """'' when the compiled optimizer equals the reference: the same step count, state
    names, dtypes and shapes and, when ``values`` (tame calls, see TAME), NaN and +-inf at
    the same places and finite values within ``close``'s tolerances
    (tests/helpers.assert_close).

    One legitimate difference is set aside, in float32 arrays that differ: the float32
    reference's own rounding error, measured against ``oracle()`` (the reference
    interpreter run in float64 on the same float32 values, World(promote=True)).
    Catastrophic cancellation (rmsprop centered's ms - mg*mg with a small decay)
    amplifies rounding, so the kernel may differ from the float32 reference by 4x
    (that element's error + the array's largest relative error x its magnitude) on top
    of the tolerance; an element where the float32 reference is NaN/inf and the oracle
    is not is not compared. Where the float32 reference is accurate the comparison stays
    strict, so a kernel that drops a NaN (sign(NaN) = 0) or turns a finite result into
    NaN is a mismatch.
    """
    if comp.t != ref.t:
        return f"{what}: t {comp.t} != {ref.t}"
    mine, theirs = _arrays_of(comp), _arrays_of(ref)
    if set(mine) != set(theirs):
        return f"{what}: states {sorted(mine)} != reference {sorted(theirs)}"
    wide = None
    for label in mine:
        a, e = np.asarray(mine[label]), np.asarray(theirs[label])
        if a.dtype != e.dtype or a.shape != e.shape:
            return f"{what}: {label} is {a.dtype}{a.shape}, reference {e.dtype}{e.shape}"
        if a.dtype.name not in ("float32", "float64", "float16", "bfloat16"):
            return f"{what}: {label} has dtype {a.dtype}"
        if not values:
            continue
        d = _pair(label, a, e, close, what)
        if d and e.dtype == np.float32 and oracle is not None:
            if wide is None:
                o = oracle()
                wide = _arrays_of(o) if o is not None else {}
            o = wide.get(label)
            if o is not None and np.shape(o) == e.shape:
                d = _pair(label, a, e, close, what, np.asarray(o, np.float64))
        if d:
            return d
    return ""


def _pair(label: str, a: np.ndarray, e: np.ndarray, close: Callable, what: str,
          oracle: np.ndarray | None = None) -> str:
    dt = a.dtype.name
    if dt == "bfloat16":
        a, e = a.astype(np.float32), e.astype(np.float32)
    keep = np.ones(e.shape, bool)
    slack = np.zeros(e.shape)
    if oracle is not None:   # the float32 reference's own error, measured by the oracle
        e64 = e.astype(np.float64)
        keep = _classes(e64) == _classes(oracle)
        with np.errstate(all="ignore"):
            both = np.isfinite(e64) & np.isfinite(oracle)
            err = np.where(both, np.abs(e64 - oracle), 0.0)
            rel = float(np.max(np.where(both & (oracle != 0), err / np.abs(oracle), 0.0),
                               initial=0.0))
            slack = 4 * (err + rel * np.where(both, np.abs(oracle), 0.0))
    for mask_name, f in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        ma, me = f(a) & keep, f(e) & keep
        if not np.array_equal(ma, me):
            k = np.flatnonzero((ma != me).reshape(-1))[:3]
            return (f"{what}: {label} {mask_name} at different places, e.g. flat "
                    f"{k.tolist()}: {a.reshape(-1)[k].tolist()} vs reference "
                    f"{e.reshape(-1)[k].tolist()}"
                    + (f" (float64 oracle {oracle.reshape(-1)[k].tolist()})"
                       if oracle is not None else ""))
    fin = np.isfinite(e) & keep
    af, ef = a[fin], e[fin]
    if oracle is not None and af.size:   # move the kernel's value towards the reference
        with np.errstate(all="ignore"):   # by the slack, then the usual tolerance applies
            d = af.astype(np.float64) - ef.astype(np.float64)
            af = (ef + np.sign(d) * np.maximum(np.abs(d) - slack[fin], 0.0)).astype(af.dtype)
    try:
        if dt == "bfloat16":
            assert_close(af, ef, "bfloat16", label)
        else:
            close(af, ef, dt if dt != "float16" else "float32", f"{what}: {label}")
    except AssertionError as err:
        return f"{what}: {label}: {str(err).strip()[:600]}"
    return ""


def _in_kernel(tb) -> bool:
    """Whether a traceback passes through the kernel launches (after validation)."""
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name in ("_run", "_run_lazy") and code.co_filename.endswith("optimizer.py"):
            return True
        tb = tb.tb_next
    return False


def run_case(case: Case, close: Callable = assert_close) -> Outcome:
    """Run ``case`` on the compiled and the reference backend and judge it."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return _run_case(case, close)
        except Exception as e:   # noqa: BLE001 - a bug of this harness (must not happen)
            return Outcome("harness", "harness", type(e).__name__, "", str(e)[:500],
                           traceback.format_exc()[-2000:])


def _typed(case: Case, e: BaseException) -> bool:
    return isinstance(e, TYPED) or (case.fpe_allowed and isinstance(e, FloatingPointError))


def _run_case(case: Case, close: Callable) -> Outcome:
    comp, ref = World(case, "compiled"), World(case, "reference")
    notes: list = []
    art_name = artifact(case.spec, case.base).name
    mode = {"values": True}   # see TAME: once a step is not tame, the call stays so
    done: list = []        # (prepare, run) of the phases that succeeded: the oracle replays them
    promotable = all(isinstance(p, ArraySpec) and p.dtype in GOOD_DTYPES for p in case.params) \
        and any(p.dtype == "float32" for p in case.params)

    def oracle():
        """The float64 reference run of every phase that succeeded so far (or None)."""
        if not promotable:
            return None
        w = World(case, "reference", promote=True)
        try:
            for prep, run in done:
                run(w, prep(w))
        except Exception:   # noqa: BLE001 - no oracle then; the mismatch stands
            return None
        return w.opt

    def judged(name: str, kind: str, e: BaseException | None = None, detail: str = "") -> Outcome:
        msg = str(e) if e is not None else ""
        return Outcome(kind, name, type(e).__name__ if e is not None else "",
                       categorize(msg) if e is not None else "", msg[:500], detail)

    def phase(name: str, prep: Callable, run: Callable, snap: bool = True,
              check_grads: bool = True):
        """Run one phase on both sides. Returns None to go on, or the call's Outcome."""
        expect = case.expect.get(name, "ok")
        args_c, args_r = prep(comp), prep(ref)
        before = snapshot(comp.opt) if snap else None
        if snap:
            mode["values"] = mode["values"] and step_is_tame(comp.opt, case, args_c)
        gbytes = _grad_bytes(args_c) if check_grads and args_c is not None else None
        try:
            rc = run(comp, args_c)
        except BaseException as e:   # noqa: B902 - everything is judged here
            if isinstance(e, KeyboardInterrupt):
                raise
            msg = str(e)
            if not _typed(case, e):
                return judged(name, "crash", e, "".join(
                    traceback.format_exception(type(e), e, e.__traceback__))[-2500:])
            if snap:
                after = snapshot(comp.opt)
                if after != before:
                    return judged(name, "partial", e, _diff(before, after))
            else:
                changed = [i for i, a in enumerate(comp.arrays) if a.tobytes() != comp.before[i]]
                if changed:
                    return judged(name, "param-written", e,
                                  f"parameters {changed} written by a failed constructor")
            if _in_kernel(e.__traceback__):
                return judged(name, "partial", e, "raised by a kernel launch, not by the "
                              "checks before it")
            if not msg.startswith(f"{art_name}:") and not msg.startswith(case.spec):
                notes.append(f"{name}: {type(e).__name__} without the optimizer's name: "
                             f"{msg[:200]}")
            try:
                run(ref, args_r)
            except BaseException as er:   # noqa: B902
                if type(er) is not type(e):
                    return judged(name, "divergent", e, f"reference raised {type(er).__name__}: "
                                  f"{str(er)[:300]}")
            else:
                return judged(name, "divergent", e, "the reference backend accepted it")
            fpe = isinstance(e, FloatingPointError)
            if expect in ("ok", "skip") or (expect == "fpe") != fpe and expect != "either":
                want = {"ok": "success", "skip": "a skipped step (False)", "bad": "a TypeError or "
                        "ValueError", "fpe": "FloatingPointError"}[expect]
                return judged(name, "rejected-valid", e,
                              f"expected {want} ({case.why.get(name)})")
            out = Outcome("typed", name, type(e).__name__, categorize(msg), msg[:300])
            if snap:   # the optimizer goes on as if the call never happened
                out2 = recovery(name)
                if out2 is not None:
                    return out2
            out.notes = notes
            return out
        # success on the compiled side
        if expect == "bad":
            return judged(name, "accepted-invalid",
                          detail=f"expected a TypeError/ValueError ({case.why.get(name)})")
        if expect == "fpe":
            return judged(name, "accepted-invalid",
                          detail="expected FloatingPointError (non-finite gradient)")
        if gbytes is not None and _grad_bytes(args_c) != gbytes:
            return judged(name, "grad-written", detail="a gradient or input changed in step()")
        try:
            rr = run(ref, args_r)
        except BaseException as er:   # noqa: B902
            return judged(name, "divergent", er, "the compiled backend succeeded, the "
                          "reference raised")
        done.append((prep, run))
        if rc != rr:
            return judged(name, "mismatch", detail=f"returned {rc!r}, reference {rr!r}")
        if expect == "skip":
            if rc is not False:
                return judged(name, "mismatch", detail="expected a skipped step (False)")
            after = snapshot(comp.opt)
            if {k: v for k, v in after.items() if k != "skipped"} != \
                    {k: v for k, v in before.items() if k != "skipped"}:
                return judged(name, "partial",
                              detail="skipped step changed " + _diff(before, after))
        d = compare(comp.opt, ref.opt, close, name, mode["values"], oracle)
        return judged(name, "mismatch", detail=d) if d else None

    def recovery(name: str) -> Outcome | None:
        """One good step on both sides after a failed phase: the same outcome, the same
        values. (It may fail itself, typed, on both sides: an lr sequence that ran out.)"""
        prep = lambda w: w.good_grads(77)                     # noqa: E731
        run = lambda w, a: w.opt.step(a[0], **a[1])           # noqa: E731
        mode["values"] = mode["values"] and step_is_tame(comp.opt, case, prep(comp))
        errors = []
        for w in (comp, ref):
            try:
                run(w, prep(w))
                errors.append(None)
            except BaseException as e:   # noqa: B902
                if isinstance(e, KeyboardInterrupt):
                    raise
                errors.append(e)
        ec, er = errors
        if ec is not None and not isinstance(ec, TYPED):
            return judged(f"{name}+recovery", "crash", ec, "a good step after the failed call")
        if type(ec) is not type(er):
            return judged(f"{name}+recovery", "divergent", ec or er,
                          f"a good step after the failed call: compiled {type(ec).__name__}, "
                          f"reference {type(er).__name__}")
        if ec is not None:
            return None
        done.append((prep, run))
        d = compare(comp.opt, ref.opt, close, f"{name}+recovery", mode["values"], oracle)
        return judged(f"{name}+recovery", "mismatch", detail=d) if d else None

    # construction
    out = phase("construct", lambda w: None, lambda w, a: w.construct(), snap=False)
    if out is not None:
        return out
    changed = [i for i, a in enumerate(comp.arrays) if a.tobytes() != comp.before[i]]
    if changed:
        return judged("construct", "param-written",
                      detail=f"parameters {changed} changed by the constructor")
    for k in range(case.warmup):
        out = phase(f"warmup{k}", lambda w, k=k: w.good_grads(100 + k),
                    lambda w, a: w.opt.step(a[0], **a[1]))
        if out is not None:
            return out
    if case.set_hyper is not None:
        kw = {} if case.set_group is None else {"group": case.set_group}
        out = phase("set_hyper", lambda w: None,
                    lambda w, a: w.opt.set_hyper(**_made(case.set_hyper), **kw), check_grads=False)
        if out is not None:
            return out
    # a gradient that is another parameter moves during the step: no grad-written check
    moving = isinstance(case.grads, list) and any(g.kind == "alias-other-param" for g in case.grads)
    out = phase("step", lambda w: w.step_args(), lambda w, a: w.opt.step(a[0], **a[1]),
                check_grads=not moving)
    if out is not None:
        return out
    return Outcome("skipped" if case.expect.get("step") == "skip" else "ok", "step", notes=notes,
                   values_compared=mode["values"])


def _grad_bytes(grads) -> list:
    gl, ins = grads
    out = []
    items = list(gl) if isinstance(gl, (list, tuple)) else []
    for lst in ins.values():
        items += list(lst) if isinstance(lst, (list, tuple)) else []
    for g in items:
        if isinstance(g, np.ndarray):
            out.append(g.tobytes())
        elif isinstance(g, RowSparse):
            out.append(np.asarray(g.rows).tobytes())
    return out


# -- the script ------------------------------------------------------------------------
def case_for(seed: int, index: int, specs) -> Case:
    return generate(RngDraw(np.random.default_rng([seed, index])), specs)


def _worker(seed: int, start: int, stop: int, bases: bool) -> None:
    """Child process: one JSON line per call on stdout (a segfault's Python stack on stderr)."""
    import faulthandler
    faulthandler.enable()
    specs = spec_list(bases)
    for i in range(start, stop):
        try:
            case = case_for(seed, i, specs)
        except Exception as e:   # noqa: BLE001 - a bug of the generator (must not happen)
            print(json.dumps({"i": i, "spec": "?", "kind": "harness", "phase": "generate",
                              "exc": type(e).__name__, "message": str(e)[:300],
                              "detail": traceback.format_exc()[-1500:]}), flush=True)
            continue
        print(json.dumps({"i": i, "spec": case.spec + (f"+{case.base}" if case.base else ""),
                          "started": True}), flush=True)
        out = run_case(case)
        rec = {"i": i, "spec": case.spec + (f"+{case.base}" if case.base else ""), **out.to_json()}
        if not out.bug:
            rec.pop("detail", None)
            rec.pop("message", None) if out.kind != "typed" else None
        print(json.dumps(rec, default=str), flush=True)


def _run_chunk(seed, start, stop, bases, timeout) -> list[dict]:
    """Run calls [start, stop) in children; a dead child is a crash of its current call."""
    records = []
    while start < stop:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(seed), str(start),
               str(stop)] + (["--bases"] if bases else [])
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        current, done = None, set()
        for line in out.splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("started"):
                current = rec
                continue
            records.append(rec)
            done.add(rec["i"])
        if proc.returncode == 0:
            break
        # the child died (or hung) in the call it had started and not finished
        if current and current["i"] not in done:
            bad = current["i"]
        else:
            bad = max(done) + 1 if done else start
        records.append({"i": bad, "spec": current["spec"] if current else "?", "kind": "crash",
                        "phase": "child", "exc": f"child exit {proc.returncode}",
                        "detail": (err or "")[-1500:],
                        "replay": f"python bench/fuzz.py --replay {seed}:{bad}"})
        start = bad + 1
    return records


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the figures and every bug record here")
    ap.add_argument("--chunk", type=int, default=500, help="calls per child process")
    ap.add_argument("--jobs", type=int, default=1, help="child processes at a time")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per child")
    ap.add_argument("--bases", action="store_true", help="also LARS(adam) and SVRG(adam)")
    ap.add_argument("--replay", help="SEED:INDEX: run one call in-process and print it")
    ap.add_argument("--worker", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(*args.worker, args.bases)
        return 0
    if args.replay:
        seed, index = (int(x) for x in args.replay.split(":"))
        case = case_for(seed, index, spec_list(args.bases))
        print(case.short())
        out = run_case(case)
        print(json.dumps(out.to_json(), indent=1, default=str))
        return 1 if out.bug else 0

    t0 = time.time()
    for name, base in spec_list(args.bases):   # build (or load) every artifact once, here
        artifact(name, base)
    t_build = time.time() - t0
    t1 = time.time()
    chunks = [(s, min(s + args.chunk, args.calls)) for s in range(0, args.calls, args.chunk)]
    records: list[dict] = []
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for recs in pool.map(lambda c: _run_chunk(args.seed, c[0], c[1], args.bases, args.timeout),
                             chunks):
            records += recs
            print(f"  {len(records)} calls, {time.time() - t1:.0f} s", file=sys.stderr, flush=True)
    wall = time.time() - t1
    kinds = Counter(r["kind"] for r in records)
    typed = [r for r in records if r["kind"] == "typed"]
    bugs = [r for r in records if r["kind"] in BUG_KINDS]
    notes = sorted({n for r in records for n in r.get("notes", [])})
    figures = {
        "command": " ".join(["python", "bench/fuzz.py"] + (argv or sys.argv[1:])),
        "seed": args.seed, "calls": len(records), "wall_s": round(wall, 1),
        "artifacts_s": round(t_build, 1),
        "successes": kinds["ok"], "skipped_steps": kinds["skipped"],
        "successes_values_compared": sum(1 for r in records if r["kind"] in ("ok", "skipped")
                                         and r.get("values_compared")),
        "typed_failures": len(typed),
        "typed_by_exception": dict(Counter(r["exc"] for r in typed).most_common()),
        "typed_by_category": dict(Counter(f"{r['phase']}/{r['category']}"
                                          for r in typed).most_common()),
        "crashes": kinds["crash"], "mismatches": kinds["mismatch"],
        "other_bugs": {k: kinds[k] for k in BUG_KINDS
                       if k not in ("crash", "mismatch") and kinds[k]},
        "by_spec": dict(sorted(Counter(r["spec"] for r in records).items())),
        "untidy_messages": notes[:50],
        "bugs": bugs,
    }
    print(json.dumps({k: v for k, v in figures.items() if k != "bugs"}, indent=1))
    for b in bugs[:40]:
        print(f"BUG {b['kind']} call {b['i']} ({b['spec']}, {b.get('phase')}): {b.get('exc', '')} "
              f"{b.get('message', '')[:200]} | {b.get('detail', '')[:300]} | replay: "
              f"python bench/fuzz.py --replay {args.seed}:{b['i']}"
              f"{' --bases' if args.bases else ''}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1, default=str)
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())

"""The draw interface and what is drawn from: specs, array shapes/dtypes/layouts/values,
learning-rate sources and hyperparameter values.

Part of the fuzzer (tests/fuzz/__init__.py says what it checks; ``python tests/fuzz/run.py``
runs it)."""
from __future__ import annotations

import abc
import decimal
import fractions
import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

import optgen
from optgen.runtime import catalog, schedules, tensors
from optgen.core import hyper as hyper_rules



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



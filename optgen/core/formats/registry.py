"""The state-format registry: each family of formats (cast formats: bf16, bf16sr; block-
quantized ones: q8, q4) is one ``StateFormat`` object, registered by the names it
parses; a request's text ("q8@128") parses to a typed ``Format`` value, and every other
module asks that value (its dtype, block, companion buffers, numpy encode/decode, the
code lower emits) instead of reading the text. The texts that manifests, artifact keys
and checkpoints hold are printed back by the registry, unchanged.

May import: numpy (ml_dtypes for bfloat16 arrays); the families (cast.py, blocked.py)
import this module, never the reverse.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

ABSMAX = "__absmax"   # a block-quantized state "v" keeps its block scales as "v__absmax"
# the view of a pass that stores block-quantized states (blocks over the flat index);
# manifests name it "q8" for q8 and q4 alike, so the text stays
BLOCKED_VIEW = "q8"
FLAT_VIEWS = ("flat", BLOCKED_VIEW)   # views whose buffers are flat (n,) arrays


@dataclass(frozen=True)
class Format:
    """One state format, parsed: ``name`` ("bf16", "q8", ...), the dtype of its stored
    values, for block-quantized formats the elements per block scale and, once the
    compiler picked it for a state, the code map ("signed", "linear4", ...)."""
    name: str
    family: "StateFormat"
    dtype: str
    block: int | None = None
    map: str | None = None

    def __str__(self) -> str:        # the canonical request text: "q8", "q8@128"
        return self.family.text(self)

    @property
    def blocked(self) -> bool:
        return self.family.blocked

    @property
    def symbol(self) -> str:
        """The request text as a part of a C symbol: "q8_64" for "q8@64"."""
        return str(self).replace("@", "_")

    @property
    def stored(self) -> str:
        """How a state in this format is stored (``Artifact.stored``, checkpoints)."""
        return self.family.stored(self)

    # what a format does, asked of its family (the base class: a cast format)
    def companions(self, state: str, n: int) -> dict[str, tuple[int, ...]]:
        """Buffers stored beside state ``state`` of ``n`` elements -> their shapes."""
        return self.family.companions(self, state, n)

    def code_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of the stored array of a state shaped ``shape``."""
        return self.family.code_shape(self, shape)

    def allocate(self, state: str, init: float, shape: tuple[int, ...], fill: "Fill"
                 ) -> dict[str, Any]:
        """The stored arrays (the state and its companions) of a state at ``init``."""
        return self.family.allocate(self, state, init, shape, fill)

    def quantize(self, values: np.ndarray, scales: np.ndarray | None = None
                  ) -> tuple[np.ndarray, ...]:
        """The stored arrays of float32 ``values``: (codes, absmax) when blocked, coded
        with the given block ``scales`` (the companion as stored) instead of the values'
        own where given (a checkpoint's values read back into its codes)."""
        if scales is None:
            return self.family.quantize(self, values)
        return self.family.quantize(self, values, scales)

    def dequantize(self, stored: tuple[np.ndarray, ...], shape: tuple[int, ...]
                   ) -> np.ndarray:
        """float32 values of the arrays ``quantize`` gives."""
        return self.family.dequantize(self, stored, shape)

    def tables(self) -> list[str]:
        """The constant table arguments a kernel takes for a state in this format."""
        return self.family.tables(self)

    @property
    def stochastic(self) -> bool:
        """Whether stores round stochastically (optgen/core/rounding.py)."""
        return self.family.stochastic(self)

    def rounded(self) -> "Format":
        """The format with stochastic rounding (bf16 -> bf16sr; others: itself)."""
        return self.family.rounded(self)

    def with_map(self, kind: str) -> "Format":
        """This format for one state, with the code map the compiler picked for it."""
        return self.family.with_map(kind, self.block)

    def map_for(self, nonneg: bool) -> str:
        """The code map of a state in this format (``nonneg``: proven non-negative)."""
        return self.family.map_for(self, nonneg)

    # the kernels: TVMScript that optgen.compiler.lower emits, the schedules' hooks
    def load(self, state: str, index: str) -> str | None:
        """Element ``index`` of the state as a float32 expression (None: the generic
        load by the stored dtype)."""
        return self.family.load(self, state, index)

    def store(self, state: str, value: str) -> str | None:
        """The statement storing ``value`` (None: the generic store by the dtype)."""
        return self.family.store(self, state, value)

    def lookup(self, state: str, index: str) -> tuple[str, str, int] | None:
        """What ``load`` looks up, for a schedule with a faster lookup than a gather:
        (the map's buffer, the code of element ``index``, the map's size); ``load`` is
        that entry times ``qa_<state>`` (``scaled``). None: no map lookup."""
        return self.family.lookup(self, state, index)

    def scaled(self, state: str, value: str) -> str:
        """TVMScript of the state's element from the map entry ``value`` that ``lookup``
        names: times ``qa_<state>`` (a sqrt map: squared)."""
        return self.family.scaled(self, state, value)

    def midpoints(self) -> list[str] | None:
        return self.family.midpoints(self)

    def scale(self, absmax: str) -> str:
        """TVMScript of the companion a block stores from its largest magnitude
        ``absmax`` (the absmax itself; fp8: its scale), which ``load`` reads back."""
        return self.family.scale(self, absmax)

    def inverse(self, scale: str) -> str | None:
        """TVMScript of the factor a block's values are multiplied by before
        ``encode_lines`` (1 / scale; None: formats without an encoder)."""
        return self.family.inverse(self, scale)

    def encode_lines(self, x: str, out: str) -> list[str] | None:
        """TVMScript lines storing the code of ``x`` (the value over the block's
        companion) into ``out`` by arithmetic (None: the templates' map codes)."""
        return self.family.encode_lines(self, x, out)

    def encoded(self, value: str, inverse: str) -> str:
        """TVMScript of the ``x`` that ``encode_lines`` codes, from a block's new value
        and its ``inverse``."""
        return self.family.encoded(self, value, inverse)

    def magnitude(self, value: str) -> str:
        """TVMScript of what a block's absmax is the largest of: |value| where finite,
        0 for NaN and +-inf."""
        return self.family.magnitude(self, value)

    def normalized(self, value: str, absmax: str) -> str:
        """TVMScript of value / absmax for a map's code (0 for NaN or a zero absmax)."""
        return self.family.normalized(self, value, absmax)

    @property
    def fast(self) -> bool:
        return self.family.fast(self)


class StateFormat:
    """A family of state formats; subclasses fill in what their formats need."""
    names: tuple[str, ...] = ()
    maps: dict[str, str] = {}         # code map -> format name (block-quantized)
    blocked = False                   # stored as codes with per-block companions

    def parse(self, owner: str, what: str, text: str) -> Format | None:
        raise NotImplementedError

    def text(self, fmt: Format) -> str:
        return fmt.name

    def stored(self, fmt: Format) -> str:
        return fmt.dtype

    def syntax(self) -> str:
        """The request texts this family accepts, for error messages."""
        return ", ".join(repr(n) for n in self.names)

    def from_stored(self, text: str) -> Format | None:
        return None

    def companions(self, fmt: Format, state: str, n: int) -> dict[str, tuple[int, ...]]:
        return {}

    def code_shape(self, fmt: Format, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape

    def allocate(self, fmt: Format, state: str, init: float, shape: tuple[int, ...],
                 fill: "Fill") -> dict[str, Any]:
        return {state: fill(shape, init, fmt.dtype)}

    def quantize(self, fmt: Format, values: np.ndarray) -> tuple[np.ndarray, ...]:
        return (np.asarray(values, np.float32).astype(_numpy_dtype(fmt.dtype)),)

    def dequantize(self, fmt: Format, stored: tuple[np.ndarray, ...], shape: tuple[int, ...]
                   ) -> np.ndarray:
        return np.asarray(stored[0]).astype(np.float32).reshape(shape)

    def tables(self, fmt: Format) -> list[str]:
        return []

    def stochastic(self, fmt: Format) -> bool:
        return False

    def rounded(self, fmt: Format) -> Format:
        return fmt

    def with_map(self, kind: str, block: int | None) -> Format:
        raise TypeError(f"state format family {type(self).__name__} has no code maps")

    def map_for(self, fmt: Format, nonneg: bool) -> str:
        raise TypeError(f"state format {fmt.name!r} has no code maps")

    def load(self, fmt: Format, state: str, index: str) -> str | None:
        return None

    def store(self, fmt: Format, state: str, value: str) -> str | None:
        return None

    def lookup(self, fmt: Format, state: str, index: str) -> tuple[str, str, int] | None:
        return None

    def scaled(self, fmt: Format, state: str, value: str) -> str:
        raise TypeError(f"state format {fmt.name!r} has no code maps")

    def midpoints(self, fmt: Format) -> list[str] | None:
        return None

    def scale(self, fmt: Format, absmax: str) -> str:
        return absmax

    def inverse(self, fmt: Format, scale: str) -> str | None:
        return None

    def encode_lines(self, fmt: Format, x: str, out: str) -> list[str] | None:
        return None

    def fast(self, fmt: Format) -> bool:
        return False

    def table(self, name: str) -> np.ndarray | None:
        return None


FAMILIES: list[StateFormat] = []


def register(family: StateFormat) -> StateFormat:
    FAMILIES.append(family)
    return family


def parse(owner: str, what: str, text: Any) -> Format:
    """The Format of a request text; a ValueError naming the owner and the texts
    accepted otherwise."""
    if isinstance(text, str):
        for family in FAMILIES:
            fmt = family.parse(owner, what, text)
            if fmt is not None:
                return fmt
    raise ValueError(f"{owner}: {what} must be one of {syntax()}, got {text!r}")


def syntax() -> str:
    return ", ".join(["'default'", *(f.syntax() for f in FAMILIES if f.syntax())])


@functools.lru_cache(maxsize=None)
def of(text: str) -> Format:
    """The Format of a canonical request text (one the registry printed)."""
    return parse("state format", "the format", text)


def from_stored(text: Any) -> Format | None:
    """The Format (with its map) of a stored text naming codes ("q8:signed:128"); None
    for a dtype ("bfloat16") or anything else."""
    if isinstance(text, str):
        for family in FAMILIES:
            fmt = family.from_stored(text)
            if fmt is not None:
                return fmt
    return None


def of_map(kind: str, block: int) -> Format:
    """The block-quantized Format whose code map is ``kind`` (a kernel's ``quant``)."""
    for family in FAMILIES:
        if kind in family.maps:
            return family.with_map(kind, block)
    raise KeyError(f"no state format has the code map {kind!r}")


def kernel_formats(maps: dict[str, str], block: int) -> dict[str, Format]:
    """State -> Format of a kernel's block-quantized states (its manifest's ``quant``,
    state -> map, and ``quant_block``)."""
    return dict(_kernel_formats(tuple(maps.items()), block))


@functools.lru_cache(maxsize=None)
def _kernel_formats(maps: tuple, block: int) -> tuple:
    return tuple((n, of_map(m, block)) for n, m in maps)


class FormattedKernel:
    """What a kernel record knows of its block-quantized states, from its ``quant``
    (state -> map) and ``quant_block``: optgen.compiler.lower's LoweredKernel and the
    runtime's KernelInfo both are one."""

    @property
    def formats(self) -> dict[str, Format]:
        return kernel_formats(self.quant, self.quant_block)

    @property
    def companions(self) -> list[str]:
        """The buffers stored beside its states (``<state>__absmax``: one per block)."""
        return [c for n, f in self.formats.items() for c in f.companions(n, 0)]

    @property
    def tables(self) -> dict[str, int]:
        """Its constant table arguments (code maps, ...) -> their sizes."""
        return {t: table(t).size for f in self.formats.values() for t in f.tables()}

    @property
    def packed(self) -> list[str]:
        """Its states stored two codes a byte (declared as (n + 1) // 2 bytes)."""
        return [n for n, f in self.formats.items() if f.code_shape((2,)) != (2,)]


def table(name: str) -> np.ndarray:
    """A kernel's constant table argument by its buffer name ("_qmap_signed", ...)."""
    for family in FAMILIES:
        found = family.table(name)
        if found is not None:
            return found
    raise KeyError(f"{name!r} names no state format's table")


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":     # (numpy has none: ml_dtypes', as the runtime uses)
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


Fill = Callable[[tuple, float, str], Any]   # (shape, value, dtype) -> a filled array

"""Block-quantized state formats, q8 and q4 (optgen/core/quant.py holds the maps and
the numpy quantization): a state is stored as one code per element (q8: a byte; q4: a
nibble, two a byte) into a code map, with one float32 absmax per block of ``block``
elements as its companion ``<state>__absmax``. The compiler picks the map of each state
(non-negative states get the finer one); the kernel's pass takes the maps (and, for
8-bit maps, the code tables) as constant table arguments.

    "q8"   8-bit dynamic map, 256 elements a block unless "q8@<block>" says otherwise
    "q4"   4-bit map (signed dynamic, or zero-free linear for non-negative states), 128
           elements a block unless "q4@<block>"

Stored texts ("q8:signed", "q8:usqrt", "q4:linear4:64": the block only where it is not
the default) name the map and the block ("q8:unsigned", non-negative states coded as
themselves, is q8's earlier form: it decodes, and loads converted); manifests carry a kernel's maps as ``quant``
(state -> map) and its block as ``quant_block``.

May import: numpy, optgen.core.quant, the registry.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from optgen.core import quant
from .registry import ABSMAX, Fill, Format, StateFormat, register


@dataclass(frozen=True)
class Member:
    bits: int          # code bits
    block: int         # default elements per absmax (the one place it is written)
    signed: str        # the map of states that may be negative
    nonneg: str        # the map of states proven non-negative
    legacy: tuple[str, ...] = ()   # maps no longer chosen that checkpoints may name


MIN_BLOCK = 32      # a block size is a power of two at least this
NO_BLOCK = quant.BLOCK   # the quant_block a manifest names for a kernel without
                         # block-quantized states (never read; keeps the manifests' text)
TABLE_PREFIXES = {"_qmap_": quant.dynamic_map, "_qmid_": quant.bucket_midpoints,
                  "_qtab_": quant.code_table}


class BlockQuantized(StateFormat):
    # q8's non-negative states code their square root ("usqrt"); checkpoints that coded
    # them as themselves ("unsigned") load converted
    members = {"q8": Member(8, quant.BLOCK, "signed", "usqrt", ("unsigned",)),
               "q4": Member(4, 128, "signed4", "linear4")}
    names = tuple(members)
    blocked = True
    maps = {m: name for name, mb in members.items()
            for m in (mb.signed, mb.nonneg, *mb.legacy)}

    # -- texts ---------------------------------------------------------------------
    def parse(self, owner: str, what: str, text: str) -> Format | None:
        name, at, size = text.partition("@")
        if name not in self.members:
            return None
        if not at:
            return Format(name, self, "uint8", self.members[name].block)
        if not size.isdigit() or int(size) < MIN_BLOCK or int(size) & (int(size) - 1):
            raise ValueError(f"{owner}: {what} {text!r}: the {name} block size must be a "
                             f"power of two of at least {MIN_BLOCK} ({name}@32, {name}@64, "
                             f"...), got {size!r}")
        return Format(name, self, "uint8", int(size))

    def syntax(self) -> str:
        return ", ".join(repr(n) for n in self.names) + \
            " (" + ", ".join(f"'{n}@<block>'" for n in self.names) + ")"

    def text(self, fmt: Format) -> str:
        default = fmt.block == self.members[fmt.name].block
        return fmt.name if default else f"{fmt.name}@{fmt.block}"

    def stored(self, fmt: Format) -> str:
        default = fmt.block == self.members[fmt.name].block
        return f"{fmt.name}:{fmt.map}" + ("" if default else f":{fmt.block}")

    def from_stored(self, text: str) -> Format | None:
        parts = text.split(":")
        if len(parts) not in (2, 3) or parts[0] not in self.members or \
                self.maps.get(parts[1]) != parts[0]:
            return None
        return self.with_map(parts[1], int(parts[2]) if len(parts) == 3 else None)

    def with_map(self, kind: str, block: int | None) -> Format:
        name = self.maps[kind]
        return Format(name, self, "uint8", block or self.members[name].block, kind)

    def map_for(self, fmt: Format, nonneg: bool) -> str:
        """The map of a state in ``fmt``: the finer one where it is proven non-negative."""
        mb = self.members[fmt.name]
        return mb.nonneg if nonneg else mb.signed

    def bits(self, fmt: Format) -> int:
        return self.members[fmt.name].bits

    # -- storage and numpy -----------------------------------------------------------
    def companions(self, fmt: Format, state: str, n: int) -> dict[str, tuple[int, ...]]:
        return {state + ABSMAX: (quant.blocks(n, fmt.block),)}

    def code_shape(self, fmt: Format, shape: tuple[int, ...]) -> tuple[int, ...]:
        n = int(np.prod(shape, dtype=np.int64))
        return tuple(shape) if self.bits(fmt) == 8 else (quant.code_bytes(n, fmt.map),)

    def allocate(self, fmt: Format, state: str, init: float, shape: tuple[int, ...],
                 fill: Fill) -> dict[str, Any]:
        # every block alike: the byte (q4: two codes) and absmax of a block of the init
        codes, scales = self.quantize(fmt, np.full(2, init, np.float32))
        code, absmax = int(codes[0]), float(scales[0])
        n = int(np.prod(shape, dtype=np.int64))
        codes = fill(self.code_shape(fmt, shape), code, "uint8")
        if self.bits(fmt) == 4 and n % 2:              # the odd last byte's low nibble is 0
            codes[-1] = code & 0xF0
        (name, blocks), = self.companions(fmt, state, n).items()
        return {state: codes, name: fill(blocks, absmax, "float32")}

    def quantize(self, fmt: Format, values: np.ndarray, scales: np.ndarray | None = None
                 ) -> tuple[np.ndarray, ...]:
        return quant.quantize(values, fmt.map, fmt.block, scales)

    def dequantize(self, fmt: Format, stored: tuple[np.ndarray, ...], shape: tuple[int, ...]
                   ) -> np.ndarray:
        codes, absmax = stored
        return quant.dequantize(codes, absmax, fmt.map, fmt.block, tuple(shape))

    def tables(self, fmt: Format) -> list[str]:
        kinds = ("map", "mid", "tab") if self.bits(fmt) == 8 else ("map",)
        return [f"_q{t}_{fmt.map}" for t in kinds]

    def table(self, name: str) -> np.ndarray | None:
        make = TABLE_PREFIXES.get(name[:6])
        return make(name[6:]) if make is not None and name[6:] in self.maps else None

    # -- the kernels (optgen.compiler.lower, the schedules and templates) -------------
    def load(self, fmt: Format, state: str, index: str) -> str:
        """TVMScript of element ``index`` of a state: its code's map value times the
        block's old absmax (``qa_<state>``, bound by the template), squared for a sqrt
        map."""
        table, code, _ = self.lookup(fmt, state, index)
        return self.scaled(fmt, state, f"{table}[{code}]")

    def scaled(self, fmt: Format, state: str, value: str) -> str:
        """TVMScript of a state's element from its map value ``value``."""
        out = f"({value} * qa_{state})"
        return f"({out} * {out})" if fmt.map in quant.SQRT_MAPS else out

    def lookup(self, fmt: Format, state: str, index: str) -> tuple[str, str, int]:
        return f"B__qmap_{fmt.map}", self._code(fmt, state, index), 1 << self.bits(fmt)

    def store(self, fmt: Format, state: str, value: str) -> str:
        """The block's new values (a sqrt map: their square roots) go to ``Q_<state>``;
        the template quantizes them."""
        if fmt.map in quant.SQRT_MAPS:
            return f"Q_{state}[j] = T.sqrt({value})"
        return f"Q_{state}[j] = {value}"

    def _code(self, fmt: Format, state: str, i: str) -> str:
        """The code of element ``i``: a byte, or a nibble (the high one of byte i // 2
        for even i, the low one for odd i)."""
        if self.bits(fmt) == 8:
            return f'T.Cast("int32", B_{state}[{i}])'
        byte = f'T.Cast("int32", B_{state}[T.floordiv({i}, T.int64(2))])'
        shift = f'T.Cast("int32", (T.int64(1) - T.floormod({i}, T.int64(2))) * T.int64(4))'
        return f"T.bitwise_and(T.shift_right({byte}, {shift}), T.int32(15))"

    def magnitude(self, fmt: Format, value: str) -> str:
        return quant.kernel_magnitude(value)

    def normalized(self, fmt: Format, value: str, absmax: str) -> str:
        return quant.kernel_normalized(value, absmax, fmt.map in quant.SQRT_MAPS)

    def encoded(self, fmt: Format, value: str, inverse: str) -> str:
        raise TypeError(f"state format {fmt.name!r} codes by its map, not by arithmetic")

    def midpoints(self, fmt: Format) -> list[str] | None:
        """A 4-bit map's 15 midpoints as float32 literals: the kernels count those below
        x / absmax for a code, without tables (None for 8-bit maps: they use tables)."""
        if self.bits(fmt) != 4:
            return None
        return [repr(float(x)) for x in quant.midpoints(fmt.map)[:-1]]

    def fast(self, fmt: Format) -> bool:
        """Whether the CPU kernel counts codes by arithmetic (quant.fast_codes)."""
        return self.bits(fmt) == 8


BLOCKED = register(BlockQuantized())

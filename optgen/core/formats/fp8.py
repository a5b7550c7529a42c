"""fp8 block-scaled states ("fp8", "fp8@<block>"): one OCP FP8 E4M3 code per element
(a byte) and one float32 scale per block of ``block`` elements (256 unless
"fp8@<block>" says otherwise), as torchao's fp8 optimizer states keep them.

E4M3 (OCP 8-bit floating point specification, 2023): sign, 4 exponent bits (bias 7),
3 mantissa bits; subnormals m * 2**-9; the largest finite value 448 (S.1111.110); no
infinities; NaN is S.1111.111. A block's scale is its largest finite magnitude over
448 (float32 division), at least ``MIN_SCALE`` = 2**-126 so that its reciprocal is
finite (a smaller one made 1 / scale inf and every zero 0 * inf = NaN), and 0 for a
block without a nonzero finite value (it reads back as zeros). A code is the nearest
E4M3 value of x * (1 / scale) (float32, the reciprocal rounded once a block), ties to
the even mantissa, saturated to +-448: +-inf saturate, NaN stays NaN, and neither
changes the scale of the rest of its block. The stored companion keeps the
block-quantized family's name (``<state>__absmax``) but holds the scale.

Two maps. "e4m3" codes x itself (states of either sign). "e4m3sqrt", for the states
the compiler proves non-negative (second moments, accumulators), codes sqrt(|x|) with
the scale of the block's square roots and reads back the square: E4M3 holds about 5.4
decades below a block's largest value, the square root doubles that in x, so a second
moment spans the decades of its gradients, as the first moment does. A nonzero value
there never codes as 0 (at least the smallest subnormal): such a state is read under a
square root or as a divisor, where 0 would turn m / (sqrt(v) + eps) into m / eps
(docs/state-formats.md has the measurements).

Decoding and encoding are arithmetic on the bits, the same in numpy (``encode``,
``decode``: the reference interpreter, checkpoints, torch export) and in the kernels
(``load``, ``encode_lines``, ``encoded``: TVMScript the templates write), so compiled
codes equal the reference's: no tables, no lookups.

May import: numpy, optgen.core.quant, the registry and blocked.py.
"""
from __future__ import annotations

import numpy as np

from optgen.core.quant import finite_magnitude
from .blocked import BlockQuantized, Member
from .registry import Format, register

MAX = 448.0                 # the largest finite E4M3 value
BIAS = 7
SUB_STEP = 2.0 ** -9        # the subnormals' step (and the smallest one)
MIN_NORMAL = 2.0 ** -6
NAN = 0x7F                  # S.1111.111
_REBIAS = (127 - BIAS) << 23    # float32 exponent bias minus E4M3's, at the exponent field
_MAGIC = float(2 ** 23)     # x + 2**23 rounds x in [0, 8) to an integer, ties to even
_MAGIC_BITS = 0x4B000000    # the bits of 2**23
MIN_SCALE = 2.0 ** -126     # the smallest scale of a nonzero block: 1 / scale is finite
SIGNED, ROOT = "e4m3", "e4m3sqrt"   # the maps: x itself; sqrt(x) (non-negative states)


def encode(x: np.ndarray, nonzero: bool = False) -> np.ndarray:
    """uint8 E4M3 codes of float32 ``x``: nearest, ties to even, saturated to +-448,
    NaN -> S.1111.111. Normal range: the float32 bits rounded to 3 mantissa bits (add
    0x7FFFF plus the kept lowest bit, drop 20 bits) and rebiased; subnormal range: the
    integer nearest to |x| * 2**9. ``nonzero``: a nonzero x below the smallest
    subnormal's half codes as the smallest subnormal instead of 0 (the sqrt map)."""
    x = np.asarray(x, np.float32)
    shape, x = x.shape, x.reshape(-1)      # (arrays: wrapping uint32 math, no scalars)
    bits = x.view(np.uint32)
    sign = ((bits >> np.uint32(24)) & np.uint32(0x80)).astype(np.uint8)
    a = np.minimum(np.abs(x), np.float32(MAX))            # (NaN: handled last)
    ab = a.view(np.uint32)
    rounded = ab + np.uint32(0x7FFFF) + ((ab >> np.uint32(20)) & np.uint32(1))
    normal = (rounded - np.uint32(_REBIAS)) >> np.uint32(20)
    sub = (a * np.float32(2 ** 9) + np.float32(_MAGIC)).view(np.uint32) - \
        np.uint32(_MAGIC_BITS)
    with np.errstate(invalid="ignore"):
        mag = np.where(a < np.float32(MIN_NORMAL), sub, normal)
        if nonzero:
            mag = np.where((mag == 0) & (a > 0), np.uint32(1), mag)
        mag = np.where(np.isnan(x), np.uint32(NAN), mag)
    return (mag.astype(np.uint8) | sign).reshape(shape)


def decode(codes: np.ndarray) -> np.ndarray:
    """float32 values of E4M3 codes (bit arithmetic, as the kernels decode them)."""
    shape = np.shape(codes)
    c = np.asarray(codes, np.uint8).reshape(-1).astype(np.uint32)
    mag = c & np.uint32(0x7F)
    normal = ((mag << np.uint32(20)) + np.uint32(_REBIAS)).view(np.float32)
    sub = mag.astype(np.float32) * np.float32(SUB_STEP)
    v = np.where(mag < 8, sub, normal).astype(np.float32)
    v = np.where(mag == NAN, np.float32(np.nan), v).astype(np.float32)
    out = v.view(np.uint32) | ((c & np.uint32(0x80)) << np.uint32(24))
    return out.view(np.float32).reshape(shape)


class BlockScaledFp8(BlockQuantized):
    members = {"fp8": Member(8, 256, SIGNED, ROOT)}
    names = tuple(members)
    maps = {SIGNED: "fp8", ROOT: "fp8"}

    # -- numpy ------------------------------------------------------------------------
    def quantize(self, fmt: Format, values: np.ndarray, scales: np.ndarray | None = None
                 ) -> tuple[np.ndarray, ...]:
        flat = np.asarray(values, np.float32).reshape(-1)
        n, block = flat.size, fmt.block
        scale = np.zeros(-(-n // block), np.float32)
        if n == 0:
            return np.zeros(np.shape(values), np.uint8), scale
        pad = np.zeros(scale.size * block, np.float32)
        pad[:n] = flat
        absmax = np.max(finite_magnitude(pad).reshape(-1, block), axis=1)
        root = fmt.map == ROOT
        if root:
            absmax = np.sqrt(absmax)
        scale[:] = np.where(absmax > 0, np.maximum(absmax / np.float32(MAX),
                                                   np.float32(MIN_SCALE)), np.float32(0)) \
            if scales is None else np.asarray(scales, np.float32).reshape(-1)
        # x times the block's 1 / scale, as the kernels do: one division a block instead
        # of one an element (1 where the scale is 0: the block's finite values are 0)
        inv = np.float32(1) / np.where(scale > 0, scale, np.float32(1))
        x = np.sqrt(np.abs(flat)) if root else flat
        codes = encode(x * np.repeat(inv, block)[:n], nonzero=root)
        return codes.reshape(np.shape(values)), scale

    def dequantize(self, fmt: Format, stored: tuple[np.ndarray, ...], shape: tuple[int, ...]
                   ) -> np.ndarray:
        codes, scale = stored
        flat = np.asarray(codes).reshape(-1)
        per = np.repeat(np.asarray(scale, np.float32), fmt.block)[:flat.size]
        out = (decode(flat) * per).astype(np.float32)
        if fmt.map == ROOT:
            out = out * out
        return out.reshape(tuple(shape))

    def tables(self, fmt: Format) -> list[str]:
        return []

    def table(self, name: str) -> np.ndarray | None:
        return None

    def fast(self, fmt: Format) -> bool:
        return False

    def lookup(self, fmt: Format, state: str, index: str) -> None:
        return None        # decoded by arithmetic (load), no map

    # -- the kernels --------------------------------------------------------------------
    def load(self, fmt: Format, state: str, index: str) -> str:
        """Element ``index``: the decoded code times the block's scale (``qa_<state>``),
        squared for the sqrt map."""
        c = f'T.Cast("uint32", B_{state}[{index}])'
        mag = f"T.bitwise_and({c}, T.uint32(127))"
        normal = f'T.reinterpret("float32", T.shift_left({mag}, T.uint32(20)) + ' \
                 f"T.uint32({_REBIAS}))"
        sub = f'T.Cast("float32", {mag}) * T.float32({SUB_STEP!r})'
        value = f"T.Select({mag} < T.uint32(8), {sub}, {normal})"
        value = f'T.Select({mag} == T.uint32({NAN}), T.reinterpret("float32", ' \
                f"T.uint32(2143289344)), {value})"
        signed = f'T.reinterpret("float32", T.bitwise_or(T.reinterpret("uint32", {value}), ' \
                 f"T.shift_left(T.bitwise_and({c}, T.uint32(128)), T.uint32(24))))"
        scaled = f"({signed} * qa_{state})"
        return f"({scaled} * {scaled})" if fmt.map == ROOT else scaled

    def scale(self, fmt: Format, absmax: str) -> str:
        """A block's scale from its largest finite magnitude: (its square root, for the
        sqrt map) over 448, at least ``MIN_SCALE``; 0 for a block of zeros."""
        top = f"T.sqrt({absmax})" if fmt.map == ROOT else absmax
        return (f"T.Select({absmax} > T.float32(0), T.max({top} / T.float32({MAX!r}), "
                f"T.float32({MIN_SCALE!r})), T.float32(0))")

    def inverse(self, fmt: Format, scale: str) -> str:
        """What a block's values are multiplied by before ``encode_lines`` (1 for a block
        of zeros: its infinities then saturate instead of turning into 0 * inf)."""
        return f"(T.float32(1) / T.Select({scale} > T.float32(0), {scale}, T.float32(1)))"

    def encoded(self, fmt: Format, value: str, inverse: str) -> str:
        """The float32 ``encode_lines`` codes: the value (the sqrt map: the square root
        of its magnitude) times the block's inverse scale."""
        return f"T.sqrt(T.fabs({value})) * {inverse}" if fmt.map == ROOT \
            else f"{value} * {inverse}"

    def encode_lines(self, fmt: Format, x: str, out: str) -> list[str]:
        """TVMScript storing the code of float32 ``x`` into ``out`` (as ``encode``)."""
        code = f"T.Select(e8a < T.float32({MIN_NORMAL!r}), e8s, e8n)"
        if fmt.map == ROOT:      # nonzero x: at least the smallest subnormal
            code = f"T.Select(T.And({code} == T.uint32(0), e8a > T.float32(0)), " \
                   f"T.uint32(1), {code})"
        return [f'e8b: T.let = T.reinterpret("uint32", {x})',
                f"e8a: T.let = T.min(T.fabs({x}), T.float32({MAX!r}))",
                'e8ab: T.let = T.reinterpret("uint32", e8a)',
                "e8n: T.let = T.shift_right(e8ab + T.uint32(524287) + T.bitwise_and("
                f"T.shift_right(e8ab, T.uint32(20)), T.uint32(1)) - T.uint32({_REBIAS}), "
                "T.uint32(20))",
                'e8s: T.let = T.reinterpret("uint32", e8a * T.float32(512.0) + '
                f"T.float32({_MAGIC!r})) - T.uint32({_MAGIC_BITS})",
                "e8m: T.let = T.Select(T.bitwise_and(e8b, T.uint32(2147483647)) > "
                f"T.uint32(2139095040), T.uint32({NAN}), {code})",
                f'{out} = T.Cast("uint8", T.bitwise_or(e8m, T.bitwise_and(T.shift_right('
                "e8b, T.uint32(24)), T.uint32(128))))"]


FP8 = register(BlockScaledFp8())

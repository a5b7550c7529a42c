"""Block-wise 8-bit and 4-bit states (the "q8" and "q4" state formats,
optgen/core/formats.py): the code maps, and quantization as the reference interpreter and
the checkpoints compute it (numpy).

Dettmers et al., "8-bit Optimizers via Block-wise Quantization" (ICLR 2022): a state
tensor is cut into blocks of ``BLOCK`` elements (over its flat index); each block keeps
one float32 absmax and one uint8 code per element, the index of the nearest value of
a 256-entry *dynamic* map to ``x / absmax``. The dynamic map has 7 exponent "bits":
the decades 1e-6 .. 1 (signed: 1, 2, 4, ... 64 linearly spaced values per decade and
sign; unsigned: 2, 4, ... 128 per decade), plus 0 and 1.0 (as bitsandbytes'
``create_dynamic_map``). Signed states use the signed map; states proven non-negative
"usqrt": the unsigned map's code (twice the resolution) of sqrt(x) times the block's
1 / absmax (the absmax of the square roots), a positive value never coded as 0, read
back squared (``SQRT_MAPS``). "unsigned" coding x itself was q8's earlier form for
them; checkpoints that name it still decode.

4-bit codes (q4; Li et al., "Memory Efficient Optimizers with 4-bit States", NeurIPS
2023) use blocks of 128 (the q4 format's default) and 16-entry maps: "signed4", the signed dynamic
map with 3 exponent bits (decades 1e-2 .. 1: 1, 2, 4 values per decade and sign, plus 0
and 1.0), for states that can be negative; "linear4", the zero-free linear map
(k + 1) / 16, for states proven non-negative. Those are second moments and accumulators,
read under a square root or as a divisor, where a zero code would turn a small value
into 1/sqrt(0). Two codes share a byte: element 2k in the high nibble, 2k + 1 in the
low one (a tensor of odd size pads its last byte with a zero nibble), so the codes of
an ``n``-element state are a flat uint8 array of ``(n + 1) // 2`` bytes.

The kernels (templates/kernel_llvm_q8.py.j2) compute the same: the block's new values
in float32, their largest magnitude, ``x / absmax`` (0 where absmax is 0), and the
nearest code: the number of the map's midpoints (float32) below it, found without a
search (``code_table``; 4-bit: 15 compares with the midpoints as constants). The CPU
kernel's full blocks count them by arithmetic instead (``fast_codes``: no table) and
use the tables only for a block with a value that arithmetic is not sure of.
Non-finite values are not representable: a block's absmax is its largest *finite*
magnitude, +-inf code as +-1 (+-absmax), NaN as 0, and a block without a nonzero
finite value has absmax 0 and reads back as zeros; so a NaN or inf never spreads to the
rest of its block (``finite_magnitude``; the kernels: ``FINITE_MAGNITUDE``).

May import: numpy.
"""
from __future__ import annotations

import functools

import numpy as np

BLOCK = 256          # q8's default elements per absmax (the q8 format takes it from here:
                     # optgen/core/formats/blocked.py; quantize's default)
BITS = {"signed": 8, "unsigned": 8, "usqrt": 8, "signed4": 4, "linear4": 4}  # map -> code bits
MAPS = tuple(BITS)
# maps that code a non-negative state's square root with another map's codes (and never
# code a nonzero value as 0): q8's second moments. ``x / absmax`` of a second moment spans
# twice the decades of its gradients; its square root spans theirs, as the first moment
# does, so the 7 decades of the unsigned map hold what the signed map holds of ``m``
SQRT_MAPS = {"usqrt": "unsigned"}


def base(kind: str) -> str:
    """The map whose values and codes ``kind`` uses (itself, or a sqrt map's base)."""
    return SQRT_MAPS.get(kind, kind)
FINITE_MAX = 0x7F800000      # float32 bits of inf: below it (sign cleared) is finite


def finite_magnitude(x: np.ndarray) -> np.ndarray:
    """|x| where x is finite, 0 for NaN and +-inf (what a block's absmax is taken of)."""
    x = np.asarray(x, np.float32)
    finite = (x.view(np.uint32) & np.uint32(0x7FFFFFFF)) < np.uint32(FINITE_MAX)
    return np.where(finite, np.abs(x), np.float32(0)).astype(np.float32)


def kernel_magnitude(x: str) -> str:
    """TVMScript of ``finite_magnitude`` of float32 ``x`` (a buffer element: tested on
    its bits, which TVM's simplifier leaves alone)."""
    return (f'T.Select(T.bitwise_and(T.reinterpret("uint32", {x}), T.uint32(2147483647)) < '
            f"T.uint32({FINITE_MAX}), T.fabs({x}), T.float32(0))")


def kernel_normalized(x: str, absmax: str, inverse: bool = False) -> str:
    """TVMScript of x / absmax as ``quantize`` takes it: 0 where absmax is 0 or x is NaN
    (``inverse``: x * (1 / absmax), the sqrt maps')."""
    ratio = f"{x} * (T.float32(1) / {absmax})" if inverse else f"{x} / {absmax}"
    return (f"T.Select(T.And({absmax} > T.float32(0), T.bitwise_and(T.reinterpret("
            f'"uint32", {x}), T.uint32(2147483647)) <= T.uint32({FINITE_MAX})), '
            f"{ratio}, T.float32(0))")


def code_bytes(n: int, kind: str) -> int:
    """Bytes of the codes of ``n`` elements: one per element, or two codes a byte."""
    return n if BITS[kind] == 8 else (n + 1) // 2


@functools.lru_cache(maxsize=None)
def dynamic_map(kind: str) -> np.ndarray:
    """The sorted float32 values of a map (256 for 8-bit maps, 16 for 4-bit ones; cached
    and shared, also as a kernel argument: never write to it)."""
    if kind in SQRT_MAPS:
        return dynamic_map(base(kind))
    if kind == "linear4":
        return (np.arange(1, 17, dtype=np.float32) / np.float32(16)).astype(np.float32)
    signed, exps = kind.startswith("signed"), 7 if BITS[kind] == 8 else 3
    values = [0.0, 1.0]
    for i in range(exps):       # decade 10**(i - exps + 1): midpoints of a grid on [0.1, 1]
        count = 2 ** i if signed else 2 ** (i + 1)
        edges = np.linspace(0.1, 1.0, count + 1, dtype=np.float32)
        means = np.float32(10.0 ** (i - exps + 1)) * ((edges[:-1] + edges[1:]) / np.float32(2))
        values += means.tolist() + ((-means).tolist() if signed else [])   # (float32 math)
    out = np.sort(np.array(values, dtype=np.float32))
    assert out.size == 1 << BITS[kind], out.size
    return out


# the code of x without a search (the kernels): a table by the top bits of x's float32
# representation (sign, exponent, KEY_BITS mantissa bits; magnitudes below 2**-24 share
# the first bucket) holds the smallest code of that bucket, and one compare with the
# next midpoint (a second table by the same key) finishes it (code_table checks that no
# bucket spans more than two codes)
KEY_BITS = 7
KEY_BASE = 103 << KEY_BITS                 # biased exponent 103: 2**-24
BUCKETS = (128 << KEY_BITS) - KEY_BASE + 1   # per sign, up to the bucket of 1.0


@functools.lru_cache(maxsize=None)
def midpoints(kind: str) -> np.ndarray:
    """The float32 midpoints between consecutive map values, padded with +inf to the
    map's size:
    the code of x is the number of midpoints below it (nearest value, ties to the
    smaller, up to the rounding of the midpoints themselves)."""
    m = dynamic_map(kind)
    return np.append((m[:-1] + m[1:]) / np.float32(2), np.float32(np.inf)).astype(np.float32)


def codes_of(norm: np.ndarray, kind: str) -> np.ndarray:
    """The codes of normalized float32 values (|x| <= 1), one per value (a sqrt map's
    positive values code as at least 1: never as 0)."""
    codes = np.searchsorted(midpoints(kind)[:-1], norm, side="left").astype(np.uint8)
    if kind in SQRT_MAPS:
        codes = np.where((codes == 0) & (np.asarray(norm) > 0), np.uint8(1), codes)
    return codes.astype(np.uint8)


def pack(codes: np.ndarray) -> np.ndarray:
    """4-bit codes two a byte (element 2k in the high nibble), flat."""
    flat = np.asarray(codes, np.uint8).reshape(-1)
    pairs = np.zeros(2 * ((flat.size + 1) // 2), np.uint8)
    pairs[:flat.size] = flat
    return (pairs[0::2] << 4 | pairs[1::2]).astype(np.uint8)


def unpack(packed: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` 4-bit codes of packed bytes, flat."""
    flat = np.asarray(packed, np.uint8).reshape(-1)
    return np.stack([flat >> 4, flat & 15], axis=1).reshape(-1)[:n]


@functools.lru_cache(maxsize=None)
def code_table(kind: str) -> np.ndarray:
    """int32[2 * BUCKETS]: the smallest code of each (sign, bucket) of normalized values;
    the kernel adds 1 where x is above the midpoint after it."""
    out = np.zeros(2 * BUCKETS, np.int32)
    for b in range(BUCKETS):
        lo = np.uint32((b + KEY_BASE) << (23 - KEY_BITS)) if b else np.uint32(0)
        hi = np.uint32((b + 1 + KEY_BASE) << (23 - KEY_BITS)) - np.uint32(1)  # last member
        lo_f, hi_f = (np.array([lo, hi], np.uint32).view(np.float32))
        for sign, first, last in ((0, lo_f, hi_f), (1, -hi_f, -lo_f)):
            a, z = codes_of(np.array([first, last], np.float32), kind).astype(int)
            assert z - a <= 1 or b == BUCKETS - 1, (kind, sign, b, a, z)
            out[sign * BUCKETS + b] = a
    return out


def blocks(n: int, block: int = BLOCK) -> int:
    """The number of absmax values of a tensor of ``n`` elements."""
    return -(-n // block)


def quantize(x: np.ndarray, kind: str, block: int = BLOCK, scales: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 codes, float32 absmax per block) of float32 values: 8-bit codes shaped like
    ``x``, 4-bit ones packed (``pack``). ``scales``: each block's absmax as given (the
    nearest codes of x / absmax; a map whose smallest value is not -1, the signed one,
    codes a block whose largest magnitude is negative below its absmax), else x's own."""
    flat = np.asarray(x, np.float32).reshape(-1)
    if kind in SQRT_MAPS:       # (negative values: NaN, coded as 0)
        with np.errstate(invalid="ignore"):
            flat = np.sqrt(flat)
    n = flat.size
    absmax = np.zeros(blocks(n, block), np.float32)
    if n == 0:
        return np.zeros(np.shape(x) if BITS[kind] == 8 else (0,), np.uint8), absmax
    pad = np.zeros(absmax.size * block, np.float32)
    pad[:n] = flat
    absmax[:] = np.max(finite_magnitude(pad).reshape(-1, block), axis=1) if scales is None \
        else np.asarray(scales, np.float32).reshape(-1)
    scale = np.repeat(absmax, block)[:n]
    safe = np.where(scale > 0, scale, np.float32(1))
    with np.errstate(divide="ignore", invalid="ignore"):
        # (a sqrt map: x times the block's 1 / absmax, one division a block; its absmax,
        # a square root, is a normal float32, so 1 / absmax is finite)
        ratio = flat * (np.float32(1) / safe) if kind in SQRT_MAPS else flat / safe
        norm = np.where((scale > 0) & ~np.isnan(flat), ratio, np.float32(0))
    codes = codes_of(norm, kind)
    return (codes.reshape(np.shape(x)) if BITS[kind] == 8 else pack(codes)), absmax


def dequantize(codes: np.ndarray, absmax: np.ndarray, kind: str, block: int = BLOCK,
               shape: tuple[int, ...] | None = None) -> np.ndarray:
    """float32 values of codes and their blocks' absmax, shaped like ``codes`` (8-bit) or
    ``shape`` (4-bit codes are packed: the state's shape is needed)."""
    if BITS[kind] == 4:
        assert shape is not None, "4-bit codes are packed: dequantize needs the shape"
        flat = unpack(codes, int(np.prod(shape, dtype=np.int64)))
    else:
        flat, shape = np.asarray(codes).reshape(-1), np.shape(codes)
    scale = np.repeat(np.asarray(absmax, np.float32), block)[:flat.size]
    out = (dynamic_map(kind)[flat] * scale).astype(np.float32)
    if kind in SQRT_MAPS:
        out = out * out
    return out.reshape(shape)


def code_of(value: float, kind: str) -> tuple[int, float]:  # (any block: all alike)
    """(byte, absmax) of a block whose elements all equal ``value`` (a state's init):
    the code, or for 4-bit maps the byte of two such codes."""
    codes, absmax = quantize(np.full(2, value, np.float32), kind)
    return int(codes[0]), float(absmax[0])


@functools.lru_cache(maxsize=None)
def bucket_midpoints(kind: str) -> np.ndarray:
    """float32[2 * BUCKETS]: the midpoint after each bucket's smallest code (+inf after
    code 255), so that the kernel reads it by the same index as the code table. A sqrt
    map's positive bucket of code 0 (the first: from 0 up) compares with 0 instead, so
    that every positive value in it codes as 1."""
    out = midpoints(kind)[code_table(kind)].astype(np.float32)
    if kind in SQRT_MAPS:
        out[:BUCKETS][code_table(kind)[:BUCKETS] == 0] = np.float32(0)
    return out


# The CPU kernel's code of x without a table (kernel_llvm_q8.py.j2, full blocks): the
# decade of |x| by compares with the six midpoints between decades (constants), then the
# count of midpoints below |x| as the floor of a line per decade, u = |x| * slope -
# offset, capped at the decade's last count (the line of decade 0 also counts the
# midpoint above 0; above the midpoint below 1.0, u is the count of 1.0 + 0.5). At each
# midpoint of a decade its line is at most 1.6e-5 above the count k that starts there
# (one float32 step of u), and at least k just above it: where u is FAST_EPS or more
# away from every integer, its floor is exact; elsewhere (about one value in 20,000)
# the kernel redoes the block with the tables. fast_codes is the same arithmetic
# in numpy; tests check it against codes_of near every midpoint and, slowly, for every
# float32 in [-1, 1], with and without a fused multiply-add (LLVM may contract u).
# Negative x count the midpoints at or below |x| (those below next_up(|x|)): the signed
# map is symmetric but for the midpoint before 1.0.
FAST_EPS = 2.0 ** -15
# The kernel's signed codes (AVX-512 full blocks: ``scaled``) take x as the value times
# the block's 1 / absmax, not divided by it (the divider bounds the step); numpy
# divides. The two x differ by at most three float32 roundings (at most 6 float32 steps
# of x, 7 of a), so the kernel is sure only where no such move crosses a midpoint: u at
# least FAST_EPS_SCALED from every integer (near a midpoint inside a region the line's
# own error and the move come to at most 1.25 * 2^-15), and a at more than BOUND_NEAR
# of itself from every bound (a bound's compare picks the line, so a move across it
# changes the code whatever u's fraction is). An absmax outside [2^-126, 2^126] (1 /
# absmax inexact or not finite) has the tables code its block. tests/test_q8_fast_codes.py
# checks every float32 within 16 steps of every midpoint against each value 7 steps
# around it.
FAST_EPS_SCALED = 2.0 ** -14
BOUND_NEAR = 2.0 ** -19
SCALED_MAPS = ("signed",)     # (a sqrt map's numpy multiplies too: ``quantize``)


@functools.lru_cache(maxsize=None)
def fast_constants(kind: str) -> dict:
    """An 8-bit map's constants for ``fast_codes``: "bounds" (float32[7], the midpoints
    between decades and the one below 1.0), per region between them "slope" and
    "offset" (float32[8]: the decades, then slope 0 above the last bound), "cap" (a
    region's last count is floor(offset * -2.25 + cap)), "zero" (the code of 0),
    "nonzero" (the sqrt maps: a positive value codes as at least 1, and x is the value
    times the block's 1 / absmax)."""
    if kind in SQRT_MAPS:
        return {**fast_constants(base(kind)), "nonzero": True}
    signed, mids = kind == "signed", midpoints(kind)[:-1].astype(np.float64)
    zero = int(codes_of(np.zeros(1, np.float32), kind)[0])
    bounds, slope, offset, first = [], [], [], zero + 1
    for d in range(7):                 # decade 10**(d - 6): codes first .. first + count - 1
        count = 2 ** d if signed else 2 ** (d + 1)
        bounds += [mids[first + count - 1]] if d < 6 else []
        slope.append(10.0 ** (6 - d) * count / 0.9)
        offset.append(count / 9 - (first - zero))   # u = count of midpoints above zero
        first += count
    # decade 0 also counts the midpoint above 0, mids[zero]: its line runs through it at
    # 1 (and, unsigned, through the next one at 2), from u(0) = 0.9 (unsigned: ~0.58)
    z, z1 = mids[zero], mids[zero + 1]
    slope[0] = 0.1 / z if signed else 1 / (z1 - z)
    offset[0] = -0.9 if signed else z * slope[0] - 1
    bounds.append(mids[254])
    return {"bounds": np.array(bounds, np.float32), "zero": zero,
            "slope": np.array(slope + [0.0], np.float32),
            "offset": np.array(offset + [zero - 255.5], np.float32),
            "cap": np.float32(-0.5 if signed else 0.75), "nonzero": False}


def fast_codes(norm: np.ndarray, kind: str, fused: bool = False, scaled: bool = False
               ) -> tuple[np.ndarray, np.ndarray]:
    """(codes, sure) of normalized float32 values by the kernel's arithmetic: ``sure``
    where u is outside FAST_EPS of an integer (there the codes equal codes_of).
    ``fused``: u and the cap rounded once (fused multiply-adds). ``scaled``: the
    kernel's test for x = value * (1 / absmax) (SCALED_MAPS): sure where the codes equal
    codes_of of every x within 7 float32 steps."""
    c, f32, f64 = fast_constants(kind), np.float32, np.float64
    x = np.asarray(norm, f32)
    bits = x.view(np.uint32)
    neg = bits >> np.uint32(31)
    if kind == "signed":
        a = ((bits & np.uint32(0x7FFFFFFF)) + neg).view(f32)
    else:
        a = np.maximum(x, f32(0))
    decade = np.searchsorted(c["bounds"], a, side="left")   # bounds below a
    slope, offset = c["slope"][decade], c["offset"][decade]
    if fused:   # a * slope is exact in float64, a * slope - offset rounded to odd there
        u = _round_to_odd_sum(a.astype(f64) * slope, -offset.astype(f64)).astype(f32)
        cap = np.floor((offset.astype(f64) * -2.25 + c["cap"]).astype(f32))   # (exact)
    else:
        u = (a * slope).astype(f32) - offset
        cap = np.floor((offset * f32(-2.25)).astype(f32) + c["cap"])
    low = np.floor(u)
    count = np.minimum(low, cap)
    if c["nonzero"]:
        count = np.maximum(count, (a > 0).astype(f32))
    if kind == "signed":   # 127 + count, or 127 - count for negative x (at least 0)
        count = np.maximum(f32(c["zero"]) + np.where(neg > 0, -count, count), f32(0))
    frac = u - low
    eps = f32(FAST_EPS_SCALED if scaled else FAST_EPS)
    sure = (frac >= eps) & (frac <= f32(1) - eps)
    if scaled:      # (|a - bound| is exact where it is near: Sterbenz)
        gap = np.abs(a.reshape(-1, 1) - c["bounds"][None, :]).min(axis=1, initial=np.inf)
        sure &= gap.reshape(a.shape) > a * f32(BOUND_NEAR)
    return count.astype(np.uint8), sure


def _round_to_odd_sum(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """p + q in float64 rounded to odd (an inexact sum takes the neighbour with an odd
    last bit), so that rounding it to float32 rounds p + q once, as a fused multiply-add
    does."""
    s = p + q
    t = s - p
    err = (p - (s - t)) + (q - t)   # the exact rest (Knuth's two-sum)
    even = (s.view(np.uint64) & np.uint64(1)) == 0
    return np.where((err != 0) & even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)

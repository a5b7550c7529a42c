"""Block-wise 8-bit states (the "q8" state format, runtime/formats.py): the code maps,
and quantization as the reference interpreter and the checkpoints compute it (numpy).

Dettmers et al., "8-bit Optimizers via Block-wise Quantization" (ICLR 2022): a state
tensor is cut into blocks of ``BLOCK`` elements (over its flat index); each block keeps
one float32 absmax and one uint8 code per element, the index of the nearest value of
a 256-entry *dynamic* map to ``x / absmax``. The dynamic map has 7 exponent "bits":
the decades 1e-6 .. 1 (signed: 1, 2, 4, ... 64 linearly spaced values per decade and
sign; unsigned: 2, 4, ... 128 per decade), plus 0 and 1.0 (as bitsandbytes'
``create_dynamic_map``). Signed states use the signed map, states proven non-negative
the unsigned one (twice the resolution).

The kernels (templates/kernel_llvm_q8.py.j2) compute the same: the block's new values
in float32, their largest magnitude, ``x / absmax`` (0 where absmax is 0), and the
nearest code: the number of the map's midpoints (float32) below it, found without a
search (``code_table``). Non-finite values are not representable.

May import: numpy.
"""
from __future__ import annotations

import functools

import numpy as np

BLOCK = 256          # elements per absmax by default (a build parameter: q8@<block>)
MIN_BLOCK = 32       # a block size is a power of two at least this
MAPS = ("signed", "unsigned")


def stored(kind: str, block: int) -> str:
    """How a q8 state is stored (``Artifact.stored``, checkpoints): "q8:<map>" for the
    default block, "q8:<map>:<block>" otherwise."""
    return f"q8:{kind}" + ("" if block == BLOCK else f":{block}")


def parse_stored(text: str) -> tuple[str, int]:
    """(map, block) of a ``stored`` string."""
    parts = text.split(":")
    return parts[1], int(parts[2]) if len(parts) > 2 else BLOCK


@functools.lru_cache(maxsize=None)
def dynamic_map(kind: str) -> np.ndarray:
    """The 256 sorted float32 values of the signed or unsigned dynamic map (cached and
    shared, also as a kernel argument: never write to it)."""
    signed = kind == "signed"
    values = [0.0, 1.0]
    for i in range(7):          # decade 10**(i - 6): midpoints of a linear grid on [0.1, 1]
        count = 2 ** i if signed else 2 ** (i + 1)
        edges = np.linspace(0.1, 1.0, count + 1, dtype=np.float32)
        means = np.float32(10.0 ** (i - 6)) * ((edges[:-1] + edges[1:]) / np.float32(2))
        values += means.tolist() + ((-means).tolist() if signed else [])   # (float32 math)
    out = np.sort(np.array(values, dtype=np.float32))
    assert out.size == 256, out.size
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
    """The 255 float32 midpoints between consecutive map values, padded to 256 with +inf:
    the code of x is the number of midpoints below it (nearest value, ties to the
    smaller, up to the rounding of the midpoints themselves)."""
    m = dynamic_map(kind)
    return np.append((m[:-1] + m[1:]) / np.float32(2), np.float32(np.inf)).astype(np.float32)


def codes_of(norm: np.ndarray, kind: str) -> np.ndarray:
    """The codes of normalized float32 values (|x| <= 1)."""
    return np.searchsorted(midpoints(kind)[:255], norm, side="left").astype(np.uint8)


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


def quantize(x: np.ndarray, kind: str, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 codes shaped like ``x``, float32 absmax per block) of float32 values."""
    flat = np.asarray(x, np.float32).reshape(-1)
    n = flat.size
    absmax = np.zeros(blocks(n, block), np.float32)
    if n == 0:
        return np.zeros(np.shape(x), np.uint8), absmax
    pad = np.zeros(absmax.size * block, np.float32)
    pad[:n] = flat
    absmax[:] = np.max(np.abs(pad.reshape(-1, block)), axis=1)
    scale = np.repeat(absmax, block)[:n]
    with np.errstate(divide="ignore", invalid="ignore"):
        norm = np.where(scale > 0, flat / np.where(scale > 0, scale, 1), np.float32(0))
    return codes_of(norm, kind).reshape(np.shape(x)), absmax


def dequantize(codes: np.ndarray, absmax: np.ndarray, kind: str,
               block: int = BLOCK) -> np.ndarray:
    """float32 values of codes and their blocks' absmax, shaped like ``codes``."""
    flat = np.asarray(codes).reshape(-1)
    scale = np.repeat(np.asarray(absmax, np.float32), block)[:flat.size]
    return (dynamic_map(kind)[flat] * scale).reshape(np.shape(codes))


def code_of(value: float, kind: str) -> tuple[int, float]:  # (any block: all alike)
    """(code, absmax) of a block whose elements all equal ``value`` (a state's init)."""
    codes, absmax = quantize(np.full(1, value, np.float32), kind)
    return int(codes[0]), float(absmax[0])


@functools.lru_cache(maxsize=None)
def bucket_midpoints(kind: str) -> np.ndarray:
    """float32[2 * BUCKETS]: the midpoint after each bucket's smallest code (+inf after
    code 255), so that the kernel reads it by the same index as the code table."""
    return midpoints(kind)[code_table(kind)]


# the kernels' table arguments by buffer name prefix (optgen.compiler.specialize.quantize)
TABLES = {"_qmap_": dynamic_map, "_qmid_": bucket_midpoints, "_qtab_": code_table}

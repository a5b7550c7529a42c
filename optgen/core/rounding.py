"""Stochastic rounding to bfloat16 (``state_format="bf16sr"``, or ``"bf16"`` with
``stochastic_rounding=True``): a float32 ``x`` between two bfloat16 neighbours goes up
with probability equal to its distance from the lower one over their gap, so the
rounding is unbiased (E[round(x)] = x) and small updates to a bfloat16 state are kept
on average instead of being rounded away.

The bits: add a uniform 16-bit random number to x's float32 bits and drop the low 16
(NaN is kept as is, then canonicalized like round-to-nearest-even; inf stays inf). The
random number is a counter-based hash, with no state to carry and nothing shared
between threads:

    key  = mix64(seed, step, parameter index) mod 2**32        (host, per parameter)
    h    = (uint32(i) * 0x9E3779B1 + key) ^ salt(state)       (i: element index)
    h   ^= h >> 16; h *= 0x85EBCA6B; h ^= h >> 13; h *= 0xC2B2AE35; h ^= h >> 16
    r    = h & 0xFFFF

(the finalizer of MurmurHash3). The kernel computes the same (optgen.compiler.lower),
the reference interpreter this module's numpy version: results are reproducible for a
seed, equal between the compiled kernels and the reference, and independent of the
thread count. The key travels as two kernel scalars of 16 bits each (``KEY_SCALARS``),
exact in float32. Element indices wrap at 2**32.

May import: numpy. Imports no other runtime module.
"""
from __future__ import annotations

import zlib

import numpy as np

KEY_SCALARS = ("_sr_hi", "_sr_lo")     # the 32-bit key as two 16-bit kernel scalars
GOLDEN, MIX1, MIX2 = 0x9E3779B1, 0x85EBCA6B, 0xC2B2AE35
_M64 = (1 << 64) - 1


def salt(name: str) -> int:
    """The per-state constant mixed into the hash (states of one parameter get
    different streams)."""
    return zlib.crc32(name.encode())


def key(seed: int, step: int, index: int) -> int:
    """The 32-bit key of a parameter's step (splitmix64 of the three)."""
    x = (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + index * 0x94D049BB133111EB
         + 0x632BE59BD9B4E019) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return (x ^ (x >> 31)) & 0xFFFFFFFF


def key_scalars(k: int) -> tuple[float, float]:
    return float(k >> 16), float(k & 0xFFFF)


def noise(n: int, k: int, s: int) -> np.ndarray:
    """The 16-bit random numbers of elements 0 .. n-1 (uint32)."""
    with np.errstate(over="ignore"):
        h = np.arange(n, dtype=np.uint64).astype(np.uint32) * np.uint32(GOLDEN) + np.uint32(k)
        h ^= np.uint32(s)
        h ^= h >> np.uint32(16)
        h *= np.uint32(MIX1)
        h ^= h >> np.uint32(13)
        h *= np.uint32(MIX2)
        h ^= h >> np.uint32(16)
    return h & np.uint32(0xFFFF)


def to_bfloat16(x: np.ndarray, k: int, s: int) -> np.ndarray:
    """float32 ``x`` rounded stochastically to bfloat16 (as float32 values, each exactly
    a bfloat16; element i of ``x.reshape(-1)`` uses index i)."""
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    bits = flat.view(np.uint32)
    with np.errstate(over="ignore"):
        up = (bits + noise(flat.size, k, s)) & np.uint32(0xFFFF0000)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, flat, up.view(np.float32)).reshape(np.shape(x))


def nearest_bfloat16(x) -> np.ndarray:
    """``x`` rounded to the nearest bfloat16, ties to even (the IR's ``bf16``: what a
    value stored in bfloat16 keeps), as float32; NaN stays NaN. float64 goes through
    float32 first (rounded twice: a tie of float64 may round differently)."""
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    bits = flat.view(np.uint32)
    with np.errstate(over="ignore"):
        near = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) \
            & np.uint32(0xFFFF0000)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, flat, near.view(np.float32)).reshape(np.shape(x))

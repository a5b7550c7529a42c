"""Split master formats: a bfloat16 parameter stepped without a float32 master copy,
the master's low bits kept in one more per-element buffer, its *correction*
(``<param>__corr``: ``w__corr`` in kernels). The kernel decodes the float32 master θ
from (the bfloat16 weight, the correction), runs the rule unchanged in float32 and
encodes the new θ back into both, in the same pass (``master_format=``).

    "split16"  exact: 4 bytes a parameter (2 + 2). The weight is θ rounded to nearest,
               ties away from zero (on the magnitude: hi = (|bits| + 0x8000) >> 16 with
               θ's sign), and the correction the int16 ``bits(θ) - (bits(w) << 16)``,
               in [-0x8000, 0x7FFF]. Decoding ``(bits(w) << 16) + corr`` gives θ back
               bit for bit for every float32 but NaN. Ties go away from zero because
               the correction is an int16: round-to-nearest-even would need +0x8000
               at the ties it rounds down, one more than an int16 holds. Off ties the
               weight is θ rounded to nearest, as torch's cast rounds it.
    "split8"   3 bytes a parameter (2 + 1), FlashOptim's correction (arXiv 2602.23349):
               θ' = bfloat16(θ) rounded to nearest even, ρ = rint(clip((θ - θ') /
               (ULP(θ') / 2), -1, 1) * 127) as an int8, and θ̂ = θ' + ρ / 127 * ULP(θ') / 2,
               with ULP(θ') = 2^(exponent(θ') - 7) (zero and subnormal θ': the
               subnormal spacing 2^-133; ρ = 0 decodes θ' itself, -0 included). The
               master keeps 8 more bits than bfloat16:
               |θ̂ - θ| <= ULP(θ') / 254.

Non-finite values: a NaN master stores bfloat16's quiet NaN of its sign and a zero
correction (decoded: that NaN; its payload is lost). ±inf stores ±inf and zero. A finite
θ whose rounding overflows bfloat16 (|θ| >= 0x7F7F8000 as bits) has the weight ±inf, as
torch's cast gives; split16 still decodes θ exactly (the correction is negative), split8
decodes ±inf (θ' is infinite).

The correction belongs to the weight it was written with. A weight written outside the
optimizer keeps its correction (nothing stored tells such a write: every int16 is a
valid split16 correction of every weight), so the master decodes to the written weight
plus the old correction's low bits, within half a bfloat16 step of it, except where the
correction cannot belong to the weight: split16 decodes a pair whose master would be NaN
while the weight is not (a zeroed weight with a negative correction, an infinite one with
a positive correction) as the weight itself, correction 0; split8 does the same for the
corrections no encoding gives: one of the other sign than a zero weight, or one below
the first value of a binade past the midpoint to the value below (|rho| > 64 towards
zero: the spacing below is half), which would move the weight (it decodes a non-finite
weight as itself already). Other pairs decode within half a bfloat16 step of the weight.

May import: numpy, ml_dtypes, the registry.
"""
from __future__ import annotations

import numpy as np

from .registry import Format, StateFormat, register

CORR = "__corr"          # the parameter "w" keeps its correction as "w__corr"
_SIGN, _MAG, _INF, _QNAN = 0x80000000, 0x7FFFFFFF, 0x7F800000, 0x7FC00000
_MANT = 0x007F0000       # a bfloat16's mantissa bits, as float32 bits
_REACH = 64              # split8: the largest |rho| below a binade's first value that
                         # encodes (the spacing there is half: rint(63.5) = 64)


class Split(StateFormat):
    """The master formats: the parameter's dtype (bfloat16) and the correction's."""
    corr_dtypes = {"split16": "int16", "split8": "int8"}
    names = tuple(corr_dtypes)

    def parse(self, owner: str, what: str, text: str) -> Format | None:
        return Format(text, self, "bfloat16") if text in self.corr_dtypes else None

    def by_corr(self, dtype: str) -> Format | None:
        """The split format whose correction is stored as ``dtype`` (checkpoints)."""
        return next((Format(n, self, "bfloat16") for n, dt in self.corr_dtypes.items()
                     if dt == dtype), None)

    def syntax(self) -> str:
        return ""        # (not a state format: master_format= takes these)

    # -- numpy: what the reference interpreter and the tests run -------------------------
    def encode(self, fmt: Format, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bfloat16 weight, correction) of float32 ``theta``."""
        b = np.ascontiguousarray(theta, np.float32).view(np.uint32)
        nan = (b & _MAG) > _INF
        if fmt.name == "split16":
            hi = (b & _SIGN) | ((np.minimum(b & _MAG, _INF) + 0x8000) & 0xFFFF0000)
        else:
            hi = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000     # (nearest even)
        hi = np.where(nan, (b & _SIGN) | _QNAN, hi).astype(np.uint32)
        if fmt.name == "split16":
            corr = np.where(nan, 0, (b - hi).astype(np.int32)).astype(np.int16)
        else:
            with np.errstate(invalid="ignore"):
                d = (b.view(np.float32) - hi.view(np.float32)) / half_ulp(hi)
                rho = np.rint(np.clip(d, -1, 1) * np.float32(127))
            corr = np.where(_finite(hi), rho, 0).astype(np.int8)
        return _bfloat16(hi), corr

    def decode(self, fmt: Format, w: np.ndarray, corr: np.ndarray) -> np.ndarray:
        """The float32 master of a bfloat16 weight ``w`` and its correction."""
        hi = np.asarray(w).view(np.uint16).astype(np.uint32) << np.uint32(16)
        if fmt.name == "split16":
            c = np.asarray(corr, np.int16).astype(np.int32).view(np.uint32)
            theta = hi + c
            stale = ((theta & _MAG) > _INF) & ((hi & _MAG) <= _INF)   # (see the module doc)
            return np.where(stale, hi, theta).view(np.float32)
        with np.errstate(invalid="ignore"):
            low = (np.asarray(corr, np.int8).astype(np.float32) / np.float32(127)) * \
                half_ulp(hi)
            c = np.asarray(corr, np.int8)
            reach = np.where((hi & _INF) != 0, _REACH, 0)     # (a binade's first; ±0)
            stale = ((hi & _MANT) == 0) & np.where((hi & _SIGN) != 0, c > reach, c < -reach)
            keep = ~_finite(hi) | (c == 0) | stale     # (θ' itself: -0 stays)
            return np.where(keep, hi.view(np.float32), hi.view(np.float32) + low
                            ).astype(np.float32)

    # -- TVMScript: the kernels' load and store of the parameter ----------------------------
    def load_param(self, fmt: Format, w: str, corr: str) -> str:
        """The float32 master, from the weight's and the correction's elements."""
        hi = f'T.shift_left(T.Cast("uint32", T.reinterpret("uint16", {w})), T.uint32(16))'
        if fmt.name == "split16":   # (a pair decoding to NaN from a weight that is not: w)
            theta = f'{hi} + T.Cast("uint32", T.Cast("int32", {corr}))'
            stale = (f"T.And(T.bitwise_and({theta}, T.uint32({_MAG})) > T.uint32({_INF}), "
                     f"T.bitwise_and({hi}, T.uint32({_MAG})) <= T.uint32({_INF}))")
            return f'T.reinterpret("float32", T.Select({stale}, {hi}, {theta}))'
        # ρ / 127 without the divider: ρ * R1 is exact (R1 has 16 bits), so ρ * R1 +
        # ρ * R2 rounds once more, to float32(ρ / 127) for every int8 ρ, fused or not
        # (tests/test_split_master.py checks every one)
        r = f'T.Cast("float32", {corr})'
        low = (f"({r} * T.float32({R1!r}) + {r} * T.float32({R2!r})) * "
               f"{_tvm_half_ulp(hi)}")
        u, i8 = "T.uint32", "T.int8"
        reach = f"T.Select(T.bitwise_and({hi}, {u}({_INF})) != {u}(0), {i8}({_REACH}), {i8}(0))"
        belongs = (f"T.Or(T.bitwise_and({hi}, {u}({_MANT})) != {u}(0), "
                   f"T.Select(T.bitwise_and({hi}, {u}({_SIGN})) != {u}(0), "
                   f"{corr} <= {reach}, {corr} >= {i8}(0) - {reach}))")
        return (f'T.Select(T.And(T.And({_tvm_finite(hi)}, {corr} != T.int8(0)), {belongs}), '
                f'T.reinterpret("float32", {hi}) + {low}, T.reinterpret("float32", {hi}))')

    def store_param(self, fmt: Format, name: str, value: str, w: str, corr: str
                    ) -> list[str]:
        """Lines storing float32 ``value`` into the weight and its correction: let
        bindings (prefixed by ``name``), then the two stores."""
        u = "T.uint32"
        b, hi = f"{name}_b", f"{name}_hi"
        nan = f"T.bitwise_and({b}, {u}({_MAG})) > {u}({_INF})"
        qnan = f"T.bitwise_or(T.bitwise_and({b}, {u}({_SIGN})), {u}({_QNAN}))"
        if fmt.name == "split16":
            mag = f"T.min(T.bitwise_and({b}, {u}({_MAG})), {u}({_INF}))"
            near = (f"T.bitwise_or(T.bitwise_and({b}, {u}({_SIGN})), "
                    f"T.bitwise_and({mag} + {u}(32768), {u}(4294901760)))")
        else:
            near = (f"T.bitwise_and({b} + {u}(32767) + T.bitwise_and(T.shift_right({b}, "
                    f"{u}(16)), {u}(1)), {u}(4294901760))")
        lines = [f'{b}: T.let = T.reinterpret("uint32", {value})',
                 f"{hi}: T.let = T.Select({nan}, {qnan}, {near})"]
        if fmt.name == "split16":
            c = f'T.Select({nan}, T.int16(0), T.Cast("int16", {b} - {hi}))'
        else:
            d = _tvm_over_half_ulp(f'T.reinterpret("float32", {b}) - '
                                   f'T.reinterpret("float32", {hi})', hi)
            # rint by truncating x +- 0.5: x = 127 j / 2^15 (d is a multiple of θ's ULP),
            # so its only ties are +-63.5, where away from zero is to even
            x = f"{name}_x"
            lines.append(f"{x}: T.let = T.min(T.max({d}, T.float32(-1.0)), T.float32(1.0)) * "
                         "T.float32(127.0)")
            rho = f"{x} + T.Select({x} < T.float32(0.0), T.float32(-0.5), T.float32(0.5))"
            c = f'T.Select({_tvm_finite(hi)}, T.Cast("int8", {rho}), T.int8(0))'
        return lines + [f'{w} = T.Cast("bfloat16", T.reinterpret("float32", {hi}))',
                        f"{corr} = {c}"]


def half_ulp(hi: np.ndarray) -> np.ndarray:
    """Half the bfloat16 ULP at the bfloat16 values with float32 bits ``hi``:
    2^(exponent - 8), with the exponent of zero and subnormals taken as -126."""
    e = np.maximum(np.asarray(hi, np.uint32) & _INF, np.uint32(0x00800000))
    return e.astype(np.uint32).view(np.float32) * np.float32(2.0 ** -8)


def _finite(hi: np.ndarray) -> np.ndarray:
    return (np.asarray(hi, np.uint32) & _INF) != _INF


def _tvm_half_ulp(hi: str) -> str:
    return (f'(T.reinterpret("float32", T.max(T.bitwise_and({hi}, T.uint32({_INF})), '
            f'T.uint32(8388608))) * T.float32({2.0 ** -8!r}))')


# 1 / 127 as a 16-bit head and the float32 rest (load_param)
R1 = float(round(2.0 ** 22 / 127) * 2.0 ** -22)
R2 = float(np.float32(1 / 127 - R1))
_SMALL = 8 << 23         # below this exponent field 1 / half_ulp overflows float32


def _tvm_over_half_ulp(d: str, hi: str) -> str:
    """``d / half_ulp(hi)`` without the divider: d times 2^(135 - E) for hi's exponent
    field E >= 1 (zero and subnormals: 1), made as bits; below E = 8 that power
    overflows float32, so d is first scaled by 2^64 and then by 2^(71 - E). Both
    products are exact, and so the quotient's float32: d / half_ulp is 0 or a multiple
    of 2^-15 of at most 1, and d * 2^64 of a d below 2^-119 does not overflow."""
    u = "T.uint32"
    e = f"T.max(T.bitwise_and({hi}, {u}({_INF})), {u}(8388608))"
    small = f"{e} < {u}({_SMALL})"
    return (f"(({d}) * T.Select({small}, T.float32({2.0 ** 64!r}), T.float32(1.0))) * "
            f'T.reinterpret("float32", T.Select({small}, {u}({198 << 23}), '
            f"{u}({262 << 23})) - {e})")


def _tvm_finite(hi: str) -> str:
    return f"T.bitwise_and({hi}, T.uint32({_INF})) != T.uint32({_INF})"


def _bfloat16(hi: np.ndarray) -> np.ndarray:
    import ml_dtypes
    return (np.asarray(hi, np.uint32) >> np.uint32(16)).astype(np.uint16).view(
        ml_dtypes.bfloat16)


SPLIT = register(Split())

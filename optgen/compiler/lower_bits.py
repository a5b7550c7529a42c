"""Bit-level lines of the lowering (optgen.compiler.lower): stochastic rounding to
bfloat16, the NaN test on float32 bits, a mixed kernel's read of its master, and the
widening and narrowing of stored dtypes, as TVMScript text.

May import: optgen.core.rounding.
"""
from __future__ import annotations

from optgen.core import rounding


def stochastic(body: list[str], name: str, value: str, salt: int, key: list[str]) -> str:
    """``value`` (float32) rounded stochastically to a bfloat16 value, still as float32
    (``narrow`` then casts it exactly): adds the element's 16-bit hash
    (optgen/core/rounding.py, from its flat index ``i``, the key scalars and the state's
    salt) to the bits and drops the low 16. Appends the hash's let lines to ``body``."""
    u = 'T.uint32'
    hi, lo = (f'T.Cast("uint32", {k})' for k in key)
    h = f"sr_{name}"
    body += [
        f'{h}0: T.let = T.bitwise_xor(T.Cast("uint32", i) * {u}({rounding.GOLDEN}) + '
        f'T.bitwise_or(T.shift_left({hi}, {u}(16)), {lo}), {u}({salt}))',
        f"{h}1: T.let = T.bitwise_xor({h}0, T.shift_right({h}0, {u}(16))) * {u}({rounding.MIX1})",
        f"{h}2: T.let = T.bitwise_xor({h}1, T.shift_right({h}1, {u}(13))) * {u}({rounding.MIX2})",
        f"{h}3: T.let = T.bitwise_and(T.bitwise_xor({h}2, T.shift_right({h}2, {u}(16))), "
        f"{u}(65535))",
        f'{h}b: T.let = T.reinterpret("uint32", {value})']
    up = f'T.reinterpret("float32", T.bitwise_and({h}b + {h}3, {u}(4294901760)))'
    return f"T.Select({nan_bits(h + 'b')}, {value}, {up})"


def nan_bits(bits: str) -> str:
    """Whether the float32 with uint32 ``bits`` is a NaN (tested on the bits: see
    ``narrow``)."""
    return f"T.bitwise_and({bits}, T.uint32(0x7FFFFFFF)) > T.uint32(0x7F800000)"


def adopted(master: str, low: str, dtype: str, ty: str) -> str:
    """A mixed kernel's master as it reads it: the stored float32 master where the
    low-precision weight ``low`` is still its rounding to nearest even (bit for bit),
    else the weight widened: a weight written from outside the optimizer wins
    (optgen/core/reference.py ``adopted`` does the same). The bfloat16 rounding is done
    on the bits, as ``narrow``'s store rounds (NaN: the quiet NaN of its sign); a
    bfloat16 cast compared as uint16 crashes TVM's bfloat16 legalization."""
    u = "T.uint32"
    if dtype == "bfloat16":
        b = f'T.reinterpret("uint32", {master})'
        near = (f"T.bitwise_and({b} + {u}(0x7FFF) + T.bitwise_and(T.shift_right({b}, "
                f"{u}(16)), {u}(1)), {u}(0xFFFF0000))")
        rounded = (f"T.Select({nan_bits(b)}, T.bitwise_or(T.bitwise_and({b}, "
                   f"{u}(0x80000000)), {u}(0x7FC00000)), {near})")
        wide = f'T.shift_left(T.Cast("uint32", T.reinterpret("uint16", {low})), {u}(16))'
        return f'T.Select({rounded} == {wide}, {master}, T.reinterpret("float32", {wide}))'
    same = f'T.reinterpret("uint16", T.Cast("{dtype}", {master})) == T.reinterpret("uint16", {low})'
    return f'T.Select({same}, {master}, T.Cast("{ty}", {low}))'


def widen(slot: str, dtype: str, ty: str) -> str:
    """A load of a buffer stored as ``dtype``, in the kernel dtype ``ty`` (exact).

    bfloat16 (into float32 only) widens through its bits: TVM 0.27's bfloat16 legalization
    turns a let-bound ``T.Cast("float32", <bfloat16 load>)`` into an integer-to-float
    conversion of the uint16 bits (``uitofp``: 1.0 reads as 16256.0)."""
    if dtype == "bfloat16":
        return (f'T.reinterpret("float32", T.shift_left(T.Cast("uint32", '
                f'T.reinterpret("uint16", {slot})), T.uint32(16)))')
    return f'T.Cast("{ty}", {slot})'


def narrow(value: str, dtype: str) -> str:
    """``value`` rounded to the storage ``dtype``, to nearest even (from float32 or
    float64 to float16; from float32 only to bfloat16, the compute dtype of mixed kernels).

    TVM 0.27 legalizes float32 -> bfloat16 as integer rounding of the bits (``(x + 0x7FFF
    + lsb) >> 16``): right for every number, but NaN payloads carry into inf or zero
    (0x7F800001 -> inf, 0x7FFF8000 -> -0.0, 0xFFFFFFFF -> +0.0). So a NaN is first
    replaced by ml_dtypes' quiet NaN of its sign (sign | 0x7FC00000), which makes the
    result bit-identical to ml_dtypes. The NaN test is on the bits: ``T.isnan`` of a
    let-bound value fails MakePackedAPI ("variables ... are used, but are not passed")."""
    if dtype == "bfloat16":
        bits = f'T.reinterpret("uint32", {value})'
        is_nan = nan_bits(bits)
        nan = (f'T.reinterpret("float32", T.bitwise_or(T.bitwise_and({bits}, '
               f'T.uint32(0x80000000)), T.uint32(0x7FC00000)))')
        value = f"T.Select({is_nan}, {nan}, {value})"
    return f'T.Cast("{dtype}", {value})'


def nearest_bf16(value: str, ty: str) -> str:
    """``value`` (of dtype ``ty``) rounded to the nearest bfloat16, ties to even, and
    kept in ``ty`` (the IR's ``bf16``; optgen.core.rounding.nearest_bfloat16). On the
    float32 bits, not through a bfloat16 cast, which TVM 0.27 lowers only for bfloat16
    buffers ("BF16 needs to be storaged lowered first"); NaN stays as it is. float64
    goes through float32."""
    x = value if ty == "float32" else f'T.Cast("float32", {value})'
    bits = f'T.reinterpret("uint32", {x})'
    lsb = f"T.bitwise_and(T.shift_right({bits}, T.uint32(16)), T.uint32(1))"
    near = (f'T.reinterpret("float32", T.bitwise_and({bits} + T.uint32(0x7FFF) + {lsb}, '
            f'T.uint32(0xFFFF0000)))')
    out = f"T.Select({nan_bits(bits)}, {x}, {near})"
    return out if ty == "float32" else f'T.Cast("{ty}", {out})'


def lerp(start: str, end: str, weight: str, ty: str, const) -> str:
    """torch.lerp's value (the IR's ``lerp``): ``fma(w, end - start, start)`` for
    |w| < 0.5, else ``fma(w - 1, end - start, end)``, w - 1 and the difference in ``ty``.
    float32: the fused multiply-add in float64 (the product is exact there, so the one
    float32 rounding is fma's but where the float64 sum itself rounded onto a float32
    tie); float64: a multiply and an add."""
    small = f"(T.fabs({weight}) < {const(0.5)})"
    coeff = f"T.Select({small}, {weight}, {weight} - {const(1.0)})"
    base = f"T.Select({small}, {start}, {end})"
    diff = f"({end} - {start})"
    if ty != "float32":
        return f"({coeff} * {diff} + {base})"
    wide = [f'T.Cast("float64", {x})' for x in (coeff, diff, base)]
    return f'T.Cast("float32", {wide[0]} * {wide[1]} + {wide[2]})'

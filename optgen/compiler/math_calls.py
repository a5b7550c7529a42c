"""The C library's functions in a kernel (atan, atan2, tanh, erf, log1p, expm1, sinh,
cosh: optgen.ir.LIBM), named for each target, and copysign.

Lowering writes each as ``T.call_pure_extern("<dtype>", "<C99 name>", ...)`` (``render``:
``atanf`` on float32, ``atan`` on float64; copysign from the bits, exact everywhere).
Before a pass is scheduled, ``resolve`` asks the target for the name its compiler knows (``Target.math_name``: the C99 name on llvm, c and cuda;
OpenCL's, Metal's and WGSL's overloaded built-ins; ROCm's device library), and the
target refuses, with a BuildError naming the function and itself, one it lacks.

TVM's own intrinsics for these (``T.atan``, ``T.tanh``, ...) are not used: TVM 0.27's
LLVM rule writes float32 tanh from exp (measured: tanh(1e-8) = 0, tanh(1e-4) 440 ulp
off), and it has no rule for sinh or cosh; its OpenCL, Metal and WGSL rules emit C names (``atanf``) those
languages do not have. On llvm a pass calling one is scheduled with scalar loops: TVM
0.27's vectorizer cannot scalarize an extern call on a let-bound value (MakePackedAPI:
"variables ... are used, but are not passed in as API arguments"), and the C library's
functions are scalar anyway. Nothing here imports TVM.
"""
from __future__ import annotations

import dataclasses
import re

from ..ir import LIBM

OPS = {*LIBM, "copysign"}      # the ops ``render`` writes
CALL = re.compile(r'T\.call_pure_extern\("(float32|float64)", "(\w+)"')


def render(op: str, ty: str, args: list[str]) -> str:
    """The TVMScript of ``op`` (in OPS) on the rendered operands ``args``, dtype ``ty``."""
    if op == "copysign":   # exact, and the same on every target: the bits
        bits, magnitude = {"float32": ("int32", 0x7FFFFFFF),
                           "float64": ("int64", 0x7FFFFFFFFFFFFFFF)}[ty]
        x, y = (f'T.reinterpret("{bits}", {a})' for a in args)
        return (f'T.reinterpret("{ty}", T.bitwise_or(T.bitwise_and({x}, T.{bits}({magnitude})), '
                f'T.bitwise_and({y}, T.{bits}({-(magnitude + 1)}))))')
    return f'T.call_pure_extern("{ty}", "{op}{"f" if ty == "float32" else ""}", {", ".join(args)})'


def base_name(c_name: str, dtype: str) -> str:
    """``atanf`` (float32) -> ``atan``: the function's name in optgen.ir.LIBM."""
    name = c_name[:-1] if dtype == "float32" else c_name
    assert name in LIBM, (c_name, dtype)
    return name


def calls(k) -> bool:
    """Whether the lowered pass ``k`` calls one of the C library's functions."""
    return any(CALL.search(line) for line in k.body)


def resolve(k, tg):
    """The lowered pass ``k`` with each function named as target ``tg`` names it
    (``tg.math_name``, which raises BuildError for one it lacks)."""
    if not calls(k):
        return k

    def rename(m: re.Match) -> str:
        dtype = m.group(1)
        return f'T.call_pure_extern("{dtype}", "{tg.math_name(base_name(m.group(2), dtype), dtype)}"'

    return dataclasses.replace(k, body=[CALL.sub(rename, line) for line in k.body])

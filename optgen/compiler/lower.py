"""Stage 4 — lower: a ``KernelIR`` becomes TVMScript statements for one element ``i``.

Lowering says *what* is computed, never how it is looped: the schedule stage wraps the
statements in loops, vectors and threads for a target. All reads of an element happen
(as ``T.let`` bindings) before any write of that element, and every store reads only
let-bound values, so updating ``w`` and the states in place is safe whatever order the
stores come in (see tvm-notes §1b on in-place aliasing).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Expr, walk
from .specialize import KernelIR

TVM_DTYPE = {"float32": "float32", "float64": "float64"}
DTYPE_TAG = {"float32": "f32", "float64": "f64"}

_BIN = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">",
        "ge": ">=", "eq": "==", "ne": "!="}
_CALL = {"sqrt": "T.sqrt", "exp": "T.exp", "log": "T.log",
         "min": "T.min", "max": "T.max", "abs": "T.fabs", "pow": "T.pow",
         "and": "T.And", "or": "T.Or", "not": "T.Not", "where": "T.Select"}


@dataclass
class LoweredKernel:
    symbol: str
    dtype: str
    buffers: list[tuple[str, str]]   # (ABI name, TVMScript buffer variable)
    scalars: list[str]               # names of the entries of the scalar array, in order
    body: list[str]                  # per-element lets and stores, index variable ``i``


def buffer_var(name: str) -> str:
    return "B_" + name


SCALARS = "S"


def lower(kir: KernelIR, dtype: str, symbol: str) -> LoweredKernel:
    """Scalars (hyperparameters, host scalars) are read inline as ``S[j]`` from one
    array argument. As scalar parameters or let-bound values, TVM 0.27's simplifier
    crashes on shapes such as ``lr * min(max(g, -c), c)`` (it tries to bound a float
    variable with an integer constant); a buffer load is opaque to it."""
    ty = TVM_DTYPE[dtype]
    slot = {name: j for j, name in enumerate(kir.scalars)}
    names: dict[int, str] = {}
    body: list[str] = []

    def const(v: float) -> str:
        return f"T.{ty}({float(v)!r})"

    def ref(e: Expr) -> str:
        if e.op == "const":
            return const(e.value) if e.dtype == "float" else repr(bool(e.value))
        if e.op == "hyper":
            return f"{SCALARS}[{slot[e.name]}]"
        return names[id(e)]

    def render(e: Expr) -> str:
        a = [ref(x) for x in e.args]
        if e.op in ("param", "grad", "state"):
            return f"{buffer_var(e.name)}[i]"
        if e.op in _BIN:
            return f"({a[0]} {_BIN[e.op]} {a[1]})"
        if e.op == "neg":
            return f"({const(0.0)} - {a[0]})"
        if e.op == "pow" and e.args[1].op == "const" and e.args[1].value in (1.0, 2.0, 0.5):
            return {1.0: a[0], 2.0: f"({a[0]} * {a[0]})", 0.5: f"T.sqrt({a[0]})"}[e.args[1].value]
        if e.op == "rsqrt":
            # T.rsqrt of a let-bound value fails TVM 0.27's MakePackedAPI ("variables ...
            # are used, but are not passed in as API arguments"); 1/sqrt is what the
            # reference interpreter computes anyway.
            return f"({const(1.0)} / T.sqrt({a[0]}))"
        if e.op == "sign":
            x = a[0]
            return (f"T.Select({x} > {const(0)}, {const(1)}, "
                    f"T.Select({x} < {const(0)}, {const(-1)}, {const(0)}))")
        return f"{_CALL[e.op]}({', '.join(a)})"

    for k, e in enumerate(walk(kir.tensor_updates.values())):
        if e.op in ("const", "hyper"):
            continue
        if e.dtype == "bool":
            # Conditions stay inline in their Select: a let-bound comparison of a vector
            # with a scalar trips TVM 0.27's analyzer after vectorization ("float32 vs
            # float32x16" in IntSetAnalyzer).
            names[id(e)] = render(e)
            continue
        # compound scalars were hoisted to the host (specialize), so every let is per element
        names[id(e)] = f"v{k}"
        body.append(f"v{k}: T.let = {render(e)}")
    for out, e in kir.tensor_updates.items():  # a scalar value is broadcast
        body.append(f"{buffer_var(out)}[i] = {ref(e)}")
    return LoweredKernel(
        symbol=symbol, dtype=dtype,
        buffers=[(b, buffer_var(b)) for b in kir.buffers],
        scalars=list(kir.scalars),
        body=body)

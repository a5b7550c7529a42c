"""The optimizer IR: a small, closed set of elementwise expression nodes.

An update rule is a DAG of ``Expr`` nodes. Leaves are the parameter ``w``, the gradient,
states, hyperparameters, the step counter ``t`` and constants; inner nodes come from the
closed op set below. Every node knows

* ``dtype``: ``"float"`` (the kernel's element type) or ``"bool"``;
* ``kind``: ``"tensor"`` (one value per element) or ``"scalar"`` (one value per step);
* ``loc``: the spec file and line that created it, for error messages.

* ``axes``: for tensor values, which axes of the parameter's view ``[B, R, C]`` the value
  varies along ("brc" per element, "br" one per row, "bc" one per column, "b" one per
  batch, "" one per parameter); host scalars have "".

A parameter is viewed as ``[B, R, C]``: ``B = prod(shape[:-2])``, ``R = shape[-2]``,
``C = shape[-1]`` for two or more dimensions, ``[1, 1, n]`` otherwise. ``reduce`` nodes
(sum or mean over some axes) are the only non-elementwise nodes; the compiler runs them
as separate passes before the update (see optgen.compiler.specialize). A ``reduce``
of kind ``"gsum"`` (``global_sum``) sums over every element of every parameter the
optimizer steps: its pass computes this parameter's part, and the runtime adds the
parts of all parameters (and ranks) before any pass that reads the total.
"""
from __future__ import annotations

import numbers
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterator

from .errors import SpecError

# op name -> (arity, result dtype or None for "same as float operands", operand dtype)
ARITH = {"add": 2, "sub": 2, "mul": 2, "div": 2, "pow": 2, "min": 2, "max": 2,
         "neg": 1, "sqrt": 1, "rsqrt": 1, "abs": 1, "sign": 1, "exp": 1, "log": 1,
         "copysign": 2, "round_bf16": 1, "lerp": 3}
# "round_bf16": the value rounded to the nearest bfloat16 (ties to even), kept in the kernel
# dtype: a value torch stores in bfloat16 (Muon's Newton-Schulz), written out in the rule.
# "lerp": torch.lerp(start, end, weight) as torch rounds it: with d = end - start,
# fma(weight, d, start) if |weight| < 0.5 else fma(weight - 1, d, end), one rounding
# the C library's functions (libm: C99 names; optgen.compiler.math_calls names them per
# target): op -> arity
LIBM = {"atan": 1, "atan2": 2, "tanh": 1, "erf": 1, "log1p": 1, "expm1": 1, "sinh": 1,
        "cosh": 1}
ARITH.update(LIBM)
COMPARE = {"lt", "le", "gt", "ge", "eq", "ne"}
LOGIC = {"and": 2, "or": 2, "not": 1}
LEAVES = {"const", "param", "grad", "state", "hyper", "t"}
REDUCE_KINDS = ("sum", "mean", "gsum")
GLOBAL = "gsum"   # a sum over every parameter of the optimizer (optgen.dsl.global_sum)
# matrix nodes (2-D parameters, see the section "matrix values" below): products,
# transposes, a loop run a run-time number of times, and refresh-only linear algebra
MATRIX = {"matmul", "transpose", "loop", "loopvar", "inverse", "inverse_root", "power_qr",
          "eigen_order", "identity", "stat", "buf"}
OPS = set(ARITH) | COMPARE | set(LOGIC) | {"where", "reduce"} | LEAVES | MATRIX
AXES = "brc"


def union_axes(*axes: str) -> str:
    present = set("".join(axes))
    return "".join(a for a in AXES if a in present)

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Loc:
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


def caller_loc() -> Loc | None:
    """The first stack frame outside the optgen package: the spec line being run."""
    f = sys._getframe(1)
    while f is not None:
        raw = f.f_code.co_filename
        fn = os.path.abspath(raw)
        # skip optgen's own frames and generated code such as dataclass __init__ ("<string>")
        if not raw.startswith("<") and not fn.startswith(_PKG_DIR + os.sep):
            return Loc(f.f_code.co_filename, f.f_lineno)
        f = f.f_back
    return None


class Expr:
    """One IR node. Build them with arithmetic on spec names, not by hand."""

    __slots__ = ("op", "args", "value", "name", "dtype", "kind", "axes", "loc", "tag", "mat")
    __array_priority__ = 1000  # numpy scalars defer to our reflected operators

    def __init__(self, op: str, args: tuple = (), *, value: Any = None, name: str | None = None,
                 dtype: str = "float", kind: str = "scalar", axes: str | None = None,
                 loc: Loc | None = None, mat: str | None = None):
        assert op in OPS, op
        self.op, self.args, self.value, self.name = op, tuple(args), value, name
        self.dtype, self.kind = dtype, kind
        if axes is None:
            axes = "brc" if kind == "tensor" and op in ("param", "grad", "state") else ""
        self.axes = axes
        self.tag: str | None = None   # e.g. "preprocessed" (optgen.blocks)
        self.mat = mat                # matrix values: their shape, e.g. "RC" (see matrix_shape)
        self.loc = loc if loc is not None else caller_loc()

    # -- sugar: Python operators build nodes -------------------------------------------
    def __add__(self, o): return apply("add", self, o)
    def __radd__(self, o): return apply("add", o, self)
    def __sub__(self, o): return apply("sub", self, o)
    def __rsub__(self, o): return apply("sub", o, self)
    def __mul__(self, o): return apply("mul", self, o)
    def __rmul__(self, o): return apply("mul", o, self)
    def __truediv__(self, o): return apply("div", self, o)
    def __rtruediv__(self, o): return apply("div", o, self)
    def __pow__(self, o): return apply("pow", self, o)
    def __rpow__(self, o): return apply("pow", o, self)
    def __neg__(self): return apply("neg", self)
    def __pos__(self): return self
    def __abs__(self): return apply("abs", self)
    def __lt__(self, o): return apply("lt", self, o)
    def __le__(self, o): return apply("le", self, o)
    def __gt__(self, o): return apply("gt", self, o)
    def __ge__(self, o): return apply("ge", self, o)
    def __and__(self, o): return apply("and", self, o)
    def __rand__(self, o): return apply("and", o, self)
    def __or__(self, o): return apply("or", self, o)
    def __ror__(self, o): return apply("or", o, self)
    def __invert__(self): return apply("not", self)

    @property
    def T(self) -> "Expr":
        """The transpose of a matrix value (2-D parameters): ``matmul(x, x.T)``."""
        return transpose(self)

    # == and != stay identity-based so nodes can live in dicts; use eq()/ne() in specs.
    # Against a number, identity would make `grad == 0` the constant False: an error.
    def __eq__(self, o):
        self._not_a_number("==", o)
        return self is o

    def __ne__(self, o):
        self._not_a_number("!=", o)
        return self is not o

    __hash__ = object.__hash__

    def _not_a_number(self, op: str, o: Any) -> None:
        if isinstance(o, numbers.Real) and not isinstance(o, bool):
            raise SpecError(f"'{op}' on {self.describe()} and {o!r} compares IR objects, "
                            "not values", caller_loc(),
                            hint=f"use {'eq' if op == '==' else 'ne'}(a, b)")

    def __bool__(self):
        # located at the spec line that asks (an `if`), not where the value was made
        raise SpecError(f"the value of {self.describe()} is only known when the kernel runs",
                        caller_loc() or self.loc,
                        hint="use where(cond, a, b) instead of Python 'if'/'and'/'or'")

    def describe(self) -> str:
        if self.op in ("param", "grad", "state", "hyper", "t"):
            return f"{self.op} {self.name!r}" if self.name else self.op
        if self.op == "const":
            return repr(self.value)
        return f"a {self.kind} expression ({self.op})"

    def __repr__(self) -> str:
        return f"Expr({self.op}, {self.name or self.value or ''}, {self.dtype}, {self.kind})"


def const(value: Any, loc: Loc | None = None) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return Expr("const", value=value, dtype="bool", kind="scalar", loc=loc)
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise SpecError(f"{value!r} ({type(value).__name__}) cannot be used in an update rule",
                        loc or caller_loc(), hint="use numbers, hyperparameters, states, w "
                        "and grad") from None
    return Expr("const", value=v, dtype="float", kind="scalar", loc=loc)


def apply(op: str, *operands: Any) -> Expr:
    """Build a node, checking operand dtypes (the verifier's dtype-conflict rule)."""
    loc = caller_loc()
    args = tuple(const(a, loc) for a in operands)
    kind = "tensor" if any(a.kind == "tensor" for a in args) else "scalar"
    if op in ARITH or op in COMPARE:
        for a in args:
            if a.dtype != "float":
                raise SpecError(f"dtype conflict: {op} needs float operands, got bool "
                                f"{a.describe()}", loc,
                                hint="where(cond, 1.0, 0.0) turns a condition into a number")
        dtype = "bool" if op in COMPARE else "float"
    elif op in LOGIC:
        for a in args:
            if a.dtype != "bool":
                raise SpecError(f"dtype conflict: '{op}' needs bool operands (comparisons), "
                                f"got float {a.describe()}", loc,
                                hint="compare first, e.g. (g > 0) & (m > 0)")
        dtype = "bool"
    elif op == "where":
        c, a, b = args
        if c.dtype != "bool":
            raise SpecError(f"dtype conflict: the condition of where() must be a comparison, "
                            f"got float {c.describe()}", loc,
                            hint="e.g. where(grad > 0, a, b)")
        if a.dtype != b.dtype:
            raise SpecError(f"dtype conflict: where() branches differ ({a.dtype} vs {b.dtype})",
                            loc, hint="give both branches numbers")
        dtype = a.dtype
    else:
        raise AssertionError(op)
    return Expr(op, args, dtype=dtype, kind=kind, axes=union_axes(*(a.axes for a in args)),
                loc=loc, mat=_common_shape(op, args, loc))


# -- matrix values --------------------------------------------------------------------
# A matrix spec treats a 2-D parameter as an R x C matrix. A matrix value's ``mat`` names
# its shape with two letters from "R" and "C": the parameter, its gradient and its
# per-element states are "RC", ``shape="rr"`` states and statistics "RR", ``shape="cc"``
# ones "CC", transposes swap the letters, and matmul(a, b) of "XK" and "KY" is "XY".
# Elementwise operands must have one shape (scalars and whole-tensor reductions, which
# are one value per parameter, broadcast).
MATRIX_STATES = {"rr": "RR", "cc": "CC"}


def matrix_shape(e: Expr) -> str | None:
    """``e``'s matrix shape: its ``mat``; "RC" for a per-element tensor (w, grad, a
    param-shaped state), which is an R x C matrix in a matrix expression; None for
    scalars and per-parameter values; "" for row/column values, which no matrix
    expression may use."""
    if e.mat is not None:
        return e.mat
    if e.kind != "tensor" or not e.axes:
        return None
    return "RC" if e.axes == "brc" else ""


def _common_shape(op: str, args: tuple, loc: Loc | None) -> str | None:
    """The matrix shape of an elementwise node, or None when no operand is a matrix."""
    if not any(a.mat is not None for a in args):
        return None
    shapes = [matrix_shape(a) for a in args]
    if "" in shapes:
        bad = args[shapes.index("")]
        raise SpecError(f"{op}: {bad.describe()} holds one value per row or column "
                        f"(axes {bad.axes!r}); matrix expressions combine whole R x C, R x R "
                        "or C x C matrices", loc, hint="use a param-shaped state, or reduce "
                        "it to one value per parameter (sum, mean, norm)")
    found = sorted({s for s in shapes if s is not None})
    if len(found) > 1:
        raise SpecError(f"shape conflict: {op} of a {_shape_text(found[0])} and a "
                        f"{_shape_text(found[1])} matrix", loc,
                        hint="elementwise operands need one shape; matmul(a, b) multiplies")
    return found[0]


def _shape_text(mat: str) -> str:
    return " x ".join(mat)


def _matrix_operand(x: Any, what: str, loc: Loc | None) -> tuple[Expr, str]:
    x = const(x, loc)
    shape = matrix_shape(x)
    if not shape or x.dtype != "float":
        raise SpecError(f"{what} needs a matrix (w, grad, a param-shaped or shape='rr'/'cc' "
                        f"state, or a product), got {x.describe()}", loc,
                        hint="scalars multiply with '*'; matmul is for matrices")
    return x, shape


def matmul(a: Any, b: Any) -> Expr:
    """The matrix product ``a @ b`` (a: X x K, b: K x Y)."""
    loc = caller_loc()
    (a, sa), (b, sb) = _matrix_operand(a, "matmul", loc), _matrix_operand(b, "matmul", loc)
    if sa[1] != sb[0]:
        raise SpecError(f"matmul of a {_shape_text(sa)} and a {_shape_text(sb)} matrix: the "
                        f"inner sizes {sa[1]} and {sb[0]} differ", loc,
                        hint="transpose one operand (x.T), or swap them")
    return Expr("matmul", (a, b), kind="tensor", axes="brc", loc=loc, mat=sa[0] + sb[1])


def transpose(x: Any) -> Expr:
    """The transpose of a matrix value (also ``x.T``)."""
    loc = caller_loc()
    x, shape = _matrix_operand(x, "transpose", loc)
    return Expr("transpose", (x,), kind="tensor", axes="brc", loc=loc, mat=shape[::-1])


def reduce(kind: str, x: Any, axes: str | None = None) -> Expr:
    """``kind`` ("sum" or "mean") of ``x`` over ``axes`` (default: all of x's axes)."""
    loc = caller_loc()
    x = const(x, loc)
    if x.kind != "tensor":
        raise SpecError(f"{kind}() needs a tensor value, got {x.describe()}: a scalar has "
                        "nothing to reduce", loc,
                        hint="reduce a tensor expression (grad, w or a state)")
    if x.dtype != "float":
        raise SpecError(f"dtype conflict: {kind}() needs a float operand, got a bool", loc,
                        hint="where(cond, 1.0, 0.0) turns a condition into a number")
    if x.mat is not None and axes is not None:
        raise SpecError(f"{kind}() of a {_shape_text(x.mat)} matrix is over all of it", loc,
                        hint=f"call {kind}(x) without axes")
    axes = x.axes if axes is None else axes
    if not isinstance(axes, str) or not axes or any(a not in x.axes for a in axes) \
            or len(set(axes)) != len(axes):
        raise SpecError(f"{kind}() over axes {axes!r}: the operand varies along "
                        f"{x.axes!r}", loc, hint="name axes the operand has (b, r, c of the "
                        "view [B, R, C]), or none for all of them")
    axes = union_axes(axes)
    keep = "".join(a for a in x.axes if a not in axes)
    return Expr("reduce", (x,), value=kind, name=axes, dtype="float", kind="tensor",
                axes=keep, loc=loc)


def group_reduce(kind: str, x: Any, heads: Any) -> Expr:
    """``kind`` ("sum" or "mean") of the per-row value ``x`` (axes "br") over each group
    of ``R / heads`` consecutive rows (the [B, heads, R/heads] view): one value per row,
    the same for every row of a group. ``heads`` is an int hyperparameter or an int >= 1;
    the runtime refuses a parameter whose R it does not divide."""
    loc = caller_loc()
    x = const(x, loc)
    if x.kind != "tensor" or x.axes != "br" or x.mat is not None or x.dtype != "float":
        raise SpecError(f"{kind} over groups of rows needs one float value per row (axes "
                        f"'br'), got {x.describe()} with axes {x.axes!r}", loc,
                        hint="e.g. head_mean(grad * grad, heads) or row_mean(x) first")
    if isinstance(heads, Expr):
        if heads.op != "hyper":
            raise SpecError(f"the number of heads must be an int hyperparameter or an int, "
                            f"got {heads.describe()}", loc,
                            hint="spec.hyper('heads', 1, 'heads >= 1', type='int')")
    elif isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise SpecError(f"the number of heads must be an int hyperparameter or an int >= 1, "
                        f"got {heads!r}", loc,
                        hint="spec.hyper('heads', 1, 'heads >= 1', type='int')")
    return Expr("reduce", (x, const(heads, loc)), value=kind, name="r", dtype="float",
                kind="tensor", axes="br", loc=loc)


def is_global(e: Expr) -> bool:
    """Whether ``e`` is a sum over all parameters (``global_sum``)."""
    return e.op == "reduce" and e.value == GLOBAL


def global_sums(roots) -> list[Expr]:
    """The ``global_sum`` nodes reachable from ``roots``, operands before users."""
    return [e for e in walk(roots) if is_global(e)]


def walk(roots, stop=()) -> Iterator[Expr]:
    """Every node reachable from ``roots``, each once, operands before users. Nodes whose
    id is in ``stop`` are yielded but not entered (a pass reads a reduction's result
    from its buffer, not its operand)."""
    seen: set[int] = set()
    order: list[Expr] = []
    stack = [(r, False) for r in reversed(list(roots))]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        if id(node) not in stop:
            stack.extend((a, False) for a in reversed(node.args) if id(a) not in seen)
    return iter(order)


# -- rendering scalar expressions as Python text (manifest host scalars) ---------------
_PY_BIN = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**", "lt": "<", "le": "<=",
           "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "and": "and", "or": "or"}
_PY_CALL = {"sqrt", "rsqrt", "abs", "sign", "exp", "log", "min", "max", "where", "copysign",
            "round_bf16", "lerp", *LIBM}


def to_python(e: Expr, names: dict[int, str] | None = None) -> str:
    """Render a scalar expression in the grammar of optgen.core.scalar_expr; a
    ``global_sum`` node renders as its name in ``names`` (by node id), the host value
    the runtime computes before the scalar is evaluated."""
    if names and id(e) in names:
        return names[id(e)]
    if e.op == "const":
        return repr(e.value)
    if e.op in ("hyper", "state", "t"):
        return e.name if e.op != "t" else "t"
    if e.op in _PY_BIN:
        a, b = (to_python(x, names) for x in e.args)
        return f"({a} {_PY_BIN[e.op]} {b})"
    if e.op == "neg":
        return f"(-{to_python(e.args[0], names)})"
    if e.op == "not":
        return f"(not {to_python(e.args[0], names)})"
    if e.op in _PY_CALL:
        return f"{e.op}({', '.join(to_python(a, names) for a in e.args)})"
    raise AssertionError(f"not a scalar expression: {e!r}")

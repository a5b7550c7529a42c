"""The spec DSL: declare an optimizer's hyperparameters, states and update rule.

A spec file creates one ``Spec`` and decorates its update function::

    spec = Spec("adam", __doc__)
    lr = spec.hyper("lr", 1e-3, "lr >= 0", "step size")
    m = spec.state("m", 0.0, "first moment")

    @spec.update
    def adam(w, grad, flags):
        ...
        return {m: m_new, w: w - lr * m_new}

Names returned by ``hyper``/``state``/``spec.t`` are IR leaves; arithmetic on them builds
the IR (see optgen.ir). Booleans are *flags*: compile-time specializations read as
``flags.name`` inside the update function, which is traced once per flag combination.

This module is the vocabulary spec files import (``from optgen.dsl import Spec, sqrt``):
the functions below, and names bound here from the modules that own them: the ``Spec``
class and its records (optgen.declarations), tracing (optgen.tracing) and
``base_spec`` (optgen.compiler.loader, which loads spec files and so sits above the
declarations, never above this module).
"""
from __future__ import annotations

import itertools
from typing import Callable

from . import declarations as _declarations, tracing as _tracing
from .compiler import loader as _loader
from .errors import SpecError
from .ir import GLOBAL, Expr, apply, caller_loc, const, group_reduce, matrix_shape, reduce, walk
from .ir import matmul, transpose  # noqa: F401 (spec files import them from here)

# -- the Spec class and what it declares (bound here: the names of optgen.dsl) --------
Spec = _declarations.Spec
Hyper = _declarations.Hyper
State = _declarations.State
Refresh = _declarations.Refresh
Trace = _tracing.Trace
Flags = _tracing.Flags
RESERVED = _declarations.RESERVED
SHAPE_NAMES = _declarations.SHAPE_NAMES   # R and C of a parameter's [B, R, C] view
STATE_SHAPES = _declarations.STATE_SHAPES
constraint_names = _declarations.constraint_names
base_spec = _loader.base_spec   # load a catalog spec to build on (Spec.extend)


# -- elementwise functions (the closed op set; see ir.OPS) ---------------------------
def sqrt(x): return apply("sqrt", x)
def rsqrt(x): return apply("rsqrt", x)
def sign(x): return apply("sign", x)
def exp(x): return apply("exp", x)
def log(x): return apply("log", x)
def atan(x): return apply("atan", x)
def atan2(y, x): return apply("atan2", y, x)
def tanh(x): return apply("tanh", x)
def erf(x): return apply("erf", x)
def log1p(x): return apply("log1p", x)
def expm1(x): return apply("expm1", x)
def sinh(x): return apply("sinh", x)
def cosh(x): return apply("cosh", x)
def copysign(x, y): return apply("copysign", x, y)
def round_bf16(x): return apply("round_bf16", x)   # nearest bfloat16 (ties to even), as a float
def lerp(start, end, weight): return apply("lerp", start, end, weight)   # torch.lerp's rounding
def pow(x, y): return apply("pow", x, y)  # noqa: A001 — x ** y, named as papers write it
def minimum(a, b): return apply("min", a, b)
def maximum(a, b): return apply("max", a, b)
def where(cond, a, b): return apply("where", cond, a, b)
def eq(a, b): return apply("eq", a, b)
def ne(a, b): return apply("ne", a, b)


# -- reductions over the parameter's view [B, R, C] (see optgen.ir) -----------------
def sum(x, axes=None):  # noqa: A001 — reads like the math in a spec
    """Sum of ``x`` over ``axes`` (default: every axis of x, one value per parameter)."""
    return reduce("sum", x, axes)


def mean(x, axes=None):
    """Mean of ``x`` over ``axes`` (default: every axis of x, one value per parameter)."""
    return reduce("mean", x, axes)


def norm(x):
    """The L2 norm of the whole tensor ``x``."""
    return apply("sqrt", reduce("sum", apply("mul", x, x)))


def rms(x):
    """The root mean square of the whole tensor ``x``."""
    return apply("sqrt", reduce("mean", apply("mul", x, x)))


def global_sum(x):
    """The sum of ``x`` over every element of every parameter the optimizer steps (all
    groups; under FSDP2 also every rank's shard): one value for the whole step, the
    same for every parameter. Its operand is computed per parameter from the old values
    (no reduction inside); the update and scalar states may read the total."""
    loc = caller_loc()
    x = const(x, loc)
    inner = [e for e in walk([x]) if e.op == "reduce"] if isinstance(x, Expr) else []
    if inner:
        raise SpecError("global_sum() of a value that already reduces "
                        f"({inner[0].value} over axes {inner[0].name!r}): the sum over all "
                        "parameters is taken before any other reduction", loc,
                        hint="sum elementwise values, e.g. global_sum(abs(s))")
    if x.kind == "tensor" and x.mat is not None:
        raise SpecError("global_sum() of a matrix product: matrix rules have no sums over "
                        "all parameters", loc, hint="sum an elementwise value")
    return reduce(GLOBAL, x)


def row_mean(x):
    """Mean over the last axis: one value per row of the ``[B, R, C]`` view."""
    return reduce("mean", x, "c")


def col_mean(x):
    """Mean over the second-to-last axis: one value per column of the view."""
    return reduce("mean", x, "r")


def head_mean(x, heads):
    """Mean of ``x`` over each head of a 2-D weight viewed as ``[heads, R/heads, C]``
    (Adam-mini's query/key blocks): one value per row, equal for the rows of a head.
    ``heads`` is an int hyperparameter or an int >= 1; it must divide R (checked for
    each parameter before a step). ``x`` is per element or per row."""
    loc = caller_loc()
    x = const(x, loc)
    if x.kind == "tensor" and x.axes == "brc" and x.mat is None:
        x = reduce("mean", x, "c")
    return group_reduce("mean", x, heads)


def head_sum(x, heads):
    """Sum of ``x`` over each head (see ``head_mean``): one value per row."""
    loc = caller_loc()
    x = const(x, loc)
    if x.kind == "tensor" and x.axes == "brc" and x.mat is None:
        x = reduce("sum", x, "c")
    return group_reduce("sum", x, heads)


# -- matrix values (2-D parameters; see optgen.ir "matrix values" and docs/matrix.md) -----
_loops = itertools.count()   # loop variables' names: unique within a process


def repeat(count, body: Callable[[Expr], Expr], init) -> Expr:
    """``body`` applied ``count`` times to the matrix ``init`` (Newton-Schulz iterations).
    ``count`` is an int hyperparameter (read at run time: changing it never rebuilds) or a
    Python int; ``body`` is traced once and compiled once."""
    loc = caller_loc()
    init = const(init, loc)
    shape = matrix_shape(init)
    if not shape:
        raise SpecError(f"repeat() needs a matrix to iterate on, got {init.describe()}", loc,
                        hint="e.g. repeat(ns_steps, step, x) with x = grad / norm(grad)")
    if isinstance(count, Expr):
        if count.op != "hyper":
            raise SpecError(f"repeat() count must be an int hyperparameter or an int, got "
                            f"{count.describe()}", loc, hint="spec.hyper('steps', 5, type='int')")
        times = count.name
    elif isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        times = count
    else:
        raise SpecError(f"repeat() count must be an int hyperparameter or an int >= 0, got "
                        f"{count!r}", loc, hint="spec.hyper('steps', 5, type='int')")
    var = Expr("loopvar", name=f"_loop{next(_loops)}", kind="tensor", axes="brc", loc=loc,
               mat=shape)
    out = const(body(var), loc)
    if matrix_shape(out) != shape:
        raise SpecError(f"repeat(): the body returns {out.describe()} of shape "
                        f"{matrix_shape(out) or 'scalar'}, not the {' x '.join(shape)} matrix "
                        "it was given", out.loc or loc,
                        hint="the body maps a matrix to a matrix of the same shape")
    if any(n.op == "loop" for n in walk([out])):
        raise SpecError("repeat() inside repeat() is not supported", loc,
                        hint="unroll the inner loop with a Python for over an int")
    return Expr("loop", (init, out, var), value=times, name=var.name, kind="tensor",
                axes="brc", loc=loc, mat=shape)


def eye(which: str) -> Expr:
    """The identity matrix of size R (``eye("r")``) or C (``eye("c")``); refresh rules."""
    loc = caller_loc()
    if which not in ("r", "c"):
        raise SpecError(f"eye({which!r}): the size is 'r' (rows) or 'c' (columns)", loc,
                        hint="eye('r') is R x R, eye('c') is C x C")
    mat = which.upper() * 2
    return Expr("identity", name=mat[0], kind="tensor", axes="brc", loc=loc, mat=mat)


def inverse(x) -> Expr:
    """The inverse of a square matrix, computed on the host (numpy, float64) in a refresh
    rule (``@spec.refresh``); never inside the per-step update."""
    loc = caller_loc()
    x = const(x, loc)
    shape = matrix_shape(x)
    if not shape or shape[0] != shape[1]:
        raise SpecError(f"inverse() needs a square matrix, got {x.describe()} "
                        f"({' x '.join(shape) if shape else 'not a matrix'})", loc,
                        hint="e.g. inverse(A / batch_size + damping * eye('c'))")
    return Expr("inverse", (x,), kind="tensor", axes="brc", loc=loc, mat=shape)


def _square(x, what: str, hint: str) -> tuple[Expr, str]:
    loc = caller_loc()
    x = const(x, loc)
    shape = matrix_shape(x)
    if not shape or shape[0] != shape[1]:
        raise SpecError(f"{what}() needs a square matrix, got {x.describe()} "
                        f"({' x '.join(shape) if shape else 'not a matrix'})", loc, hint=hint)
    return x, shape


def inverse_root(x, root) -> Expr:
    """``x^(-1/root)`` of a symmetric positive semi-definite matrix (Shampoo's
    L^(-1/4)), by a float64 eigendecomposition on the host (numpy ``eigh``) in a refresh
    rule: eigenvalues <= 0 (round-off below the damping) map to 0, a pseudo-inverse root.
    ``root`` is a hyperparameter or a number."""
    x, shape = _square(x, "inverse_root", "e.g. inverse_root(L + epsilon * eye('r'), 4)")
    return Expr("inverse_root", (x, const(root, caller_loc())), kind="tensor", axes="brc",
                loc=caller_loc(), mat=shape)


def power_qr(x, q) -> Expr:
    """One QR-based power iteration on the symmetric matrix ``x`` from the basis ``q``
    (SOAP's Q = QR(L Q)), on the host in a refresh rule (numpy, float64). A basis never
    fit (``q`` zero, its initial value) is fit by ``eigh``: x's eigenvectors by
    descending eigenvalue."""
    x, shape = _square(x, "power_qr", "e.g. power_qr(L, Q_L)")
    return Expr("power_qr", (x, _basis(q, shape, "power_qr")), kind="tensor", axes="brc",
                loc=caller_loc(), mat=shape)


def eigen_order(x, q) -> Expr:
    """The permutation matrix P that orders the columns of the basis ``q`` by descending
    estimated eigenvalue ``q_j^T x q_j`` of the symmetric ``x`` (``q @ P`` is sorted;
    ``P.T @ v`` permutes the rows of a matrix in that basis alike), on the host in a
    refresh rule (SOAP re-sorts its basis before each power iteration)."""
    x, shape = _square(x, "eigen_order", "e.g. eigen_order(L, Q_L)")
    return Expr("eigen_order", (x, _basis(q, shape, "eigen_order")), kind="tensor",
                axes="brc", loc=caller_loc(), mat=shape)


def _basis(q, shape: str, what: str) -> Expr:
    q = const(q, caller_loc())
    if matrix_shape(q) != shape:
        raise SpecError(f"{what}(): the basis is {q.describe()}, not a "
                        f"{' x '.join(shape)} matrix like the statistic", caller_loc(),
                        hint=f"{what}(L, Q_L) with Q_L a state of L's shape")
    return q


def clip(x, lo, hi):
    """min(max(x, lo), hi) written with comparisons so that NaN stays NaN."""
    return where(x > hi, hi, where(x < lo, lo, x))


clamp = clip   # torch's name

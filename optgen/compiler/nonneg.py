"""Which states are never negative: the q8 state format stores those with the unsigned
dynamic map (twice the resolution of the signed one; optgen/core/quant.py).

A state is non-negative when its init is, and its update is non-negative whenever every
state it reads is (induction over steps, every state at once). The proof is a sign
analysis of the update expression:

* constants by value; hyperparameters by their constraint (``0 <= beta2 < 1`` gives
  ``beta2 >= 0`` and ``1 - beta2 >= 0``), ``t`` and shape scalars are positive;
* ``sqrt``, ``abs``, ``exp`` are non-negative; sums, ``max`` with one non-negative
  operand, ``min`` and ``where`` of non-negative operands; quotients of non-negative
  values; a product whose factors of unknown sign each occur an even number of times
  (``(1 - b) * g * g``: ``g`` twice); ``x ** 2``.

Anything else is "not proven", and that state gets the signed map, unless the spec
asserts it: ``spec.state("d", 0.0, nonneg=True)`` (the verifier checks that the init
is non-negative; the update is the author's word).
"""
from __future__ import annotations

import ast
from collections import Counter

from ..ir import Expr


def hyper_bounds(constraint: str | None, name: str) -> tuple[float | None, float | None]:
    """(lower, upper) bounds of ``name`` that a constraint states with number literals
    (``0 <= x < 1``, ``x > 0``, ``a and b``); None where it states none."""
    lo = hi = None
    if not constraint:
        return lo, hi
    try:
        tree = ast.parse(constraint, mode="eval").body
    except SyntaxError:
        return lo, hi
    parts = tree.values if isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.And) \
        else [tree]
    for part in parts:
        if not isinstance(part, ast.Compare):
            continue
        terms = [part.left, *part.comparators]
        for a, op, b in zip(terms, part.ops, terms[1:]):
            for x, y, flip in ((a, b, False), (b, a, True)):
                if isinstance(x, ast.Name) and x.id == name and isinstance(y, ast.Constant) \
                        and isinstance(y.value, (int, float)):
                    greater = isinstance(op, (ast.Gt, ast.GtE)) != flip   # name > value
                    if isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)):
                        if greater:
                            lo = max(lo, y.value) if lo is not None else y.value
                        else:
                            hi = min(hi, y.value) if hi is not None else y.value
    return lo, hi


def nonneg_states(spec, updates: dict[str, Expr], candidates: list[str]) -> set[str]:
    """The ``candidates`` (tensor state names) proven non-negative under ``updates``
    (state -> new value of one traced flag combination)."""
    bounds = _bounds(spec)
    asserted = {n for n in candidates if spec.states[n].nonneg}
    proven = {n for n in candidates if _init_nonneg(spec.states[n].init, bounds)} - asserted
    while True:   # drop the states whose update is not proven under the rest
        known = proven | asserted
        keep = {n for n in proven if n not in updates or _sign(updates[n], known, bounds, {})}
        if keep == proven:
            return known
        proven = keep


def _init_nonneg(init, bounds) -> bool:
    if isinstance(init, (int, float)):
        return init >= 0
    return bounds.get(init, (None, None))[0] is not None and bounds[init][0] >= 0


def init_nonneg(spec, init) -> bool:
    """Whether a state's init (a number or a hyperparameter's name) is known >= 0."""
    return _init_nonneg(init, _bounds(spec))


def _bounds(spec) -> dict[str, tuple[float | None, float | None]]:
    return {n: hyper_bounds(h.info.constraint, n) for n, h in spec.hypers.items()}


def _sign(e: Expr, states: set[str], bounds, memo: dict) -> bool:
    """Whether ``e`` is proven >= 0."""
    if id(e) in memo:
        return memo[id(e)]
    memo[id(e)] = False   # (no cycles in an expression DAG; a guard all the same)
    op, a = e.op, e.args
    if op == "const":
        out = e.dtype == "float" and e.value >= 0
    elif op == "hyper":
        lo = bounds.get(e.name, (None, None))[0]
        out = lo is not None and lo >= 0 or e.name in ("rows", "cols")
    elif op == "t":
        out = True
    elif op == "state":
        out = e.name in states
    elif op in ("sqrt", "abs", "exp", "cosh"):
        out = True
    elif op == "round_bf16":
        out = _sign(a[0], states, bounds, memo)
    elif op in ("add", "div", "min"):
        out = all(_sign(x, states, bounds, memo) for x in a)
    elif op == "max":
        out = any(_sign(x, states, bounds, memo) for x in a)
    elif op == "where":
        out = all(_sign(x, states, bounds, memo) for x in a[1:])
    elif op == "pow":
        out = _sign(a[0], states, bounds, memo) or (
            a[1].op == "const" and float(a[1].value).is_integer() and a[1].value % 2 == 0)
    elif op == "sub":   # c - h with h <= c by h's constraint (1 - beta2)
        out = a[0].op == "const" and a[1].op == "hyper" and \
            bounds.get(a[1].name, (None, None))[1] is not None and \
            bounds[a[1].name][1] <= a[0].value
    elif op == "mul":
        unknown = Counter(id(f) for f in _factors(e) if not _sign(f, states, bounds, memo))
        out = all(c % 2 == 0 for c in unknown.values())
    else:
        out = False
    memo[id(e)] = out
    return out


def _factors(e: Expr) -> list[Expr]:
    if e.op != "mul":
        return [e]
    return [f for x in e.args for f in _factors(x)]

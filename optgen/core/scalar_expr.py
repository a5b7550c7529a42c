"""A small, safe evaluator for scalar expressions written as Python source text.

Manifests carry two kinds of scalar expressions as plain strings: hyperparameter
constraints (``0 <= beta1 < 1``) and host-side scalars computed once per step
(``lr * sqrt(1 - beta2 ** t) / (1 - beta1 ** t)``). Both the compiler and the
trainer-side runtime evaluate them here, so the runtime needs neither TVM nor ``eval``.

Arithmetic is IEEE float64 (numpy scalars): ``1 / 0`` is ``inf``, not an exception,
which is what the compiled kernels would compute too. Each expression is checked against
a small grammar once, then compiled to a code object and cached.
"""
from __future__ import annotations

import ast
import functools
import math
from typing import Any, Callable, Mapping

import numpy as np

from .rounding import nearest_bfloat16

_F = np.float64


def _where(c, a, b):
    return a if c else b


def _sign(x):
    return _F(np.sign(x))


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": lambda x: _F(np.sqrt(_F(x))),
    "rsqrt": lambda x: _F(1.0) / _F(np.sqrt(_F(x))),
    "abs": lambda x: _F(abs(_F(x))),
    "sign": _sign,
    "exp": lambda x: _F(np.exp(_F(x))),
    "log": lambda x: _F(np.log(_F(x))),
    "min": lambda a, b: _F(np.minimum(_F(a), _F(b))),
    "max": lambda a, b: _F(np.maximum(_F(a), _F(b))),
    "where": _where,
    "copysign": lambda x, y: _F(np.copysign(_F(x), _F(y))),
    "round_bf16": lambda x: _F(nearest_bfloat16(_F(x))),
    "lerp": lambda s, e, w: _F(s) + _F(w) * (_F(e) - _F(s)),
    "atan": lambda x: _F(np.arctan(_F(x))),
    "atan2": lambda y, x: _F(np.arctan2(_F(y), _F(x))),
    "tanh": lambda x: _F(np.tanh(_F(x))),
    "erf": lambda x: _F(math.erf(_F(x))),
    "log1p": lambda x: _F(np.log1p(_F(x))),
    "expm1": lambda x: _F(np.expm1(_F(x))),
    "sinh": lambda x: _F(np.sinh(_F(x))),
    "cosh": lambda x: _F(np.cosh(_F(x))),
}

_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)


class ExprError(ValueError):
    """The text is not a scalar expression this evaluator accepts."""


@functools.lru_cache(maxsize=4096)
def parse(text: str) -> ast.expr:
    """Parse and check ``text``; raises ExprError for anything outside the grammar."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as e:
        raise ExprError(f"cannot parse {text!r}: {e.msg}") from None
    _check(tree, text)
    return tree


def _check(node: ast.AST, text: str) -> None:
    ok = (ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.Name, ast.Constant, ast.Call,
          ast.IfExp, ast.Load, ast.operator, ast.unaryop, ast.cmpop, ast.boolop, ast.keyword)
    for sub in ast.walk(node):
        if not isinstance(sub, ok):
            raise ExprError(f"{type(sub).__name__} is not allowed in {text!r}")
        if isinstance(sub, ast.BinOp) and not isinstance(sub.op, _BINOPS):
            raise ExprError(f"operator {type(sub.op).__name__} is not allowed in {text!r}")
        if isinstance(sub, ast.Call):
            if not isinstance(sub.func, ast.Name) or sub.func.id not in FUNCTIONS or sub.keywords:
                raise ExprError(f"only calls of {sorted(FUNCTIONS)} are allowed in {text!r}")
        if isinstance(sub, ast.Constant) and not isinstance(sub.value, (int, float, bool)):
            raise ExprError(f"constant {sub.value!r} is not a number in {text!r}")


def names(text: str) -> set[str]:
    """The variable names an expression reads (function names excluded)."""
    tree = parse(text)
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in called}


@functools.lru_cache(maxsize=4096)
def _compiled(text: str):
    """The checked expression as a code object, its numeric constants as float64 names.

    Only the node types ``_check`` admits reach ``compile``: names, numbers, arithmetic,
    comparisons, boolean logic, conditionals and calls of FUNCTIONS, so ``eval`` of it
    with empty builtins can do nothing else. float64 constants keep ``1 / 0`` IEEE.
    """
    parse(text)           # the checks: raises on anything _check does not admit
    consts: dict[str, Any] = {}

    class Consts(ast.NodeTransformer):
        def visit_Constant(self, node):
            name = f"__c{len(consts)}"
            consts[name] = _num(node.value)
            return ast.copy_location(ast.Name(id=name, ctx=ast.Load()), node)

    body = Consts().visit(ast.parse(text, mode="eval"))
    ast.fix_missing_locations(body)
    free = names(text)
    return compile(body, "<optgen scalar>", "eval"), {"__builtins__": {}, **FUNCTIONS, **consts}, free


def evaluate(text: str, env: Mapping[str, Any]) -> Any:
    """Evaluate ``text`` with the variables in ``env`` (numbers or bools)."""
    code, glob, free = _compiled(text)
    missing = free - env.keys()
    if missing:
        raise ExprError(f"unknown name {sorted(missing)[0]!r} in {text!r}")
    local = {n: _num(env[n]) for n in free}
    with np.errstate(all="ignore"):
        return eval(code, glob, local)  # noqa: S307 — whitelisted AST, no builtins


def _num(v):
    """bools stay bools, numbers become float64, and None (an unset optional
    hyperparameter) becomes NaN, so every comparison with it but ``!=`` is False."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    return _F("nan") if v is None else _F(v)

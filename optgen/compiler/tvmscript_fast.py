"""A fast loader for the TVMScript that optgen's own templates emit.

``tvm.script.from_source`` spends most of its time in TVM's generic parser machinery
(the doc-AST conversion, and an evaluator that compiles every sub-expression with
Python's ``compile``), not in building the IR. This module builds the same PrimFunc
directly with TVM's IRBuilder, the API that parser drives: the text is parsed once
with ``ast`` and walked once, each statement making exactly the IRBuilder calls the
parser's tirx handlers make for it (``tvm/tirx/script/parser/parser.py``), each
expression evaluated as the parser's evaluator does (``tvm/script/parser/core/
evaluator.py``): Python semantics over PrimExpr/Buffer objects in the namespace the
parser uses (``T`` is ``tvm.script.parser.tirx``), with operators, comparisons and
``and``/``or`` dispatched through the parser's operator table first. (Translating the
text into one Python function and compiling that was measured too: ``compile`` alone
cost about as much as building the IR, so the walk is faster for code run once.)

Only the subset of TVMScript that optgen generates is accepted: one ``@T.prim_func``
with ``T.<type>``-annotated parameters, ``x: T.let = ...`` bindings, ``name =
T.xxx(...)`` declarations (size variables, ``T.match_buffer``, ``T.alloc_buffer``),
buffer stores, ``for`` over ``range``/``T.serial``/``T.parallel``/``T.vectorized``/
``T.unroll``/``T.thread_binding``, ``if``/``else`` on PrimExpr conditions, ``with`` on
IRBuilder frames (``T.attr``), expression statements, lambdas (``T.comm_reducer``).
Anything else, anything whose meaning depends on parser state this loader does not
model exactly (re-binding a visible name, an ``if`` on a Python bool, ...), and any
error while building raises ``Unsupported``: the caller then falls back to
``tvm.script.from_source``, which also reports errors properly.

No TVM import here (every TVM import of optgen is in tvm_backend.py): the caller
passes the imported ``tvm`` module to ``load_prim_func``.

The parts: optgen.compiler.tvmscript_rules (the parser's run-time rules, once per tvm
module, and ``Unsupported``) and optgen.compiler.tvmscript_walk (the walk that builds the
function); this module parses the text and checks the result as the parser does.
"""
from __future__ import annotations

import ast

from .tvmscript_rules import Unsupported, runtime_for
from .tvmscript_walk import Loader

__all__ = ["Unsupported", "load_prim_func"]


def _parse(text: str) -> ast.FunctionDef:
    """The one function definition ``text`` holds."""
    if not isinstance(text, str):
        raise Unsupported(f"TVMScript text must be a str, not {type(text).__name__}")
    try:
        module = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise Unsupported(f"not Python syntax: {e}") from None
    if len(module.body) != 1 or type(module.body[0]) is not ast.FunctionDef:
        raise Unsupported("the text is not exactly one function definition")
    return module.body[0]


def load_prim_func(tvm, text: str):
    """The ``tvm.tirx.PrimFunc`` that ``tvm.script.from_source(text)`` returns, built
    without TVM's parser; ``tvm`` is the imported tvm module. Raises ``Unsupported``
    where it cannot promise the same function (or the parser would fail)."""
    func_def = _parse(text)
    rt = runtime_for(tvm)
    try:
        with rt.IRBuilder() as builder:
            Loader(rt).function(func_def)
        func = builder.get()
    except Unsupported:
        raise
    except RecursionError as e:
        raise Unsupported("too deeply nested") from e
    except Exception as e:  # noqa: BLE001 — any failure: the parser says what it is
        raise Unsupported(f"building failed: {type(e).__name__}: {e}") from e
    if not isinstance(func, rt.PrimFunc):
        raise Unsupported(f"built a {type(func).__name__}, not a PrimFunc")
    # the parser's own well-formedness checks (tvm.script.parser.core.entry.parse)
    try:
        tvm.s_tir.analysis.verify_well_formed(tvm.IRModule.from_expr(func))
        if not func.attrs.get("s_tir", False):
            tvm.tirx.analysis.verify_tirx_well_formed(func)
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"not well-formed: {e}") from e
    return func

"""The run-time rules of TVM's TVMScript parser that optgen's fast loader reproduces
(optgen.compiler.tvmscript_fast), looked up once per ``tvm`` module: the ``T``
namespace of expressions, the IRBuilder calls of the statement handlers, the evaluator's
operator dispatch, the binding rules (bind_assign_value, visit_expr_stmt, ...), and
lambdas (plain Python over the visible names, as the evaluator compiles them).

``Unsupported`` is raised for anything these rules do not reproduce exactly. No TVM
import here: ``runtime_for`` is given the imported ``tvm`` module.
"""
from __future__ import annotations

import ast
import functools
import math
import threading


class Unsupported(Exception):
    """The text uses a construct this loader does not reproduce exactly; parse it with
    ``tvm.script.from_source`` instead."""


# Python spelling of the operators, for lambda bodies (plain Python in the parser too)
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
           ast.Mod: "%", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|",
           ast.BitXor: "^", ast.BitAnd: "&", ast.MatMult: "@", ast.Pow: "**"}
_UNARYOPS = {ast.Invert: "~", ast.Not: "not ", ast.UAdd: "+", ast.USub: "-"}
_CMPOPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
           ast.GtE: ">=", ast.Is: "is", ast.IsNot: "is not", ast.In: "in",
           ast.NotIn: "not in"}


# -- the parser's run-time rules, once per tvm module -----------------------------------

class Runtime:
    """What the parser's handlers use, looked up once: the T namespace of expressions,
    the builder the statement handlers call, the operator dispatch and the binding
    rules (bind_assign_value, visit_expr_stmt, ...) for the cases this loader takes."""

    def __init__(self, tvm) -> None:
        # the parser's globals (tvm.script.parser.core.entry._default_globals): T in
        # expressions is tvm.script.parser.tirx. Making them also imports the dialect
        # parsers, which register operators in the evaluator's table (the relax parser
        # re-registers <, <=, >, >= on tvm.ir.Expr), as every from_source call does.
        core = tvm.script.parser.core
        self.T = core.entry._default_globals()["T"]  # noqa: SLF001
        self.B = B = tvm.tirx.script.builder        # the T of the statement handlers
        base = tvm.script.ir_builder.base
        ir_builder_ir = tvm.script.ir_builder.ir
        entry = tvm.tirx.script.parser.entry
        dispatch, evaluator, doc = core.dispatch, core.evaluator, core.doc
        if self.T is not tvm.tirx.script.parser:
            raise Unsupported("the parser's T is not tvm.tirx.script.parser")
        self.tvm = tvm
        self.IRBuilder, self.Frame = base.IRBuilder, base.IRBuilderFrame
        self.name = base.IRBuilder.name
        self.Expr, self.Var, self.Call = tvm.ir.Expr, tvm.ir.Var, tvm.ir.Call
        self.is_prim_expr = tvm.ir.is_prim_expr
        self.is_buffer_var = tvm.tirx.is_buffer_var
        self.const, self.StringImm = tvm.tirx.const, tvm.ir.StringImm
        self.ExprOp = tvm.tirx.expr.ExprOp
        self.not_named = (B.scalar_wrapper, ir_builder_ir.meta_var, list, tuple,
                          tvm.ir.TensorRegion)
        self.named = (tvm.tirx.IterVar, tvm.tirx.Layout)
        self.BufferStore = tvm.tirx.stmt.BufferStore
        self.ForFrame = B.frame.ForFrame
        self.optional, self.constexpr = entry._OptionalAnnotation, entry.constexpr  # noqa: SLF001
        self.buffer_store, self.Bind, self.evaluate = B.buffer_store, B.Bind, B.evaluate
        self.if_then_else = tvm.tirx.op.if_then_else
        self.BOOL = tvm.runtime.DataTypeCode.BOOL
        self.PrimFunc = tvm.tirx.PrimFunc
        if not isinstance(self.T.let, B.LetAnnotation) or self.T.let.type_spec is not None:
            raise Unsupported("T.let is not the plain LetAnnotation this loader expects")
        op_table, default_op = dispatch.OpVTable, evaluator.DEFAULT_OP

        def make_op(op_type):
            """evaluator._eval_op for one operator: the first operand (left to right)
            whose type has a ``_dispatch_type`` with a registered method decides, else
            Python's operator."""
            default = default_op[op_type]

            def op(*values):
                for i, v in enumerate(values):
                    t = getattr(type(v), "_dispatch_type", None)
                    if t is not None:
                        f = op_table.get((t, op_type, i))
                        if f is not None:
                            return f(*values)
                return default(*values)
            return op

        self.ops = {a: make_op(getattr(doc, a.__name__))
                    for a in (*_BINOPS, *_UNARYOPS, *_CMPOPS, ast.And, ast.Or)}

    # binding rules ---------------------------------------------------------------------
    def let(self, value, var_name: str):
        """visit_ann_assign, ``x: T.let = value``: a fresh Var named x, then Bind."""
        if not isinstance(value, self.Expr):
            value = self.StringImm(value) if isinstance(value, str) else self.const(value)
        var = self.T.let.as_var(rhs_dtype=value.ty)
        if not isinstance(var, self.Var):
            raise Unsupported("T.let did not give a Var")
        self.name(var_name, var)  # bind_assign_value of a Var not in the variable table
        self.Bind(value, var=var)
        return var

    def makes_fresh_var(self, func, call: ast.Call) -> bool:
        """Whether ``func(...)`` (the call ``call``) returns a Var made by the call:
        ``T.<dtype>()``, ``T.bool()``, ``T.handle(...)``, ``T.env_thread(...)``."""
        if func is self.B.handle or func is self.B.env_thread:
            return True
        return ((isinstance(func, self.B.DtypeConstructor) or func is self.B.boolean)
                and not call.args and not call.keywords)

    def assign(self, value, var_name: str, fresh: bool):
        """bind_assign_value for ``x = value`` where x is not a visible local name;
        ``fresh``: value, if a Var, was just made (so is not in the variable table)."""
        if isinstance(value, self.not_named) or getattr(type(value), "_is_meta_class", False):
            raise Unsupported(f"assignment of a {type(value).__name__}")
        if isinstance(value, self.Frame):
            value.add_callback(functools.partial(value.__exit__, None, None, None))
            res = value.__enter__()
            self.name(var_name, res)
            return res
        if self.is_buffer_var(value) or isinstance(value, self.named):
            self.name(var_name, value)
            return value
        if fresh and isinstance(value, self.Var):
            # a new Var cannot be in the variable table: named
            self.name(var_name, value)
            return value
        # a Var that may be in the variable table already, or a scalar: not modelled
        raise Unsupported(f"assignment of a {type(value).__name__} to {var_name!r}")

    def expr_stmt(self, res) -> None:
        """visit_expr_stmt. Nothing, a docstring, a variable or a buffer on its own
        emits nothing."""
        if res is None or isinstance(res, (self.Var, str)) or self.is_buffer_var(res):
            return
        if isinstance(res, self.Frame):
            res.add_callback(functools.partial(res.__exit__, None, None, None))
            res.__enter__()
        elif hasattr(res, "frames") and hasattr(res, "__enter__"):
            for f in res.frames:
                f.add_callback(functools.partial(f.__exit__, None, None, None))
                f.__enter__()
        elif self.is_prim_expr(res):
            self.evaluate(res)
        elif isinstance(res, (int, bool)):
            self.evaluate(self.const(res))
        elif isinstance(res, self.Call) and not self.is_prim_expr(res):
            self.evaluate(res)
        elif isinstance(res, self.BufferStore):
            self.buffer_store(res.buffer, res.value, res.indices)
        else:
            raise Unsupported(f"expression statement of type {type(res).__name__}")

    def arg(self, arg_name: str, ann):
        """visit_function_def for one parameter annotated T.<type>."""
        if isinstance(ann, self.optional) or ann is self.constexpr:
            raise Unsupported("T.Optional / T.constexpr parameter")
        if callable(ann) and not isinstance(ann, self.Expr):
            ann = ann()
        if not isinstance(ann, self.Var) or self.is_buffer_var(ann):
            raise Unsupported(f"parameter {arg_name!r} is not a scalar or handle Var")
        return self.B.arg(arg_name, ann)


_RUNTIMES: dict[int, Runtime] = {}
_RUNTIME_LOCK = threading.Lock()


def runtime_for(tvm) -> Runtime:
    rt = _RUNTIMES.get(id(tvm))
    if rt is None:
        with _RUNTIME_LOCK:
            rt = _RUNTIMES.get(id(tvm))
            if rt is None:
                rt = _RUNTIMES[id(tvm)] = Runtime(tvm)
    return rt


# -- lambdas: evaluator._eval_lambda compiles them as plain Python --------------------

def lambda_body(e: ast.expr, params: set[str], free: dict[str, str]) -> str:
    """Python source of a lambda body: names other than the parameters become
    ``_f<k>`` (values supplied by the caller); native operators, as in the parser."""
    t = type(e)
    rec = functools.partial(lambda_body, params=params, free=free)
    if t is ast.Constant:
        v = e.value
        if v is None or type(v) in (bool, int, str) or (type(v) is float and math.isfinite(v)):
            return repr(v)
    elif t is ast.Name and type(e.ctx) is ast.Load:
        if e.id in params:
            return e.id
        return free.setdefault(e.id, f"_f{len(free)}")
    elif t is ast.Attribute:
        return f"({rec(e.value)}).{e.attr}"
    elif t is ast.Call and not any(type(a) is ast.Starred for a in e.args) \
            and all(kw.arg is not None for kw in e.keywords):
        parts = [rec(a) for a in e.args] + [f"{kw.arg}={rec(kw.value)}" for kw in e.keywords]
        return f"({rec(e.func)})({', '.join(parts)})"
    elif t is ast.BinOp and type(e.op) in _BINOPS:
        return f"(({rec(e.left)}) {_BINOPS[type(e.op)]} ({rec(e.right)}))"
    elif t is ast.UnaryOp:
        return f"({_UNARYOPS[type(e.op)]}({rec(e.operand)}))"
    elif t is ast.Compare:
        out = f"({rec(e.left)})"
        for op, rhs in zip(e.ops, e.comparators):
            out += f" {_CMPOPS[type(op)]} ({rec(rhs)})"
        return f"({out})"
    elif t is ast.BoolOp:
        word = " and " if type(e.op) is ast.And else " or "
        return "(" + word.join(f"({rec(v)})" for v in e.values) + ")"
    elif t is ast.IfExp:
        return f"(({rec(e.body)}) if ({rec(e.test)}) else ({rec(e.orelse)}))"
    elif t is ast.Subscript and type(e.slice) is not ast.Slice:
        return f"({rec(e.value)})[{rec(e.slice)}]"
    elif t in (ast.Tuple, ast.List) and not any(type(x) in (ast.Starred, ast.Slice)
                                                 for x in e.elts):
        inner = "".join(f"{rec(x)}, " for x in e.elts)
        return f"({inner})" if t is ast.Tuple else f"[{inner}]"
    raise Unsupported(f"{t.__name__} in a lambda body")


@functools.lru_cache(maxsize=64)
def compile_lambda(source: str):
    return compile(source, "<optgen tvmscript_fast lambda>", "eval")

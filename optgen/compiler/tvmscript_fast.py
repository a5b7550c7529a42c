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
"""
from __future__ import annotations

import ast
import functools
import math
import threading

__all__ = ["Unsupported", "load_prim_func"]


class Unsupported(Exception):
    """The text uses a construct this loader does not reproduce exactly; parse it with
    ``tvm.script.from_source`` instead."""


_MISSING = object()

# Python spelling of the operators, for lambda bodies (plain Python in the parser too)
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
           ast.Mod: "%", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|",
           ast.BitXor: "^", ast.BitAnd: "&", ast.MatMult: "@", ast.Pow: "**"}
_UNARYOPS = {ast.Invert: "~", ast.Not: "not ", ast.UAdd: "+", ast.USub: "-"}
_CMPOPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
           ast.GtE: ">=", ast.Is: "is", ast.IsNot: "is not", ast.In: "in",
           ast.NotIn: "not in"}


# -- the parser's run-time rules, once per tvm module -----------------------------------

class _Runtime:
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


_RUNTIMES: dict[int, _Runtime] = {}
_RUNTIME_LOCK = threading.Lock()


def _runtime(tvm) -> _Runtime:
    rt = _RUNTIMES.get(id(tvm))
    if rt is None:
        with _RUNTIME_LOCK:
            rt = _RUNTIMES.get(id(tvm))
            if rt is None:
                rt = _RUNTIMES[id(tvm)] = _Runtime(tvm)
    return rt


# -- the walk ----------------------------------------------------------------------------

class _Loader:
    """Walks the function's AST once, building the PrimFunc. The variable table is one
    dict of the visible local bindings, with a frame (the names it bound and what they
    shadowed) per scope the parser opens: the function, each ``for``, ``with`` and
    ``if`` branch. Names not bound locally resolve to the parser's global T only."""

    def __init__(self, rt: _Runtime) -> None:
        self.rt = rt
        self.T = rt.T
        self.ops = rt.ops
        self.env: dict = {}
        self.frames: list[dict] = []
        self.exprs = {
            ast.Constant: self.constant, ast.Name: self.name, ast.Attribute: self.attribute,
            ast.Call: self.call, ast.BinOp: self.binop, ast.UnaryOp: self.unaryop,
            ast.Compare: self.compare, ast.BoolOp: self.boolop, ast.IfExp: self.ifexp,
            ast.Subscript: self.subscript, ast.Tuple: self.tuple, ast.List: self.list,
            ast.Dict: self.dict, ast.Lambda: self.lambda_}
        self.stmts = {
            ast.AnnAssign: self.ann_assign, ast.Assign: self.assign, ast.Expr: self.expr_stmt,
            ast.For: self.for_, ast.If: self.if_, ast.With: self.with_, ast.Pass: self.pass_}

    # scopes ----------------------------------------------------------------------------
    def push(self) -> None:
        self.frames.append({})

    def pop(self) -> None:
        env = self.env
        for name, old in self.frames.pop().items():
            if old is _MISSING:
                del env[name]
            else:
                env[name] = old

    def bind(self, name: str, value) -> None:
        frame = self.frames[-1]
        if name in frame:  # the parser: "Variable ... already defined in current scope"
            raise Unsupported(f"{name!r} is bound twice in one scope")
        frame[name] = self.env.get(name, _MISSING)
        self.env[name] = value

    def is_t_attr(self, node: ast.expr, attr: str | None = None) -> bool:
        """``T.<attr>`` with T the parser's global (not a local of that name)."""
        return (type(node) is ast.Attribute and type(node.value) is ast.Name
                and node.value.id == "T" and "T" not in self.env
                and (attr is None or node.attr == attr))

    # expressions -----------------------------------------------------------------------
    def ev(self, e: ast.expr):
        f = self.exprs.get(type(e))
        if f is None:
            raise Unsupported(f"expression {type(e).__name__}")
        return f(e)

    def elt(self, e: ast.expr):
        if type(e) in (ast.Starred, ast.Slice):
            raise Unsupported(f"{type(e).__name__} element")
        return self.ev(e)

    def constant(self, e: ast.Constant):
        v = e.value
        if v is None or type(v) in (bool, int, str) or (type(v) is float and math.isfinite(v)):
            return v
        raise Unsupported(f"constant {v!r}")

    def name(self, e: ast.Name):
        v = self.env.get(e.id, _MISSING)
        if v is not _MISSING:
            return v
        if e.id == "T":
            return self.T
        raise Unsupported(f"name {e.id!r} is not a local binding or T")

    def attribute(self, e: ast.Attribute):
        return getattr(self.ev(e.value), e.attr)

    def arguments(self, e: ast.Call) -> tuple[list, dict]:
        """A call's positional and keyword arguments, evaluated."""
        args = [self.elt(a) for a in e.args]
        kwargs = {}
        for kw in e.keywords:
            if kw.arg is None or kw.arg in kwargs:
                raise Unsupported("** argument")
            kwargs[kw.arg] = self.ev(kw.value)
        return args, kwargs

    def call(self, e: ast.Call, func=_MISSING):
        if func is _MISSING:
            func = self.ev(e.func)
        args, kwargs = self.arguments(e)
        return func(*args, **kwargs)

    def binop(self, e: ast.BinOp):
        left = self.ev(e.left)
        return self.ops[type(e.op)](left, self.ev(e.right))

    def unaryop(self, e: ast.UnaryOp):
        return self.ops[type(e.op)](self.ev(e.operand))

    def compare(self, e: ast.Compare):
        """evaluator._eval_compare: every operand evaluated, then pairwise, and-ed."""
        values = [self.ev(e.left)]
        values += [self.ev(c) for c in e.comparators]
        result = None
        for k, op in enumerate(e.ops):
            sub = self.ops[type(op)](values[k], values[k + 1])
            result = sub if result is None else self.ops[ast.And](result, sub)
        return result

    def boolop(self, e: ast.BoolOp):
        """evaluator._eval_bool_op: short-circuits on a Python bool only."""
        is_and = type(e.op) is ast.And
        op = self.ops[type(e.op)]
        value = self.ev(e.values[0])
        for rhs in e.values[1:]:
            if isinstance(value, bool) and value is not is_and:
                return value
            value = op(value, self.ev(rhs))
        return value

    def ifexp(self, e: ast.IfExp):
        """evaluator._eval_if_exp."""
        rt = self.rt
        test = self.ev(e.test)
        if isinstance(test, bool):
            return self.ev(e.body if test else e.orelse)
        if rt.is_prim_expr(test) and test.ty.matches_code(rt.BOOL):
            body = self.ev(e.body)
            return rt.if_then_else(test, body, self.ev(e.orelse))
        raise Unsupported(f"conditional expression on a {type(test).__name__}")

    def subscript(self, e: ast.Subscript):
        value = self.ev(e.value)
        s = e.slice
        if type(s) is ast.Tuple:
            return value[tuple([self.elt(x) for x in s.elts])]
        return value[self.elt(s)]

    def tuple(self, e: ast.Tuple):
        return tuple([self.elt(x) for x in e.elts])

    def list(self, e: ast.List):
        return [self.elt(x) for x in e.elts]

    def dict(self, e: ast.Dict):
        if any(k is None for k in e.keys):
            raise Unsupported("** in a dict display")
        keys = [self.ev(k) for k in e.keys]      # the evaluator's order: keys, then values
        return dict(zip(keys, [self.ev(v) for v in e.values]))

    def lambda_(self, e: ast.Lambda):
        """evaluator._eval_lambda: a Python lambda over the visible names. Its parameters
        keep their names (T.comm_reducer names its Vars after them)."""
        a = e.args
        if a.posonlyargs or a.vararg or a.kwonlyargs or a.kw_defaults or a.kwarg or a.defaults:
            raise Unsupported("lambda with non-positional parameters")
        params = [p.arg for p in a.args]
        if len(set(params)) != len(params) or any(p.startswith("_") or p == "T" for p in params):
            raise Unsupported("lambda parameter names")
        free: dict[str, str] = {}
        body = _lambda_body(e.body, set(params), free)
        scope = {"__builtins__": {}, "T": self.T}
        for name, ident in free.items():   # the values visible now, as in the parser
            scope[ident] = self.name(ast.Name(id=name, ctx=ast.Load()))
        return eval(_compile_lambda(f"lambda {', '.join(params)}: {body}"), scope)  # noqa: S307

    # statements ------------------------------------------------------------------------
    def body(self, stmts: list[ast.stmt]) -> None:
        table = self.stmts
        for s in stmts:
            f = table.get(type(s))
            if f is None:
                raise Unsupported(f"statement {type(s).__name__}")
            f(s)

    def scoped_body(self, stmts: list[ast.stmt]) -> None:
        self.push()
        self.body(stmts)
        self.pop()

    def ann_assign(self, s: ast.AnnAssign) -> None:
        """``x: T.let = value`` (visit_ann_assign's LetAnnotation branch)."""
        target = s.target
        if not (type(target) is ast.Name and s.value is not None
                and self.is_t_attr(s.annotation, "let")):
            raise Unsupported("annotated assignment other than `name: T.let = value`")
        if type(s.value) in (ast.List, ast.Tuple):
            raise Unsupported("T.let of a tuple literal")
        self.bind(target.id, self.rt.let(self.ev(s.value), target.id))

    def assign(self, s: ast.Assign) -> None:
        """visit_assign: ``name = T.xxx(...)`` or ``buffer[indices] = value``."""
        if len(s.targets) != 1:
            raise Unsupported("chained assignment")
        target = s.targets[0]
        if type(target) is ast.Name:
            # visit_assign first tries a visible name as a buffer to store into: only
            # names that are not visible locals are taken here
            if target.id in self.env:
                raise Unsupported(f"assignment to the visible name {target.id!r}")
            v = s.value
            if type(v) is ast.Call and self.is_t_attr(v.func):
                func = self.ev(v.func)
                value = self.call(v, func)
                fresh = self.rt.makes_fresh_var(func, v)
            else:
                value, fresh = self.ev(v), False
            self.bind(target.id, self.rt.assign(value, target.id, fresh))
        elif type(target) is ast.Subscript:
            value = self.ev(s.value)
            sl = target.slice
            if type(sl) is ast.Tuple:
                indices = [self.elt(x) for x in sl.elts]
            else:
                indices = self.elt(sl)
            self.rt.buffer_store(self.ev(target.value), value, indices)
        else:
            raise Unsupported(f"assignment to a {type(target).__name__}")

    def expr_stmt(self, s: ast.Expr) -> None:
        self.rt.expr_stmt(self.ev(s.value))

    def for_(self, s: ast.For) -> None:
        """visit_for: range(...) is T.serial; otherwise the iterable must be a ForFrame."""
        if s.orelse or type(s.target) is not ast.Name:
            raise Unsupported("for-else, or a loop target other than a name")
        it = s.iter
        rt = self.rt
        if type(it) is ast.Call and type(it.func) is ast.Name and it.func.id == "range":
            args, kwargs = self.arguments(it)
            if len(args) == 1:
                frame = rt.B.serial(0, args[0], **kwargs)
            elif len(args) == 2:
                frame = rt.B.serial(args[0], args[1], **kwargs)
            elif len(args) == 3:
                frame = rt.B.serial(args[0], args[1], step=args[2], **kwargs)
            else:
                raise Unsupported("range() takes 1 to 3 arguments")
        else:
            frame = self.ev(it)
            if not isinstance(frame, rt.ForFrame):
                raise Unsupported(f"for over a {type(frame).__name__}")
        self.push()
        with frame as loop_var:
            if not isinstance(loop_var, rt.Var):       # bind_for_value, one variable
                raise Unsupported("loop over several variables")
            rt.name(s.target.id, loop_var)
            self.bind(s.target.id, loop_var)
            self.body(s.body)
        self.pop()

    def if_(self, s: ast.If) -> None:
        """visit_if on a PrimExpr. On a Python bool the parser picks a branch without
        opening a scope, which is not modelled here."""
        rt = self.rt
        predicate = self.ev(s.test)
        if not (rt.is_prim_expr(predicate) or isinstance(predicate, rt.ExprOp)):
            raise Unsupported(f"if on a {type(predicate).__name__}")
        with rt.B.If(predicate):
            with rt.B.Then():
                self.scoped_body(s.body)
            if s.orelse:
                with rt.B.Else():
                    self.scoped_body(s.orelse)

    def with_(self, s: ast.With) -> None:
        """visit_with: one scope; the items entered in order, exited in reverse."""
        for item in s.items:
            if item.optional_vars is not None:
                raise Unsupported("with ... as")
        self.push()
        self._with_items(s.items, 0, s.body)
        self.pop()

    def _with_items(self, items, k: int, body) -> None:
        if k == len(items):
            self.body(body)
            return
        frame = self.ev(items[k].context_expr)
        if not isinstance(frame, self.rt.Frame) and not (hasattr(frame, "__enter__")
                                                         and hasattr(frame, "__exit__")):
            raise Unsupported("with on something that is not a frame")
        with frame:
            self._with_items(items, k + 1, body)

    def pass_(self, s: ast.Pass) -> None:
        """A ``pass`` statement builds nothing."""

    def function(self, f: ast.FunctionDef) -> None:
        """visit_function_def for a bare ``@T.prim_func`` (not private, not s_tir, not
        persistent) with T.<type>-annotated positional parameters."""
        if (len(f.decorator_list) != 1 or not self.is_t_attr(f.decorator_list[0], "prim_func")
                or getattr(f, "type_params", None) or f.returns is not None):
            raise Unsupported("not a plain @T.prim_func function")
        a = f.args
        if a.posonlyargs or a.vararg or a.kwonlyargs or a.kw_defaults or a.kwarg or a.defaults:
            raise Unsupported("non-positional parameters")
        rt = self.rt
        self.push()
        with rt.B.prim_func(is_private=False, s_tir=False, persistent=False):
            rt.B.func_name(f.name)
            for p in a.args:
                if p.annotation is None or not self.is_t_attr(p.annotation):
                    raise Unsupported("a parameter annotation other than T.<type>")
                self.bind(p.arg, rt.arg(p.arg, self.ev(p.annotation)))
            self.body(f.body)
        self.pop()


def _lambda_body(e: ast.expr, params: set[str], free: dict[str, str]) -> str:
    """Python source of a lambda body: names other than the parameters become
    ``_f<k>`` (values supplied by the caller); native operators, as in the parser."""
    t = type(e)
    rec = functools.partial(_lambda_body, params=params, free=free)
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
def _compile_lambda(source: str):
    return compile(source, "<optgen tvmscript_fast lambda>", "eval")


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
    rt = _runtime(tvm)
    try:
        with rt.IRBuilder() as builder:
            _Loader(rt).function(func_def)
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

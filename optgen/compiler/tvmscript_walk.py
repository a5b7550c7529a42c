"""The walk of optgen's fast TVMScript loader (optgen.compiler.tvmscript_fast): one pass
over the function's ``ast`` that makes, statement by statement, the IRBuilder calls the
parser's tirx handlers make, and evaluates each expression as the parser's evaluator
does, through the rules in optgen.compiler.tvmscript_rules.
"""
from __future__ import annotations

import ast
import math

from .tvmscript_rules import Runtime, Unsupported, compile_lambda, lambda_body

_MISSING = object()


class Loader:
    """Walks the function's AST once, building the PrimFunc. The variable table is one
    dict of the visible local bindings, with a frame (the names it bound and what they
    shadowed) per scope the parser opens: the function, each ``for``, ``with`` and
    ``if`` branch. Names not bound locally resolve to the parser's global T only."""

    def __init__(self, rt: Runtime) -> None:
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
        body = lambda_body(e.body, set(params), free)
        scope = {"__builtins__": {}, "T": self.T}
        for name, ident in free.items():   # the values visible now, as in the parser
            scope[ident] = self.name(ast.Name(id=name, ctx=ast.Load()))
        return eval(compile_lambda(f"lambda {', '.join(params)}: {body}"), scope)  # noqa: S307

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

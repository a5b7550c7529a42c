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
"""
from __future__ import annotations

import dataclasses
import itertools
import keyword
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import SpecError
from .ir import (MATRIX_STATES, Expr, Loc, apply, caller_loc, const, matrix_shape, reduce,
                 to_python, walk)
from .ir import matmul, transpose  # noqa: F401 (spec files import them from here)
from optgen.runtime.hyper import HyperInfo, Requirement
from optgen.runtime import scalar_expr

RESERVED = {"t", "w", "grad", "n", "flags", "T", "rows", "cols"}
SHAPE_NAMES = ("rows", "cols")   # R and C of a parameter's [B, R, C] view (spec.rows/cols)


# -- elementwise functions (the closed op set; see ir.OPS) ---------------------------
def sqrt(x): return apply("sqrt", x)
def rsqrt(x): return apply("rsqrt", x)
def sign(x): return apply("sign", x)
def exp(x): return apply("exp", x)
def log(x): return apply("log", x)
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


def row_mean(x):
    """Mean over the last axis: one value per row of the ``[B, R, C]`` view."""
    return reduce("mean", x, "c")


def col_mean(x):
    """Mean over the second-to-last axis: one value per column of the view."""
    return reduce("mean", x, "r")


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


def clip(x, lo, hi):
    """min(max(x, lo), hi) written with comparisons so that NaN stays NaN."""
    return where(x > hi, hi, where(x < lo, lo, x))


@dataclass
class Hyper:
    info: HyperInfo
    node: Expr | None
    loc: Loc | None


STATE_SHAPES = {"param": "brc", "row": "br", "col": "bc", "scalar": "",
                "rr": "brc", "cc": "brc"}   # R x R and C x C matrices (2-D parameters)


@dataclass
class State:
    name: str
    init: float | str   # a number, or a Python expression over hyperparameters
    doc: str
    shape: str  # "param" (per element), "row"/"col" (per row/column of the view), "scalar",
                # "rr"/"cc" (R x R, C x C matrices of a 2-D parameter)
    node: Expr
    loc: Loc | None
    when: str | None = None  # a flag expression: the state exists only where it is true
    half_when: str | None = None  # a flag expression: stored as float16 where it is true


@dataclass
class Trace:
    """The update for one flag combination: new values by name (``"w"`` is the parameter);
    ``refresh``: the refresh rule's new state values there (``@spec.refresh``), if any."""

    flags: dict[str, bool]
    updates: dict[str, Expr]
    loc: Loc | None
    refresh: dict[str, Expr] | None = None

    @property
    def matrix(self) -> bool:
        """Whether the update uses matrix values (compiled by the matrix planner)."""
        return any(n.mat is not None for n in walk(list(self.updates.values())))


@dataclass
class Refresh:
    """``@spec.refresh(every=k)``: new values of some states, computed on the host every k
    steps of a parameter (its steps 1, 1 + k, 1 + 2k, ...) from statistics the trainer
    passes to step() (``spec.statistic``)."""
    rule: Callable
    every: str | int            # an int hyperparameter's name, or a number
    loc: Loc | None


class Flags:
    """The flag values seen by the update function while it is traced."""

    def __init__(self, values: dict[str, bool], loc: Loc | None):
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_loc", loc)

    def __getattr__(self, name: str) -> bool:
        values = object.__getattribute__(self, "_values")
        if name not in values:
            raise SpecError(f"undefined name: flags.{name} is not a declared flag "
                            f"(declared: {', '.join(values) or 'none'})", caller_loc(),
                            hint=f"declare it with spec.flag({name!r}, False) before the update")
        return values[name]

    def __setattr__(self, name, value):
        raise SpecError(f"cannot assign to flag {name!r}: flags are fixed per kernel", caller_loc(),
                        hint="keep the value in a local variable")


@dataclass
class Spec:
    name: str
    doc: str = ""
    reference: str = ""
    hypers: dict[str, Hyper] = field(default_factory=dict)
    states: dict[str, State] = field(default_factory=dict)
    requirements: list[tuple[Requirement, Loc | None]] = field(default_factory=list)
    shape_flags: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (expr, doc)
    name_flags: dict[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    lazy_update_default: bool = False   # row-sparse gradients update only their rows
    preprocessing: str | None = None    # "coupled" / "decoupled" weight decay (optgen.blocks)
    base: "Spec | None" = None          # the spec this one extends (Spec.extend)
    inputs: dict[str, str] = field(default_factory=dict)  # extra per-element inputs -> doc
    statistics: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (shape, doc)
    accepted: dict[str, str] = field(default_factory=dict)  # options accepted, unused -> why
    refresh_rule: Refresh | None = None
    rule: Callable | None = None
    rule_loc: Loc | None = None
    loc: Loc | None = None
    file: str | None = None

    def __post_init__(self):
        self.loc = self.loc or caller_loc()
        if not self.name.isidentifier():
            raise SpecError(f"spec name {self.name!r} must be a Python identifier", self.loc,
                            hint="use letters, digits and underscores, starting with a letter")
        self.t = Expr("t", name="t", kind="scalar", loc=self.loc)
        # a parameter's R and C (2-D: its shape), per parameter on the host
        self.rows = Expr("hyper", name="rows", kind="scalar", loc=self.loc)
        self.cols = Expr("hyper", name="cols", kind="scalar", loc=self.loc)

    @classmethod
    def extend(cls, base: "Spec", name: str, doc: str = "", reference: str = "") -> "Spec":
        """A new spec with ``base``'s hyperparameters, flags, states and requirements.

        Its update function is declared as usual and may call ``base.rule(w, g, flags)``
        (wrappers such as LARS), or be ``base.rule`` itself (``spec.update(base.rule)``,
        e.g. LazyAdam = Adam with lazy row-sparse updates by default)."""
        spec = cls(name, doc, reference=reference or base.reference, loc=caller_loc())
        spec.hypers = dict(base.hypers)
        spec.states = dict(base.states)
        spec.requirements = list(base.requirements)
        spec.shape_flags = dict(base.shape_flags)
        spec.name_flags = dict(base.name_flags)
        spec.lazy_update_default = base.lazy_update_default
        spec.preprocessing = base.preprocessing
        spec.inputs = dict(base.inputs)
        spec.statistics = dict(base.statistics)
        spec.accepted = dict(base.accepted)
        spec.base = base
        return spec

    # -- declarations ------------------------------------------------------------------
    def _new_name(self, name: str, what: str, loc: Loc | None) -> None:
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise SpecError(f"{what} name {name!r} must be a Python identifier", loc,
                            hint="use letters, digits and underscores, starting with a letter")
        if name.startswith("_"):
            raise SpecError(f"{what} name {name!r} must not start with '_' (reserved for optgen)",
                            loc, hint="rename it without the leading underscore")
        if name in RESERVED:
            raise SpecError(f"{what} name {name!r} is reserved ({', '.join(sorted(RESERVED))})", loc,
                            hint="rename it")
        if name in self.hypers or name in self.states or name in self.shape_flags \
                or name in self.name_flags \
                or name in self.inputs or name in self.statistics or name in self.accepted:
            raise SpecError(f"{what} {name!r} is declared twice", loc,
                            hint="give every hyperparameter, flag, state and input its own name")

    def hyper(self, name: str, default: Any, constraint: str | None = None, doc: str = "", *,
              type: str | None = None, optional: bool = False,
              none_value: float | None = None) -> Expr:
        """A numeric hyperparameter: a run-time kernel argument (changing it never rebuilds)."""
        loc = caller_loc()
        self._new_name(name, "hyperparameter", loc)
        if isinstance(default, bool) or type == "bool":
            raise SpecError(f"hyperparameter {name!r} is a bool", loc,
                            hint=f"declare it with spec.flag({name!r}, {default!r})")
        if type is None:
            type = "int" if isinstance(default, int) else "float"
        if type not in ("float", "int"):
            raise SpecError(f"hyperparameter {name!r}: type must be 'float' or 'int', got {type!r}",
                            loc, hint="pass type='float' or type='int'")
        if default is None and not optional:
            raise SpecError(f"hyperparameter {name!r} has default None but is not optional=True",
                            loc, hint="pass optional=True and none_value=..., or a number")
        if optional and none_value is None:
            raise SpecError(f"optional hyperparameter {name!r} needs none_value=", loc,
                            hint="pass none_value=<the number the kernel uses when it is None>")
        info = HyperInfo(name, default, type, constraint, doc, optional, none_value)
        node = Expr("hyper", name=name, kind="scalar", loc=loc)
        self.hypers[name] = Hyper(info, node, loc)
        return node

    def flag(self, name: str, default: bool = False, doc: str = "") -> str:
        """A boolean compile-time specialization, read as ``flags.<name>`` in the update."""
        loc = caller_loc()
        self._new_name(name, "flag", loc)
        if not isinstance(default, bool):
            raise SpecError(f"flag {name!r} needs a bool default, got {default!r}", loc,
                            hint=f"spec.flag({name!r}, False)")
        self.hypers[name] = Hyper(HyperInfo(name, default, "bool", None, doc), None, loc)
        return name

    def input(self, name: str, doc: str = "") -> Expr:
        """An extra read-only per-element input beside the gradient (SVRG's snapshot
        gradient), passed to ``step(grads, name=[...])``."""
        loc = caller_loc()
        self._new_name(name, "input", loc)
        if name in self.inputs:
            raise SpecError(f"input {name!r} is declared twice", loc,
                            hint="give every input its own name")
        self.inputs[name] = doc
        return Expr("grad", name=name, kind="tensor", loc=loc)

    def shape_flag(self, name: str, rule: str, doc: str = "") -> str:
        """A flag set per parameter from its shape, e.g. ``"ndim >= 2"`` (names: ndim,
        numel, and rows and cols: R and C of the [B, R, C] view).

        Like a flag it specializes the kernel (read it as ``flags.<name>``), but the user
        does not set it: the runtime evaluates ``rule`` for each parameter."""
        loc = caller_loc()
        self._new_name(name, "flag", loc)
        try:
            unknown = scalar_expr.names(rule) - {"ndim", "numel", *SHAPE_NAMES}
        except scalar_expr.ExprError as e:
            raise SpecError(f"shape flag {name!r}: bad rule: {e}", loc,
                            hint="a rule is an expression over ndim and numel, "
                            "e.g. 'ndim >= 2'") from None
        if unknown:
            raise SpecError(f"shape flag {name!r}: the rule may use ndim, numel, rows and "
                            f"cols, not {sorted(unknown)[0]!r}", loc,
                            hint="e.g. 'ndim >= 2 and numel > 1' or 'ndim == 2 and rows > cols'")
        self.shape_flags[name] = (rule, doc)
        return name

    def name_flag(self, name: str, exclude: tuple[str, ...] = (), doc: str = "") -> str:
        """A flag set per parameter from its name: False when the name contains one of
        ``exclude`` (LARS leaves out "LayerNorm" and "bias"), True otherwise and for
        unnamed parameters. Users name parameters with ``create(..., param_names=[...])``
        and may replace the rule with ``name_filters={name: callable}``."""
        loc = caller_loc()
        self._new_name(name, "flag", loc)
        if isinstance(exclude, str) or not all(isinstance(x, str) for x in exclude):
            raise SpecError(f"name flag {name!r}: exclude must be a tuple of strings", loc,
                            hint="e.g. exclude=('bias', 'norm')")
        self.name_flags[name] = (tuple(exclude), doc)
        return name

    def state(self, name: str, init: Any = 0.0, doc: str = "", *, shape: str = "param",
              when: str | None = None, half_when: str | None = None) -> Expr:
        """Optimizer state: per element (``shape="param"``), per row or column of the
        ``[B, R, C]`` view (``"row"``: shape[:-1], ``"col"``: shape[:-2] + shape[-1:]),
        one scalar per parameter (``"scalar"``), or an R x R / C x C matrix (``"rr"`` /
        ``"cc"``, 2-D parameters; matrix specs). ``init`` is a number or a
        hyperparameter expression (``spec.state("accum", initial_accum)``). With
        ``when="flag"`` (a flag expression) the state exists only in those kernels; with
        ``half_when="flag"`` it is stored as float16 there (computed in the kernel dtype)."""
        loc = caller_loc()
        self._new_name(name, "state", loc)
        if shape not in STATE_SHAPES:
            raise SpecError(f"state {name!r}: shape must be one of {', '.join(STATE_SHAPES)}, "
                            f"got {shape!r}", loc,
                            hint="shape='param' for a state like the parameter")
        if isinstance(init, Expr):
            bad = [n for n in _leaves(init) if n.op not in ("hyper", "const")]
            if bad:
                raise SpecError(f"state {name!r}: init may use hyperparameters and numbers, "
                                f"not {bad[0].describe()}", loc,
                                hint="e.g. init=0.0 or init=<a hyperparameter>")
            init = _init_text(init)
        elif isinstance(init, bool) or not isinstance(init, (int, float)):
            raise SpecError(f"state {name!r}: init must be a number or a hyperparameter "
                            f"expression, got {init!r}", loc,
                            hint="e.g. init=0.0 or init=<a hyperparameter>")
        else:
            init = float(init)
        for key, rule in (("when", when), ("half_when", half_when)):
            if rule is None:
                continue
            try:
                unknown = scalar_expr.names(rule) - set(self.all_flag_names())
            except scalar_expr.ExprError as e:
                raise SpecError(f"state {name!r}: bad {key}= rule: {e}", loc,
                                hint=f"{key}= is an expression over flags, "
                                "e.g. 'amsgrad'") from None
            if unknown:
                raise SpecError(f"state {name!r}: {key}= names {sorted(unknown)[0]!r}, which "
                                "is not a flag declared before it", loc,
                                hint="declare the flag with spec.flag() above the state")
        if half_when is not None and shape == "scalar":
            raise SpecError(f"state {name!r}: scalar states stay float64 on the host "
                            "(half_when applies to tensor states)", loc,
                            hint="drop half_when=")
        if half_when is not None and shape in MATRIX_STATES:
            raise SpecError(f"state {name!r}: matrix states are stored in the parameter's "
                            "dtype", loc, hint="drop half_when=")
        axes = STATE_SHAPES[shape]
        node = Expr("state", name=name, kind="tensor" if axes else "scalar", axes=axes, loc=loc,
                    mat=MATRIX_STATES.get(shape))
        self.states[name] = State(name, init, doc, shape, node, loc, when, half_when)
        return node

    def restrict(self, name: str, when: str) -> None:
        """Make an existing state (one a base spec declared) exist only where the flag
        expression ``when`` holds: Muon keeps AdamW's second moment for non-2-D
        parameters only."""
        loc = caller_loc()
        st = self.states.get(name)
        if st is None:
            raise SpecError(f"restrict(): no state {name!r}", loc,
                            hint=f"states: {', '.join(self.states) or 'none'}")
        try:
            unknown = scalar_expr.names(when) - set(self.all_flag_names())
        except scalar_expr.ExprError as e:
            raise SpecError(f"restrict({name!r}): bad when= rule: {e}", loc,
                            hint="an expression over flags, e.g. 'not matrix'") from None
        if unknown:
            raise SpecError(f"restrict({name!r}): when= names {sorted(unknown)[0]!r}, which is "
                            "not a declared flag", loc, hint="declare the flag first")
        rule = when if st.when is None else f"({st.when}) and ({when})"
        self.states[name] = dataclasses.replace(st, when=rule)

    def statistic(self, name: str, shape: str, doc: str = "") -> Expr:
        """A matrix the trainer supplies per 2-D parameter (THOR's input covariance A,
        ``shape="cc"``, and output-gradient covariance G, ``shape="rr"``), read by the
        refresh rule on the steps it runs: ``step(grads, A=[...], G=[...])``."""
        loc = caller_loc()
        self._new_name(name, "statistic", loc)
        if shape not in MATRIX_STATES:
            raise SpecError(f"statistic {name!r}: shape must be 'rr' (R x R) or 'cc' (C x C), "
                            f"got {shape!r}", loc, hint="shape='cc' for an input covariance")
        self.statistics[name] = (shape, doc)
        return Expr("stat", name=name, kind="tensor", axes="brc", loc=loc,
                    mat=MATRIX_STATES[shape])

    def accept(self, name: str, doc: str) -> None:
        """An option users may pass that this runtime has no use for (THOR's
        ``split_indices``, for distributed all-reduce): accepted and recorded, not used."""
        loc = caller_loc()
        self._new_name(name, "option", loc)
        self.accepted[name] = doc

    def refresh(self, every: Any) -> Callable:
        """Decorator: ``fn(w, flags)`` returns ``{state: new value}``, evaluated on the host
        in float64 (numpy, with ``inverse``) on a parameter's steps 1, 1 + every, ...;
        ``every`` is an int hyperparameter or an int."""
        loc = caller_loc()
        if isinstance(every, Expr) and every.op == "hyper" and every.name in self.hypers \
                and self.hypers[every.name].info.type == "int":
            every = every.name
        elif not (isinstance(every, int) and not isinstance(every, bool) and every >= 1):
            raise SpecError(f"refresh(every=...) must be an int hyperparameter or an int >= 1, "
                            f"got {every!r}", loc, hint="spec.refresh(every=frequency)")

        def decorate(fn: Callable) -> Callable:
            if self.refresh_rule is not None:
                raise SpecError("the spec has two refresh functions", loc,
                                hint="decorate one function with @spec.refresh")
            self.refresh_rule = Refresh(fn, every, loc)
            return fn
        return decorate

    def active_states(self, flags: dict[str, bool]) -> list[State]:
        """The states that exist for one flag combination (see ``when=``)."""
        return [s for s in self.states.values()
                if s.when is None or scalar_expr.evaluate(s.when, flags)]

    def require(self, expr: str, message: str) -> None:
        """A rule over several hyperparameters and flags, checked at construction."""
        self.requirements.append((Requirement(expr, message), caller_loc()))

    def update(self, fn: Callable) -> Callable:
        """Decorator: ``fn(w, grad, flags)`` returns ``{state_or_name: new_value, w: new_w}``."""
        if self.rule is not None:
            raise SpecError("the spec has two update functions", caller_loc(),
                            hint="decorate exactly one function with @spec.update")
        self.rule = fn
        code = fn.__code__
        self.rule_loc = Loc(code.co_filename, code.co_firstlineno)
        return fn

    # -- queries -----------------------------------------------------------------------
    @property
    def flags(self) -> dict[str, HyperInfo]:
        return {n: h.info for n, h in self.hypers.items() if h.info.is_flag}

    @property
    def numeric_hypers(self) -> dict[str, HyperInfo]:
        return {n: h.info for n, h in self.hypers.items() if not h.info.is_flag}

    def trace(self, flags: dict[str, bool]) -> Trace:
        """Run the update function symbolically for one flag combination."""
        w = Expr("param", name="w", kind="tensor", loc=self.rule_loc)
        g = Expr("grad", name="grad", kind="tensor", loc=self.rule_loc)
        result = self.rule(w, g, Flags(flags, self.rule_loc))
        if not isinstance(result, dict):
            raise SpecError("the update function must return a dict {state: new value, w: new w}, "
                            f"got {type(result).__name__}", self.rule_loc,
                            hint="return {m: m_new, w: w - lr * m_new}")
        updates: dict[str, Expr] = {}
        for key, value in result.items():
            name = self._target_name(key, w, g, value)
            updates[name] = const(value, getattr(value, "loc", None) or self.rule_loc)
        refresh = None
        if self.refresh_rule is not None:
            result = self.refresh_rule.rule(w, Flags(flags, self.refresh_rule.loc))
            if not isinstance(result, dict):
                raise SpecError("the refresh function must return a dict {state: new value}, "
                                f"got {type(result).__name__}", self.refresh_rule.loc,
                                hint="return {A_inv: inverse(A + damping * eye('c'))}")
            refresh = {}
            for key, value in result.items():
                name = self._target_name(key, w, g, value)
                if name == "w":
                    raise SpecError("the refresh function assigns to w; it updates states only",
                                    self.refresh_rule.loc, hint="update w in @spec.update")
                refresh[name] = const(value, getattr(value, "loc", None) or self.refresh_rule.loc)
        return Trace(dict(flags), updates, self.rule_loc, refresh)

    def _target_name(self, key, w: Expr, g: Expr, value) -> str:
        loc = getattr(value, "loc", None) or self.rule_loc
        if key is w or key == "w":
            return "w"
        if key is g or key == "grad":
            raise SpecError("the update assigns to the gradient; the gradient is read-only", loc,
                            hint="compute a new local value instead")
        if isinstance(key, Expr):
            if key.op == "hyper":
                raise SpecError(f"the update assigns to hyperparameter {key.name!r}; "
                                "hyperparameters are read-only", loc,
                                hint="keep a value that changes in a state (spec.state)")
            if key.op == "state" and key.name in self.states and self.states[key.name].node is key:
                return key.name
            raise SpecError(f"the update assigns to {key.describe()}, which is not a state "
                            "declared by this spec", loc,
                            hint="update keys are w and the states spec.state() returned")
        if isinstance(key, str):
            if key in self.states:
                return key
            if key in self.hypers:
                raise SpecError(f"the update assigns to hyperparameter {key!r}; "
                                "hyperparameters are read-only", loc,
                                hint="keep a value that changes in a state (spec.state)")
            raise SpecError(f"state {key!r} is updated but not declared", loc,
                            hint=f"declare it: spec.state({key!r}, 0.0)")
        raise SpecError(f"update keys must be states or w, got {key!r}", loc,
                        hint="update keys are w and the states spec.state() returned")

    def all_flag_names(self) -> list[str]:
        return [*self.flags, *self.shape_flags, *self.name_flags]

    def hyper_defaults(self) -> dict[str, Any]:
        return {n: h.info.default for n, h in self.hypers.items()}


def base_spec(name: str) -> Spec:
    """Load catalog spec ``name`` to build on (``Spec.extend``). The artifact key of a spec
    that does this covers the base's source too (optgen.runtime.cache)."""
    from optgen.compiler.loader import load_spec  # the loader imports this module
    from optgen.runtime import catalog
    return load_spec(catalog.resolve(name))


def _leaves(e: Expr) -> list[Expr]:
    return [n for n in walk([e]) if not n.args]


def _init_text(e: Expr) -> str:
    return to_python(e)


def constraint_names(text: str, loc: Loc | None) -> set[str]:
    try:
        return scalar_expr.names(text)
    except scalar_expr.ExprError as e:
        raise SpecError(f"bad constraint: {e}", loc, hint="a constraint is a comparison over "
                        "hyperparameters, e.g. '0 <= beta < 1'") from None

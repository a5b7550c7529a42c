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

import keyword
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import SpecError
from .ir import Expr, Loc, apply, caller_loc, const, reduce, to_python, walk
from optgen.runtime.hyper import HyperInfo, Requirement
from optgen.runtime import scalar_expr

RESERVED = {"t", "w", "grad", "n", "flags", "T"}


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


def clip(x, lo, hi):
    """min(max(x, lo), hi) written with comparisons so that NaN stays NaN."""
    return where(x > hi, hi, where(x < lo, lo, x))


@dataclass
class Hyper:
    info: HyperInfo
    node: Expr | None
    loc: Loc | None


STATE_SHAPES = {"param": "brc", "row": "br", "col": "bc", "scalar": ""}


@dataclass
class State:
    name: str
    init: float | str   # a number, or a Python expression over hyperparameters
    doc: str
    shape: str  # "param" (per element), "row"/"col" (per row/column of the view), "scalar"
    node: Expr
    loc: Loc | None
    when: str | None = None  # a flag expression: the state exists only where it is true
    half_when: str | None = None  # a flag expression: stored as float16 where it is true


@dataclass
class Trace:
    """The update for one flag combination: new values by name (``"w"`` is the parameter)."""

    flags: dict[str, bool]
    updates: dict[str, Expr]
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
                or name in self.inputs:
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
        """A flag set per parameter from its shape, e.g. ``"ndim >= 2"`` (names: ndim, numel).

        Like a flag it specializes the kernel (read it as ``flags.<name>``), but the user
        does not set it: the runtime evaluates ``rule`` for each parameter."""
        loc = caller_loc()
        self._new_name(name, "flag", loc)
        try:
            unknown = scalar_expr.names(rule) - {"ndim", "numel"}
        except scalar_expr.ExprError as e:
            raise SpecError(f"shape flag {name!r}: bad rule: {e}", loc,
                            hint="a rule is an expression over ndim and numel, "
                            "e.g. 'ndim >= 2'") from None
        if unknown:
            raise SpecError(f"shape flag {name!r}: the rule may use ndim and numel, "
                            f"not {sorted(unknown)[0]!r}", loc, hint="e.g. 'ndim >= 2 and numel > 1'")
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
        or one scalar per parameter (``"scalar"``). ``init`` is a number or a
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
        axes = STATE_SHAPES[shape]
        node = Expr("state", name=name, kind="tensor" if axes else "scalar", axes=axes, loc=loc)
        self.states[name] = State(name, init, doc, shape, node, loc, when, half_when)
        return node

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
        return Trace(dict(flags), updates, self.rule_loc)

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

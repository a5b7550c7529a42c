"""The ``Spec`` class: an optimizer's declarations (hyperparameters, flags, states,
extra inputs, statistics, requirements) and its update and refresh rules, plus the
records it keeps of each declaration (``Hyper``, ``State``, ``Refresh``).

Spec files reach these names through optgen.dsl; the compiler (optgen.compiler.loader,
verify, specialize) imports them from here, below the DSL module.
"""
from __future__ import annotations

import dataclasses
import inspect
import keyword
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import SpecError
from .ir import MATRIX_STATES, Expr, Loc, caller_loc, to_python, walk
from .tracing import Trace, trace_spec
from optgen.core.hyper import HyperInfo, Requirement
from optgen.core import scalar_expr

RESERVED = {"t", "w", "grad", "n", "flags", "T", "rows", "cols"}
SHAPE_NAMES = ("rows", "cols")   # R and C of a parameter's [B, R, C] view (spec.rows/cols)


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
    nonneg: bool = False     # the spec asserts the state is never negative (q8: unsigned map)


@dataclass
class Refresh:
    """``@spec.refresh(every=k, start=s)``: new values of some states, computed on the
    host every k steps of a parameter (its steps s, s + k, s + 2k, ...; s = 1 unless
    given) from its states and statistics the trainer passes to step()
    (``spec.statistic``); a rule ``fn(w, grad, flags)`` may also read the step's
    gradient (see ``Spec.refresh``)."""
    rule: Callable
    every: str | int            # an int hyperparameter's name, or a number
    loc: Loc | None
    start: int = 1              # the parameter's step of the first refresh
    reads_grad: bool = False    # fn(w, grad, flags): the step's gradient is an argument
    dtype: str = "float64"      # evaluated in float64, or "kernel": the kernel's dtype


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
              none_value: float | None = None, tuple: str | None = None) -> Expr:
        """A numeric run-time kernel argument; ``tuple``: the torch tuple holding it."""
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
        if tuple is not None and not (isinstance(tuple, str) and tuple.isidentifier()
                                      and tuple not in self.hypers and tuple != name):
            raise SpecError(f"hyperparameter {name!r}: tuple must be a name no hyperparameter "
                            f"has, got {tuple!r}", loc, hint='e.g. tuple="eps" for eps1, eps2')
        info = HyperInfo(name, default, type, constraint, doc, optional, none_value, tuple)
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
        numel, rows and cols of the [B, R, C] view, int hyperparameters declared before).

        Like a flag it specializes the kernel (read it as ``flags.<name>``), but the user
        does not set it: the runtime evaluates ``rule`` for each parameter at creation."""
        loc = caller_loc()
        self._new_name(name, "flag", loc)
        ints = {n for n, h in self.hypers.items() if h.info.type == "int"}
        try:
            unknown = scalar_expr.names(rule) - {"ndim", "numel", *SHAPE_NAMES, *ints}
        except scalar_expr.ExprError as e:
            raise SpecError(f"shape flag {name!r}: bad rule: {e}", loc,
                            hint="a rule is an expression over ndim and numel, "
                            "e.g. 'ndim >= 2'") from None
        if unknown:
            raise SpecError(f"shape flag {name!r}: the rule may use ndim, numel, rows, "
                            f"cols and int hyperparameters, not {sorted(unknown)[0]!r}", loc,
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
              when: str | None = None, half_when: str | None = None,
              nonneg: bool = False) -> Expr:
        """Optimizer state: per element (``shape="param"``), per row or column of the
        ``[B, R, C]`` view (``"row"``: shape[:-1], ``"col"``: shape[:-2] + shape[-1:]),
        one scalar per parameter (``"scalar"``), or an R x R / C x C matrix (``"rr"`` /
        ``"cc"``, 2-D parameters; matrix specs). ``init`` is a number, a hyperparameter
        expression (``spec.state("accum", initial_accum)``) or "w" (the parameter). With
        ``when="flag"`` (a flag expression) the state exists only in those kernels; with
        ``half_when="flag"`` it is stored as float16 there (computed in the kernel dtype).
        ``nonneg=True`` asserts that it is never negative where the compiler cannot prove
        it (the q8 state format then uses the unsigned map; the verifier checks the init)."""
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
            init = to_python(init)
        elif init != "w" or shape != "param":   # ("w": a copy of the parameter)
            if isinstance(init, bool) or not isinstance(init, (int, float)):
                raise SpecError(f"state {name!r}: init must be a number, a hyperparameter "
                                f"expression or 'w' (shape='param' only), got {init!r}",
                                loc, hint="e.g. init=0.0, init=<a hyperparameter> or 'w'")
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
        if not isinstance(nonneg, bool):
            raise SpecError(f"state {name!r}: nonneg must be True or False, got {nonneg!r}",
                            loc, hint="nonneg=True")
        self.states[name] = State(name, init, doc, shape, node, loc, when, half_when, nonneg)
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

    def refresh(self, every: Any, start: int = 1, dtype: str = "float64") -> Callable:
        """Decorator: ``fn(w, flags)`` returns ``{state: new value}``, evaluated in float64
        (``dtype="kernel"``: the kernel's dtype, SOAP's float32) before a parameter's steps
        start, start + every, ... (``every``: an int hyperparameter or int; ``start`` >= 1).
        ``fn(w, grad, flags)`` also reads the step's gradient, and runs on the steps every,
        2 every, ... (from start on) instead (Distributed Shampoo's roots)."""
        loc = caller_loc()
        if not (isinstance(start, int) and not isinstance(start, bool) and start >= 1):
            raise SpecError(f"refresh(start=...) must be an int >= 1, got {start!r}", loc,
                            hint="spec.refresh(every=frequency, start=2)")
        if dtype not in ("float64", "kernel"):
            raise SpecError(f"refresh(dtype=...) must be 'float64' or 'kernel', got {dtype!r}", loc)
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
            n = len(inspect.signature(fn).parameters)
            if n not in (2, 3):
                raise SpecError(f"the refresh function has {n} parameters", loc,
                                hint="def refresh(w, flags) or def refresh(w, grad, flags)")
            self.refresh_rule = Refresh(fn, every, loc, start, n == 3, dtype)
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
        return trace_spec(self, flags)

    def all_flag_names(self) -> list[str]:
        return [*self.flags, *self.shape_flags, *self.name_flags]

    def hyper_defaults(self) -> dict[str, Any]:
        return {n: h.info.default for n, h in self.hypers.items()}


def _leaves(e: Expr) -> list[Expr]:
    return [n for n in walk([e]) if not n.args]


def constraint_names(text: str, loc: Loc | None) -> set[str]:
    try:
        return scalar_expr.names(text)
    except scalar_expr.ExprError as e:
        raise SpecError(f"bad constraint: {e}", loc, hint="a constraint is a comparison over "
                        "hyperparameters, e.g. '0 <= beta < 1'") from None

"""Tracing: a spec's update (and refresh) function run symbolically for one flag
combination, with the flags it reads (``Flags``) and what it assigns (``Trace``).

``Spec.trace`` (optgen.declarations) is the entry point; the verifier
(optgen.compiler.verify) traces every flag combination and checks the result.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import SpecError
from .ir import Expr, Loc, caller_loc, const, walk


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


def trace_spec(spec, flags: dict[str, bool]) -> Trace:
    """Run ``spec``'s update function (and refresh function) symbolically for one flag
    combination: ``Spec.trace``."""
    w = Expr("param", name="w", kind="tensor", loc=spec.rule_loc)
    g = Expr("grad", name="grad", kind="tensor", loc=spec.rule_loc)
    result = spec.rule(w, g, Flags(flags, spec.rule_loc))
    if not isinstance(result, dict):
        raise SpecError("the update function must return a dict {state: new value, w: new w}, "
                        f"got {type(result).__name__}", spec.rule_loc,
                        hint="return {m: m_new, w: w - lr * m_new}")
    updates: dict[str, Expr] = {}
    for key, value in result.items():
        name = _target_name(spec, key, w, g, value)
        updates[name] = const(value, getattr(value, "loc", None) or spec.rule_loc)
    refresh = None
    if spec.refresh_rule is not None:
        rule = spec.refresh_rule
        args = (w, g) if rule.reads_grad else (w,)
        result = rule.rule(*args, Flags(flags, rule.loc))
        if not isinstance(result, dict):
            raise SpecError("the refresh function must return a dict {state: new value}, "
                            f"got {type(result).__name__}", spec.refresh_rule.loc,
                            hint="return {A_inv: inverse(A + damping * eye('c'))}")
        refresh = {}
        for key, value in result.items():
            name = _target_name(spec, key, w, g, value)
            if name == "w":
                raise SpecError("the refresh function assigns to w; it updates states only",
                                spec.refresh_rule.loc, hint="update w in @spec.update")
            refresh[name] = const(value, getattr(value, "loc", None) or spec.refresh_rule.loc)
    return Trace(dict(flags), updates, spec.rule_loc, refresh)


def _target_name(spec, key, w: Expr, g: Expr, value) -> str:
    """The name an update key assigns to: "w" or a state the spec declared."""
    loc = getattr(value, "loc", None) or spec.rule_loc
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
        if key.op == "state" and key.name in spec.states and spec.states[key.name].node is key:
            return key.name
        raise SpecError(f"the update assigns to {key.describe()}, which is not a state "
                        "declared by this spec", loc,
                        hint="update keys are w and the states spec.state() returned")
    if isinstance(key, str):
        if key in spec.states:
            return key
        if key in spec.hypers:
            raise SpecError(f"the update assigns to hyperparameter {key!r}; "
                            "hyperparameters are read-only", loc,
                            hint="keep a value that changes in a state (spec.state)")
        raise SpecError(f"state {key!r} is updated but not declared", loc,
                        hint=f"declare it: spec.state({key!r}, 0.0)")
    raise SpecError(f"update keys must be states or w, got {key!r}", loc,
                    hint="update keys are w and the states spec.state() returned")

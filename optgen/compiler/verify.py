"""Stage 2 — verify: reject a bad spec before anything is lowered.

Checks: hyperparameter defaults against their types and constraints, constraint names,
requirements, and, for every flag combination, that the update assigns exactly the
declared states and the parameter, with float values of the right kind.
"""
from __future__ import annotations

import itertools
import math

from ..dsl import Spec, Trace, constraint_names
from ..errors import SpecError
from ..ir import walk
from .loader import spec_line_error
from optgen.runtime import hyper as hyper_rules
from optgen.runtime import scalar_expr

MAX_FLAGS = 6  # 64 kernels per dtype at most


def flag_combinations(spec: Spec) -> list[dict[str, bool]]:
    """Every flag combination that a requirement over flags alone does not rule out
    (adafactor's "relative_step or not warmup_init"): no kernel is built for those."""
    names = spec.all_flag_names()
    combos = [dict(zip(names, bits)) for bits in itertools.product([False, True], repeat=len(names))]
    flag_rules = [r.expr for r, _ in spec.requirements
                  if scalar_expr.names(r.expr) <= set(names)]
    return [c for c in combos if all(scalar_expr.evaluate(e, c) for e in flag_rules)]


def verify(spec: Spec) -> list[Trace]:
    """Return the traced update of every flag combination, or raise SpecError."""
    _check_hypers(spec)
    if spec.rule is None:
        raise SpecError("the spec declares no update function (decorate one with @spec.update)",
                        spec.loc)
    nflags = len(spec.all_flag_names())
    if nflags > MAX_FLAGS:
        raise SpecError(f"at most {MAX_FLAGS} flags per spec, found {nflags}", spec.loc)
    return [_check_trace(spec, _trace(spec, flags)) for flags in flag_combinations(spec)]


def _check_hypers(spec: Spec) -> None:
    known = set(spec.hypers)
    defaults = spec.hyper_defaults()
    for h in spec.hypers.values():
        info = h.info
        try:
            hyper_rules.coerce(spec.name, info, info.default)
        except (TypeError, ValueError) as e:
            raise SpecError(f"bad default: {e}", h.loc) from None
        if info.constraint is None:
            continue
        unknown = constraint_names(info.constraint, h.loc) - known
        if unknown:
            raise SpecError(f"undefined name {sorted(unknown)[0]!r} in the constraint "
                            f"{info.constraint!r} of {info.name!r}", h.loc)
        if info.default is not None and not scalar_expr.evaluate(info.constraint, defaults):
            raise SpecError(f"the default {info.name}={info.default!r} breaks its own constraint "
                            f"{info.constraint!r}", h.loc)
    for req, loc in spec.requirements:
        unknown = constraint_names(req.expr, loc) - known
        if unknown:
            raise SpecError(f"undefined name {sorted(unknown)[0]!r} in the requirement "
                            f"{req.expr!r}", loc)
        if not scalar_expr.evaluate(req.expr, defaults):
            raise SpecError(f"the defaults break the requirement {req.expr!r}", loc)


def _trace(spec: Spec, flags: dict[str, bool]) -> Trace:
    try:
        return spec.trace(flags)
    except Exception as e:  # the update function is user code
        raise spec_line_error(e, spec.file or "") from None


def _check_trace(spec: Spec, tr: Trace) -> Trace:
    which = f" (flags {tr.flags})" if tr.flags else ""
    if "w" not in tr.updates:
        raise SpecError(f"the update returns no new value for the parameter w{which}", tr.loc)
    active = {s.name for s in spec.active_states(tr.flags)}
    for name, st in spec.states.items():
        if name in active and name not in tr.updates:
            raise SpecError(f"state {name!r} is declared but never updated{which}", st.loc)
        if name not in active and name in tr.updates:
            raise SpecError(f"state {name!r} is updated{which} but does not exist there "
                            f"(when={st.when!r})", tr.updates[name].loc or st.loc)
    for name, value in tr.updates.items():
        loc = value.loc or tr.loc
        if value.dtype != "float":
            raise SpecError(f"dtype conflict: the new value of {name!r} is a bool (a comparison);"
                            " wrap it in where(cond, 1.0, 0.0)", loc)
        st = spec.states.get(name)
        if st is not None and st.shape == "scalar" and value.kind == "tensor":
            raise SpecError(f"scalar state {name!r} is computed from tensor values; scalar "
                            "states are updated on the host from hyperparameters, t and "
                            "scalar states only", loc)
        target_axes = st.node.axes if st is not None else "brc"
        if any(a not in target_axes for a in value.axes):
            raise SpecError(f"the new value of {name!r} varies along axes {value.axes!r} but "
                            f"{name!r} holds {target_axes!r} (reduce it first, e.g. "
                            "row_mean/col_mean/mean)", loc)
        for node in walk([value]):
            if node.op == "state" and node.name not in active:
                raise SpecError(f"state {node.name!r} is read{which} but does not exist there "
                                f"(when={spec.states[node.name].when!r})", node.loc or loc)
            if node.op == "const" and node.dtype == "float" and not math.isfinite(node.value):
                raise SpecError(f"constant {node.value!r} is not finite", node.loc or loc)
    return tr

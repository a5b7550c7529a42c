"""Stage 2 — verify: reject a bad spec before anything is lowered.

Checks: hyperparameter defaults against their types and constraints, constraint names,
requirements, and, for every flag combination, that the update assigns exactly the
declared states and the parameter, with float values of the right kind.
"""
from __future__ import annotations

import itertools
import math

from ..declarations import Spec, constraint_names
from ..errors import SpecError
from ..ir import global_sums, is_global, matrix_shape, walk
from ..tracing import Trace
from .loader import spec_line_error
from .nonneg import init_nonneg
from optgen.core import hyper as hyper_rules
from optgen.core import scalar_expr

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
        raise SpecError("the spec declares no update function", spec.loc,
                        hint="decorate the rule with @spec.update")
    nflags = len(spec.all_flag_names())
    if nflags > MAX_FLAGS:
        raise SpecError(f"at most {MAX_FLAGS} flags per spec, found {nflags}", spec.loc,
                        hint="turn a flag into a float hyperparameter (0.0 or 1.0)")
    traces = [_check_trace(spec, _trace(spec, flags)) for flags in flag_combinations(spec)]
    _check_lazy(spec, traces)
    _check_nonneg(spec)
    return traces


def _check_nonneg(spec: Spec) -> None:
    """A state asserted non-negative (``nonneg=True``) needs a non-negative init: a
    number >= 0, or a hyperparameter whose constraint bounds it below by 0."""
    for st in spec.states.values():
        if st.nonneg and not init_nonneg(spec, st.init):
            raise SpecError(f"state {st.name!r} is declared nonneg=True, but its init "
                            f"{st.init!r} is not known to be >= 0", st.loc,
                            hint="use a non-negative init, or constrain the hyperparameter "
                                 "(e.g. 'x >= 0'), or drop nonneg=True")


def _check_lazy(spec: Spec, traces: list[Trace]) -> None:
    """``lazy_update_default`` promises row-sparse kernels, which update the rows a
    gradient names and nothing else: a reduction (a norm, a mean) or a row/column state
    makes a row's new value depend on other rows, so no such kernel exists."""
    if not spec.lazy_update_default:
        return
    hint = ("drop lazy_update_default (row-sparse gradients then update every row), or "
            "keep the rule row-wise elementwise")
    for st in spec.states.values():
        if st.shape in ("row", "col"):
            raise SpecError(f"lazy_update_default is set, but state {st.name!r} has "
                            f"shape={st.shape!r}; a lazy (row-sparse) kernel cannot keep "
                            "it", st.loc, hint=hint)
    for tr in traces:
        for node in walk(list(tr.updates.values())):
            if node.op == "reduce":
                raise SpecError(f"lazy_update_default is set, but the update reduces "
                                f"({node.value} over axes {node.name!r}); a lazy (row-sparse) "
                                "kernel sees only some rows and cannot compute it",
                                node.loc or tr.loc, hint=hint)
        if spec.inputs:
            raise SpecError("lazy_update_default is set, but the update reads extra inputs "
                            f"({', '.join(spec.inputs)}), which have no row-sparse form",
                            spec.loc, hint=hint)


def _check_hypers(spec: Spec) -> None:
    known = set(spec.hypers)
    defaults = spec.hyper_defaults()
    for h in spec.hypers.values():
        info = h.info
        try:
            hyper_rules.coerce(spec.name, info, info.default)
        except (TypeError, ValueError) as e:
            raise SpecError(f"bad default: {e}", h.loc,
                            hint="give a default of the declared type") from None
        if info.constraint is None:
            continue
        unknown = constraint_names(info.constraint, h.loc) - known
        if unknown:
            raise SpecError(f"undefined name {sorted(unknown)[0]!r} in the constraint "
                            f"{info.constraint!r} of {info.name!r}", h.loc,
                            hint="constraints name this spec's hyperparameters only")
        if info.default is not None and not scalar_expr.evaluate(info.constraint, defaults):
            raise SpecError(f"the default {info.name}={info.default!r} breaks its own constraint "
                            f"{info.constraint!r}", h.loc,
                            hint="change the default or the constraint")
    for req, loc in spec.requirements:
        unknown = constraint_names(req.expr, loc) - known
        if unknown:
            raise SpecError(f"undefined name {sorted(unknown)[0]!r} in the requirement "
                            f"{req.expr!r}", loc,
                            hint="requirements name this spec's hyperparameters only")
        if not scalar_expr.evaluate(req.expr, defaults):
            raise SpecError(f"the defaults break the requirement {req.expr!r}", loc,
                            hint="change the defaults or the requirement")


def _trace(spec: Spec, flags: dict[str, bool]) -> Trace:
    try:
        return spec.trace(flags)
    except Exception as e:  # the update function is user code
        raise spec_line_error(e, spec.file or "") from None


HOST_ONLY = {"stat": "a statistic", "inverse": "inverse()", "identity": "eye()",
             "inverse_root": "inverse_root()", "power_qr": "power_qr()",
             "eigen_order": "eigen_order()"}


def _check_matrix(spec: Spec, tr: Trace, active: set[str]) -> None:
    """Matrix rules: shapes of matrix states, loop counts, and what runs where (statistics,
    inverse and eye belong to the refresh rule, which runs on the host)."""
    which = f" (flags {tr.flags})" if tr.flags else ""
    for name, value in tr.updates.items():
        for node in walk([value]):
            if node.op in HOST_ONLY:
                raise SpecError(f"{HOST_ONLY[node.op]} is used in the update{which}; it belongs "
                                "to the refresh rule, which runs on the host every k steps",
                                node.loc or tr.loc, hint="compute it in @spec.refresh and keep "
                                "the result in a state (shape='rr' or 'cc')")
            if node.op == "loop" and isinstance(node.value, str):
                info = spec.hypers[node.value].info
                if info.type != "int":
                    raise SpecError(f"repeat() count {node.value!r} is a {info.type} "
                                    "hyperparameter; it must be an int", node.loc or tr.loc,
                                    hint=f"spec.hyper({node.value!r}, ..., type='int')")
    matrix = tr.matrix
    if matrix and spec.inputs:
        raise SpecError(f"the update multiplies matrices{which} and reads extra inputs "
                        f"({', '.join(spec.inputs)}); matrix rules take the gradient only",
                        tr.loc, hint="drop spec.input, or keep the rule elementwise")
    for name, value in [*tr.updates.items(), *(tr.refresh or {}).items()]:
        st = spec.states.get(name)
        want = "RC" if st is None or st.shape == "param" else \
            {"rr": "RR", "cc": "CC"}.get(st.shape)
        got = matrix_shape(value)
        if (st is not None and st.shape in ("rr", "cc") or matrix) and want and got and \
                got != want:
            raise SpecError(f"shape conflict: the new value of {name!r} is a "
                            f"{' x '.join(got)} matrix, {name!r} is {' x '.join(want)}"
                            f"{which}", value.loc or tr.loc,
                            hint="transpose it (x.T) or multiply to the right shape")
    if tr.refresh is None:
        return
    for name, value in tr.refresh.items():
        if name not in active:
            raise SpecError(f"the refresh rule updates state {name!r}, which does not exist "
                            f"here{which}", value.loc or tr.loc,
                            hint="refresh it only under its when= flags")
        for node in walk([value]):
            if node.op == "grad" and node.name != "grad":
                raise SpecError(f"the refresh rule reads input {node.name!r}; it runs from "
                                "the states, statistics and the gradient only",
                                node.loc or value.loc, hint="use the input in @spec.update")
            if node.op == "loop":
                raise SpecError("repeat() in the refresh rule is not supported",
                                node.loc or value.loc, hint="unroll it with a Python for")


def _check_trace(spec: Spec, tr: Trace) -> Trace:
    which = f" (flags {tr.flags})" if tr.flags else ""
    if "w" not in tr.updates:
        raise SpecError(f"the update returns no new value for the parameter w{which}", tr.loc,
                        hint="return {..., w: new_w}")
    active = {s.name for s in spec.active_states(tr.flags)}
    refreshed = set(tr.refresh or ())
    _check_matrix(spec, tr, active)
    for name, st in spec.states.items():
        if name in active and name not in tr.updates and name not in refreshed:
            raise SpecError(f"state {name!r} is declared but never updated{which}", st.loc,
                            hint=f"return {{{name}: <new value>}} from the update, or drop "
                            "the state")
        if name not in active and name in tr.updates:
            raise SpecError(f"state {name!r} is updated{which} but does not exist there "
                            f"(when={st.when!r})", tr.updates[name].loc or st.loc,
                            hint="update it only under its when= flags")
    for name, value in tr.updates.items():
        loc = value.loc or tr.loc
        if value.dtype != "float":
            raise SpecError(f"dtype conflict: the new value of {name!r} is a bool (a comparison)",
                            loc, hint="wrap it in where(cond, 1.0, 0.0)")
        st = spec.states.get(name)
        if st is not None and st.shape == "scalar" and value.kind == "tensor" \
                and not _of_global_sums(value):
            raise SpecError(f"scalar state {name!r} is computed from tensor values; scalar "
                            "states are updated on the host from hyperparameters, t and "
                            "scalar states only", loc,
                            hint="make it a tensor state (shape='param'); a reduction "
                            "(mean, sum) is computed in the kernel too; global_sum() "
                            "values may be read")
        target_axes = st.node.axes if st is not None else "brc"
        if any(a not in target_axes for a in value.axes):
            raise SpecError(f"shape conflict: the new value of {name!r} varies along axes "
                            f"{value.axes!r} but {name!r} holds {target_axes!r}", loc,
                            hint="reduce it first, e.g. row_mean/col_mean/mean")
        nodes = list(walk([value]))
        # a leaf's loc is where it was declared; a read is located by the node using it
        user_loc = {id(a): n.loc for n in nodes for a in n.args}
        for node in nodes:
            if node.op == "state" and node.name not in active:
                raise SpecError(f"state {node.name!r} is read{which} but does not exist there "
                                f"(when={spec.states[node.name].when!r})",
                                user_loc.get(id(node)) or tr.loc,
                                hint="read it only under its when= flags")
            if node.op == "const" and node.dtype == "float" and not math.isfinite(node.value):
                raise SpecError(f"constant {node.value!r} is not finite", node.loc or loc,
                                hint="use a large finite number, e.g. 1e30")
    return tr


def _of_global_sums(value) -> bool:
    """Whether ``value`` reads tensors only through ``global_sum`` (a host value)."""
    return all(e.kind == "scalar" or e.args or is_global(e)    # (the leaves)
               for e in walk([value], stop={id(g) for g in global_sums([value])}))

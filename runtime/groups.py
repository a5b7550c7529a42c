"""What a trainer passes as ``params``, and the hyperparameter names it may use.

``params`` takes the forms of torch.optim and MindSpore:

* a list of arrays (``model.parameters()``);
* a dict name -> array (names enable lr/wd multipliers and the weight-decay filter);
* a list of group dicts: ``{"params": [...] or {name: array}, <hyperparameter>: value,
  "grad_centralization": bool}``, plus at most one ``{"order_params": [...]}`` entry
  (MindSpore) that fixes the order in which the optimizer sees the parameters.

Hyperparameters may be given by their spec names or by aliases (hyper_names.py:
``alias`` maps them to the spec's names).

Once parsed, a group is a ``RuntimeGroup``: its validated hyperparameters (``resolve``,
where an lr may be a schedule) and where its lr comes from. Per parameter come the
lr/wd multipliers (``multipliers``), the weight-decay filter (``decay_filter``) and the
name flags of a spec such as LARS (``name_flags``).

May import: hyper, hyper_names, schedules, tensors.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from optgen.core import hyper as hyper_rules, scalar_expr, views
from . import schedules, tensors
from .hyper_names import alias, is_hyper_key, torch_view   # noqa: F401 (re-exported)

GROUP_KEYS = ("params", "grad_centralization")


def shape_flags(rules: Mapping[str, str], hyper: Mapping[str, Any],
                shape: tuple[int, ...]) -> dict[str, bool]:
    """A parameter's shape flags: each rule over its shape and its group's hyperparameters."""
    env = {**hyper, **views.shape_env(shape)}
    return {f: bool(scalar_expr.evaluate(rule, env)) for f, rule in rules.items()}


def check_shape_hypers(owner: str, rules: Mapping[str, str], changes: Mapping[str, Any],
                       current: Sequence[RuntimeGroup]) -> None:
    """Refuse a new value of a hyperparameter that a shape flag's rule reads: the rules
    chose each parameter's flags and states when the optimizer was made."""
    for flag, rule in rules.items():
        for n in sorted(scalar_expr.names(rule) & set(changes)):
            if any(g.hyper.get(n) != changes[n] for g in current):
                raise ValueError(f"{owner}: {n} is fixed once the optimizer is made (the "
                                 f"shape flag {flag}: {rule} chose each parameter's states "
                                 f"with it); got {changes[n]!r}: make a new optimizer")


@dataclass
class Entry:
    """One parameter as the trainer gave it."""
    array: Any
    name: str | None
    group: int


@dataclass
class Group:
    overrides: dict[str, Any] = field(default_factory=dict)   # spec names -> raw values
    grad_centralization: bool = False
    size: int = 0


def _is_array(x: Any) -> bool:
    return tensors.library(x) is not None


def _members(owner: str, value: Any, where: str) -> list[tuple[Any, str | None]]:
    if _is_array(value):
        return [(value, None)]
    if isinstance(value, Mapping):
        for k in value:
            if not isinstance(k, str):
                raise TypeError(f"{owner}: {where}parameter names must be strings, got {k!r}")
        return [(a, n) for n, a in value.items()]
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{owner}: {where}params must be a list of arrays or a dict "
                        f"name -> array, got {type(value).__name__}")
    return [(a, None) for a in value]


def parse(owner: str, params: Any, hypers: Mapping[str, Any]
          ) -> tuple[list[Entry], list[Group]]:
    """The parameters in optimizer order, and the groups they belong to."""
    if _is_array(params):
        raise TypeError(f"{owner}: params must be a list of arrays, got a single array "
                        "(wrap it in a list)")
    if isinstance(params, Mapping):
        return [Entry(a, n, 0) for a, n in _members(owner, params, "")], [Group(size=len(params))]
    if isinstance(params, (str, bytes)) or not hasattr(params, "__iter__"):
        raise TypeError(f"{owner}: params must be a list of arrays, a dict name -> array or "
                        f"a list of group dicts, got {type(params).__name__}")
    items = list(params)
    if not items:
        raise ValueError(f"{owner}: params is empty (an optimizer needs parameters)")
    dicts = [isinstance(x, Mapping) for x in items]
    if not any(dicts):
        return [Entry(a, None, 0) for a in items], [Group(size=len(items))]
    if not all(dicts):
        raise TypeError(f"{owner}: params mixes group dicts and arrays; pass either a list of "
                        "arrays or a list of group dicts")
    return _parse_groups(owner, items, hypers)


def _parse_groups(owner: str, items: list[Mapping], hypers: Mapping[str, Any]
                  ) -> tuple[list[Entry], list[Group]]:
    entries: list[Entry] = []
    groups: list[Group] = []
    order = None
    seen: dict[int, int] = {}      # id(array) -> group
    for gi, d in enumerate(items):
        where = f"group {gi}: "
        if "order_params" in d:
            if len(d) != 1:
                raise ValueError(f"{owner}: {where}a dict with 'order_params' may have no "
                                 f"other keys, got {sorted(d)}")
            if order is not None:
                raise ValueError(f"{owner}: {where}'order_params' given twice")
            order = (gi, d["order_params"])
            continue
        if "params" not in d:
            raise ValueError(f"{owner}: {where}has no 'params' key (keys: {sorted(d)})")
        gix = len(groups)
        members = _members(owner, d["params"], where)
        if not members:
            raise ValueError(f"{owner}: {where}has no parameters")
        for a, n in members:
            if not _is_array(a):
                raise TypeError(f"{owner}: {where}parameters must be arrays (numpy, torch, "
                                f"CuPy), got {type(a).__name__}")
            if id(a) in seen:
                raise ValueError(f"{owner}: a parameter{f' ({n})' if n else ''} is in both "
                                 f"group {seen[id(a)]} and group {gix}")
            seen[id(a)] = gix
            entries.append(Entry(a, n, gix))
        rest = {k: v for k, v in d.items() if k not in GROUP_KEYS}
        unknown = [k for k in rest if not is_hyper_key(k, hypers)]
        if unknown:
            raise ValueError(f"{owner}: {where}unknown key {unknown[0]!r}; a group takes "
                             f"'params', 'grad_centralization' and hyperparameters "
                             f"({', '.join(hypers)})")
        gc = d.get("grad_centralization", False)
        if not isinstance(gc, bool):
            raise TypeError(f"{owner}: {where}grad_centralization must be a bool, got {gc!r}")
        groups.append(Group(alias(owner, hypers, rest, where), gc, len(members)))
    if not groups:
        raise ValueError(f"{owner}: params has no group with 'params'")
    if order is not None:
        entries = _reorder(owner, entries, *order)
    return entries, groups


def _reorder(owner: str, entries: list[Entry], gi: int, order: Any) -> list[Entry]:
    """The entries in the order of ``order_params`` (arrays or names), which must list
    every grouped parameter once."""
    where = f"group {gi}: order_params"
    if _is_array(order) or isinstance(order, (str, bytes)) or not hasattr(order, "__iter__"):
        raise TypeError(f"{owner}: {where} must be a list of parameters or names")
    by_id = {id(e.array): e for e in entries}
    by_name = {e.name: e for e in entries if e.name is not None}
    out: list[Entry] = []
    used: set[int] = set()
    for x in (order.values() if isinstance(order, Mapping) else order):
        e = by_name.get(x) if isinstance(x, str) else by_id.get(id(x))
        if e is None:
            raise ValueError(f"{owner}: {where} has {x!r} which is in no group"
                             if isinstance(x, str) else
                             f"{owner}: {where} has a parameter which is in no group")
        if id(e) in used:
            raise ValueError(f"{owner}: {where} lists a parameter"
                             f"{f' ({e.name})' if e.name else ''} twice")
        used.add(id(e))
        out.append(e)
    missing = [e for e in entries if id(e) not in used]
    if missing:
        e = missing[0]
        raise ValueError(f"{owner}: {where} misses {len(missing)} parameter(s) of the groups, "
                         f"first one{f' {e.name!r}' if e.name else ''} in group {e.group}")
    return out


# -- groups at run time: hyperparameters and lr schedules --------------------------------
class RuntimeGroup:
    """A parameter group: its hyperparameters and where its lr comes from."""
    __slots__ = ("hyper", "lr", "explicit", "grad_centralization")

    def __init__(self, hyper: dict, lr: Callable[[int], float] | None, explicit: set,
                 grad_centralization: bool):
        self.hyper = hyper            # validated values; hyper["lr"] is the constant lr
        self.lr = lr                  # a schedule (step -> lr), or None for a constant
        self.explicit = explicit      # hyperparameters the group set itself
        self.grad_centralization = grad_centralization


def describe(groups: Sequence[RuntimeGroup], slots: Sequence[Any]) -> list[dict[str, Any]]:
    """``Optimizer.param_groups``: each group's parameters, names and hyperparameters
    (``slots``: the parameters' records)."""
    out = []
    for gi, g in enumerate(groups):
        members = [s for s in slots if s.group == gi]
        out.append({"params": [s.array for s in members], "names": [s.name for s in members],
                    **g.hyper, **({"lr": g.lr} if g.lr is not None else {}),
                    "grad_centralization": g.grad_centralization})
    return out


def resolve(owner: str, artifact: Any, t: int, current: Mapping[str, Any], current_lr,
            changes: Mapping[str, Any]) -> tuple[dict[str, Any], Callable | None]:
    """``current`` updated by ``changes`` (spec names), validated; an lr that is a
    schedule, sequence or callable becomes the group's lr schedule (its value at step
    ``t`` is checked)."""
    changes = dict(changes)
    lr = current_lr
    if "lr" in changes:
        value = changes["lr"]
        if value is None or isinstance(value, (numbers.Real, str)) or \
                getattr(value, "ndim", None) == 0:   # a number, or a 0-d array of one
            lr = None
        else:
            lr = schedules.as_schedule(value, owner=owner)
            changes["lr"] = current.get("lr")
    new = hyper_rules.resolve(owner, artifact.hypers, artifact.requirements, current, changes)
    if lr is not None and "lr" in artifact.hypers:
        check_lr(owner, artifact.hypers["lr"], lr(t), new)
    return new, lr


def check_lr(owner: str, info: Any, value: Any, hyper: Mapping[str, Any]) -> float:
    """A schedule's lr for one step, checked as the lr hyperparameter is."""
    value = hyper_rules.coerce(owner, info, value)
    hyper_rules.check_constraint(owner, info, value, hyper)
    return value


def lr_value(owner: str, hypers: Mapping[str, Any], g: RuntimeGroup, step: int) -> float | None:
    """Group ``g``'s lr at ``step``: its schedule's value, or its constant lr."""
    if g.lr is None:
        return g.hyper.get("lr")
    return check_lr(owner, hypers["lr"], g.lr(step), g.hyper)


# -- per parameter: multipliers, the weight-decay filter, name flags -----------------------
DEFAULT_NO_DECAY = ("beta", "gamma", "bias")


def default_decay_filter(name: str) -> bool:
    """MindSpore's and MXNet's default: no weight decay on normalization scales/shifts
    and biases (names containing beta, gamma or bias)."""
    return not any(s in name for s in DEFAULT_NO_DECAY)


def multipliers(owner: str, what: str, mults: Any, names: Sequence[str | None]
                ) -> dict[int, float]:
    """MXNet's lr_mult / wd_mult (``what``): parameter index -> multiplier, from a dict
    keyed by parameter name or index."""
    if not isinstance(mults, Mapping):
        raise TypeError(f"{owner}: {what} must be a dict name or index -> float")
    by_name = {n: i for i, n in enumerate(names) if n is not None}
    out = {}
    for key, value in mults.items():
        if isinstance(key, str):
            if key not in by_name:
                raise ValueError(f"{owner}: {what} names {key!r}, which is not a "
                                 f"parameter name" + ("" if by_name else
                                                      " (the parameters have no names)"))
            i = by_name[key]
        elif isinstance(key, numbers.Integral) and not isinstance(key, bool) \
                and 0 <= key < len(names):
            i = int(key)
        else:
            raise ValueError(f"{owner}: {what} key {key!r} is neither a parameter name "
                             f"nor an index below {len(names)}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                or not math.isfinite(value) or value < 0:
            raise ValueError(f"{owner}: {what}[{key!r}] must be a finite float >= 0, "
                             f"got {value!r}")
        out[i] = float(value)
    return out


def decay_filter(owner: str, flt: Any, slots: Sequence[Any],
                 groups: Sequence[RuntimeGroup]) -> None:
    """wd_mult 0 for named parameters (``slots``: their records) the filter leaves out,
    in groups that did not set weight_decay themselves (MindSpore's rule)."""
    if flt == "default":
        flt = default_decay_filter
    elif flt is None or flt is False:
        return
    elif not callable(flt):
        raise TypeError(f"{owner}: decay_filter must be 'default', None or a callable "
                        f"name -> bool, got {flt!r}")
    for s in slots:
        if s.name is not None and "weight_decay" not in groups[s.group].explicit \
                and not flt(s.name):
            s.wd_mult = 0.0


def name_flags(owner: str, flags: Mapping[str, Sequence[str]], filters: Any,
               names: Sequence[str | None]) -> list[dict[str, bool]]:
    """Per-parameter name flags (LARS's filter) from names/``name_filters``: a flag is
    on unless the name contains one of the spec's exclusions, or as a filter says."""
    filters = dict(filters or {})
    unknown = sorted(set(filters) - set(flags))
    if unknown:
        raise ValueError(f"{owner}: name_filters has {unknown[0]!r}; this optimizer's "
                         f"name flags are {sorted(flags) or 'none'}")
    for n, f in filters.items():
        if not callable(f):
            raise TypeError(f"{owner}: name_filters[{n!r}] must be a callable "
                            f"name -> bool, got {type(f).__name__}")
    out = []
    for name in names:
        row = {}
        for n, exclude in flags.items():
            if n in filters:
                row[n] = bool(filters[n](name if name is not None else ""))
            else:
                row[n] = name is None or not any(x in name for x in exclude)
        out.append(row)
    return out

"""What a trainer passes as ``params``, and the hyperparameter names it may use.

``params`` takes the forms of torch.optim and MindSpore:

* a list of arrays (``model.parameters()``);
* a dict name -> array (names enable lr/wd multipliers and the weight-decay filter);
* a list of group dicts: ``{"params": [...] or {name: array}, <hyperparameter>: value,
  "grad_centralization": bool}``, plus at most one ``{"order_params": [...]}`` entry
  (MindSpore) that fixes the order in which the optimizer sees the parameters.

Hyperparameters may be given by their spec names or by the aliases of MXNet
(``learning_rate``, ``wd``, ``lr_scheduler``), MindSpore (``learning_rate``,
``weight_decay``) and torch (``betas=(b1, b2)``, ``eps``/``epsilon``, ``nesterov``/
``use_nesterov``). ``alias`` maps them to the spec's names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from . import tensors

# alias -> spec name; used only when the spec has no hyperparameter of the alias's name
ALIASES = {"learning_rate": "lr", "lr_scheduler": "lr", "wd": "weight_decay",
           "eps": "epsilon", "epsilon": "eps", "nesterov": "use_nesterov",
           "use_nesterov": "nesterov"}
GROUP_KEYS = ("params", "grad_centralization")


def alias(owner: str, hypers: Mapping[str, Any], given: Mapping[str, Any],
          where: str = "") -> dict[str, Any]:
    """``given`` with every key renamed to the spec's hyperparameter name."""
    out: dict[str, Any] = {}
    came_from: dict[str, str] = {}

    def put(key: str, name: str, value: Any) -> None:
        if name in out:
            raise TypeError(f"{owner}: {where}{came_from[name]!r} and {key!r} both set "
                            f"hyperparameter {name}")
        out[name], came_from[name] = value, key

    for key, value in given.items():
        if key == "betas" and "betas" not in hypers and "beta1" in hypers and "beta2" in hypers:
            names = ["beta1", "beta2"] + (["beta3"] if "beta3" in hypers else [])  # Adan
            if not isinstance(value, (tuple, list)) or len(value) != len(names):
                raise TypeError(f"{owner}: {where}betas must be a "
                                f"{'pair' if len(names) == 2 else 'triple'} "
                                f"({', '.join(names)}), got {value!r}")
            for name, v in zip(names, value):
                put(key, name, v)
        elif key in hypers:
            put(key, key, value)
        elif key in ALIASES and ALIASES[key] in hypers:
            put(key, ALIASES[key], value)
        else:
            known = ", ".join(hypers)
            usable = sorted([a for a, n in ALIASES.items() if n in hypers and a not in hypers]
                            + (["betas"] if "beta1" in hypers and "beta2" in hypers else []))
            raise TypeError(f"{owner}: {where}unknown hyperparameter {key!r}; known: {known}"
                            + (f" (aliases: {', '.join(usable)})" if usable else ""))
    return out


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


def is_hyper_key(key: str, hypers: Mapping[str, Any]) -> bool:
    """Whether ``key`` names a hyperparameter, directly or as an alias."""
    return key in hypers or (key in ALIASES and ALIASES[key] in hypers) or \
        (key == "betas" and "beta1" in hypers)


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

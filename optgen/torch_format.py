"""torch.optim checkpoints in and out of the torch drop-ins (optgen/torch.py).

A job that trains with ``torch.optim.AdamW`` saves ``opt.state_dict()``: per parameter
``step`` (a float32 tensor), ``exp_avg`` and ``exp_avg_sq``; per group torch's
hyperparameters and switches (``amsgrad``, ``maximize``, ``foreach``, ...). The drop-ins
name the same quantities after their spec (``m``, ``v``) and keep the spec's
hyperparameters. This module converts between the two, exactly, for the optimizers whose
states are the same quantities under both names:

* ``adam`` (torch.optim.Adam): ``exp_avg`` -> ``m``, ``exp_avg_sq`` -> ``v``. The states are
  the same moving averages; the rule differs in where eps enters (optgen's Adam, the seeds'
  rule, adds eps to sqrt(v) before the bias correction of the step size; torch adds it to
  the bias-corrected sqrt(v)), a difference of order eps in each update, not a state
  conversion.
* ``adamw`` (torch.optim.AdamW): the same names; the rule is torch's.

What cannot be carried over is refused with a ValueError that says why: ``amsgrad=True``
(a ``max_exp_avg_sq`` state optgen's rules do not have), ``maximize=True``, Adam with
``decoupled_weight_decay=True`` (that is AdamW: load it into optgen.torch.AdamW), and any
optimizer not in the table. Group values (lr, betas, eps, weight_decay) are taken from
the checkpoint; torch's implementation switches (foreach, fused, capturable, ...) are
dropped. Imports: torch.
"""
from __future__ import annotations

from typing import Any

import torch

# catalog name -> torch.optim class name, torch state name -> spec state name
FORMATS: dict[str, tuple[str, dict[str, str]]] = {
    "adam": ("Adam", {"exp_avg": "m", "exp_avg_sq": "v"}),
    "adamw": ("AdamW", {"exp_avg": "m", "exp_avg_sq": "v"}),
}
GROUP_VALUES = ("lr", "betas", "eps", "weight_decay")   # taken over, both ways
# torch switches that change the algorithm: the value optgen's rule corresponds to
SWITCHES = {"amsgrad": False, "maximize": False}


def is_torch(name: str, sd: dict[str, Any]) -> bool:
    """Whether ``sd`` is in torch.optim's format (its states carry torch's names)."""
    torch_names = {n for _, names in FORMATS.values() for n in names}
    return any(set(rec) & torch_names - {"step"} for rec in sd.get("state", {}).values()) \
        or any("amsgrad" in g or "maximize" in g for g in sd.get("param_groups", []))


def _format(name: str, what: str) -> tuple[str, dict[str, str]]:
    if name not in FORMATS:
        raise ValueError(f"{name}: {what} is implemented for "
                         f"{', '.join(f'{n} (torch.optim.{c})' for n, (c, _) in FORMATS.items())}"
                         f" only; {name}'s states have no torch.optim counterpart here")
    return FORMATS[name]


def to_optgen(name: str, groups: list[dict], sd: dict[str, Any]) -> dict[str, Any]:
    """A torch.optim state_dict of ``name``'s algorithm as the drop-in's state_dict, for
    a drop-in whose param_groups are ``groups`` (their keys and current values are the
    base; the checkpoint's values of GROUP_VALUES replace them)."""
    cls, names = _format(name, "loading a torch.optim checkpoint")
    saved = sd["param_groups"]
    if len(saved) != len(groups):
        raise ValueError(f"{name}: the torch.optim checkpoint has {len(saved)} parameter "
                         f"groups, this optimizer {len(groups)}")
    out_groups = []
    for gi, (sg, g) in enumerate(zip(saved, groups)):
        for key, ours in SWITCHES.items():
            if bool(sg.get(key, ours)) != ours:
                raise ValueError(f"{name}: group {gi} of the torch.optim checkpoint has "
                                 f"{key}={sg[key]}; optgen's {name} rule has no {key} "
                                 "variant, so its states cannot continue that run")
        if name == "adam" and sg.get("decoupled_weight_decay"):
            raise ValueError(f"{name}: group {gi} of the torch.optim checkpoint has "
                             "decoupled_weight_decay=True, which is AdamW: load it into "
                             "optgen.torch.AdamW")
        new = {k: v for k, v in g.items() if k != "params"}
        new.update({k: sg[k] for k in GROUP_VALUES if k in sg and k in g})
        new["params"] = list(sg["params"])
        out_groups.append(new)
    state = {}
    for pid, rec in sd["state"].items():
        unknown = sorted(set(rec) - set(names) - {"step"})
        if unknown or "step" not in rec:
            raise ValueError(f"{name}: state of parameter {pid} in the torch.optim checkpoint "
                             f"has {sorted(rec)}; torch.optim.{cls} without amsgrad keeps "
                             f"{sorted(set(names) | {'step'})}")
        state[pid] = {names.get(k, k): v for k, v in rec.items()}
    return {"state": state, "param_groups": out_groups}


def to_torch(name: str, sd: dict[str, Any]) -> dict[str, Any]:
    """The drop-in's state_dict ``sd`` in torch.optim's format: ``torch.optim.<cls>``
    loads it and continues the run."""
    _, names = _format(name, "writing a torch.optim checkpoint")
    back = {ours: theirs for theirs, ours in names.items()}
    state = {}
    for pid, rec in sd["state"].items():
        # copies: torch.optim's load keeps tensors of the right dtype and device as they
        # are, and two optimizers stepping one state tensor in place would corrupt both
        state[pid] = {back[k]: torch.as_tensor(v).detach().clone()
                      for k, v in rec.items() if k in back}
        state[pid]["step"] = torch.tensor(float(rec.get("step", 0)), dtype=torch.float32)
    groups = []
    for g in sd["param_groups"]:
        new = {k: g[k] for k in GROUP_VALUES if k in g}
        new.update(SWITCHES, foreach=None, capturable=False, differentiable=False, fused=None,
                   decoupled_weight_decay=name == "adamw", params=list(g["params"]))
        groups.append(new)
    return {"state": state, "param_groups": groups}

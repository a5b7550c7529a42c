"""torch.optim checkpoints in and out of the torch drop-ins (optgen/torch/__init__.py).

A job that trains with ``torch.optim.AdamW`` saves ``opt.state_dict()``: per parameter
``step`` (a float32 tensor), ``exp_avg`` and ``exp_avg_sq``; per group torch's
hyperparameters and switches (``amsgrad``, ``maximize``, ``foreach``, ...). The drop-ins
name the same quantities after their spec (``m``, ``v``) and keep the spec's
hyperparameters. This module converts between the two, exactly (states are renamed,
never recomputed), for the optimizers whose states are the same quantities under both
names and whose rules agree (FORMATS; each is checked by a 20-step continuation against
torch.optim in tests/test_torch_checkpoints.py):

* adam, adamw, adamax, nadam, radam, adadelta, adagrad, sgd. optgen's Adam (the seeds'
  rule) adds eps to sqrt(v) before the step size's bias correction, torch after it: a
  difference of order eps per update, not a state conversion. torch's SGD checkpoint has
  no step count: the drop-in counts on from 0 (SGD's rule does not read it).

What cannot be carried over is refused with a ValueError that says why: a switch whose
value optgen's rule does not implement (``amsgrad=True``: a ``max_exp_avg_sq`` state the
rules lack; ``maximize=True``; ``decoupled_weight_decay=True`` except for AdamW; Adagrad's
``lr_decay``), and optimizers not in the table (DIFFERENT says why for RMSprop and
Adafactor, whose torch.optim rules differ from the specs'). Group values
named alike on both sides (lr, betas, eps, weight_decay, momentum, rho, ...) are taken
from the checkpoint; torch's implementation switches (foreach, fused, ...) are dropped
on the way in and set to torch's defaults on the way out. Imports: torch.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch

from optgen.core import formats
from optgen.core.formats import ABSMAX

# catalog name -> (torch.optim class, torch state -> spec state, torch group key -> spec's)
FORMATS: dict[str, tuple[str, dict[str, str], dict[str, str]]] = {
    "adam": ("Adam", {"exp_avg": "m", "exp_avg_sq": "v"}, {}),
    "adamw": ("AdamW", {"exp_avg": "m", "exp_avg_sq": "v"}, {}),
    "adamax": ("Adamax", {"exp_avg": "m", "exp_inf": "u"}, {}),
    "nadam": ("NAdam", {"exp_avg": "m", "exp_avg_sq": "v", "mu_product": "mu_product"}, {}),
    "radam": ("RAdam", {"exp_avg": "m", "exp_avg_sq": "v"}, {}),
    "adadelta": ("Adadelta", {"square_avg": "acc_grad", "acc_delta": "acc_delta"}, {}),
    "adagrad": ("Adagrad", {"sum": "accum"}, {"initial_accumulator_value": "initial_accum"}),
    "sgd": ("SGD", {"momentum_buffer": "momentum_buffer"}, {}),
}
# torch.optim has these too, but their rules differ from the specs': refused, with why
DIFFERENT = {
    "rmsprop": "torch.optim.RMSprop adds eps outside the square root and keeps its momentum "
               "buffer without lr; optgen's rule (MXNet's) adds it inside and keeps lr in it",
    "adafactor": "torch.optim.Adafactor's step size is min(lr, 1/sqrt(t)) and its weight "
                 "decay lr * weight_decay (eps1 clamps the variance); optgen's rule (fairseq/"
                 "MindSpore) uses lr or min(1e-2, 1/sqrt(t)), decay scaled by alpha, eps1 "
                 "added to g*g: the states would carry over, the next steps would not match",
}
# torch switches that change the algorithm, at the value optgen's rules implement
SWITCHES = {"amsgrad": False, "maximize": False, "lr_decay": 0}
SGD_STARTED = "buffer_started"   # sgd's scalar state: 1 once the buffer holds a value


def is_torch(sd: dict[str, Any], own: set[str]) -> bool:
    """Whether ``sd`` is in torch.optim's format: its groups carry torch's switches, or
    its states torch's names that are not the optimizer's ``own`` (Adafactor's
    exp_avg is optgen's name too)."""
    names = {n for _, states, _ in FORMATS.values() for n in states} - {"mu_product"}
    return any("maximize" in g or "foreach" in g for g in sd.get("param_groups", [])) or \
        any(set(rec) & (names - {"momentum_buffer"}) and set(rec) - own - {"step"}
            for rec in sd.get("state", {}).values())


def _format(name: str, what: str) -> tuple[str, dict[str, str], dict[str, str]]:
    if name in DIFFERENT:
        raise ValueError(f"{name}: {what} is not offered: {DIFFERENT[name]}")
    if name not in FORMATS:
        known = ", ".join(f"{n} (torch.optim.{c})" for n, (c, _, _) in FORMATS.items())
        raise ValueError(f"{name}: {what} is implemented for {known} only; {name}'s "
                         "states have no exact torch.optim counterpart here")
    return FORMATS[name]


def _check_switches(name: str, gi: int, sg: dict[str, Any]) -> None:
    for key, ours in SWITCHES.items():
        if key in sg and sg[key] != ours:
            raise ValueError(f"{name}: group {gi} of the torch.optim checkpoint has "
                             f"{key}={sg[key]}; optgen's {name} rule has no {key} variant, "
                             "so its states cannot continue that run")
    if bool(sg.get("decoupled_weight_decay", name == "adamw")) != (name == "adamw"):
        hint = ": load it into optgen.torch.AdamW" if name == "adam" else \
            f"; optgen's {name} couples weight decay to the gradient"
        raise ValueError(f"{name}: group {gi} of the torch.optim checkpoint has "
                         f"decoupled_weight_decay={sg['decoupled_weight_decay']}"
                         + (", which is AdamW" if name == "adam" else "") + hint)


def to_optgen(name: str, groups: list[dict], sd: dict[str, Any]) -> dict[str, Any]:
    """A torch.optim state_dict of ``name``'s algorithm as the drop-in's state_dict, for
    a drop-in whose param_groups are ``groups`` (their keys and current values are the
    base; the checkpoint's values of keys both sides have replace them)."""
    cls, states, keys = _format(name, "loading a torch.optim checkpoint")
    saved = sd["param_groups"]
    if len(saved) != len(groups):
        raise ValueError(f"{name}: the torch.optim checkpoint has {len(saved)} parameter "
                         f"groups, this optimizer {len(groups)}")
    out_groups = []
    for gi, (sg, g) in enumerate(zip(saved, groups)):
        _check_switches(name, gi, sg)
        new = {k: v for k, v in g.items() if k != "params"}
        new.update({keys.get(k, k): v for k, v in sg.items()
                    if keys.get(k, k) in g and k != "params"})
        new["params"] = list(sg["params"])
        out_groups.append(new)
    param_of = {pid: p for sg, g in zip(saved, groups)
                for pid, p in zip(sg["params"], g["params"])}
    state = {}
    for pid, rec in sd["state"].items():
        unknown = sorted(k for k in set(rec) - set(states) - {"step"}
                         if not (k.endswith(ABSMAX) and k[:-len(ABSMAX)] in states))
        if unknown or ("step" not in rec and name != "sgd"):
            raise ValueError(f"{name}: state of parameter {pid} in the torch.optim checkpoint "
                             f"has {sorted(rec)}; torch.optim.{cls} (as optgen converts it) "
                             f"keeps {sorted(set(states) | {'step'})}")
        new = {states.get(k, k): v for k, v in rec.items()}
        new.update((states[k[:-len(ABSMAX)]] + ABSMAX, v) for k, v in rec.items()
                   if k.endswith(ABSMAX) and k[:-len(ABSMAX)] in states)
        if name == "sgd":   # (torch keeps None where momentum was off: no buffer yet)
            buf = new.get("momentum_buffer")
            new[SGD_STARTED] = torch.tensor(0.0 if buf is None else 1.0, dtype=torch.float64)
            if buf is None and pid in param_of:
                new["momentum_buffer"] = torch.zeros_like(param_of[pid])
            new.setdefault("step", torch.tensor(0.0))
        state[pid] = new
    return {"state": state, "param_groups": out_groups}


def to_torch(name: str, sd: dict[str, Any], stored: dict[str, str] | None = None,
             shapes: dict[int, tuple[int, ...]] | None = None) -> dict[str, Any]:
    """The drop-in's state_dict ``sd`` in torch.optim's format: ``torch.optim.<cls>``
    loads it and continues the run. q8/q4 states (codes and ``<state>__absmax``;
    ``stored`` names their maps) are written dequantized, as float32, shaped as the
    parameter (``shapes`` by state_dict index): torch.optim has no 8-bit states; their
    block scales go beside them (``<torch name>__absmax``, which torch.optim ignores),
    so that loading the values back gives the codes again."""
    cls, states, keys = _format(name, "writing a torch.optim checkpoint")
    back = {ours: theirs for theirs, ours in states.items()}
    back_keys = {ours: theirs for theirs, ours in keys.items()}
    defaults = {k: p.default for k, p in
                list(inspect.signature(getattr(torch.optim, cls).__init__).parameters.items())[2:]
                if p.default is not inspect.Parameter.empty}
    state = {}
    for pid, rec in sd["state"].items():
        # copies: torch.optim's load keeps tensors of the right dtype and device as they
        # are, and two optimizers stepping one state tensor in place would corrupt both
        new = {back[k]: full_precision(k, v, rec, stored or {}, (shapes or {}).get(pid))
               for k, v in rec.items() if k in back}
        new.update((back[k] + ABSMAX, torch.as_tensor(rec[k + ABSMAX]).detach().clone())
                   for k in back if k + ABSMAX in rec)   # (block scales: exact back)
        if name == "sgd":
            if not float(rec.get(SGD_STARTED, 0.0)):
                new["momentum_buffer"] = None
        else:
            new["step"] = torch.tensor(float(rec.get("step", 0)), dtype=torch.float32)
        state[pid] = new
    groups = []
    for g in sd["param_groups"]:
        new = dict(defaults)
        new.update({back_keys.get(k, k): v for k, v in g.items()
                    if back_keys.get(k, k) in defaults})
        if name in ("adam", "adamw", "nadam", "radam"):   # (AdamW's is not an argument)
            new["decoupled_weight_decay"] = name == "adamw"
        new["params"] = list(g["params"])
        groups.append(new)
    return {"state": state, "param_groups": groups}


def full_precision(k: str, v: Any, rec: dict[str, Any], stored: dict[str, str],
                    shape: tuple[int, ...] | None):
    """A copy of state ``k`` for torch.optim: q8/q4 codes dequantized to float32."""
    if k + ABSMAX not in rec:
        return torch.as_tensor(v).detach().clone()
    codes = torch.as_tensor(v).detach().cpu().numpy()
    absmax = torch.as_tensor(rec[k + ABSMAX]).detach().cpu().numpy()
    values = formats.from_stored(stored[k]).dequantize((codes, absmax), shape)
    return torch.from_numpy(values).to(torch.as_tensor(v).device)

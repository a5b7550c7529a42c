"""state_dicts of the torch forms (optgen/torch/optim_form.py) in torch.optim's format.

The torch_* specs keep torch's state names, so the conversion is small: per parameter,
``step`` as torch keeps it (a float32 tensor; SparseAdam an int; SGD and Muon none),
scalar states (NAdam's ``mu_product``, ASGD's ``eta``/``mu``) as 0-d tensors, and what
a class's ``_torch_record`` / ``_optgen_record`` change (a state torch holds only
sometimes, Adafactor's factored shapes). Group keys are torch's on both sides already.
States are copied on the way out (torch.optim steps its tensors in place); q8/q4/fp8
codes are written as their float32 values with their block scales beside them
(``<state>__absmax``, which torch.optim keeps and ignores): loading them back codes the
values in those blocks again, exactly (state_load.reformat). Imports: torch_checkpoints.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.optim.optimizer import _get_scalar_dtype

from .torch_checkpoints import full_precision


def to_torch(opt: Any, sd: dict[str, Any]) -> dict[str, Any]:
    """``sd`` (the drop-in's own state_dict) as torch.optim.<cls>.state_dict() writes it."""
    group_of = {pid: g for g in sd["param_groups"] for pid in g["params"]}
    shapes = {pid: tuple(p.shape) for sg, g in zip(sd["param_groups"], opt.param_groups)
              for pid, p in zip(sg["params"], g["params"])}
    state = {}
    for pid, rec in sd["state"].items():
        new: dict[str, Any] = {}
        for k, v in rec.items():
            if k == "step":
                continue
            # (q8/q4/fp8 codes as float32 values, their block scales kept: exact back)
            new[k] = full_precision(k, v, rec, opt._artifact.stored, shapes.get(pid)) \
                if isinstance(v, torch.Tensor) else \
                torch.tensor(float(v), dtype=_get_scalar_dtype())
        if opt.step_kind == "tensor":
            new["step"] = torch.tensor(float(rec["step"]), dtype=_get_scalar_dtype())
        elif opt.step_kind == "int":
            new["step"] = int(rec["step"])
        state[pid] = opt._torch_record(new, group_of.get(pid, {}))
    return {"state": state, "param_groups": sd["param_groups"]}


def to_optgen(opt: Any, sd: dict[str, Any]) -> dict[str, Any]:
    """A torch.optim state_dict (or the drop-in's own) with the spec's states: records
    reshaped to the runtime's shapes, scalars as floats, missing ``step`` as 0."""
    saved = sd["param_groups"]
    if len(saved) != len(opt.param_groups) or any(
            len(a["params"]) != len(b["params"]) for a, b in zip(saved, opt.param_groups)):
        return sd   # (the layout check of load_state_dict says what is wrong)
    index = {id(p): i for i, p in enumerate(opt._params)}
    where = {pid: (index[id(p)], g) for sg, g in zip(saved, opt.param_groups)
             for pid, p in zip(sg["params"], g["params"])}
    state = {}
    for pid, rec in sd["state"].items():
        if pid not in where:
            state[pid] = rec
            continue
        i, group = where[pid]
        own = opt._core.state[i]
        new = opt._optgen_record(dict(rec), own, group)
        for k, v in own.items():
            got = new.get(k)
            if isinstance(got, torch.Tensor) and isinstance(v, torch.Tensor) \
                    and got.shape != v.shape and got.numel() == v.numel():
                new[k] = got.reshape(v.shape)   # (Adafactor's [..., R, 1] rows)
        new["step"] = torch.tensor(float(new.get("step", 0)))
        state[pid] = new
    named = {k: sd[k] for k in ("stored",) if k in sd}   # (the form of saved codes)
    return {"state": state, "param_groups": saved, **named}

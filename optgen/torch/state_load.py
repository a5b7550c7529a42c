"""Loading a drop-in's ``state_dict``: every saved state checked against the
optimizer's layout before anything changes, then copied into the runtime's states.

Used by ``OptgenOptimizer.load_state_dict`` (drop_in.py): ``plan`` raises a ValueError
naming the parameter and the state on another group layout, a missing or extra state or
another shape, and changes nothing; ``copy_in`` then copies from the saved tensors (not
torch's dtype-cast copies), so float64 scalar states and every stored dtype round-trip.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import fsdp


def plan(name: str, state_dict: dict[str, Any], param_groups: list[dict[str, Any]],
         params: list, states: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """(parameter index, saved record) of every parameter ``state_dict`` holds a state
    for, each checked against ``states`` (the runtime's)."""
    saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
    if len(saved_groups) != len(param_groups) or any(
            len(a["params"]) != len(b["params"])
            for a, b in zip(saved_groups, param_groups)):
        raise ValueError(f"{name}: state_dict has another group layout "
                         "(number of groups or parameters per group)")
    index = {id(p): i for i, p in enumerate(params)}
    out = []
    for sg, g in zip(saved_groups, param_groups):
        for pid, p in zip(sg["params"], g["params"]):
            if pid not in saved_state:
                continue
            i, rec = index[id(p)], saved_state[pid]
            want = set(states[i]) | {"step"}
            if set(rec) != want:
                raise ValueError(f"{name}: state_dict state of parameter "
                                 f"{i} has {sorted(rec)}, expected {sorted(want)}")
            for n, v in states[i].items():   # (a DTensor state: its local shard)
                got = None if isinstance(v, np.floating) else fsdp.local(rec[n])
                if got is not None and tuple(got.shape) != tuple(v.shape):
                    raise ValueError(f"{name}: state_dict state {i}.{n} has "
                                     f"shape {tuple(got.shape)}, expected {tuple(v.shape)}")
            out.append((i, rec))
    return out


def copy_in(states: list[dict[str, Any]], plan: list[tuple[int, dict[str, Any]]]) -> None:
    """The saved records of ``plan`` into the runtime's ``states``, in place."""
    for i, rec in plan:   # copied from the saved tensors (not torch's dtype-cast copies)
        for n, v in states[i].items():
            if isinstance(v, np.floating):
                states[i][n] = np.float64(float(rec[n]))
            elif isinstance(v, np.ndarray):   # (SparseAdam steps numpy views)
                np.copyto(v, torch.as_tensor(rec[n]).detach().cpu().numpy())
            else:
                v.copy_(fsdp.local(rec[n]))

"""Where a torch optimizer's kernels run when its caller does not say: the target of the
parameters' device (CUDA tensors: cuda, CPU tensors: llvm), as torch.optim steps
parameters wherever they live; and the parameters' names as torch's groups hold them."""
from __future__ import annotations

from typing import Any

import torch

# the target of each torch device type; another device type (mps, xpu, ...) gets llvm,
# whose device check then names the device and the targets built
TARGETS = {"cuda": "cuda", "cpu": "llvm"}


def listed(params: Any, owner: str = "", options: Any = ()) -> Any:
    """``params`` as torch's constructor takes them (tensors, or dicts of groups), listed
    once, so that a generator can be read here and again by torch; anything else (a lone
    tensor, None) is returned for torch's constructor to refuse with its own error.
    ``options`` (the keyword arguments) may not name parameters as the runtime does."""
    if "param_names" in options:
        raise TypeError(f"{owner}: param_names= is optgen.create's; a torch optimizer takes "
                        "names as torch.optim does: model.named_parameters() or groups with "
                        "'param_names'")
    if params is None or isinstance(params, torch.Tensor) or not hasattr(params, "__iter__"):
        return params
    out = []
    for p in params:
        if isinstance(p, dict) and not isinstance(p.get("params"), (torch.Tensor, type(None))):
            p = {**p, "params": list(p["params"])}
        out.append(p)
    return out


def default_target(params: Any) -> str:
    """The target of the first parameter's device (llvm when there is none)."""
    for p in params if isinstance(params, list) else ():
        group = p.get("params") if isinstance(p, dict) else p
        for t in [group] if isinstance(group, torch.Tensor) else group or ():
            if isinstance(t, torch.Tensor):
                return TARGETS.get(t.device.type, "llvm")
    return "llvm"


def names(param_groups: list[dict[str, Any]], runtime: list | None = None) -> Any:
    """The groups' ``param_names`` (torch's, from ``named_parameters()`` pairs) in the
    runtime's order, which a spec's name flags read; None where unnamed (every name flag
    on, as the runtime does for unnamed parameters). With ``runtime`` (the runtime's
    names): whether they differ (a load renamed parameters)."""
    out = [n for g in param_groups for n in g["param_names"]] \
        if any("param_names" in g for g in param_groups) else None
    return out if runtime is None else (out or [None] * len(runtime)) != list(runtime)


def check_names(owner: str, group: dict[str, Any], index: int) -> None:
    """A group's own ``param_names`` (torch keeps what it is given): one string per
    parameter, checked before the group joins."""
    if "param_names" not in group:
        return
    params = group["params"]
    if not isinstance(params, torch.Tensor):
        params = group["params"] = list(params)   # (read once: torch reads it again)
        if any(isinstance(p, tuple) for p in params):
            return                                # (torch names them from the pairs)
    n, got = 1 if isinstance(params, torch.Tensor) else len(params), group["param_names"]
    if not isinstance(got, (list, tuple)) or len(got) != n or \
            not all(isinstance(x, str) for x in got):
        raise ValueError(f"{owner}: param group {index}: 'param_names' must be {n} strings, "
                         f"one per parameter, got {got!r}")

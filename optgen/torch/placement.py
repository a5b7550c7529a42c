"""Where a torch optimizer's kernels run when its caller does not say: the target of the
parameters' device (CUDA tensors: cuda, CPU tensors: llvm), as torch.optim steps
parameters wherever they live."""
from __future__ import annotations

from typing import Any

import torch

# the target of each torch device type; another device type (mps, xpu, ...) gets llvm,
# whose device check then names the device and the targets built
TARGETS = {"cuda": "cuda", "cpu": "llvm"}


def listed(params: Any) -> Any:
    """``params`` as torch's constructor takes them (tensors, or dicts of groups), listed
    once, so that a generator can be read here and again by torch; anything else (a lone
    tensor, None) is returned for torch's constructor to refuse with its own error."""
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

"""A torch group's values as the runtime reads them, and the spec's hyperparameters as a
torch group shows them (``betas`` tuples). Imports: optgen.runtime.groups."""
from __future__ import annotations

from typing import Any

import torch

from optgen.runtime import groups


def torch_view(art, hyper: dict[str, Any]) -> dict[str, Any]:
    """Spec-named hyperparameters as a torch group holds them: the spec's declared
    tuples (``betas``, CAME's ``eps``) and ``beta1, beta2, ...`` as ``betas``
    (runtime/hyper_names.py); ``alias`` splits them back."""
    return groups.torch_view(art.hypers, hyper)


def current(v: Any) -> Any:
    """A group value as of now: a one-element tensor (torch.optim allows a tensor lr or
    betas) becomes a float; pairs are read element by element."""
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return float(v)
    if isinstance(v, (tuple, list)):
        return type(v)(current(x) for x in v)
    return v

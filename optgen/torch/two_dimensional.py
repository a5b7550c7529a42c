"""Drop-in classes whose rule preconditions 2-D parameters (SOAP, SOAP-NAdam,
PSGD-Kron): a parameter with more dimensions is refused when its group is added, with
the class's reason (``beyond_2d``), before anything is made for it."""
from __future__ import annotations

from typing import Any

import torch

from .drop_in import OptgenOptimizer


class TwoDimensional(OptgenOptimizer):
    """An OptgenOptimizer that takes parameters of at most two dimensions."""

    beyond_2d = "it preconditions 2-D parameters"   # (each class says what it does instead)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        for p in params:
            if isinstance(p, torch.Tensor) and p.dim() > 2:
                raise ValueError(
                    f"{type(self).__name__}: a parameter of shape {tuple(p.shape)} has "
                    f"{p.dim()} dimensions; {self.beyond_2d}: reshape it to 2-D or give it "
                    "another optimizer")
        super().add_param_group({**param_group, "params": params})

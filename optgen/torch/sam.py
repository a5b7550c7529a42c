"""Sharpness-aware minimization around any optimizer: ``SAM`` (Foret et al. 2021) and its
adaptive form ASAM (Kwon et al. 2021), with the signature of the authors' and
pytorch-optimizer's ``SAM(params, base_optimizer, rho=0.05, adaptive=False, **kwargs)``.

One step needs two gradients: the one at ``w`` (computed by the trainer before
``step``) and the one at the perturbed point ``w + e``, which ``step(closure)`` gets by
calling the closure::

    opt = optgen.torch.SAM(model.parameters(), optgen.torch.AdamW, rho=0.05, lr=1e-3)
    for x, y in data:
        def closure():
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            return loss
        loss = closure()          # the gradient at w
        opt.step(closure)         # e from it; the closure's gradient at w + e; w restored; base step

The rule: ``T = |w|`` (adaptive) or 1, ``e = rho * T^2 * g / (||T * g|| + perturb_eps)``
with the norm over every parameter of every group that has a gradient; the weights move
to ``w + e``, the closure computes the gradient there, the weights are put back bit for
bit (a copy, not a subtraction) and the base optimizer (an optgen class: one fused
kernel launch per group) steps with that gradient. ``rho`` and ``adaptive`` are group
keys (per group, as torch lets any key be). ``state_dict``/``load_state_dict`` are the base
optimizer's. Imports: torch only.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch


class SAM(torch.optim.Optimizer):
    def __init__(self, params, base_optimizer: Callable[..., torch.optim.Optimizer],
                 rho: float = 0.05, adaptive: bool = False, perturb_eps: float = 1e-12,
                 **kwargs: Any):
        if not callable(base_optimizer) or isinstance(base_optimizer, torch.optim.Optimizer):
            raise TypeError(f"SAM: base_optimizer must be an optimizer class (called with the "
                            f"parameter groups and **kwargs), got {base_optimizer!r}")
        for name, value in (("rho", rho), ("perturb_eps", perturb_eps)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError(f"SAM: {name} must be a finite number >= 0, got {value!r}")
        if not isinstance(adaptive, bool):
            raise TypeError(f"SAM: adaptive must be a bool, got {adaptive!r}")
        self.perturb_eps = float(perturb_eps)
        super().__init__(params, {"rho": rho, "adaptive": adaptive})
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups
        self.state = self.base_optimizer.state
        self._saved: dict[torch.Tensor, torch.Tensor] = {}

    def _grad_norm(self) -> torch.Tensor:
        norms = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.to(torch.float64)
                norms.append(torch.linalg.vector_norm(g * p.detach().abs() if group["adaptive"]
                                                      else g).to(torch.float64))
        return torch.linalg.vector_norm(torch.stack(norms)) if norms else \
            torch.zeros((), dtype=torch.float64)

    @torch.no_grad()
    def first_step(self, zero_grad: bool = False) -> None:
        """Moves every parameter with a gradient to w + e (keeps a copy of w)."""
        scale_all = 1.0 / (self._grad_norm() + self.perturb_eps)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                self._saved[p] = p.detach().clone()
                e = p.grad * (group["rho"] * scale_all).to(p.grad.dtype)
                if group["adaptive"]:
                    e = e * p * p
                p.add_(e.to(p.dtype))
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False) -> None:
        """Puts the weights back and steps the base optimizer with the current gradient."""
        for p, w in self._saved.items():
            p.copy_(w)
        self._saved.clear()
        self.base_optimizer.step()
        if zero_grad:
            self.zero_grad()

    def step(self, closure: Callable[[], Any] | None = None):
        if closure is None or not callable(closure):
            raise ValueError("SAM.step needs a closure that recomputes the loss and the "
                             "gradients (it is called at the perturbed weights)")
        self.first_step(zero_grad=True)
        try:
            with torch.enable_grad():
                loss = closure()
        except BaseException:
            with torch.no_grad():       # the closure failed: the weights are put back
                for p, w in self._saved.items():
                    p.copy_(w)
                self._saved.clear()
            raise
        self.second_step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base_optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return self.base_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.base_optimizer.load_state_dict(state_dict)
        self.param_groups = self.base_optimizer.param_groups
        self.state = self.base_optimizer.state

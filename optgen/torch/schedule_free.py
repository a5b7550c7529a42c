"""Schedule-Free AdamW as a torch drop-in, with the authors' ``train()`` and ``eval()``.

specs/schedule_free_adamw.py steps y, the point where the gradient is taken; the point
to evaluate is the average x, with y = (1 - beta1) * z + beta1 * x. As in
schedulefree.AdamWScheduleFree, each group has a ``train_mode`` (False at construction,
kept in ``state_dict``): ``train()`` moves the parameters of the groups in eval mode from
x to y (``p.lerp_(z, 1 - beta1)``), ``eval()`` moves those in train mode back to x
(``p.lerp_(z, 1 - 1 / beta1)``); a parameter that has not stepped yet stays where it is
(x = y = z there). ``step()`` outside train mode is a RuntimeError. The authors advise
``eval()`` before saving a checkpoint and before evaluating.

With ``multi_precision`` or ``offload`` the switch moves the master copy (in its own
dtype) and rounds it into the parameter, as a step does.
Imports: drop_in.
"""
from __future__ import annotations

from typing import Any

import torch

from .drop_in import OptgenOptimizer
from optgen.runtime import catalog


class AdamWScheduleFree(OptgenOptimizer):
    """Schedule-Free AdamW (specs/schedule_free_adamw.py) with ``train()``/``eval()``.

    Takes the spec's hyperparameters (``lr``, ``betas`` or ``beta1``/``beta2``, ``eps``,
    ``weight_decay``, ``warmup_steps``, ``r``, ``weight_lr_power``, ...), the authors'
    ``foreach`` (accepted, changes nothing) and optgen's runtime options."""

    spec_name = "schedule_free_adamw"

    def __init__(self, params: Any, *, foreach: bool | None = None, **kwargs: Any):
        self.spec = catalog.resolve(self.spec_name)
        super().__init__(params, **kwargs)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        param_group.setdefault("train_mode", False)   # a new group starts in eval mode
        super().add_param_group(param_group)
        self._note_modes()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)   # (the groups' train_mode is the checkpoint's)
        self._note_modes()

    def _note_modes(self) -> None:
        """The first group in eval mode, or None: what ``step`` checks (one attribute, so
        that a compiled step does not guard on every group value, lr included)."""
        self._idle_group = next((i for i, g in enumerate(self.param_groups)
                                 if not g["train_mode"]), None)

    @torch.no_grad()
    def train(self) -> None:
        """Parameters to y, where the next gradient is taken; steps need train mode."""
        self._switch(True)

    @torch.no_grad()
    def eval(self) -> None:
        """Parameters to x, the average: for evaluating and saving checkpoints."""
        self._switch(False)

    def _switch(self, train: bool) -> None:
        for group in self.param_groups:
            if group["train_mode"] == train:
                continue
            beta1 = float(group["betas"][0])
            weight = 1 - beta1 if train else 1 - 1 / beta1
            for p in group["params"]:
                state = self.state[p]
                if float(state.get("step", 0)) == 0:   # no z yet: x = y = z
                    continue
                held = state.get("master", self._runtime_tensor(p))   # the stepped copy
                held.lerp_(state["z"].to(held.device), weight)
                if held is not p:
                    p.copy_(held)
            group["train_mode"] = train
        self._note_modes()

    @torch.no_grad()
    def step(self, closure=None, **statistics):
        """One step at y (train mode only); returns the closure's loss."""
        self._check_train_mode()
        return super().step(closure, **statistics)

    step._wrapped_by_lr_sched = True   # (as the base's step: lr schedulers leave it as is)

    def _open_round(self) -> bool:   # (step_in_backward: a backward's steps, train mode only)
        self._check_train_mode()
        return super()._open_round()

    def _check_train_mode(self) -> None:
        if self._idle_group is not None:
            raise RuntimeError(f"{self._artifact.name}: parameter group {self._idle_group} is "
                               "in eval mode; call optimizer.train() before step() (and "
                               "optimizer.eval() before evaluating or saving)")

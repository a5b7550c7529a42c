"""Schedule-Free AdamW as a torch drop-in, with the authors' ``train()`` and ``eval()``.

specs/schedule_free_adamw.py steps y, the point where the gradient is taken; the point
to evaluate is the average x, with y = (1 - beta1) * z + beta1 * x. As in
schedulefree.AdamWScheduleFree, each group has a ``train_mode`` (False at construction,
kept in ``state_dict``): ``train()`` moves the parameters of the groups in eval mode from
x to y (``p.lerp_(z, 1 - beta1)``), ``eval()`` moves those in train mode back to x
(``p.lerp_(z, 1 - 1 / beta1)``); a parameter that has not stepped yet stays where it is
(x = y = z there). ``step()`` outside train mode is a RuntimeError. The authors advise
``eval()`` before saving a checkpoint and before evaluating.

The switch moves the stored truth, in float32, with every state and master format:
``z`` is read as its values (bf16 widened, q8/q4/fp8 codes dequantized: ``z`` itself is
not written), the master is the float32 copy (``multi_precision``, ``offload``), the
split master decoded from the weight and its correction (``master_format``: encoded
back into both), or the parameter; the moved master is rounded into the parameter as a
step rounds it. Imports: drop_in.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import fsdp
from .drop_in import OptgenOptimizer
from optgen.core import formats
from optgen.runtime import catalog, state, tensors


class AdamWScheduleFree(OptgenOptimizer):
    """Schedule-Free AdamW (specs/schedule_free_adamw.py) with ``train()``/``eval()``.

    Takes the spec's hyperparameters (``lr``, ``betas`` or ``beta1``/``beta2``, ``eps``,
    ``weight_decay``, ``warmup_steps``, ``r``, ``weight_lr_power``, ...), the authors'
    ``foreach`` (accepted, changes nothing) and optgen's runtime options."""

    spec_name = "schedule_free_adamw"
    interpolation = "beta1"   # the hyperparameter y = (1 - it) * z + it * x reads


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
        self._follow()   # (weights written since the last step win first, as at a step)
        index = {id(p): i for i, p in enumerate(self._params)}
        for group in self.param_groups:
            if group["train_mode"] == train:
                continue
            beta1 = float(group["betas"][0] if self.interpolation == "beta1" and "betas" in group
                          else group[self.interpolation])
            weight = 1 - beta1 if train else 1 - 1 / beta1
            for p in group["params"]:
                i = index[id(p)]
                if self._core.records[i].steps == 0:   # no z yet: x = y = z
                    continue
                self._move(p, i, weight)
            group["train_mode"] = train
        self._note_modes()

    def _move(self, p: torch.Tensor, i: int, weight: float) -> None:
        """Parameter ``i``'s master lerped toward z by ``weight`` in float32, stored back
        in its format, and rounded into the parameter."""
        st, x = self._core.state[i], self._runtime_tensor(p)   # (x: what the kernels step)
        z = self._values(i, "z", x)
        if formats.CORRECTION in st:      # split master: (bfloat16 weight, correction)
            fmt = formats.master(self._artifact.state_format)
            corr = st[formats.CORRECTION]
            theta = fmt.family.decode(fmt, tensors.to_numpy(x, "torch"),
                                      corr.detach().cpu().numpy())
            moved = torch.from_numpy(np.asarray(theta, np.float32)).to(x.device).lerp_(z, weight)
            w, c = fmt.family.encode(fmt, moved.cpu().numpy())
            tensors.copy_into(x, "torch", w)
            corr.copy_(torch.from_numpy(np.asarray(c)))
        elif state.MASTER in st:          # a float32 master (multi_precision)
            st[state.MASTER].lerp_(z.to(st[state.MASTER].device), weight)
            x.copy_(st[state.MASTER])
        elif x.dtype == torch.float32:
            x.lerp_(z, weight)
        else:                             # a low-precision weight stepped as it is
            x.copy_(x.float().lerp_(z, weight))
        if x is not fsdp.local(p):        # (offload: the device parameter from its host copy)
            p.copy_(x)

    def _values(self, i: int, name: str, like: torch.Tensor) -> torch.Tensor:
        """State ``name`` of parameter ``i`` as float32 values on ``like``'s device:
        block-quantized codes dequantized, a cast format widened."""
        st = self._core.state[i]
        v = st[name]
        if name + formats.ABSMAX in st:
            fmt = formats.from_stored(self._artifact.stored[name])
            values = fmt.dequantize((v.detach().cpu().numpy(),
                                     st[name + formats.ABSMAX].detach().cpu().numpy()),
                                    tuple(like.shape))
            return torch.from_numpy(np.asarray(values, np.float32)).to(like.device)
        return v.detach().to(device=like.device, dtype=torch.float32)

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

"""``optgen.torch.DAdaptAdam``: D-Adaptation Adam with its authors' signature and
defaults (github.com/facebookresearch/dadaptation, DAdaptAdam; Defazio & Mishchenko
2023), stepped by the ``dadapt_adam`` spec's kernels (specs/dadapt_adam.py states the
rule). One ``step()`` computes the step's two sums over every parameter (a first kernel
pass per tensor, added on the host) and then runs the update.

    opt = optgen.torch.DAdaptAdam(model.parameters(), lr=1.0, decouple=True,
                                  weight_decay=0.01)

``growth_rate=float("inf")`` is the spec's unbounded growth (None). ``log_every`` must
be 0 (the authors' periodic logging is not built) and ``fsdp_in_use`` is accepted and
changes nothing: FSDP2 shards are refused by the runtime for this rule, and so is
``step_in_backward=True`` (a step needs every gradient). The estimate d
is each parameter's scalar state ``d`` (``opt.state[p]["d"]``); every parameter should
have a gradient at every step, as with the authors' code, whose d is one value.
Imports: drop_in.
"""
from __future__ import annotations

import math
from typing import Any

from .drop_in import OptgenOptimizer
from optgen.runtime import catalog


class DAdaptAdam(OptgenOptimizer):
    """D-Adaptation Adam (Defazio & Mishchenko 2023) as the authors' DAdaptAdam steps it,
    with fused kernels and the sums over all parameters in the same step."""

    spec_name = "dadapt_adam"

    def __init__(self, params, lr: float = 1.0, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, log_every: int = 0,
                 decouple: bool = False, use_bias_correction: bool = False,
                 d0: float = 1e-6, growth_rate: float = float("inf"),
                 fsdp_in_use: bool = False, **options: Any) -> None:
        if log_every != 0:
            raise ValueError(f"DAdaptAdam: log_every={log_every!r} is not built; the "
                             "estimate is opt.state[p]['d'] (log_every=0)")
        self.spec = catalog.resolve(self.spec_name)
        unbounded = isinstance(growth_rate, (int, float)) and math.isinf(growth_rate) \
            and growth_rate > 0
        if not {"beta1", "beta2"} & set(options):   # (the spec's names stand for betas)
            options["betas"] = betas
        super().__init__(params, lr=lr, eps=eps, weight_decay=weight_decay,
                         decouple=decouple, use_bias_correction=use_bias_correction, d0=d0,
                         growth_rate=None if unbounded else growth_rate, **options)


DAdaptAdam.__module__ = "optgen.torch"

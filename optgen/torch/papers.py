"""Recent optimizers with their authors' signatures and defaults, stepped by catalog
specs: ``Prodigy`` (specs/prodigy.py; pip prodigyopt), ``CAME`` (specs/came.py; pip
came-pytorch) and ``AdamAtan2`` (specs/adam_atan2.py; pip adam-atan2-pytorch).

    opt = optgen.torch.Prodigy(model.parameters(), lr=1.0, weight_decay=0.01)
    opt = optgen.torch.CAME(model.parameters(), lr=2e-4, eps=(1e-30, 1e-16))
    opt = optgen.torch.AdamAtan2(model.parameters(), lr=1e-4, betas=(0.9, 0.99))

The tuples (Prodigy's ``betas`` pair beside ``beta3``, CAME's ``eps`` pair and ``betas``
triple) are the specs' (``spec.hyper(..., tuple=...)``); ``beta3=None`` and
``growth_rate=float("inf")`` are the Prodigy spec's None. What the authors' classes
take and these do not build is refused with a ValueError naming it: Prodigy's
``slice_p`` other than 1, AdamAtan2's ``regen_reg_rate`` and ``cautious_factor``.
Prodigy's estimate d is each parameter's scalar state ``d`` (``opt.state[p]["d"]``).
Imports: drop_in.
"""
from __future__ import annotations

from typing import Any

from .drop_in import OptgenOptimizer
from optgen.runtime import catalog


def tuple_option(options: dict[str, Any], key: str, value: Any, names: tuple[str, ...]) -> None:
    """Pass ``key=value`` on unless one of the spec's names it sets is given by itself
    (``beta1=0.8``: the other entries keep the spec's defaults, as in the seed forms)."""
    if not set(names) & set(options):
        options[key] = value


class Prodigy(OptgenOptimizer):
    """Prodigy (Mishchenko & Defazio 2024) as the authors' Prodigy steps it, with fused
    kernels and the sums over all parameters in the same step."""

    spec_name = "prodigy"

    def __init__(self, params, lr: float = 1.0, betas: tuple[float, float] = (0.9, 0.999),
                 beta3: float | None = None, eps: float = 1e-8, weight_decay: float = 0,
                 decouple: bool = True, use_bias_correction: bool = False,
                 safeguard_warmup: bool = False, d0: float = 1e-6, d_coef: float = 1.0,
                 growth_rate: float = float("inf"), fsdp_in_use: bool = False,
                 slice_p: int = 1, **options: Any) -> None:
        if slice_p != 1:
            raise ValueError(f"Prodigy: slice_p={slice_p!r} is not built (the estimate "
                             "reads every element: slice_p=1)")
        self.spec = catalog.resolve(self.spec_name)
        tuple_option(options, "betas", betas, ("beta1", "beta2"))
        super().__init__(params, lr=lr, beta3=beta3, eps=eps,
                         weight_decay=weight_decay, decouple=decouple,
                         use_bias_correction=use_bias_correction,
                         safeguard_warmup=safeguard_warmup, d0=d0, d_coef=d_coef,
                         growth_rate=growth_rate, **options)


class CAME(OptgenOptimizer):
    """CAME (Luo et al. 2023) as the authors' CAME steps it: lr must be given."""

    spec_name = "came"

    def __init__(self, params, lr: float | None = None,
                 eps: tuple[float, float] = (1e-30, 1e-16), clip_threshold: float = 1.0,
                 betas: tuple[float, float, float] = (0.9, 0.999, 0.9999),
                 weight_decay: float = 0.0, **options: Any) -> None:
        if lr is None:
            raise ValueError("CAME: lr must be given (the authors' CAME has no default), "
                             "e.g. lr=2e-4")
        self.spec = catalog.resolve(self.spec_name)
        tuple_option(options, "eps", eps, ("eps1", "eps2"))
        tuple_option(options, "betas", betas, ("beta1", "beta2", "beta3"))
        super().__init__(params, lr=lr, clip_threshold=clip_threshold,
                         weight_decay=weight_decay, **options)


class AdamAtan2(OptgenOptimizer):
    """Adam-atan2 (Everett et al. 2024) as the authors' AdamAtan2 steps it; with
    ``decoupled_wd`` the weight decay is divided by the initial lr, as theirs is."""

    spec_name = "adam_atan2"

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, regen_reg_rate: float = 0.0,
                 decoupled_wd: bool = False, cautious_wd: bool = False,
                 cautious_factor: float = 1.0, a: float = 1.27, b: float = 1.0,
                 **options: Any) -> None:
        if regen_reg_rate != 0:
            raise ValueError(f"AdamAtan2: regen_reg_rate={regen_reg_rate!r} is not built "
                             "(regen_reg_rate=0)")
        if cautious_factor != 1:
            raise ValueError(f"AdamAtan2: cautious_factor={cautious_factor!r} is not built "
                             "(cautious_factor=1)")
        if not isinstance(decoupled_wd, bool):
            raise TypeError(f"AdamAtan2: decoupled_wd must be True or False, got "
                            f"{decoupled_wd!r}")
        if decoupled_wd and not (isinstance(lr, (int, float)) and lr > 0):
            raise ValueError(f"AdamAtan2: decoupled_wd divides weight_decay by lr, which "
                             f"must then be > 0; got lr={lr!r}")
        self.spec = catalog.resolve(self.spec_name)
        tuple_option(options, "betas", betas, ("beta1", "beta2"))
        super().__init__(params, lr=lr, a=a, b=b, cautious_wd=cautious_wd,
                         weight_decay=weight_decay / lr if decoupled_wd else weight_decay,
                         **options)


for _cls in (Prodigy, CAME, AdamAtan2):
    _cls.__module__ = "optgen.torch"

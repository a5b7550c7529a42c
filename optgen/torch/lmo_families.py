"""Matrix families with their authors' signatures and defaults: ``Scion`` (the LIONS-EPFL
authors' Scion, the ``scion`` spec) and ``MuonLaProp`` (heavyball's, the ``muon_laprop``
spec); heavyball's ``OrthoLaProp`` and ``LaPropOrtho`` (the ``ortho_laprop`` spec) beside
them.

    opt = optgen.torch.Scion([{"params": hidden, "norm": "Spectral", "scale": 50.0},
                              {"params": [head.weight], "norm": "Sign", "scale": 3000.0}],
                             lr=2 ** -12, momentum=0.1)
    opt.init()                       # the authors' norm-matched initialization (optional)
    opt = optgen.torch.MuonLaProp(model.parameters(), lr=0.0025, betas=(0.9, 0.99))

Scion takes the authors' norms per group (``norm``, ``norm_kwargs``): "Auto" (spectral on
2-D, RMS on 0-D and 1-D), "Spectral" (2-D), "Sign" (2-D) and "BiasRMS" (0-D and 1-D).
What is not built is refused with a ValueError naming it, before anything changes:
"ColNorm", "RowNorm", "SpectralConv", parameters of 3 or more dimensions, and norm_kwargs
other than Spectral's ``steps`` and the defaults. heavyball's classes refuse its options
that change the rule (caution, mars, palm, warm-up, clipping, storage formats) unless
they have heavyball's defaults; the others (multi_tensor, compile_step, ...) say how
heavyball runs and are accepted.
Imports: drop_in, papers, placement.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from . import placement
from .drop_in import OptgenOptimizer
from .papers import tuple_option
from optgen.runtime import catalog

NORMS = {"Auto": (False, 2), "Spectral": (False, 0), "Sign": (True, 0), "BiasRMS": (False, 1)}
# norm -> (the spec's sign flag, which parameters: 0 = 2-D only, 1 = 0-D/1-D only, 2 = both)
NORM_KWARGS = {"Spectral": {"max": False, "normalized": True},
               "Sign": {"normalized": True, "zero_init": None}}   # None: any value (init only)


def _tensors(params: Any) -> list:
    """The tensors of a group's ``params``: a tensor, tensors, or (name, tensor) pairs."""
    if isinstance(params, torch.Tensor):
        return [params]
    return [p[1] if isinstance(p, tuple) else p for p in params
            if isinstance(p, (torch.Tensor, tuple))]


def _scion_group(group: dict, norm: str, norm_kwargs: dict | None) -> tuple[str, dict]:
    """The spec's hyperparameters of one Scion group (its norm as the ``sign`` flag and
    ``ns_steps``); a ValueError for what is not built."""
    norm, kw = group.pop("norm", norm), dict(group.pop("norm_kwargs", norm_kwargs) or {})
    if norm not in NORMS:
        raise ValueError(f"Scion: norm={norm!r} is not built (built: {', '.join(NORMS)})")
    sign, which = NORMS[norm]
    for p in _tensors(group["params"]):
        ok = (p.ndim == 2, p.ndim <= 1, p.ndim <= 2)[which]
        if not ok:
            raise ValueError(f"Scion: norm={norm!r} does not take a {p.ndim}-D parameter "
                             f"({tuple(p.shape)}); built: 2-D (Spectral, Sign), 0-D and 1-D "
                             "(BiasRMS), both (Auto)")
    if norm == "Spectral" and "steps" in kw:
        group["ns_steps"] = kw.pop("steps")
    allowed = NORM_KWARGS.get(norm, {})
    for key, value in kw.items():
        if key not in allowed or (allowed[key] is not None and value != allowed[key]):
            raise ValueError(f"Scion: norm_kwargs {key}={value!r} of norm {norm!r} is not "
                             "built")
    group["sign"] = sign
    return norm, kw


class Scion(OptgenOptimizer):
    """Scion (Pethick et al. 2025) as the authors' Scion steps it: per group, the LMO of
    its norm (``norm``), ``scale`` the radius, ``momentum`` one minus the usual factor
    (1: no averaging), ``unconstrained=False`` the Frank-Wolfe step w (1 - lr) - lr u."""

    spec_name = "scion"

    def __init__(self, params, lr: float = 1e-3, momentum: float = 1.0, norm: str = "Auto",
                 norm_kwargs: dict | None = None, scale: float = 1.0,
                 unconstrained: bool = False, **options: Any) -> None:
        self.spec = catalog.resolve(self.spec_name)
        params = placement.listed(params, "Scion", options)
        if isinstance(params, list) and params and isinstance(params[0], dict):
            params = [dict(g) for g in params]
            self._norms = [_scion_group(g, norm, norm_kwargs) for g in params]
        else:   # (one group: its norm's flags are the optimizer's; torch refuses a non-list)
            top = {"params": params if isinstance(params, list) else []}
            self._norms = [_scion_group(top, norm, norm_kwargs)]
            options.update((k, v) for k, v in top.items() if k != "params")
        super().__init__(params, lr=lr, momentum=momentum, scale=scale,
                         unconstrained=unconstrained, **options)

    @torch.no_grad()
    def init(self) -> None:
        """The authors' ``init()``: each parameter drawn as its norm's ball suggests, times
        its group's scale: 2-D spectral an orthogonal matrix times sqrt(R / C), 2-D sign
        +-1 / C at random (zeros with zero_init), 0-D and 1-D zeros."""
        for group, (norm, kw) in zip(self.param_groups, self._norms):
            for p in group["params"]:
                if p.ndim != 2:
                    p.zero_()
                elif group["sign"]:
                    if kw.get("zero_init"):
                        p.zero_()
                    else:
                        p.copy_(torch.randint(0, 2, p.shape, device=p.device) * 2 - 1)
                        p.div_(p.shape[1])
                else:
                    w = torch.empty(p.shape, dtype=torch.float64)
                    torch.nn.init.orthogonal_(w)
                    p.copy_(w * math.sqrt(p.shape[0] / p.shape[1]))
                p.mul_(group["scale"])


class _HeavyballLaProp(OptgenOptimizer):
    """heavyball's signature of its LaProp variants; ``flags``: the spec's flags of the
    variant. heavyball's options that change the rule are refused unless they have its
    defaults (a ValueError naming the option)."""

    spec_name, flags = "", {}

    def __init__(self, params, lr: float = 0.0025, betas: tuple[float, float] = (0.9, 0.99),
                 eps: float = 1e-8, weight_decay: float = 0.0,
                 cautious_weight_decay: bool = False, warmup_steps: int = 0,
                 multi_tensor: bool = True, storage_dtype: str = "float32", mars: bool = False,
                 caution: bool = False, mars_gamma: float = 0.0025,
                 gradient_clipping: Any = None, update_clipping: Any = None,
                 palm: bool = False, beta2_scale: float = 0.8, compile_step: Any = None,
                 promote: Any = None, ecc: str | None = None, param_ecc: str | None = None,
                 orig_shapes: Any = None, **options: Any) -> None:
        for name, value, built in (("cautious_weight_decay", cautious_weight_decay, False),
                                   ("warmup_steps", warmup_steps, 0), ("mars", mars, False),
                                   ("caution", caution, False), ("palm", palm, False),
                                   ("gradient_clipping", gradient_clipping, None),
                                   ("update_clipping", update_clipping, None),
                                   ("storage_dtype", storage_dtype, "float32"),
                                   ("ecc", ecc, None), ("param_ecc", param_ecc, None)):
            if value != built:
                raise ValueError(f"{type(self).__name__}: {name}={value!r} is not built "
                                 f"({name}={built!r})")
        self.spec = catalog.resolve(self.spec_name)
        tuple_option(options, "betas", betas, ("beta1", "beta2"))
        super().__init__(params, lr=lr, eps=eps, weight_decay=weight_decay,
                         **{**self.flags, **options})


class MuonLaProp(_HeavyballLaProp):
    """MuonLaProp (heavyball) as heavyball's MuonLaProp steps it: LaProp's bias-corrected
    momentum of g / max(sqrt(v), eps), orthogonalized on 2-D parameters (Muon's
    Newton-Schulz, scaled by sqrt(max(1, R / C))), decoupled weight decay."""

    spec_name = "muon_laprop"


class OrthoLaProp(_HeavyballLaProp):
    """OrthoLaProp (heavyball): OrthoGrad's projection of g off w (at g's norm), then
    heavyball's LaProp (the ``ortho_laprop`` spec)."""

    spec_name, flags = "ortho_laprop", {"after": False}


class LaPropOrtho(_HeavyballLaProp):
    """LaPropOrtho (heavyball): heavyball's LaProp, its step projected off w (at the
    step's norm) by OrthoGrad (the ``ortho_laprop`` spec with ``after``)."""

    spec_name, flags = "ortho_laprop", {"after": True}


LMO_FAMILIES = {"scion": Scion, "muon_laprop": MuonLaProp, "ortho_laprop": OrthoLaProp}

for _cls in (*LMO_FAMILIES.values(), LaPropOrtho):
    _cls.__module__ = "optgen.torch"

"""``optgen.torch.SOAP``: SOAP as its authors' code runs it (github.com/nikhilvyas/SOAP,
soap.py; Vyas et al. 2024), with their signature and defaults, stepped by the
``soap`` spec's compiled kernels (specs/soap.py states the rule; docs/matrix.md).

    opt = optgen.torch.SOAP(model.parameters(), lr=3e-3, betas=(0.95, 0.95),
                            weight_decay=0.01, precondition_frequency=10)

A side longer than ``max_precond_dim`` is not preconditioned, as the authors do. What is
not built is refused by name, before anything changes: tensors of more than two
dimensions (the authors give each dimension its own factor), ``merge_dims=True`` and
``precondition_1d=True``. ``data_format`` is checked as
the authors check it and only matters with ``merge_dims``. optgen's runtime options
(``target``, ``flat``, ``offload``, ``loss_scale``, ...) go with the arguments.
Imports: drop_in.
"""
from __future__ import annotations

from typing import Any

from .two_dimensional import TwoDimensional
from optgen.runtime import catalog

DATA_FORMATS = ("channels_first", "channels_last")


def _refuse(what: str, value: Any, rule: str) -> None:
    raise ValueError(f"SOAP: {what}={value!r} is not built; {rule}")


class SOAP(TwoDimensional):
    """SOAP (Vyas et al. 2024) as the authors' soap.py steps it, with fused kernels: the
    first step fits the eigenbasis (eigh) and changes nothing else, then Adam runs in
    it; the basis is re-sorted and takes one QR power iteration every
    ``precondition_frequency`` steps."""

    beyond_2d = ("optgen's SOAP preconditions 2-D parameters and steps 1-D ones with Adam "
                 "(the authors' code gives each dimension of a larger tensor its own factor, "
                 "which is not built)")

    def __init__(self, params, lr: float = 3e-3, betas: tuple[float, float] = (0.95, 0.95),
                 shampoo_beta: float = -1, eps: float = 1e-8, weight_decay: float = 0.01,
                 precondition_frequency: int = 10, max_precond_dim: int = 10000,
                 merge_dims: bool = False, precondition_1d: bool = False,
                 normalize_grads: bool = False, data_format: str = "channels_first",
                 correct_bias: bool = True, **options: Any) -> None:
        if data_format not in DATA_FORMATS:
            raise ValueError(f"SOAP: data_format must be one of {', '.join(DATA_FORMATS)}, "
                             f"got {data_format!r}")
        if merge_dims:
            _refuse("merge_dims", merge_dims, "optgen's SOAP preconditions 1-D and 2-D "
                    "parameters as they are (merge_dims=False)")
        if precondition_1d:
            _refuse("precondition_1d", precondition_1d, "1-D parameters take Adam in "
                    "optgen's SOAP (precondition_1d=False)")
        super().__init__(params, lr=lr, betas=betas, shampoo_beta=shampoo_beta, eps=eps,
                         weight_decay=weight_decay,
                         precondition_frequency=precondition_frequency,
                         max_precond_dim=max_precond_dim, normalize_grads=normalize_grads, correct_bias=correct_bias,
                         **options)



SOAP.spec = catalog.resolve("soap")
SOAP.__module__ = "optgen.torch"

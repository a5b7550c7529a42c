"""``optgen.torch.SOAPNAdam``: SOAP with NAdam's Nesterov momentum in the eigenbasis, with
heavyball 3.2.1's signature and defaults (``heavyball.SOAPNAdam``), stepped by the
``soap_nadam`` spec's compiled kernels (specs/soap_nadam.py states the rule and where
heavyball's differs; docs/matrix.md).

    opt = optgen.torch.SOAPNAdam(model.parameters(), lr=3e-3, betas=(0.9, 0.999),
                                 precondition_frequency=2, momentum_decay=4e-3)

Parameters are 1-D (NAdam) or 2-D (preconditioned on each side of at most
``max_precond_dim``); a tensor of more dimensions is refused, as by ``SOAP``. heavyball's
options that change nothing here are accepted: ``merge_dims`` (a 2-D parameter is not
merged), ``multi_tensor``, ``compile_step``, ``promote``, ``orig_shapes``,
``decoupled_weight_decay`` (heavyball's SOAPNAdam decays the weight either way), and
``mars_gamma``, ``beta2_scale``, ``precond_scheduler`` (read only with ``mars``,
``palm``, ``use_precond_schedule``). Its feature flags other than their defaults are
refused by name before anything changes (ValueError). optgen's runtime options
(``target``, ``flat``, ``state_format``, ...) go with the arguments.
Imports: drop_in, papers.
"""
from __future__ import annotations

from typing import Any

from .two_dimensional import TwoDimensional
from .papers import tuple_option
from optgen.runtime import catalog

# heavyball's options this rule does not build: name -> the one value it takes
NOT_BUILT = {"cautious_weight_decay": False, "precondition_1d": False, "warmup_steps": 0,
             "split": False, "mars": False, "caution": False, "palm": False,
             "use_precond_schedule": False, "gradient_clipping": None,
             "update_clipping": None, "storage_dtype": "float32", "precond_grad_accum": False,
             "ecc": None, "param_ecc": None}


class SOAPNAdam(TwoDimensional):
    """SOAP-NAdam (heavyball's SOAPNAdam) with fused kernels: the first step fits the
    eigenbasis and changes nothing else, then NAdam (Nesterov momentum with its
    ``momentum_decay`` schedule) runs in it; the basis is re-sorted and takes one QR power
    iteration every ``precondition_frequency`` steps (SOAP's refresh)."""

    beyond_2d = ("optgen's SOAPNAdam preconditions 2-D parameters and steps 1-D ones with "
                 "NAdam (heavyball merges the dimensions of a larger tensor, which is not "
                 "built)")

    def __init__(self, params, lr: float = 3e-3, betas: tuple[float, float] = (0.9, 0.999),
                 shampoo_beta: float = 0.95, eps: float = 1e-8, weight_decay: float = 0.01,
                 cautious_weight_decay: bool = False, precondition_frequency: int = 2,
                 max_precond_dim: int = 2048, merge_dims: bool = True,
                 precondition_1d: bool = False, warmup_steps: int = 0, split: bool = False,
                 multi_tensor: bool = True, mars: bool = False, caution: bool = False,
                 mars_gamma: float = 0.0025, palm: bool = False,
                 precond_scheduler: tuple[float, float] = (1 / 3, 9), beta2_scale: float = 0.8,
                 use_precond_schedule: bool = False, gradient_clipping: Any = None,
                 update_clipping: Any = None, storage_dtype: str = "float32",
                 precond_grad_accum: bool = False, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, compile_step: bool = False,
                 promote: bool = False, ecc: str | None = None, param_ecc: str | None = None,
                 orig_shapes: Any = None, **options: Any) -> None:
        given = dict(cautious_weight_decay=cautious_weight_decay,
                     precondition_1d=precondition_1d, warmup_steps=warmup_steps, split=split,
                     mars=mars, caution=caution, palm=palm,
                     use_precond_schedule=use_precond_schedule,
                     gradient_clipping=gradient_clipping, update_clipping=update_clipping,
                     storage_dtype=storage_dtype, precond_grad_accum=precond_grad_accum,
                     ecc=ecc, param_ecc=param_ecc)
        for name, built in NOT_BUILT.items():
            value = given[name]
            if type(value) is not type(built) or value != built:
                raise ValueError(f"SOAPNAdam: {name}={value!r} is not built "
                                 f"({name}={built!r})")
        tuple_option(options, "betas", betas, ("beta1", "beta2"))
        super().__init__(params, lr=lr, shampoo_beta=shampoo_beta, eps=eps,
                         weight_decay=weight_decay,
                         precondition_frequency=precondition_frequency,
                         max_precond_dim=max_precond_dim, momentum_decay=momentum_decay,
                         **options)



SOAPNAdam.spec_name = "soap_nadam"
SOAPNAdam.spec = catalog.resolve("soap_nadam")
SOAPNAdam.__module__ = "optgen.torch"

"""``optgen.torch.Adam``, ``SGD``, ... : torch.optim's optimizers, stepped by fused kernels.

Each class is torch.optim's class of the same name: its constructor signature
(``inspect.signature`` equal to torch's), defaults, checks and exceptions (torch's own
constructor checks the arguments), ``param_groups`` keys, update rule (the
``specs/torch_<name>.py`` spec: torch's algorithm box, ``maximize``/``amsgrad``/...
compiled into the kernels as flags) and ``state_dict`` (torch's state names; torch.optim
loads it, and these load torch.optim's). ``foreach`` and ``fused`` are accepted and
change nothing: optgen always steps each parameter with one fused kernel.
``capturable=True`` is checked as torch checks it (CPU parameters: torch's
AssertionError at step) and on CUDA steps through the runtime's capturable mode
(``opt.stage()`` before each graph replay). ``differentiable=True`` is refused. A one-element tensor ``lr`` is read at each step (an
in-place change takes effect; under torch.compile it is no graph input: no recompile).
optgen's runtime options go with the arguments: ``Adam(params, lr=1e-3, flat=True,
offload="cpu", state_format="bf16", ...)``; the kernels' target is the parameters'
device's (``target=`` chooses another).

The seeds' forms (MXNet/MindSpore rules and defaults) stay under their own names:
``optgen.torch.seeds.Adam`` (optgen/torch/seeds.py), ``optgen.torch.make("adam")``.
LBFGS has no twin: a closure-driven line search is not a fused elementwise step.
Imports: optim_form.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT

from .optim_form import TorchForm
from optgen.runtime import RowSparse

_NOT_ARGS = ("self", "params", "__class__")


def _args(local: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in local.items() if k not in _NOT_ARGS}


class Adam(TorchForm):
    """torch.optim.Adam (amsgrad, maximize, decoupled_weight_decay) with fused kernels."""
    torch_cls, spec_name = torch.optim.Adam, "torch_adam"

    def __init__(self, params: ParamsT, lr: float | Tensor = 1e-3,
                 betas: tuple[float | Tensor, float | Tensor] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None, decoupled_weight_decay: bool = False) -> None:
        self._build(params, _args(locals()))


class AdamW(TorchForm):
    """torch.optim.AdamW with fused kernels."""
    torch_cls, spec_name = torch.optim.AdamW, "torch_adamw"

    def __init__(self, params: ParamsT, lr: float | Tensor = 1e-3,
                 betas: tuple[float | Tensor, float | Tensor] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        self._build(params, _args(locals()))


class SGD(TorchForm):
    """torch.optim.SGD (momentum, dampening, nesterov, maximize) with fused kernels."""
    torch_cls, spec_name, step_kind = torch.optim.SGD, "torch_sgd", None

    def __init__(self, params: ParamsT, lr: float | Tensor = 1e-3, momentum: float = 0,
                 dampening: float = 0, weight_decay: float | Tensor = 0, nesterov: bool = False,
                 *, maximize: bool = False, foreach: bool | None = None,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        self._build(params, _args(locals()))

    def _torch_record(self, rec, group):
        # torch keeps None until a step with momentum has made the buffer
        started = float(rec.pop("buffer_started", 0.0))
        return {"momentum_buffer": rec["momentum_buffer"] if started else None}

    def _optgen_record(self, rec, own, group):
        if "buffer_started" in rec:
            return rec
        buf = rec.get("momentum_buffer")
        rec["buffer_started"] = 0.0 if buf is None else 1.0
        rec["momentum_buffer"] = torch.zeros_like(own["momentum_buffer"]) if buf is None else buf
        return rec


class Adagrad(TorchForm):
    """torch.optim.Adagrad (lr_decay, initial_accumulator_value, maximize) with fused kernels."""
    torch_cls, spec_name = torch.optim.Adagrad, "torch_adagrad"

    def __init__(self, params: ParamsT, lr: float | Tensor = 1e-2, lr_decay: float = 0,
                 weight_decay: float = 0, initial_accumulator_value: float = 0,
                 eps: float = 1e-10, foreach: bool | None = None, *, maximize: bool = False,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        self._build(params, _args(locals()))


class RMSprop(TorchForm):
    """torch.optim.RMSprop (alpha, eps outside the root, centered, momentum) with fused
    kernels."""
    torch_cls, spec_name = torch.optim.RMSprop, "torch_rmsprop"

    def __init__(self, params: ParamsT, lr: float | Tensor = 1e-2, alpha: float = 0.99,
                 eps: float = 1e-8, weight_decay: float = 0, momentum: float = 0,
                 centered: bool = False, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False) -> None:
        self._build(params, _args(locals()))

    def _torch_record(self, rec, group):
        if not group.get("momentum", 0) > 0:   # torch makes the buffer only with momentum
            rec.pop("momentum_buffer", None)
        return rec

    def _optgen_record(self, rec, own, group):
        if "momentum_buffer" in own and "momentum_buffer" not in rec:
            rec["momentum_buffer"] = torch.zeros_like(own["momentum_buffer"])
        return rec


class Adadelta(TorchForm):
    """torch.optim.Adadelta with fused kernels."""
    torch_cls, spec_name = torch.optim.Adadelta, "torch_adadelta"

    def __init__(self, params: ParamsT, lr: float | Tensor = 1.0, rho: float = 0.9,
                 eps: float = 1e-6, weight_decay: float = 0, foreach: bool | None = None, *,
                 capturable: bool = False, maximize: bool = False,
                 differentiable: bool = False) -> None:
        self._build(params, _args(locals()))


class Adamax(TorchForm):
    """torch.optim.Adamax with fused kernels."""
    torch_cls, spec_name = torch.optim.Adamax, "torch_adamax"

    def __init__(self, params: ParamsT, lr: float | Tensor = 2e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, foreach: bool | None = None, *,
                 maximize: bool = False, differentiable: bool = False,
                 capturable: bool = False) -> None:
        self._build(params, _args(locals()))


class NAdam(TorchForm):
    """torch.optim.NAdam (momentum_decay, decoupled_weight_decay) with fused kernels."""
    torch_cls, spec_name = torch.optim.NAdam, "torch_nadam"

    def __init__(self, params: ParamsT, lr: float | Tensor = 2e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False) -> None:
        self._build(params, _args(locals()))


class RAdam(TorchForm):
    """torch.optim.RAdam (its rectification switch, decoupled_weight_decay) with fused
    kernels."""
    torch_cls, spec_name = torch.optim.RAdam, "torch_radam"

    def __init__(self, params: ParamsT, lr: float | Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, decoupled_weight_decay: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False) -> None:
        self._build(params, _args(locals()))


class Adafactor(TorchForm):
    """torch.optim.Adafactor (beta2_decay, eps=(eps1, eps2), d) with fused kernels."""
    torch_cls, spec_name = torch.optim.Adafactor, "torch_adafactor"

    def __init__(self, params: ParamsT, lr: float | Tensor = 1e-2, beta2_decay: float = -0.8,
                 eps: tuple[float | None, float] = (None, 1e-3), d: float = 1.0,
                 weight_decay: float = 0.0, *, foreach: bool | None = None,
                 maximize: bool = False) -> None:
        self._build(params, _args(locals()))

    def _torch_record(self, rec, group):
        # optgen's factored states drop the reduced axis; torch keeps it as size 1
        if "row_var" in rec:
            rec["row_var"] = rec["row_var"].unsqueeze(-1)
        if "col_var" in rec:
            rec["col_var"] = rec["col_var"].unsqueeze(-2)
        return rec


class Muon(TorchForm):
    """torch.optim.Muon (2-D parameters only, as torch) with fused kernels; Newton-Schulz
    in bfloat16 as torch runs it (its products in torch's bfloat16 matmul)."""
    torch_cls, spec_name, probe_params, step_kind = torch.optim.Muon, "torch_muon", True, None

    def __init__(self, params: ParamsT, lr: float = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients: tuple[float, float, float] = (3.4445, -4.775, 2.0315),
                 eps: float = 1e-07, ns_steps: int = 5, adjust_lr_fn: str | None = None) -> None:
        self._build(params, _args(locals()))


class ASGD(TorchForm):
    """torch.optim.ASGD (eta, mu, ax) with fused kernels."""
    torch_cls, spec_name = torch.optim.ASGD, "torch_asgd"

    def __init__(self, params: ParamsT, lr: float | Tensor = 1e-2, lambd: float = 1e-4,
                 alpha: float = 0.75, t0: float = 1e6, weight_decay: float = 0,
                 foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False, capturable: bool = False) -> None:
        self._build(params, _args(locals()))


class Rprop(TorchForm):
    """torch.optim.Rprop (per-element step sizes from the sign of g * g_prev) with fused
    kernels."""
    torch_cls, spec_name = torch.optim.Rprop, "torch_rprop"

    def __init__(self, params: ParamsT, lr: float | Tensor = 1e-2,
                 etas: tuple[float, float] = (0.5, 1.2),
                 step_sizes: tuple[float, float] = (1e-6, 50), *, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False) -> None:
        self._build(params, _args(locals()))


class SparseAdam(TorchForm):
    """torch.optim.SparseAdam: sparse COO gradients (``nn.Embedding(sparse=True)``) step
    only their rows, through optgen's lazy row-sparse kernels."""
    torch_cls, spec_name, probe_params, step_kind = \
        torch.optim.SparseAdam, "torch_sparseadam", True, "int"

    def __init__(self, params: ParamsT, lr: float | Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 maximize: bool = False) -> None:
        self._build(params, _args(locals()))

    # optgen's lazy row-sparse kernels step numpy arrays: the runtime sees numpy views of
    # the (CPU) parameters, opt.state shows its states as tensors over the same memory
    # (made again when p's data moved: p.data = new; the runtime checks the new view)
    def _runtime_tensor(self, p: Any) -> Any:
        views = self.__dict__.setdefault("_views", {})
        at = views.get(id(p))
        if at is None or at[0] != (p.data_ptr(), p.shape, p.dtype):
            if p.device.type != "cpu" or self._offload is not None or self._flat:
                raise ValueError("SparseAdam: optgen steps sparse gradients of CPU parameters "
                                 f"(got {p.device}{', offload' if self._offload else ''}"
                                 f"{', flat' if self._flat else ''})")
            at = views[id(p)] = ((p.data_ptr(), p.shape, p.dtype), p.detach().numpy())
        return at[1]

    def _mirror(self) -> None:
        super()._mirror()
        for st in self.state.values():
            for n, v in st.items():
                if isinstance(v, np.ndarray):
                    st[n] = torch.from_numpy(v)

    def _kernel_grads(self, grads: list) -> list:
        out = []
        for g in grads:
            if g is not None and not g.is_sparse:
                raise RuntimeError("SparseAdam does not support dense gradients, please "
                                   "consider Adam instead")
            if g is not None:
                g = g.coalesce()
                if g.sparse_dim() != 1:
                    raise ValueError(f"SparseAdam: optgen steps row-sparse gradients "
                                     f"(sparse_dim 1, as nn.Embedding's); got sparse_dim "
                                     f"{g.sparse_dim()}")
                g = RowSparse(g.indices()[0].numpy(), g.values().numpy())
            out.append(g)
        return out


TORCH_FORMS = {c.__name__: c for c in (Adam, AdamW, SGD, Adagrad, RMSprop, Adadelta, Adamax,
                                       NAdam, RAdam, Adafactor, Muon, ASGD, Rprop, SparseAdam)}
for _cls in TORCH_FORMS.values():   # their public home (pickle finds them there)
    _cls.__module__ = "optgen.torch"

"""The base of the torch forms (optgen/torch/optim.py): a drop-in that is torch.optim's
optimizer of the same name, stepped by the fused kernels of a ``torch_<name>`` spec.

* Constructor: torch's signature (each class spells it out), checked by torch's own
  constructor on a one-element probe (so every bad argument raises torch's exception
  with torch's message), and torch's ``defaults`` become the group keys: ``betas`` as a
  tuple, ``foreach``, ``fused``, ``capturable``, ``differentiable``, ``maximize``, ...
  ``foreach``/``fused`` are accepted and change nothing (optgen always runs one fused
  kernel per parameter); ``differentiable=True`` is refused. ``capturable=True`` is
  torch's: parameters off a capturable device (the CPU) fail torch's check at the first
  step (torch's AssertionError, from torch's optimizer on a probe). On CUDA a captured
  torch step replays by itself (its step count lives on the device); optgen's replays
  after ``opt.stage()`` (runtime/capture.py), so capturable CUDA parameters need
  ``staged_capture=True`` as well (a ValueError at the first step says so otherwise):
  the runtime's capturable mode, scalars through fixed device buffers.
* optgen's runtime options (``target``, ``flat``, ``offload``, ``state_format``, ...)
  are taken by the class call before torch's constructor sees the arguments, so
  ``inspect.signature(optgen.torch.Adam)`` is torch's.
* A group's values reach the spec through ``_group_hyper``: tuples split (SPLIT),
  one-element tensors (a tensor lr) read as floats at each step, torch-only keys dropped.
* ``state_dict()`` is torch's (``optim_state.to_torch``): torch's state names and keys,
  ``step`` as torch keeps it; ``load_state_dict`` takes torch's or optgen's form.
Imports: drop_in, optim_state.
"""
from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch

from . import optim_state, placement
from .drop_in import RUNTIME_OPTIONS, OptgenOptimizer
from .group_values import current
from optgen.core import hyper as hyper_rules
from optgen.runtime import catalog

# torch argument -> the spec's hyperparameters it is split into (where the spec has them)
SPLIT = {"betas": ("beta1", "beta2"), "etas": ("etaminus", "etaplus"),
         "step_sizes": ("step_size_min", "step_size_max"),
         "ns_coefficients": ("ns_a", "ns_b", "ns_c"), "eps": ("eps1", "eps2")}
TAKEN_BY_CALL = (*RUNTIME_OPTIONS, "flat", "offload", "agree", "step_in_backward")   # optgen's, not torch's


class TakesRuntimeOptions(type):
    """Takes optgen's runtime options out of a class call, so that ``__init__`` keeps
    torch's exact signature: ``optgen.torch.AdamW(params, lr=1e-3, offload="cpu")``."""

    def __call__(cls, *args: Any, **kwargs: Any):
        obj = cls.__new__(cls)
        obj._runtime_options = {k: kwargs.pop(k) for k in TAKEN_BY_CALL if k in kwargs}
        obj._staged_capture = bool(kwargs.pop("staged_capture", False))
        obj.__init__(*args, **kwargs)
        return obj


class TorchForm(OptgenOptimizer, metaclass=TakesRuntimeOptions):
    """torch.optim's ``torch_cls``, stepped by the kernels of the spec ``spec_name``."""

    torch_cls: type = torch.optim.Optimizer
    spec_name: str = ""
    probe_params: bool = False   # torch's constructor checks the parameters (Muon: 2-D)
    step_kind: str | None = "tensor"   # torch's per-parameter "step": tensor, int or none
    _runtime_options: dict[str, Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:   # the class call's signature is __init__'s
            sig = inspect.signature(cls.__init__)
            cls.__signature__ = sig.replace(parameters=list(sig.parameters.values())[1:])

    def _build(self, params: Any, args: dict[str, Any]) -> None:
        """What every torch form's ``__init__`` does with its arguments."""
        params = placement.listed(params)   # (read here and by torch's constructor)
        probe = params if self.probe_params else [torch.zeros(1)]
        defaults = dict(self.torch_cls(probe, **args).defaults)   # torch's checks
        if defaults.get("differentiable"):
            raise ValueError(f"{type(self).__name__}: differentiable=True is not supported: "
                             "optgen's fused kernels step outside autograd (torch.optim."
                             f"{self.torch_cls.__name__} with differentiable=True does)")
        self.spec = catalog.resolve(self.spec_name)
        options = dict(getattr(self, "_runtime_options", {}))
        art = self._prepare(options.pop("flat", False), options, params)
        hyper_rules.resolve(art.name, art.hypers, art.requirements,
                            {n: h.default for n, h in art.hypers.items()},
                            self._group_hyper(defaults))
        torch.optim.Optimizer.__init__(self, params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        params = param_group.get("params")
        items = [params] if isinstance(params, torch.Tensor) else \
            params if isinstance(params, (list, tuple)) else []   # (torch checks the rest)
        if any(isinstance(p, torch.Tensor) and p.is_complex() for p in items):
            raise RuntimeError(f"{self.torch_cls.__name__} does not support complex "
                               "parameters")   # (torch's message; raised at its step)
        if len({id(p) for p in items}) != len(items):
            warnings.warn("optimizer contains a parameter group with duplicate parameters; "
                          "in future, this will cause an error; see github.com/pytorch/"
                          "pytorch/issues/40967 for more information", stacklevel=3)
            raise ValueError(f"{type(self).__name__}: a parameter group lists a parameter "
                             "twice; torch.optim warns (as above) and steps it twice per "
                             "step, optgen refuses it")
        super().add_param_group(param_group)

    def _step_now(self, grads: list, statistics: dict[str, Any]) -> None:
        self._capturable_devices()
        super()._step_now(grads, statistics)

    def stage(self) -> None:
        self._capturable_devices()
        super().stage()

    def _capturable_devices(self) -> None:
        """torch's check of ``capturable=True`` (params on a device a graph can capture:
        CUDA, ...), made at the first step on each device by torch's own optimizer on a
        one-element probe there, so the error is torch's (an AssertionError at step)."""
        ok = self.__dict__.setdefault("_capturable_ok", set())
        for group in self.param_groups:
            for dev in {p.device for p in group["params"]} - ok if group.get("capturable") \
                    else ():
                probe = torch.zeros(1, device=dev, requires_grad=True)
                probe.grad = torch.zeros(1, device=dev)
                self.torch_cls([probe], capturable=True).step()   # (raises off CUDA)
                if not self.__dict__.get("_staged_capture"):
                    raise ValueError(
                        f"{type(self).__name__}: capturable=True on {dev}: torch's captured "
                        "step advances its step count on the device at every replay; "
                        "optgen's advances it on the host, so a replay without "
                        "opt.stage() before it would repeat the captured step's learning "
                        "rate and bias corrections. Pass staged_capture=True and call "
                        "opt.stage() before each replay (docs/runtime.md), or leave "
                        "capturable off")
                ok.add(dev)

    # -- torch's group keys <-> the spec's hyperparameters ------------------------------
    def _group_hyper(self, group: dict[str, Any]) -> dict[str, Any]:
        hypers = self._artifact.hypers
        out: dict[str, Any] = {}
        for k, v in group.items():
            if k in SPLIT and SPLIT[k][0] in hypers:
                out.update(zip(SPLIT[k], current(v)))
            elif k == "adjust_lr_fn" and "match_rms_adamw" in hypers:
                out["match_rms_adamw"] = v == "match_rms_adamw"
            elif k in hypers and k != "params":
                out[k] = bool(v) if hypers[k].is_flag else current(v)
        if "eps1" in out and out["eps1"] is None:   # torch: the parameters' dtype's eps
            out["eps1"] = torch.finfo(_dtype(self, group)).eps
        return out

    def _group_values(self, group: dict[str, Any], hyper: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in hyper.items() if k in group and k not in SPLIT}
        for key, names in SPLIT.items():
            if key in group and all(n in hyper for n in names):
                out[key] = tuple(hyper[n] for n in names)
        if "eps" in out and "eps1" in hyper and group["eps"][0] is None \
                and hyper["eps1"] == torch.finfo(_dtype(self, group)).eps:
            out["eps"] = (None, out["eps"][1])
        return out

    # -- checkpoints: torch's format -----------------------------------------------------
    def state_dict(self, format: str = "torch") -> dict[str, Any]:
        """torch.optim's state_dict of this optimizer (``format="optgen"``: with the
        spec's own bookkeeping states, e.g. SGD's ``buffer_started``)."""
        if format not in ("optgen", "torch"):
            raise ValueError(f"state_dict format must be 'optgen' or 'torch', got {format!r}")
        sd = OptgenOptimizer.state_dict(self)
        return optim_state.to_torch(self, sd) if format == "torch" else sd

    def _optgen_form(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        return optim_state.to_optgen(self, state_dict)

    def _torch_record(self, rec: dict[str, Any], group: dict[str, Any]) -> dict[str, Any]:
        """A parameter's states as torch.optim keeps them (classes override: states
        torch holds only sometimes, shapes that differ)."""
        return rec

    def _optgen_record(self, rec: dict[str, Any], own: dict[str, Any],
                       group: dict[str, Any]) -> dict[str, Any]:
        """A torch.optim record with the spec's states (``own``: this optimizer's states
        of that parameter): states torch had not created yet are filled as they start."""
        return rec


def _dtype(opt: TorchForm, group: dict[str, Any]) -> torch.dtype:
    """The one dtype of a group's parameters (float32 for a group without any)."""
    dtypes = {p.dtype for p in group.get("params", [])}
    if len(dtypes) > 1:
        raise TypeError(f"{type(opt).__name__}: eps=(None, ...) takes the parameters' dtype's "
                        f"eps, and this group mixes {sorted(map(str, dtypes))}: give eps[0], "
                        "or one group per dtype")
    return dtypes.pop() if dtypes else torch.float32

"""``optgen.torch.PSGDKron``: PSGD with a Kronecker-factored preconditioner as heavyball
3.2.1's ``PSGDKron`` steps it, with its signature and defaults: the momentum, P m, the
update clipping and the parameter update run in the ``psgd_kron`` spec's fused kernel;
the fit of the factors Q runs on the host before it (optgen/torch/psgd_fit.py).

    opt = optgen.torch.PSGDKron(model.parameters(), lr=1e-3, betas=(0.9, 0.999))

What heavyball's class offers and this one does not build is refused by name before
anything changes: tensors of more than two dimensions, ``merge_dims``, ``split``,
``mars``, ``caution``, ``cautious_weight_decay``, ``precond_grad_accum``,
``delayed=True``, ``exp_avg_input=False``, gradient or custom update clipping,
Hessian-vector products, ``ecc``/``param_ecc`` and q/storage dtypes other than float32.
Storage and speed switches that do not change the rule (``store_triu_as_line``,
``multi_tensor``, ``cached``, ``compile_step``, ``promote``) are accepted and ignored.
``generator`` (optgen's): the torch.Generator the probe vectors come from (None: torch's
global one, as heavyball draws them).
Imports: drop_in, psgd_fit.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from . import psgd_fit
from .two_dimensional import TwoDimensional
from optgen.runtime import catalog

DIAG_MODES = {None: 0, "one_diag": 1, "smart_one_diag": 2, "one_triu": 3, "all_diag": 4}
_DEFAULT = object()
SCHEDULE = "psgd_update_schedule"   # state_dict's key: [schedule step, cumulative probability]
# what heavyball accepts and this class does not build: name -> the value that is built
_FIXED = {"merge_dims": False, "split": False, "mars": False, "caution": False,
          "cautious_weight_decay": False, "precond_grad_accum": False, "delayed": False,
          "exp_avg_input": True, "gradient_clipping": None, "finite_differences": None,
          "fallback_to_finite_differences": None, "hvp_interval": None,
          "hessian_approx": None, "ecc": None, "param_ecc": None, "orig_shapes": None,
          "q_dtype": "float32", "storage_dtype": "float32"}
# runtime options the host fit cannot follow (it reads the raw gradient and the states)
_REFUSED_OPTIONS = ("flat", "offload", "step_in_backward", "state_format", "loss_scale",
                    "clip_global_norm", "nonfinite", "multi_precision", "master_format",
                    "stochastic_rounding")


def update_probability(max_prob: float = 1.0, min_prob: float = 0.03, decay: float = 0.999,
                       flat_start: float = 1000) -> Callable[[int], float]:
    """heavyball's default schedule: ``max_prob`` for ``flat_start`` steps, then decaying
    by ``decay`` per step to ``min_prob``."""
    return lambda n: max(min_prob, max_prob * decay ** max(n - flat_start, 0))


def _refuse(what: str, value: Any, rule: str) -> None:
    raise ValueError(f"PSGDKron: {what}={value!r} is not built; {rule}")


class PSGDKron(TwoDimensional):
    """PSGD-Kron (Li 2018) as heavyball 3.2.1's PSGDKron steps it, with fused kernels:
    a debiased momentum m, a fit of the triangular (or diagonal) Kronecker factors Q of
    P = Q^T Q on the steps the update-probability schedule picks (every step for the
    first 1000 by default), then W -= lr * trust_clip(P m)."""

    beyond_2d = ("optgen's PSGDKron gives 2-D parameters two factors and others one diagonal "
                 "factor (heavyball gives each dimension of a larger tensor its own factor, "
                 "which is not built)")

    def __init__(self, params, lr: float = 0.001, beta: float | None = None,
                 betas: tuple[float, float] = (0.9, 0.999), weight_decay: float = 0.0,
                 cautious_weight_decay: bool = False,
                 preconditioner_update_probability: Any = _DEFAULT,
                 max_size_triangular: int = 2048, min_ndim_triangular: int = 2,
                 memory_save_mode: str | None = None,
                 momentum_into_precond_update: bool = True, warmup_steps: int = 0,
                 merge_dims: bool = False, split: bool = False,
                 store_triu_as_line: bool = True, multi_tensor: bool = True,
                 q_dtype: str = "float32", storage_dtype: str = "float32",
                 mars: bool = False, caution: bool = False, mars_gamma: float = 0.0025,
                 delayed: Any = _DEFAULT, cached: Any = _DEFAULT,
                 exp_avg_input: Any = _DEFAULT, gradient_clipping: Any = _DEFAULT,
                 update_clipping: Any = _DEFAULT, precond_grad_accum: bool = False,
                 lower_bound_beta: float = 0.9, dampening: float = 1e-9,
                 precond_update_power_iterations: int = 2, precond_init_scale=None,
                 precond_init_scale_scale: float = 1,
                 precond_init_scale_power: float | None = None, precond_lr: float = 0.1,
                 finite_differences: Any = _DEFAULT,
                 fallback_to_finite_differences: Any = _DEFAULT,
                 hvp_interval: Any = _DEFAULT, hessian_approx: Any = _DEFAULT,
                 compile_step: Any = _DEFAULT, promote: Any = _DEFAULT,
                 ecc: str | None = None, param_ecc: str | None = None, orig_shapes=None,
                 generator: torch.Generator | None = None, **options: Any) -> None:
        given = dict(merge_dims=merge_dims, split=split, mars=mars, caution=caution,
                     cautious_weight_decay=cautious_weight_decay,
                     precond_grad_accum=precond_grad_accum, delayed=delayed,
                     exp_avg_input=exp_avg_input, gradient_clipping=gradient_clipping,
                     finite_differences=finite_differences,
                     fallback_to_finite_differences=fallback_to_finite_differences,
                     hvp_interval=hvp_interval, hessian_approx=hessian_approx, ecc=ecc,
                     param_ecc=param_ecc, orig_shapes=orig_shapes, q_dtype=q_dtype,
                     storage_dtype=storage_dtype)
        for name, value in given.items():
            if value is not _DEFAULT and value != _FIXED[name]:
                _refuse(name, value, f"optgen's PSGDKron builds {name}={_FIXED[name]!r}")
        if update_clipping is not _DEFAULT:
            _refuse("update_clipping", update_clipping, "optgen's PSGDKron applies "
                    "heavyball's default trust-region clip (leave it unset)")
        for name in _REFUSED_OPTIONS:
            if options.get(name):
                _refuse(name, options[name], "the host's fit of Q reads the raw gradient "
                        "and the float32 states")
        if memory_save_mode not in DIAG_MODES:
            raise ValueError(f"PSGDKron: memory_save_mode must be one of "
                             f"{', '.join(map(repr, DIAG_MODES))}, got {memory_save_mode!r}")
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise TypeError(f"PSGDKron: betas must be a pair (beta1, beta2), got {betas!r}")
        self._fit = self._fit_options(preconditioner_update_probability, lower_bound_beta,
                                      dampening, precond_update_power_iterations,
                                      precond_init_scale, precond_init_scale_scale,
                                      precond_init_scale_power, precond_lr,
                                      momentum_into_precond_update, generator)
        self._prob_step, self._prob_sum = 0, 0.0
        super().__init__(params, lr=lr, beta1=betas[0] if beta is None else beta,
                         weight_decay=weight_decay, warmup_steps=warmup_steps,
                         max_size_triangular=max_size_triangular,
                         min_ndim_triangular=min_ndim_triangular,
                         diag_mode=DIAG_MODES[memory_save_mode], **options)

    @staticmethod
    def _fit_options(prob, lower_bound_beta, dampening, power_iter, scale, scale_scale,
                     scale_power, precond_lr, momentum_in, generator) -> dict[str, Any]:
        """The fit's settings, checked (ValueError/TypeError naming the bad one)."""
        if prob is _DEFAULT or prob is None:
            prob = update_probability()
        elif isinstance(prob, (int, float)) and not isinstance(prob, bool):
            if not 0 <= prob <= 1:
                raise ValueError(f"PSGDKron: preconditioner_update_probability must be in "
                                 f"[0, 1], got {prob!r}")
            prob = float(prob)
        elif not callable(prob):
            raise TypeError("PSGDKron: preconditioner_update_probability must be a float "
                            f"or a callable of the step, got {prob!r}")
        for name, value, ok in (("lower_bound_beta", lower_bound_beta, 0 <= lower_bound_beta < 1),
                                ("dampening", dampening, dampening >= 0),
                                ("precond_lr", precond_lr, precond_lr > 0),
                                ("precond_init_scale_scale", scale_scale, scale_scale > 0)):
            if not ok:
                raise ValueError(f"PSGDKron: {name}={value!r} is out of range")
        if not isinstance(power_iter, int) or power_iter < 0:
            raise ValueError("PSGDKron: precond_update_power_iterations must be an int "
                             f">= 0, got {power_iter!r}")
        if scale is not None and not (np.isfinite(scale) and scale > 0):
            raise ValueError(f"PSGDKron: precond_init_scale must be > 0, got {scale!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"PSGDKron: generator must be a torch.Generator, got {generator!r}")
        return dict(prob=prob, lower_bound_beta=float(lower_bound_beta),
                    dampening=float(dampening), power_iter=power_iter, scale=scale,
                    scale_scale=float(scale_scale), scale_power=scale_power,
                    precond_lr=float(precond_lr), momentum_in=bool(momentum_in),
                    generator=generator)

    def step(self, closure=None, **statistics):
        """Fit Q (on the steps the schedule picks), then the fused step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if torch.compiler.is_compiling():   # (a graph break: the fit runs eagerly)
            torch.compiler.disable(self._fit_all)()
        else:
            self._fit_all()
        super().step(**statistics)
        return loss

    def state_dict(self, format: str = "optgen") -> dict[str, Any]:
        """The drop-in's state_dict and the update schedule's position (``SCHEDULE``)."""
        out = super().state_dict(format)
        out[SCHEDULE] = [self._prob_step, self._prob_sum]
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        schedule = state_dict.pop(SCHEDULE, None)
        if schedule is not None and not (isinstance(schedule, (list, tuple)) and
                                         len(schedule) == 2):
            raise ValueError(f"PSGDKron: {SCHEDULE} must be [step, cumulative "
                             f"probability], got {schedule!r}")
        super().load_state_dict(state_dict)
        if schedule is not None:
            self._prob_step, self._prob_sum = int(schedule[0]), float(schedule[1])

    @torch.no_grad()
    def _fit_all(self) -> None:
        fit = self._fit
        self._prob_step += 1
        prob = fit["prob"] if isinstance(fit["prob"], float) else fit["prob"](self._prob_step)
        before, self._prob_sum = self._prob_sum, self._prob_sum + prob
        fitting = int(self._prob_sum) > int(before)
        todo = [(p, g) for g in self.param_groups for p in g["params"]
                if p.grad is not None and p.numel() > 0]
        for p, _ in todo:   # (checked before anything changes)
            if float(self.state[p]["step"]) != 0 or fit["scale"] is not None:
                continue
            if not bool(torch.isfinite(p.grad).all()):
                raise ValueError("PSGDKron: a parameter's first gradient has NaN or Inf "
                                 "values; its preconditioner's scale comes from it")
            if not bool(p.grad.abs().sum() > 0):
                raise ValueError("PSGDKron: a parameter's first gradient is all zeros; "
                                 "its preconditioner's scale comes from it (set "
                                 "precond_init_scale)")
        index = {id(p): i for i, p in enumerate(self._params)}
        for p, group in todo:
            self._fit_one(p, group, fitting, self._core.records[index[id(p)]].state)

    def _fit_one(self, p: torch.Tensor, group: dict[str, Any], fitting: bool,
                 core: dict[str, Any]) -> None:
        """Parameter ``p``'s fit (``core``: its runtime states, where the bounds live)."""
        fit, st = self._fit, self.state[p]
        steps = int(float(st["step"]))
        g = p.grad.detach().to(torch.float32)
        mat = p.dim() == 2 and min(p.shape) > 1
        tri = ("Q_L" in st, "Q_R" in st) if mat else (False, False)
        if steps == 0:
            self._initialize(st, g, mat, tri)
        if not fitting:
            return
        t = steps + 1
        beta = float(group["beta1"])
        beta_t = 1 - (1 - beta) / (1 - beta ** t)
        m = torch.lerp(st["m"].reshape(g.shape), g, 1 - beta_t) if fit["momentum_in"] else g
        v = torch.randn(m.shape, generator=fit["generator"], dtype=m.dtype, device=m.device)
        opts = dict(precond_lr=fit["precond_lr"], lower_bound_beta=fit["lower_bound_beta"],
                    dampening=fit["dampening"])
        if not mat:
            q = st["D"].view(-1)
            core["lb_L"] = np.float64(psgd_fit.fit_diagonal(
                q, m.reshape(-1), v.reshape(-1), float(core["lb_L"]), **opts))
            return
        d = st["D"].view(p.shape) if "D" in st else None
        diag = psgd_fit.split_diagonal(d, tri) if d is not None else [None, None]
        factors = [st["Q_L"].view(p.shape[0], p.shape[0]) if tri[0] else diag[0],
                   st["Q_R"].view(p.shape[1], p.shape[1]) if tri[1] else diag[1]]
        lb = psgd_fit.fit_matrix(factors, m, v, [float(core["lb_L"]), float(core["lb_R"])],
                                 power_iter=fit["power_iter"], **opts)
        core["lb_L"], core["lb_R"] = np.float64(lb[0]), np.float64(lb[1])
        if d is not None:
            psgd_fit.join_diagonal(d, None if tri[0] else factors[0],
                                   None if tri[1] else factors[1])

    def _initialize(self, st: dict[str, Any], g: torch.Tensor, mat: bool,
                    tri: tuple[bool, bool]) -> None:
        """Q = scale^(1/k) I per factor (k: the parameter's dimensions after heavyball's
        squeeze: 2 for a matrix, 1 for a vector, 0 for a single value)."""
        fit = self._fit
        scale = psgd_fit.init_scale(g, fit["scale"], fit["scale_scale"], fit["scale_power"])
        k = 2 if mat else (1 if g.numel() > 1 else 0)
        s = scale ** (1 / k) if k else scale
        for name, on in (("Q_L", tri[0]), ("Q_R", tri[1])):
            if on:
                q = st[name]
                n = int(round(q.numel() ** 0.5))
                q.copy_((torch.eye(n) * s).view(q.shape))
        if "D" in st:
            st["D"].fill_(s ** ((not tri[0]) + (not tri[1])) if mat else s)


PSGDKron.spec = catalog.resolve("psgd_kron")
PSGDKron.__module__ = "optgen.torch"

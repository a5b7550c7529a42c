"""The trainer-side optimizer: parameter groups, learning-rate schedules, gradient
handling, mixed precision and checkpoints around one fused kernel call per parameter.

A step is:

    check grads  ->  lr of each group (schedules)  ->  global norm / non-finite check
    ->  per parameter: host scalars (float64), then the kernel launches, in place

Every input is checked before any kernel runs, so an error (or a skipped step) leaves
parameters and states bit-identical. Messages name the optimizer, the parameter
(index and name), the value and the rule.
"""
from __future__ import annotations

import math
import numbers
import weakref
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import checkpoint, flat, groups as grouping
from . import hyper as hyper_rules
from . import reference, scalar_expr, schedules, tensors, views
from .artifact import Artifact, KernelInfo, bfloat16_tensor
from .reference import LOW_COPY
from .sparse import RowSparse
from .tensors import aligned_full

DEFAULT_NO_DECAY = ("beta", "gamma", "bias")
NONFINITE = (None, "skip", "raise")
NORM_EPS = 1e-6   # clip coefficient max_norm / (norm + eps), as torch.nn.utils.clip_grad_norm_


def default_decay_filter(name: str) -> bool:
    """MindSpore's and MXNet's default: no weight decay on normalization scales/shifts
    and biases (names containing beta, gamma or bias)."""
    return not any(s in name for s in DEFAULT_NO_DECAY)


class _Group:
    """A parameter group: its hyperparameters and where its lr comes from."""
    __slots__ = ("hyper", "lr", "explicit", "grad_centralization")

    def __init__(self, hyper: dict, lr: Callable[[int], float] | None, explicit: set,
                 grad_centralization: bool):
        self.hyper = hyper            # validated values; hyper["lr"] is the constant lr
        self.lr = lr                  # a schedule (step -> lr), or None for a constant
        self.explicit = explicit      # hyperparameters the group set itself
        self.grad_centralization = grad_centralization


class Optimizer:
    """Steps arrays (numpy, torch, CuPy) in place with an artifact's kernels.

    ``backend="reference"`` runs the reference interpreter instead of the compiled
    kernels (same IR, same host scalars): the oracle used by the tests.
    See README ("The runtime") for every argument.
    """

    def __init__(self, artifact: Artifact, params: Any, *,
                 backend: str = "compiled", lazy_update: bool | None = None,
                 param_names: Sequence[str] | None = None,
                 name_filters: Mapping[str, Any] | None = None,
                 lr_mult: Mapping | None = None, wd_mult: Mapping | None = None,
                 decay_filter: Any = "default", multi_precision: bool = False,
                 clip_global_norm: float | None = None, nonfinite: str | None = None,
                 loss_scale: float = 1.0, begin_num_update: int = 0, **hyper: Any):
        self.artifact = artifact
        self.name = artifact.name
        if backend not in ("compiled", "reference"):
            raise ValueError(f"{self.name}: backend must be 'compiled' or 'reference', "
                             f"got {backend!r}")
        self.backend = backend
        if lazy_update is None:
            lazy_update = artifact.lazy_update_default
        self.lazy_update = self._bool("lazy_update", lazy_update)
        self.multi_precision = self._bool("multi_precision", multi_precision)
        self.clip_global_norm = None if clip_global_norm is None else \
            self._positive("clip_global_norm", clip_global_norm)
        if nonfinite not in NONFINITE:
            raise ValueError(f"{self.name}: nonfinite must be None, 'skip' or 'raise', "
                             f"got {nonfinite!r}")
        self.nonfinite = nonfinite
        self.loss_scale = self._positive("loss_scale", loss_scale)
        if "rescale_grad" not in artifact.hypers:
            for what, off in (("loss_scale", self.loss_scale == 1.0),
                              ("clip_global_norm", self.clip_global_norm is None)):
                if not off:
                    raise ValueError(f"{self.name}: {what} needs a spec with rescale_grad "
                                     "(the runtime scales gradients through it; use "
                                     "gradient_preprocessing or rescale_and_clip in the spec)")
        if isinstance(begin_num_update, bool) or not isinstance(begin_num_update, numbers.Integral) \
                or begin_num_update < 0:
            raise ValueError(f"{self.name}: begin_num_update must be an int >= 0, "
                             f"got {begin_num_update!r}")
        self.t = int(begin_num_update)        # updates applied (the schedules' step)
        self.skipped_steps = 0                # steps skipped for non-finite gradients
        self.last_grad_norm: float | None = None

        # options the spec accepts but has no use for here (THOR's split_indices)
        self.accepted = {n: hyper.pop(n) for n in list(hyper) if n in artifact.accepted}
        entries, parsed = grouping.parse(self.name, params, artifact.hypers)
        self.params: list[Any] = [e.array for e in entries]
        self._lib: list[str] = self._check_params()
        self.names: list[str | None] = self._names(entries, param_names)
        self._group_of: list[int] = [e.group for e in entries]

        defaults = {n: h.default for n, h in artifact.hypers.items()}
        top = grouping.alias(self.name, artifact.hypers, hyper)
        self._defaults, self._default_lr = self._resolve(defaults, None, top)
        self._groups: list[_Group] = []
        for g in parsed:
            h, lr = self._resolve(self._defaults, self._default_lr, g.overrides)
            self._groups.append(_Group(h, lr, set(g.overrides), g.grad_centralization))
        for i, gi in enumerate(self._group_of):
            if self._groups[gi].grad_centralization and len(self.params[i].shape) != 4:
                raise ValueError(f"{self.name}: {self._label(i)} has shape "
                                 f"{tuple(self.params[i].shape)}; grad_centralization applies "
                                 f"only to 4-D convolution weights (group {gi})")

        self._dims = [views.dims(tuple(p.shape)) for p in self.params]
        self._flags_fixed = [{n: bool(scalar_expr.evaluate(rule, views.shape_env(p.shape)))
                              for n, rule in artifact.shape_flags.items()}
                             for p in self.params]
        for flags, by_name in zip(self._flags_fixed, self._name_flags(name_filters)):
            flags.update(by_name)
        self._lr_mult = [1.0] * len(self.params)
        self._wd_mult = [1.0] * len(self.params)
        self._apply_decay_filter(decay_filter)
        if lr_mult:
            self.set_lr_mult(lr_mult)
        if wd_mult:
            self.set_wd_mult(wd_mult)

        self._steps = [self.t] * len(self.params)   # per parameter (bias corrections)
        self.state: list[dict[str, Any]] = [{} for _ in self.params]
        self._kargs = [tensors.kernel_arg(p, lib) for p, lib in zip(self.params, self._lib)]
        self._is_mixed = [self.multi_precision and tensors.dtype_name(p, lib) in
                          tensors.LOW_PRECISION for p, lib in zip(self.params, self._lib)]
        for i, lib in enumerate(self._lib):
            if self._mixed(i):   # the float32 master copy the kernel updates
                self.state[i]["master"] = tensors.cast_copy(self.params[i], lib, "float32")
        self._kernels: dict[tuple, KernelInfo] = {}
        self._prepared: list[KernelInfo | None] = [None] * len(self.params)
        self._plans: list[list | None] = [None] * len(self.params)
        self._numel = [_numel(p) for p in self.params]
        self._bf16_numpy = [lib == "numpy" and p.dtype.name == "bfloat16"
                            for p, lib in zip(self.params, self._lib)]
        self._work: list[dict[str, dict[str, Any]]] = [{} for _ in self.params]
        # flat groups (runtime/flat.py): parameters back to back get back-to-back states
        self._chain_of: dict[int, tuple[int, int]] = {}
        for a, b in flat.chains(self.params, self._lib,
                                [not m for m in self._is_mixed]):
            self._chain_of.update((i, (a, b)) for i in range(a, b))
        self._runs: dict[int, tuple[int, list[tuple[Callable, list]], list]] | None = None
        self._runs_for: list | None = None
        self._grad_spans: dict[int, tuple[tuple, Any, list[int]]] = {}   # start ->
        # (weak references to the gradients, their span, their addresses)
        # numpy gradients that passed _check_grads, by parameter: (weakref, shape, dtype,
        # strides); forgotten when states change (a new state must be checked against)
        self._checked: list[tuple | None] = [None] * len(self.params)
        self._refreshed: list[int | None] = [None] * len(self.params)  # step of the last refresh
        self._refreshing = any(k.refresh is not None for k in artifact.kernels)
        self._check_matrix_params()
        for i in range(len(self.params)):
            self._ensure_state(i)

    # -- construction ------------------------------------------------------------------
    def _check_matrix_params(self) -> None:
        """A matrix rule (products) needs a 2-D parameter; specs pick it by a shape flag
        (``ndim == 2``), so this only fails for a spec that does not."""
        if not any(k.matrix for k in self.artifact.kernels):
            return
        for i, p in enumerate(self.params):
            k = self.artifact.kernel_for(tensors.dtype_name(p, self._lib[i]), self._flags(i))
            if k is not None and k.matrix and len(p.shape) != 2:
                raise ValueError(f"{self.name}: {self._label(i)} has shape {tuple(p.shape)}; "
                                 f"its rule (flags {k.flags}) multiplies matrices and needs a "
                                 "2-D parameter")

    def _bool(self, what: str, value: Any) -> bool:
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{self.name}: {what} must be a bool, got {value!r}")
        return bool(value)

    def _positive(self, what: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{self.name}: {what} must be a float, got "
                            f"{type(value).__name__} {value!r}")
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{self.name}: invalid {what}={value!r}: must be finite and > 0")
        return float(value)

    def _label(self, i: int) -> str:
        name = self.names[i] if hasattr(self, "names") else None
        return f"parameter {i}" + (f" ({name})" if name else "")

    def _check_params(self) -> list[str]:
        device = tensors.TARGET_DEVICE.get(self.artifact.target, "cpu")
        plain, mixed = self.artifact.dtypes, self.artifact.mixed_dtypes
        libs, ranges = [], []
        for i, p in enumerate(self.params):
            lib = tensors.library(p)
            if lib is None:
                raise TypeError(f"{self.name}: parameter {i} must be an array (numpy.ndarray, "
                                f"torch.Tensor or cupy.ndarray), got {type(p).__name__}")
            dev = tensors.device(p, lib)
            if dev.split(":")[0] != device:
                raise TypeError(f"{self.name}: parameter {i} is on {dev}, but this optimizer's "
                                f"kernels are built for {self.artifact.target} ({device}); "
                                f"build for a matching target or move the parameter")
            if lib == "numpy" and not p.dtype.isnative:
                raise TypeError(f"{self.name}: parameter {i} has dtype {p.dtype.str} in "
                                "non-native byte order; the kernels read native byte order "
                                "(convert with .astype(p.dtype.newbyteorder('=')))")
            dt = tensors.dtype_name(p, lib)
            if dt in tensors.LOW_PRECISION and dt in mixed:
                if not self.multi_precision:
                    raise TypeError(f"{self.name}: parameter {i} has dtype {dt}; low-precision "
                                    "parameters need multi_precision=True (a float32 master "
                                    "copy and float32 states)")
            elif dt not in plain:
                raise TypeError(f"{self.name}: parameter {i} has dtype {dt}; the kernels "
                                f"support {', '.join(plain + list(mixed))}"
                                + (" (low precision with multi_precision=True)" if mixed else ""))
            if not tensors.is_contiguous(p, lib):
                raise ValueError(f"{self.name}: parameter {i} is not C-contiguous "
                                 "(pass a contiguous copy and keep that array)")
            if not tensors.is_writeable(p, lib):
                raise ValueError(f"{self.name}: parameter {i} is read-only; "
                                 "parameters are updated in place")
            if lib == "numpy" and not p.flags.aligned:
                raise ValueError(f"{self.name}: parameter {i} is not aligned to its "
                                 f"{p.itemsize}-byte elements (data at address "
                                 f"{p.ctypes.data:#x}); copy it into an aligned array "
                                 "(optgen.aligned_full) and keep that array")
            r = tensors.address_range(p, lib)
            for j, q in enumerate(ranges):
                if tensors.overlaps(r, q):
                    raise ValueError(f"{self.name}: parameters {j} and {i} share memory")
            libs.append(lib)
            ranges.append(r)
        return libs

    def _names(self, entries, param_names) -> list[str | None]:
        names = [e.name for e in entries]
        if param_names is None:
            return names
        if any(n is not None for n in names):
            raise TypeError(f"{self.name}: param_names given, but params already names its "
                            "parameters (dict keys)")
        param_names = list(param_names)
        if len(param_names) != len(self.params) or not all(isinstance(x, str)
                                                           for x in param_names):
            raise ValueError(f"{self.name}: param_names must be {len(self.params)} "
                             "strings, one per parameter")
        return param_names

    def _name_flags(self, filters) -> list[dict[str, bool]]:
        """Per-parameter name flags (LARS's filter) from names/``name_filters``."""
        flags = self.artifact.name_flags
        filters = dict(filters or {})
        unknown = sorted(set(filters) - set(flags))
        if unknown:
            raise ValueError(f"{self.name}: name_filters has {unknown[0]!r}; this optimizer's "
                             f"name flags are {sorted(flags) or 'none'}")
        for n, f in filters.items():
            if not callable(f):
                raise TypeError(f"{self.name}: name_filters[{n!r}] must be a callable "
                                f"name -> bool, got {type(f).__name__}")
        out = []
        for name in self.names:
            row = {}
            for n, exclude in flags.items():
                if n in filters:
                    row[n] = bool(filters[n](name if name is not None else ""))
                else:
                    row[n] = name is None or not any(x in name for x in exclude)
            out.append(row)
        return out

    def _apply_decay_filter(self, decay_filter) -> None:
        """wd_mult 0 for named parameters the filter leaves out, in groups that did not
        set weight_decay themselves (MindSpore's rule)."""
        if decay_filter == "default":
            decay_filter = default_decay_filter
        elif decay_filter is None or decay_filter is False:
            return
        elif not callable(decay_filter):
            raise TypeError(f"{self.name}: decay_filter must be 'default', None or a callable "
                            f"name -> bool, got {decay_filter!r}")
        for i, name in enumerate(self.names):
            if name is not None and "weight_decay" not in self._groups[self._group_of[i]].explicit \
                    and not decay_filter(name):
                self._wd_mult[i] = 0.0

    def _mixed(self, i: int) -> bool:
        """Whether parameter ``i`` is stepped through a float32 master copy."""
        return self._is_mixed[i]

    def _compute_dtype(self, i: int) -> str:
        return "float32" if self._mixed(i) else tensors.dtype_name(self.params[i], self._lib[i])

    def _flags(self, i: int) -> dict[str, bool]:
        """Parameter ``i``'s flags: its group's, then those set by its shape and name."""
        h = self._groups[self._group_of[i]].hyper
        return {**{n: h[n] for n in self.artifact.flags}, **self._flags_fixed[i]}

    def _state_init(self, i: int, s) -> tuple[float, str] | None:
        """Parameter ``i``'s new state ``s``: (init value, dtype); None if it has it or
        its flags leave it out."""
        flags = self._flags(i)
        if s.name in self.state[i] or not s.exists(flags):
            return None
        if isinstance(s.init, str):
            gi = self._group_of[i]
            init = scalar_expr.evaluate(s.init, self._group_env(gi, self._lr_value(gi, self.t),
                                                                1.0))
        else:
            init = s.init
        half = s.half_when is not None and scalar_expr.evaluate(s.half_when, flags)
        return init, "float16" if half else self._compute_dtype(i)

    def _ensure_state(self, i: int) -> None:
        """Allocate the states parameter ``i`` has under its current flags (a state that
        appears when a flag is switched on starts at its init value). An elementwise
        state new to every parameter of i's chain, with one init and dtype, is one
        buffer for the chain (runtime/flat.py)."""
        p, lib, st = self.params[i], self._lib[i], self.state[i]
        for s in self.artifact.states:
            new = self._state_init(i, s)
            if new is None:
                continue
            init, dtype = new
            if s.shape == "scalar":
                st[s.name] = np.float64(init)
                continue
            a, b = self._chain_of.get(i, (i, i + 1))
            if s.shape == "param" and b - a > 1 and \
                    all(self._state_init(j, s) == new for j in range(a, b)):
                for j, v in zip(range(a, b), flat.split_full(
                        self.params[a:b], lib, [tuple(q.shape) for q in self.params[a:b]],
                        init, dtype)):
                    self.state[j][s.name] = v
                continue
            st[s.name] = tensors.full_like(p, lib, views.state_shape(tuple(p.shape), s.shape),
                                           init, dtype)

    # -- hyperparameters ---------------------------------------------------------------
    def _resolve(self, current: Mapping[str, Any], current_lr, changes: Mapping[str, Any]
                 ) -> tuple[dict[str, Any], Callable | None]:
        """``current`` updated by ``changes`` (spec names), validated; an lr that is a
        schedule, sequence or callable becomes the group's lr schedule."""
        changes = dict(changes)
        lr = current_lr
        if "lr" in changes:
            value = changes["lr"]
            if value is None or isinstance(value, (numbers.Real, str)) or \
                    getattr(value, "ndim", None) == 0:   # a number, or a 0-d array of one
                lr = None
            else:
                lr = schedules.as_schedule(value, owner=self.name)
                changes["lr"] = current.get("lr")
        new = hyper_rules.resolve(self.name, self.artifact.hypers, self.artifact.requirements,
                                  current, changes)
        if lr is not None and "lr" in self.artifact.hypers:
            self._check_lr(lr(self.t), self.t, new)
        return new, lr

    def _check_lr(self, value: Any, step: int, hyper: Mapping[str, Any]) -> float:
        info = self.artifact.hypers["lr"]
        value = hyper_rules.coerce(self.name, info, value)
        hyper_rules.check_constraint(self.name, info, value, hyper)
        return value

    def _lr_value(self, gi: int, step: int) -> float | None:
        g = self._groups[gi]
        if g.lr is None:
            return g.hyper.get("lr")
        return self._check_lr(g.lr(step), step, g.hyper)

    @property
    def hyper(self) -> dict[str, Any]:
        """The optimizer-wide hyperparameters (groups may override them); change them
        with ``set_hyper``."""
        return dict(self._defaults)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Each group's parameters, names and hyperparameters (copies; the lr entry is
        the schedule where the group has one)."""
        out = []
        for gi, g in enumerate(self._groups):
            idx = [i for i, x in enumerate(self._group_of) if x == gi]
            out.append({"params": [self.params[i] for i in idx],
                        "names": [self.names[i] for i in idx], **g.hyper,
                        **({"lr": g.lr} if g.lr is not None else {}),
                        "grad_centralization": g.grad_centralization})
        return out

    @property
    def learning_rate(self) -> float | None:
        """The lr group 0 uses for the next step (MXNet's ``learning_rate``)."""
        return self._lr_value(0, self.t)

    def set_learning_rate(self, lr: Any) -> None:
        """MXNet's ``set_learning_rate``: the lr of every group."""
        self.set_hyper(lr=lr)

    def set_hyper(self, group: int | None = None, **changes: Any) -> None:
        """Validate and apply new values (aliases accepted), to every group or to
        ``group``; nothing changes if any value is invalid. ``lr`` may be a schedule."""
        changes = grouping.alias(self.name, self.artifact.hypers, changes)
        if group is not None and not (isinstance(group, int) and 0 <= group < len(self._groups)):
            raise ValueError(f"{self.name}: group must be an index below {len(self._groups)}, "
                             f"got {group!r}")
        targets = range(len(self._groups)) if group is None else [group]
        new = {gi: self._resolve(self._groups[gi].hyper, self._groups[gi].lr, changes)
               for gi in targets}
        if group is None:
            self._defaults, self._default_lr = self._resolve(self._defaults, self._default_lr,
                                                             changes)
        for gi, (h, lr) in new.items():
            self._groups[gi].hyper, self._groups[gi].lr = h, lr
        if any(n in self.artifact.flags for n in changes):
            self._prepared = [None] * len(self.params)  # kernels and state storage follow flags

    def _mults(self, what: str, mults: Mapping) -> dict[int, float]:
        if not isinstance(mults, Mapping):
            raise TypeError(f"{self.name}: {what} must be a dict name or index -> float")
        by_name = {n: i for i, n in enumerate(self.names) if n is not None}
        out = {}
        for key, value in mults.items():
            if isinstance(key, str):
                if key not in by_name:
                    raise ValueError(f"{self.name}: {what} names {key!r}, which is not a "
                                     f"parameter name" + ("" if by_name else
                                                          " (the parameters have no names)"))
                i = by_name[key]
            elif isinstance(key, numbers.Integral) and not isinstance(key, bool) \
                    and 0 <= key < len(self.params):
                i = int(key)
            else:
                raise ValueError(f"{self.name}: {what} key {key!r} is neither a parameter name "
                                 f"nor an index below {len(self.params)}")
            if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError(f"{self.name}: {what}[{key!r}] must be a finite float >= 0, "
                                 f"got {value!r}")
            out[i] = float(value)
        return out

    def set_lr_mult(self, mults: Mapping) -> None:
        """MXNet's per-parameter lr multipliers, by name or index: lr_i = lr * mult."""
        for i, v in self._mults("lr_mult", mults).items():
            self._lr_mult[i] = v
        self._runs = None

    def set_wd_mult(self, mults: Mapping) -> None:
        """MXNet's per-parameter weight-decay multipliers, by name or index."""
        for i, v in self._mults("wd_mult", mults).items():
            self._wd_mult[i] = v
        self._runs = None

    # -- kernels -------------------------------------------------------------------------
    def _param_kernel(self, i: int) -> KernelInfo:
        """Parameter ``i``'s kernel under the current flags, with its states ready for it
        (cached: only a flag change, through set_hyper or load_state_dict, redoes this)."""
        k = self._prepared[i]
        if k is not None:
            return k
        dt = tensors.dtype_name(self.params[i], self._lib[i])
        k = self._kernel(dt, self._flags(i))
        self._ensure_state(i)
        st, lib = self.state[i], self._lib[i]
        for n in k.buffers:  # a storage flag changed: convert the state (rounds once)
            want = k.storage.get(n, k.dtype)
            v = st.get(n)
            if v is not None and not isinstance(v, np.floating) and \
                    tensors.dtype_name(v, lib) != want:
                st[n] = tensors.cast_copy(v, lib, want)
        self._prepared[i] = k
        self._plans[i] = self._plan(i, k) if self.backend == "compiled" else None
        self._checked[i] = None
        return k

    def _plan(self, i: int, k: KernelInfo) -> list[tuple[Callable, list]]:
        """Parameter ``i``'s launches with their persistent arguments (parameter, states,
        workspaces) viewed once; per-step arrays (the gradient, extra inputs) are named by
        a ``(name, axes, view)`` placeholder."""
        d = self._dims[i]
        persistent = {**self._arrays(i, k, None, {}), **self._workspace(i, k, d)}
        plan = []
        for ln in k.launches:
            if ln["kind"] == "repeat":   # the next ln["length"] entries, count times
                count = ln["count"]   # a hyperparameter's slot in the scalars, or a number
                plan.append((REPEAT, ((k.scalars.index(count), None) if isinstance(count, str)
                                      else (None, count), ln["length"])))
                continue
            args = [bfloat16_tensor(views.as_kernel(persistent[b], k.buffer_axes[b], d,
                                                    ln["view"]))
                    if b in persistent else (b, k.buffer_axes[b], ln["view"])
                    for b in ln["buffers"]]
            plan.append((self.artifact.function(ln["symbol"]), args))
        return plan

    # -- flat runs (runtime/flat.py) ----------------------------------------------------
    def _fusable(self, i: int) -> bool:
        """Whether parameter ``i``'s kernel is one elementwise launch over the flat view,
        or passes that each have a segmented variant (whole-tensor reductions: LAMB,
        LARS), so it may share a call per pass with its neighbours (scalar states, such as
        SGD's buffer_started, are checked equal per step)."""
        k = self._prepared[i]
        if self.artifact.inputs:
            return False
        if all("seg_symbol" in ln for ln in k.launches):
            return not k.param_scalars
        return (len(k.launches) == 1 and k.launches[0]["view"] == "flat" and not k.workspaces
                and all(k.buffer_axes[b] == views.AXES for b in k.launches[0]["buffers"]))

    def _find_runs(self) -> dict[int, tuple[int, list[tuple[Callable, list]], list]]:
        """start -> (end, [(kernel, arguments), ...], every argument): stretches of a
        chain that one call per pass can update: one group, one kernel, equal
        multipliers, every persistent array back to back (the gradient's span, ``GRAD``,
        is filled in per step)."""
        runs = {}
        for a, b in sorted(set(self._chain_of.values())):
            i = a
            while i < b:
                j = i + 1
                if self._fusable(i):
                    same = (self._group_of[i], self._prepared[i].symbol, self._lr_mult[i],
                            self._wd_mult[i])
                    while j < b and self._fusable(j) and same == (
                            self._group_of[j], self._prepared[j].symbol, self._lr_mult[j],
                            self._wd_mult[j]):
                        j += 1
                if j - i > 1:
                    calls = self._run_plan(i, j)
                    if calls is not None:
                        runs[i] = (j, calls, [a for _, args in calls for a in args])
                i = j
        return runs

    def _run_plan(self, i: int, j: int) -> list[tuple[Callable, list]] | None:
        """The calls that update parameters ``i:j`` together: the kernel's one launch
        over the span, or each pass's segmented variant with the run's offsets (``_seg``)
        and reduction buffers (one per tensor, kept with the run); None when some
        persistent array is not back to back."""
        k, lib = self._prepared[i], self._lib[i]
        parts = [self._arrays(x, k, None, {}) for x in range(i, j)]
        spans: dict[str, Any] = {"grad": GRAD}
        segmented = "seg_symbol" in k.launches[0]
        if segmented:
            size = self.artifact.reduction_buffer_size * (j - i)
            spans.update((n, tensors.full_like(self.params[i], lib, (size,), 0.0,
                                               self.artifact.reduction_dtype))
                         for n in k.workspaces)
            offsets = np.cumsum([0] + [self._numel[x] for x in range(i, j)], dtype=np.int64)
            spans["_seg"] = tensors.full_like(self.params[i], lib, (j - i + 1,), 0, "int64")
            tensors.copy_into(spans["_seg"], lib, offsets)
        calls = []
        for ln in k.launches:
            args = []
            for name in ln["buffers"]:
                if name not in spans:
                    arrays = [p[name] for p in parts]
                    if not flat.adjacent(arrays, lib):
                        return None
                    spans[name] = flat.span(arrays, lib)
                args.append(spans[name])
            if segmented:
                args.append(spans["_seg"])
            calls.append((self.artifact.function(ln["seg_symbol" if segmented else "symbol"]),
                          args))
        return calls

    def _same_scalar_states(self, i: int, j: int) -> bool:
        names = self._prepared[i].scalar_state_updates
        return not names or all(self.state[x][n] == self.state[i][n]
                                for x in range(i + 1, j) for n in names)

    def _grad_span(self, i: int, j: int, grads: list, args: list) -> Any:
        """The span of gradients ``i:j`` if they lie back to back (apart from the run's
        parameters and states) and every one takes this step; else None. The verdict is
        kept per gradient object, rechecked by address for torch tensors."""
        gs = grads[i:j]
        lib = self._lib[i]
        hit = self._grad_spans.get(i)
        if hit is not None and all(r() is g for r, g in zip(hit[0], gs)) and \
                (lib == "numpy" or hit[2] == [tensors.address_range(g, lib)[0] for g in gs]):
            return hit[1]
        self._grad_spans.pop(i, None)
        if any(g is None or isinstance(g, RowSparse) for g in gs) or \
                any(self._steps[x] != self._steps[i] for x in range(i, j)) or \
                not flat.adjacent(gs, lib):
            return None
        span = flat.span(gs, lib)
        full = [g for g in gs if _numel(g)]
        where = (tensors.address_range(full[0], lib)[0], tensors.address_range(full[-1], lib)[1])
        if any(a is not GRAD and tensors.overlaps(where, tensors.address_range(a, lib))
               for a in args):
            return None
        try:
            refs = tuple(weakref.ref(g) for g in gs)
        except TypeError:           # an array type without weak references: no caching
            return span
        self._grad_spans[i] = (refs, span, [tensors.address_range(g, lib)[0] for g in gs])
        return span

    def _kernel(self, dtype: str, flags: dict[str, bool]) -> KernelInfo:
        key = (dtype, tuple(sorted(flags.items())))
        k = self._kernels.get(key)
        if k is None:
            k = self.artifact.kernel_for(dtype, flags)
            if k is None:
                raise TypeError(f"{self.name}: no kernel for dtype {dtype} with flags {flags}")
            self._kernels[key] = k
        return k

    def _group_env(self, gi: int, lr: float | None, grad_scale: float) -> dict[str, Any]:
        """The scalar environment of group ``gi`` for one step (float64 on the host)."""
        env = {}
        for n, v in self._groups[gi].hyper.items():
            env[n] = self.artifact.hypers[n].none_value if v is None else v
        if "lr" in env:
            env["lr"] = self.artifact.hypers["lr"].none_value if lr is None else lr
        if "rescale_grad" in env:
            env["rescale_grad"] = env["rescale_grad"] * grad_scale
        env["t"] = self.t
        return env

    # -- stepping ----------------------------------------------------------------------
    def _check_grads(self, grads: Sequence[Any], what: str = "grads") -> list[Any]:
        if tensors.library(grads) is not None:
            raise TypeError(f"{self.name}: {what} must be a list of arrays, got a single array")
        grads = list(grads)
        if len(grads) != len(self.params):
            raise ValueError(f"{self.name}: got {len(grads)} "
                             f"{'gradients' if what == 'grads' else what + ' arrays'} for "
                             f"{len(self.params)} parameters")
        label = "gradient" if what == "grads" else what
        for i, (p, g) in enumerate(zip(self.params, grads)):
            if g is None:   # no gradient (torch's p.grad is None): the parameter is skipped
                continue
            if isinstance(g, RowSparse) and what == "grads":
                grads[i] = self._check_row_sparse(i, p, g)
                continue
            lib = self._lib[i]
            seen = self._checked[i] if what == "grads" else None
            if seen is not None and seen[0]() is g and g.shape == seen[1] and \
                    g.dtype == seen[2] and g.strides == seen[3] and g.flags.writeable:
                continue        # the numpy array checked last step, still in that form
            if type(g) is not type(p) and tensors.library(g) != lib:
                kind = {"numpy": "numpy.ndarray", "torch": "torch.Tensor",
                        "cupy": "cupy.ndarray"}[lib]
                raise TypeError(f"{self.name}: {label} {i} must be a {kind} like parameter {i}, "
                                f"got {type(g).__name__}")
            if g.shape != p.shape:
                raise ValueError(f"{self.name}: {label} {i} has shape {tuple(g.shape)}, "
                                 f"parameter {i} has shape {tuple(p.shape)}")
            if lib == "numpy" and not g.dtype.isnative:
                raise TypeError(f"{self.name}: {label} {i} has dtype {g.dtype.str} in "
                                "non-native byte order; the kernels read native byte order")
            if g.dtype != p.dtype:
                raise TypeError(f"{self.name}: {label} {i} has dtype "
                                f"{tensors.dtype_name(g, lib)}, parameter {i} has dtype "
                                f"{tensors.dtype_name(p, lib)}")
            if lib == "numpy":
                if not g.flags.c_contiguous:
                    raise ValueError(f"{self.name}: {label} {i} is not C-contiguous")
                if not g.flags.aligned:
                    raise ValueError(f"{self.name}: {label} {i} is not aligned to its "
                                     f"{g.itemsize}-byte elements (data at address "
                                     f"{g.ctypes.data:#x}); pass an aligned copy (np.array(g))")
                if not g.flags.writeable:
                    raise ValueError(f"{self.name}: {label} {i} is read-only; the kernels "
                                     "take arrays through DLPack, which cannot pass read-only "
                                     "numpy arrays: pass a writeable copy (np.array(g)); the "
                                     "optimizer never writes to it")
                shared = np.may_share_memory(g, p) or any(
                    np.may_share_memory(g, s) for s in self._guarded(i))
                if not shared and what == "grads":   # (its memory cannot move)
                    self._checked[i] = (weakref.ref(g), g.shape, g.dtype, g.strides)
            else:
                if tensors.device(g, lib) != tensors.device(p, lib):
                    raise TypeError(f"{self.name}: {label} {i} is on {tensors.device(g, lib)}, "
                                    f"parameter {i} is on {tensors.device(p, lib)}")
                if not tensors.is_contiguous(g, lib):
                    raise ValueError(f"{self.name}: {label} {i} is not C-contiguous")
                r = tensors.address_range(g, lib)
                shared = tensors.overlaps(r, tensors.address_range(p, lib)) or any(
                    tensors.overlaps(r, tensors.address_range(s, lib)) for s in self._guarded(i))
            if shared:
                raise ValueError(f"{self.name}: {label} {i} shares memory with parameter {i} "
                                 "or its state; pass a separate gradient array")
        return grads

    def _guarded(self, i: int) -> list[Any]:
        """The state arrays of parameter ``i`` (a gradient must not overlap them)."""
        return [s for s in self.state[i].values() if not isinstance(s, np.floating)]

    def _check_row_sparse(self, i: int, p, g: RowSparse):
        """A valid RowSparse gradient, coalesced; or its dense array (lazy_update off,
        or a rule with whole-tensor reductions, which has no lazy variant)."""
        if self._lib[i] != "numpy":
            raise TypeError(f"{self.name}: gradient {i} is a RowSparse (numpy) gradient, but "
                            f"parameter {i} is a {self._lib[i]} array")
        if self._groups[self._group_of[i]].grad_centralization:
            raise TypeError(f"{self.name}: gradient {i} is row-sparse, but its group uses "
                            "grad_centralization (dense gradients only)")
        idx, rows = g.indices, g.rows
        if p.ndim == 0:
            raise ValueError(f"{self.name}: gradient {i} is row-sparse but parameter {i} is "
                             "a 0-d array (it has no rows)")
        if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
            raise TypeError(f"{self.name}: gradient {i}: RowSparse indices must be a 1-D "
                            f"integer array, got {idx.dtype}{list(idx.shape)}")
        if rows.shape != (len(idx),) + p.shape[1:]:
            raise ValueError(f"{self.name}: gradient {i}: RowSparse rows have shape "
                             f"{rows.shape}, expected {(len(idx),) + p.shape[1:]}")
        if rows.dtype != p.dtype:
            raise TypeError(f"{self.name}: gradient {i}: RowSparse rows have dtype "
                            f"{rows.dtype}, parameter {i} has dtype {p.dtype}")
        if len(idx) and (idx.min() < 0 or idx.max() >= p.shape[0]):
            bad = idx[(idx < 0) | (idx >= p.shape[0])][0]
            raise ValueError(f"{self.name}: gradient {i}: row index {bad} is out of range "
                             f"for parameter {i} with {p.shape[0]} rows")
        k = self._prepared[i] or self._kernel(p.dtype.name, self._flags(i))
        if not self.lazy_update or k.lazy is None:
            return g.to_dense(p.shape)
        return g.coalesce()

    def _check_inputs(self, inputs: dict[str, Any], grads: list) -> list[dict[str, Any]]:
        """The spec's extra per-element inputs (e.g. SVRG's grad_snapshot), per parameter."""
        want = set(self.artifact.inputs)
        if set(inputs) != want:
            missing, extra = sorted(want - set(inputs)), sorted(set(inputs) - want)
            raise TypeError(f"{self.name}: step() " + (f"needs {' and '.join(m + '=[...]' for m in missing)}"
                            if missing else f"got unexpected input {extra[0]!r}")
                            + (f" ({'; '.join(f'{n}: {d}' for n, d in self.artifact.inputs.items())})"
                               if want else ""))
        per_param: list[dict[str, Any]] = [{} for _ in self.params]
        for name, arrays in inputs.items():
            checked = self._check_grads(arrays, what=name)
            for i, (a, g) in enumerate(zip(checked, grads)):
                if isinstance(g, RowSparse):
                    raise TypeError(f"{self.name}: gradient {i} is row-sparse, but {name} "
                                    "inputs need dense gradients")
                if g is not None and a is None:
                    raise TypeError(f"{self.name}: {name} {i} is None but gradient {i} is not")
                per_param[i][name] = a
        return per_param

    def _grad_scale(self, grads: list) -> float | None:
        """The factor every gradient is multiplied by this step (fused into the kernels
        through rescale_grad): 1/loss_scale, times the global-norm clip coefficient.
        None when a gradient is not finite and the step is to be skipped."""
        scale = 1.0 / self.loss_scale
        if self.clip_global_norm is None and self.nonfinite is None:
            return scale
        def values(i: int, g) -> tuple[Any, str]:   # the array holding g's values, its library
            return (g.rows, "numpy") if isinstance(g, RowSparse) else (g, self._lib[i])

        total = 0.0
        for i, g in enumerate(grads):
            if g is None:
                continue
            r = self._groups[self._group_of[i]].hyper.get("rescale_grad", 1.0) * scale
            total += tensors.sum_of_squares(*values(i, g)) * r * r
        if not math.isfinite(total):
            bad = next((i for i, g in enumerate(grads)
                        if g is not None and not tensors.all_finite(*values(i, g))), None)
            if bad is not None:
                if self.nonfinite == "skip":
                    self.last_grad_norm = math.nan
                    return None
                raise FloatingPointError(f"{self.name}: gradient {bad}"
                                         f"{f' ({self.names[bad]})' if self.names[bad] else ''} "
                                         "has NaN or Inf values; the step was not applied "
                                         "(nonfinite='skip' skips such steps)")
        norm = math.sqrt(total)
        self.last_grad_norm = norm
        if self.clip_global_norm is not None:
            scale *= min(1.0, self.clip_global_norm / (norm + NORM_EPS))
        return scale

    def step(self, grads: Sequence[Any], **inputs: Sequence[Any]) -> bool:
        """One update of every parameter that has a gradient, in place. Returns False
        when the step was skipped for a non-finite gradient (``nonfinite="skip"``).
        Specs with extra inputs (SVRG) take them by name: ``step(grads,
        grad_snapshot=[...], full_grad=[...])``, and so do statistics (THOR: ``A=[...],
        G=[...]``, one per parameter, None where there is none), which are read on the
        steps that refresh (``refresh_due``) and ignored on the others."""
        stats = {n: inputs.pop(n) for n in list(inputs) if n in self.artifact.statistics}
        grads = self._check_grads(grads)
        extra = self._check_inputs(inputs, grads)
        refresh = self._refresh_due(grads, stats)
        used = sorted({self._group_of[i] for i, g in enumerate(grads) if g is not None})
        lrs = {gi: self._lr_value(gi, self.t) for gi in used}
        scale = self._grad_scale(grads)
        if scale is None:
            self.skipped_steps += 1
            return False
        for i, g in enumerate(grads):
            if g is not None and not isinstance(g, RowSparse) and \
                    self._groups[self._group_of[i]].grad_centralization:
                grads[i] = tensors.centralize(g, self._lib[i])
        self.t += 1
        envs = {gi: self._group_env(gi, lrs[gi], scale) for gi in used}
        shared: dict[tuple, tuple] = {}  # host scalars that read no scalar state: once a step
        runs = self._current_runs()
        end = 0
        for i, g in enumerate(grads):
            if g is None or i < end:
                continue
            run = runs.get(i)
            if run is not None and self._same_scalar_states(i, run[0]):
                gspan = self._grad_span(i, run[0], grads, run[2])
                if gspan is not None:           # one call for parameters i .. end - 1
                    end = run[0]
                    for x in range(i + 1, end):
                        self._steps[x] += 1
            k = self._param_kernel(i)
            gi, st = self._group_of[i], self.state[i]
            self._steps[i] += 1
            lm, wm = self._lr_mult[i], self._wd_mult[i]
            key = (k.symbol, gi, self._steps[i], lm, wm)
            if key not in shared:
                env = envs[gi]
                if lm != 1.0 or wm != 1.0 or self._steps[i] != self.t:
                    env = dict(env, t=self._steps[i])
                    if lm != 1.0 and lrs[gi] is not None and "lr" in env:
                        env["lr"] = env["lr"] * lm
                    if wm != 1.0 and "weight_decay" in env:
                        env["weight_decay"] = env["weight_decay"] * wm
                values = {**env, **{n: scalar_expr.evaluate(k.host_scalars[n], env)
                                    for n in k.step_scalars}}
                shared[key] = values, (None if k.param_scalars else self._pack(k, values))
            values, scalars = shared[key]
            if i in refresh:
                self._refresh(i, k, values, refresh[i])
            if k.scalar_state_updates or scalars is None:  # scalar states, shape scalars
                local = {**values, **{n: v for n, v in st.items() if isinstance(v, np.floating)},
                         "rows": self._dims[i][1], "cols": self._dims[i][2]}
                if scalars is None:
                    local.update((n, scalar_expr.evaluate(k.host_scalars[n], local))
                                 for n in k.param_scalars)
                    scalars = self._pack(k, local)
                for n, e in k.scalar_state_updates.items():
                    st[n] = np.float64(scalar_expr.evaluate(e, local))
                for x in range(i + 1, end):     # the run's parameters had the same values
                    self.state[x].update((n, st[n]) for n in k.scalar_state_updates)
            if i < end:
                for fn, args in run[1]:
                    fn(*[gspan if a is GRAD else a for a in args], scalars)
            elif isinstance(g, RowSparse):
                if len(g.indices) and self.params[i].size:
                    self._run_lazy(i, k, g, scalars)
            elif self._numel[i]:
                self._run(i, k, g, scalars, extra[i])
        return True

    # -- refresh rules (matrix specs: THOR's inverses) -----------------------------------
    def _refresh_every(self, i: int, k: KernelInfo) -> int:
        every = k.refresh["every"]
        return int(self._groups[self._group_of[i]].hyper[every]) if isinstance(every, str) \
            else int(every)

    def _due(self, i: int, k: KernelInfo) -> bool:
        """Whether parameter ``i``'s next step runs its refresh rule: its first step, and
        then every ``every`` steps (its steps 1, 1 + every, 1 + 2 every, ...)."""
        return k.refresh is not None and (self._refreshed[i] is None or
                                          self._steps[i] % self._refresh_every(i, k) == 0)

    @property
    def refresh_due(self) -> bool:
        """Whether the next step() runs a refresh rule (and so reads the statistics, e.g.
        THOR's A and G): a trainer computes them only then."""
        return any(self._due(i, self._param_kernel(i)) for i in range(len(self.params)))

    def _refresh_due(self, grads: list, stats: Mapping[str, Any]) -> dict[int, dict]:
        """Parameter -> its statistics (numpy float64) for the parameters this step
        refreshes; every statistic is checked before anything changes."""
        if not self._refreshing:        # (most specs: nothing to do per step)
            return {}
        for name, arrays in stats.items():
            if tensors.library(arrays) is not None or not isinstance(arrays, (list, tuple)):
                raise TypeError(f"{self.name}: {name} must be a list with one matrix (or "
                                "None) per parameter")
            if len(arrays) != len(self.params):
                raise ValueError(f"{self.name}: got {len(arrays)} {name} matrices for "
                                 f"{len(self.params)} parameters")
        out = {}
        for i, g in enumerate(grads):
            if g is None:
                continue
            k = self._param_kernel(i)
            if not self._due(i, k):
                continue
            d = self._dims[i]
            out[i] = {}
            for name in k.refresh["reads"]:
                n = d[1] if self.artifact.statistics[name] == "rr" else d[2]
                what = (f"{self.name}: step {self._steps[i] + 1} of {self._label(i)} refreshes "
                        f"and reads statistic {name!r} ({n} x {n})")
                a = stats.get(name, [None] * len(self.params))[i]
                if a is None:
                    raise ValueError(f"{what}, which is missing: pass step(grads, "
                                     f"{', '.join(f'{s}=[...]' for s in k.refresh['reads'])}) "
                                     "on steps where opt.refresh_due is True")
                lib = tensors.library(a)
                if lib is None:
                    raise TypeError(f"{what}; got {type(a).__name__}, not an array")
                host = np.asarray(tensors.to_numpy(a, lib), dtype=np.float64)
                if host.shape != (n, n):
                    raise ValueError(f"{what}; got shape {tuple(host.shape)}")
                if not np.isfinite(host).all():
                    raise ValueError(f"{what}; it has NaN or Inf values")
                out[i][name] = host
        return out

    def _refresh(self, i: int, k: KernelInfo, env: Mapping[str, Any],
                 stats: Mapping[str, np.ndarray]) -> None:
        """Run parameter ``i``'s refresh rule on the host (numpy, float64) and store the
        new states in their dtype."""
        lib, st, d = self._lib[i], self.state[i], self._dims[i]
        arrays = {n: tensors.to_numpy(v, lib) for n, v in st.items()
                  if not isinstance(v, np.floating)}
        arrays["w"] = tensors.to_numpy(self.params[i], lib)
        arrays.update(stats)
        axes = {**k.buffer_axes, **{n: self.artifact.statistics[n].upper() for n in stats}}
        scalars = {**env, **{n: v for n, v in st.items() if isinstance(v, np.floating)},
                   "rows": d[1], "cols": d[2]}
        new = reference.evaluate(k.refresh["ir"], "float64", arrays, axes, scalars, d)
        for name, value in new.items():
            tensors.copy_into(st[name], lib, value)
        self._refreshed[i] = self._steps[i]

    def _current_runs(self) -> dict[int, tuple[int, list[tuple[Callable, list]], list]]:
        """The flat runs under the current kernels (found again after a flag, state or
        multiplier change); none for the reference backend, which is the oracle."""
        if self.backend != "compiled" or not self._chain_of:
            return {}
        # kernels to prepare again come as a new _prepared list (set_hyper, load_state_dict)
        if self._runs is None or self._runs_for is not self._prepared:
            for i in range(len(self.params)):
                self._param_kernel(i)
            self._runs, self._runs_for = self._find_runs(), self._prepared
            self._grad_spans.clear()
        return self._runs

    @staticmethod
    def _pack(k: KernelInfo, values: Mapping[str, Any]) -> np.ndarray:
        """The kernel's scalar array: float64 on the host, rounded once to the kernel dtype."""
        return np.array([values[s] for s in k.scalars], dtype=k.dtype)

    def _arrays(self, i: int, k: KernelInfo, g, extra: Mapping[str, Any]) -> dict[str, Any]:
        """Kernel arguments by buffer name (without the gradient when ``g`` is None)."""
        st, lib = self.state[i], self._lib[i]
        arrays = {**({} if g is None else {"grad": tensors.kernel_arg(g, lib)}),
                  **{n: tensors.kernel_arg(a, lib) for n, a in extra.items()},
                  **{n: st[n] for n in k.buffers if n in st}}
        if self._mixed(i):
            arrays["w"], arrays[LOW_COPY] = st["master"], self._kargs[i]
        else:
            arrays["w"] = self._kargs[i]
        return arrays

    def _workspace(self, i: int, k: KernelInfo, d: tuple[int, int, int]) -> dict[str, Any]:
        """Parameter ``i``'s workspaces for kernel ``k``, kept between steps: float64
        reduction buffers, and a matrix rule's temporaries in the kernel dtype."""
        ws = self._work[i].get(k.symbol)
        if ws is None:
            ws = self._work[i][k.symbol] = {
                n: tensors.full_like(self.params[i], self._lib[i],
                                     (self.artifact.reduction_buffer_size,) if not axes
                                     else views.extents(d, axes), 0.0,
                                     self.artifact.reduction_dtype if n.startswith("_red")
                                     else k.dtype)
                for n, axes in k.workspaces.items()}
        return ws

    def _run(self, i: int, k: KernelInfo, g, scalars: np.ndarray,
             extra: Mapping[str, Any]) -> None:
        d = self._dims[i]
        if self.backend == "compiled":
            step = {"grad": tensors.kernel_arg(g, self._lib[i]),
                    **{n: tensors.kernel_arg(a, self._lib[i]) for n, a in extra.items()}}
            wrap = bfloat16_tensor if self._bf16_numpy[i] else _same

            def call(fn, args):
                fn(*[a if type(a) is not tuple else
                     wrap(views.as_kernel(step[a[0]], a[1], d, a[2])) for a in args], scalars)
            if k.matrix:                 # its plan may hold loops
                _run_loops(self._plans[i], call, scalars)
            else:
                for fn, args in self._plans[i]:
                    call(fn, args)
            return
        arrays = self._arrays(i, k, g, extra)
        lib = self._lib[i]
        host = {n: tensors.numpy_view(a, lib) for n, a in arrays.items()}
        new = reference.evaluate(k.ir, k.dtype, host, k.buffer_axes,
                                 dict(zip(k.scalars, scalars)), d)
        for name, value in new.items():
            host[name][...] = value

    def _run_lazy(self, i: int, k: KernelInfo, g: RowSparse, scalars: np.ndarray) -> None:
        """The rule on the rows ``g`` names only (indices unique and in range)."""
        p = self.params[i]
        rows = g.rows.reshape(len(g.indices), -1)
        full = self._arrays(i, k, rows, {})
        full.pop("grad")
        if self.backend == "compiled":
            arrays = {"grad": rows, "_indices": g.indices,
                      **{n: a.reshape(-1) for n, a in full.items()}}
            self.artifact.function(k.lazy["symbol"])(
                *(bfloat16_tensor(arrays[b]) for b in k.lazy["buffers"]), scalars)
            return
        sub = {"grad": rows.reshape(-1),
               **{n: a.reshape(p.shape[0], -1)[g.indices].reshape(-1) for n, a in full.items()}}
        new = reference.evaluate(k.ir, k.dtype, sub, k.buffer_axes,
                                 dict(zip(k.scalars, scalars)), (1, 1, rows.size))
        for name, value in new.items():
            full[name].reshape(p.shape[0], -1)[g.indices] = value.reshape(len(g.indices), -1)

    # -- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs, as plain Python values and numpy copies:
        states (master copies included), step counts, each group's hyperparameters and
        layout, multipliers, and the spec's hash. Schedules are code: a group whose lr
        is a schedule records ``lr_schedule: True`` and resumes with the schedule the new
        optimizer was given (it is a function of ``t``, which is restored)."""
        return {
            "format": checkpoint.FORMAT, "optimizer": self.name,
            "spec_hash": checkpoint.spec_hash(self.artifact), "key": self.artifact.key,
            "t": self.t, "param_steps": list(self._steps), "skipped_steps": self.skipped_steps,
            "hyper": dict(self._defaults),
            "groups": [{"hyper": dict(g.hyper), "lr_schedule": g.lr is not None,
                        "params": [i for i, x in enumerate(self._group_of) if x == gi]}
                       for gi, g in enumerate(self._groups)],
            "params": [{"name": n, "shape": list(p.shape),
                        "dtype": tensors.dtype_name(p, lib)}
                       for n, p, lib in zip(self.names, self.params, self._lib)],
            "lr_mult": list(self._lr_mult), "wd_mult": list(self._wd_mult),
            "refreshed": list(self._refreshed),
            "state": [{n: (float(v) if isinstance(v, np.floating) else
                           tensors.to_numpy(v, lib)) for n, v in st.items()}
                      for st, lib in zip(self.state, self._lib)]}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore a ``state_dict``; validated whole before anything is overwritten."""
        plan = checkpoint.check(self, sd)
        for i, (mine, theirs) in enumerate(zip(self.state, sd["state"])):
            for n in list(mine):
                if isinstance(mine[n], np.floating):
                    mine[n] = np.float64(theirs[n])
                else:
                    tensors.copy_into(mine[n], self._lib[i], np.asarray(theirs[n]))
        self._defaults = plan["defaults"]
        for g, h in zip(self._groups, plan["groups"]):
            g.hyper = h
        self.t = int(sd["t"])
        self._steps = [int(s) for s in sd["param_steps"]]
        self.skipped_steps = int(sd.get("skipped_steps", 0))
        self._lr_mult = [float(x) for x in sd["lr_mult"]]
        self._wd_mult = [float(x) for x in sd["wd_mult"]]
        self._refreshed = [None if r is None else int(r)
                           for r in sd.get("refreshed", [None] * len(self.params))]
        self._prepared = [None] * len(self.params)

    def save(self, path: str) -> None:
        """Write ``state_dict()`` to ``path`` (npz + json, no pickle; atomic)."""
        checkpoint.save(path, self.state_dict())

    def load(self, path: str) -> None:
        """Restore a checkpoint written by ``save``."""
        self.load_state_dict(checkpoint.load(path))

    def __repr__(self) -> str:
        hp = ", ".join(f"{k}={v!r}" for k, v in self._defaults.items())
        return (f"<optgen {self.name} ({len(self.params)} params, {len(self._groups)} "
                f"group(s), t={self.t}): {hp}>")


GRAD = object()   # a run's argument slot for the gradient span
REPEAT = object()  # a plan entry: the next entries run a hyperparameter's number of times


def _run_loops(plan: list, call: Callable, scalars: np.ndarray) -> None:
    """A matrix rule's plan: ``(REPEAT, ((slot, times), length))`` runs the next
    ``length`` entries ``times`` times (or the value of scalar ``slot``: Newton-Schulz
    iterations); other entries are calls."""
    j = 0
    while j < len(plan):
        fn, args = plan[j]
        if fn is not REPEAT:
            call(fn, args)
            j += 1
            continue
        (slot, times), length = args
        if slot is not None:
            times = round(float(scalars[slot]))
        for _ in range(times):
            for body in plan[j + 1:j + 1 + length]:
                call(*body)
        j += 1 + length


def _same(x: Any) -> Any:
    return x


def _numel(x: Any) -> int:
    return int(np.prod(tuple(x.shape), dtype=np.int64))


__all__ = ["Optimizer", "aligned_full", "default_decay_filter"]

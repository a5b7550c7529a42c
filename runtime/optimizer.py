"""The trainer-side optimizer: the public ``Optimizer`` class, which ties the runtime's
rooms together. A step is:

    check       gradients, extra inputs, statistics; with parameters split across
                ranks, every rank passed them          (inputs.py, refresh.py, shards.py)
    preprocess  lr of each group (schedules), loss scale, global norm / non-finite
                check, gradient centralization                  (groups.py, preprocess.py)
    plan        per parameter (or flat run): its kernel, its host scalars in float64,
                its refresh rule                                (launch.py, scalars.py,
                                                                 refresh.py)
    launch      the kernel calls, in place                      (launch.py, flat.py)
    count       t and each parameter's step count

Every input is checked before any kernel runs, so an error (or a skipped step) leaves
parameters and states bit-identical. Messages name the optimizer, the parameter
(index and name), the value and the rule.

Also: groups.py and hyper.py (groups, hyperparameters, lr schedules, multipliers),
state.py (state allocation), checkpoint.py (state_dict checks and files). This module
is the top of the runtime: no runtime module but ``__init__.py`` imports it.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from . import checkpoint, flat, launch, preprocess, refresh, scalars, state
from optgen.core import formats, scalar_expr
from . import shards as shards_
from . import groups as grouping
from . import inputs as checks
from . import tensors
from optgen.core import views
from .artifact import Artifact, KernelInfo
from .groups import DEFAULT_NO_DECAY, default_decay_filter   # noqa: F401 (re-exported)
from .inputs import NONFINITE                                # noqa: F401 (re-exported)
from .preprocess import NORM_EPS                             # noqa: F401 (re-exported)
from .sparse import RowSparse
from .tensors import aligned_full


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
                 loss_scale: float = 1.0, begin_num_update: int = 0,
                 state_format: Any = None, state_format_min_size: int = formats.MIN_SIZE,
                 stochastic_rounding: bool = False, seed: int = 0,
                 shards: shards_.Shards | None = None, **hyper: Any):
        self.artifact = artifact
        self.name = name = artifact.name
        if backend not in ("compiled", "reference"):
            raise ValueError(f"{name}: backend must be 'compiled' or 'reference', got {backend!r}")
        self.backend = backend
        if lazy_update is None:
            lazy_update = artifact.lazy_update_default
        self.lazy_update = checks.check_bool(name, "lazy_update", lazy_update)
        self.multi_precision = checks.check_bool(name, "multi_precision", multi_precision)
        self.clip_global_norm = None if clip_global_norm is None else \
            checks.check_positive(name, "clip_global_norm", clip_global_norm)
        self.nonfinite = checks.check_nonfinite(name, nonfinite)
        self._shards = shards_.check(name, backend, shards, artifact, clip_global_norm or nonfinite)
        self.loss_scale = checks.check_positive(name, "loss_scale", loss_scale)
        checks.check_scaling(name, artifact.hypers, self.loss_scale, self.clip_global_norm)
        self.t = checks.check_begin_num_update(name, begin_num_update)  # updates applied
        self.skipped_steps = 0                # steps skipped for non-finite gradients
        self.last_grad_norm: float | None = None

        # parameters, their names and groups (accepted: options the spec takes unused)
        self.accepted = {n: hyper.pop(n) for n in list(hyper) if n in artifact.accepted}
        entries, parsed = grouping.parse(name, params, artifact.hypers)
        self.params: list[Any] = [e.array for e in entries]
        n = len(self.params)
        self._lib: list[str] = checks.check_params(name, artifact, self.params,
                                                   self.multi_precision)
        self.names: list[str | None] = checks.check_names(name, [e.name for e in entries],
                                                          param_names, n)
        self._group_of: list[int] = [e.group for e in entries]
        defaults = {h: info.default for h, info in artifact.hypers.items()}
        top = grouping.alias(name, artifact.hypers, hyper)
        self._defaults, self._default_lr = self._resolve(defaults, None, top)
        self._groups: list[grouping.RuntimeGroup] = []
        for g in parsed:
            h, lr = self._resolve(self._defaults, self._default_lr, g.overrides)
            self._groups.append(grouping.RuntimeGroup(h, lr, set(g.overrides),
                                                      g.grad_centralization))
        checks.check_centralization(name, self.params, self._group_of,
                                    [g.grad_centralization for g in self._groups], self.names)
        self._centralized = [i for i, gi in enumerate(self._group_of)
                             if self._groups[gi].grad_centralization]

        # per parameter: flags set by shape and name, multipliers
        self._dims = [views.dims(tuple(p.shape)) for p in self.params]
        self._flags_fixed = [{f: bool(scalar_expr.evaluate(rule, views.shape_env(shape)))
                              for f, rule in artifact.shape_flags.items()}
                             for shape in shards_.whole_shapes(self.params, shards)]
        for flags, by_name in zip(self._flags_fixed, grouping.name_flags(
                name, artifact.name_flags, name_filters, self.names)):
            flags.update(by_name)
        self._lr_mult, self._wd_mult = [1.0] * n, [1.0] * n
        grouping.decay_filter(name, decay_filter, self.names, self._group_of, self._groups,
                              self._wd_mult)

        # states, kernels and launches
        self._steps = [self.t] * n               # per parameter (bias corrections)
        self.state: list[dict[str, Any]] = [{} for _ in self.params]
        self._is_mixed = [self.multi_precision and tensors.dtype_name(p, lib) in
                          tensors.LOW_PRECISION for p, lib in zip(self.params, self._lib)]
        self.state_format = formats.rounded(name, formats.request(name, state_format),
                                            stochastic_rounding)
        self.seed = checks.check_seed(name, seed)    # of stochastic rounding
        self._formatted = state.formatted(name, artifact, self.state_format, self.params,
                                          state_format_min_size)
        self._launch = launch.Launcher(name, artifact, backend, self.params, self._lib,
                                       self.state, self._is_mixed, self._dims, self._formatted)
        for mults, setter in ((lr_mult, self.set_lr_mult), (wd_mult, self.set_wd_mult)):
            if mults:
                setter(mults)
        for i, lib in enumerate(self._lib):
            if self._is_mixed[i]:   # the float32 master copy the kernel updates
                self.state[i][state.MASTER] = state.master_copy(self.params[i], lib)
        self._prepared: list[KernelInfo | None] = [None] * n  # kernels under current flags
        # flat chains (runtime/flat.py): parameters back to back get back-to-back states
        self._chains = flat.chains(self.params, self._lib, [   # (split ones step alone)
            not m and not shards_.split(shards, i) for i, m in enumerate(self._is_mixed)])
        self._chain_of = {i: (a, b) for a, b in self._chains for i in range(a, b)}
        # gradients that passed the checks, by parameter (see inputs.check_grads);
        # forgotten when states change (a new state must be checked against)
        self._checked: list[tuple | None] = [None] * n
        self._refreshed: list[int | None] = [None] * n  # (step of the last refresh)
        self._refreshing = any(k.refresh is not None for k in artifact.kernels)
        checks.check_kernels(name, artifact, self.params, self._lib, self._flags,
                             self.names, self._formatted, self.multi_precision)
        for i in range(n):
            self._ensure_state(i)

    # -- per parameter: flags, states, kernel --------------------------------------------
    def _flags(self, i: int) -> dict[str, bool]:
        """Parameter ``i``'s flags: its group's, then those set by its shape and name."""
        h = self._groups[self._group_of[i]].hyper
        return {**{n: h[n] for n in self.artifact.flags}, **self._flags_fixed[i]}

    def _state_init(self, i: int, s) -> tuple[float, str] | None:
        gi, art = self._group_of[i], self.artifact
        return state.init_value(
            s, self.state[i], self._flags(i),
            lambda: scalars.group_env(art.hypers, self._groups[gi].hyper,
                                      self._lr_value(gi, self.t), 1.0, self.t),
            tensors.compute_dtype(tensors.dtype_name(self.params[i], self._lib[i])),
            art.stored if self._formatted[i] else {})

    def _ensure_state(self, i: int) -> None:
        state.allocate(self.artifact.states, i, self.params, self._lib[i], self.state,
                       self._chain_of.get(i, (i, i + 1)), self._state_init)

    def _param_kernel(self, i: int) -> KernelInfo:
        """Parameter ``i``'s kernel under the current flags, with its states ready for it
        (cached: only a flag change, through set_hyper or load_state_dict, redoes this)."""
        k = self._prepared[i]
        if k is not None:
            return k
        k = self._launch.select(i, self._flags(i))
        self._ensure_state(i)
        state.convert(self.state[i], self._lib[i], k)
        self._prepared[i] = k
        self._launch.prepare(i, k)
        self._checked[i] = None
        return k

    # -- hyperparameters ---------------------------------------------------------------
    def _resolve(self, current: Mapping[str, Any], current_lr, changes: Mapping[str, Any]
                 ) -> tuple[dict[str, Any], Callable | None]:
        return grouping.resolve(self.name, self.artifact, self.t, current, current_lr, changes)

    def _lr_value(self, gi: int, step: int) -> float | None:
        return grouping.lr_value(self.name, self.artifact.hypers, self._groups[gi], step)

    @property
    def hyper(self) -> dict[str, Any]:
        """The optimizer-wide hyperparameters (groups may override them); change them
        with ``set_hyper``."""
        return dict(self._defaults)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Each group's parameters, names and hyperparameters (copies; the lr entry is
        the schedule where the group has one)."""
        return grouping.describe(self._groups, self._group_of, self.params, self.names)

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

    def set_lr_mult(self, mults: Mapping) -> None:
        """MXNet's per-parameter lr multipliers, by name or index: lr_i = lr * mult."""
        for i, v in grouping.multipliers(self.name, "lr_mult", mults, self.names).items():
            self._lr_mult[i] = v
        self._launch.forget_runs()

    def set_wd_mult(self, mults: Mapping) -> None:
        """MXNet's per-parameter weight-decay multipliers, by name or index."""
        for i, v in grouping.multipliers(self.name, "wd_mult", mults, self.names).items():
            self._wd_mult[i] = v
        self._launch.forget_runs()

    # -- stepping ----------------------------------------------------------------------
    def step(self, grads: Sequence[Any], **inputs: Sequence[Any]) -> bool:
        """One update of every parameter that has a gradient, in place. Returns False
        when the step was skipped for a non-finite gradient (``nonfinite="skip"``).
        Extra inputs (SVRG: ``step(grads, grad_snapshot=[...], full_grad=[...])``) and
        statistics (THOR: ``A=[...], G=[...]``, None where there is none; read when
        ``refresh_due``) are passed by name. Kernels are found before anything changes."""
        art = self.artifact
        with shards_.agreed(self._shards, self.name, grads):   # all ranks passed, or none
            stats = {n: inputs.pop(n) for n in list(inputs) if n in art.statistics}
            grads = self._check_grads(grads, "grads", self._checked)       # check
            extra = checks.check_inputs(self.name, art.inputs, inputs, grads, self._check_grads)
            for i in (i for i, g in enumerate(grads) if g is not None and not self._prepared[i]):
                self._launch.select(i, self._flags(i))
            due = self._refresh_due(grads, stats)
        used = sorted({self._group_of[i] for i, g in enumerate(grads) if g is not None})
        lrs = {gi: self._lr_value(gi, self.t) for gi in used}               # preprocess
        scale, norm = preprocess.grad_scale(
            self.name, grads, self._lib, self._group_of,
            [g.hyper.get("rescale_grad", 1.0) for g in self._groups], self.loss_scale,
            self.clip_global_norm, self.nonfinite, self.names, self._shards)
        self.last_grad_norm = self.last_grad_norm if norm is None else norm
        if scale is None:
            self.skipped_steps += 1
            return False
        if self._centralized:
            preprocess.centralize(grads, self._lib, self._centralized)
        self.t += 1                                                         # count
        envs = {gi: scalars.group_env(art.hypers, self._groups[gi].hyper, lrs[gi], scale,
                                      self.t) for gi in used}
        self._launch_all(grads, extra, due, envs, lrs)                      # plan, launch
        return True

    def _check_grads(self, grads: Any, what: str, checked: list | None = None) -> list[Any]:
        return checks.check_grads(self.name, self.params, self._lib, grads, what, checked,
                                  self._guarded, self._row_sparse)

    def _guarded(self, i: int) -> list[Any]:
        """The state arrays of parameter ``i`` (a gradient must not overlap them)."""
        return state.arrays(self.state[i])

    def _row_sparse(self, i: int, p, g: RowSparse):
        """A valid RowSparse gradient, coalesced; or its dense array (lazy_update off,
        or a rule with whole-tensor reductions, which has no lazy variant)."""
        checks.check_row_sparse(self.name, i, p, self._lib[i], g,
                                self._groups[self._group_of[i]].grad_centralization)
        k = self._prepared[i] or self._launch.select(i, self._flags(i))
        if not self.lazy_update or k.lazy is None:
            return g.to_dense(p.shape)
        return g.coalesce()

    def _launch_all(self, grads: list, extra: list, due: Mapping[int, dict],
                    envs: Mapping[int, dict], lrs: Mapping[int, float | None]) -> None:
        """Each parameter with a gradient, or each flat run whose gradients lie back to
        back: its kernel, its step count, its host scalars (computed once for parameters
        with one kernel, group, step and multipliers unless they read scalar states or
        the shape), its refresh rule, then its launch."""
        launcher, runs = self._launch, self._current_runs()
        prepared, steps, states = self._prepared, self._steps, self.state
        shared: dict[tuple, tuple] = {}
        end, split = 0, []      # split: the passes of parameters split across ranks
        for i, g in enumerate(grads):
            if g is None or i < end:
                continue
            k = prepared[i] or self._param_kernel(i)
            run = runs.get(i)
            if run is not None:
                gspan = launcher.fused(i, run, k, grads, steps)
                if gspan is not None:           # one call for parameters i .. end - 1
                    end = run[0]
                    for x in range(i + 1, end):
                        steps[x] += 1
            gi, st = self._group_of[i], states[i]
            steps[i] += 1
            lm, wm = self._lr_mult[i], self._wd_mult[i]
            key = (k.symbol, gi, steps[i], lm, wm)
            hit = shared.get(key)
            if hit is None:
                hit = shared[key] = scalars.step_values(k, envs[gi], steps[i], self.t, lm, wm,
                                                        lrs[gi] is not None)
            values, packed = hit
            if i in due:
                refresh.run(k, self.artifact.statistics, values, due[i], st, self.params[i],
                            self._lib[i], self._dims[i])
                self._refreshed[i] = steps[i]
            if k.scalar_state_updates or packed is None:  # scalar states, shape scalars
                packed = scalars.param_values(k, values, st, self._dims[i], packed)
                for x in range(i + 1, end):     # the run's parameters had the same values
                    states[x].update((n, st[n]) for n in k.scalar_state_updates)
            if k.stochastic:                    # (a key per parameter and step)
                packed = scalars.keyed(k, packed, self.seed, steps[i], i)
            if i < end:
                launcher.run_fused(run, gspan, packed, i)
            elif isinstance(g, RowSparse):
                if len(g.indices) and self.params[i].size:
                    launcher.run_lazy(i, k, g, packed)
            elif shards_.split(self._shards, i):
                split.append(launcher.passes(i, k, g, packed, extra[i], self._shards.splits[i]))
            elif launcher.numel[i]:
                launcher.run(i, k, g, packed, extra[i])
        if split:
            shards_.run(self._shards, split)

    def _current_runs(self) -> dict[int, launch.Run]:
        """The flat runs under the current kernels (found again after a flag, state or
        multiplier change); none for the reference backend, which is the oracle."""
        if self.backend != "compiled" or not self._chains:
            return {}
        # kernels to prepare again come as a new _prepared list (set_hyper, load_state_dict)
        if self._launch.runs_for is not self._prepared:
            for i in range(len(self.params)):
                self._param_kernel(i)
            self._launch.find_runs(self._prepared, self._chains, self._group_of,
                                   self._lr_mult, self._wd_mult)
        return self._launch.runs

    # -- refresh rules (matrix specs: THOR's inverses) -----------------------------------
    def _due(self, i: int, k: KernelInfo) -> bool:
        return refresh.due(k, self._refreshed[i], self._steps[i],
                           self._groups[self._group_of[i]].hyper)

    @property
    def refresh_due(self) -> bool:
        """Whether the next step() runs a refresh rule (and so reads the statistics, e.g.
        THOR's A and G): a trainer computes them only then."""
        return any(self._due(i, self._param_kernel(i)) for i in range(len(self.params)))

    def _refresh_due(self, grads: list, stats: Mapping[str, Any]) -> dict[int, dict]:
        if not self._refreshing:        # (most specs: nothing to do per step)
            return {}
        return refresh.collect(self.name, self.artifact.statistics, stats, grads,
                               self._param_kernel, self._due, self._dims, self._steps,
                               self.names)

    # -- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs, as plain Python values and numpy copies:
        states (master copies included), step counts, each group's hyperparameters and
        layout, multipliers, and the spec's hash. Schedules are code: a group whose lr
        is a schedule records ``lr_schedule: True`` and resumes with the schedule the new
        optimizer was given (it is a function of ``t``, which is restored)."""
        return checkpoint.state_dict(self)

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore a ``state_dict``; validated whole before anything is overwritten."""
        checkpoint.apply(self, checkpoint.check(self, sd))

    def save(self, path: str) -> None:
        """Write ``state_dict()`` to ``path`` (npz + json, no pickle; atomic)."""
        checkpoint.save(path, self.state_dict())

    def load(self, path: str) -> None:
        """Restore a checkpoint written by ``save``."""
        self.load_state_dict(checkpoint.load(path))

    def __repr__(self) -> str:
        hp = ", ".join(f"{k}={v!r}" for k, v in self._defaults.items())
        return f"<optgen {self.name} ({len(self.params)} params, {len(self._groups)} " \
            f"group(s), t={self.t}): {hp}>"


__all__ = ["Optimizer", "aligned_full", "default_decay_filter"]

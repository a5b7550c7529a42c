"""The public ``Optimizer`` class ties the runtime's rooms together. A step (design.md):

    gather  ``check_step``: moved parameter data followed; gradients (noted in
            gradcache.py), extra inputs, statistics, lrs, loss scale, global norm and
            non-finite check, into one ``StepInputs``  (storage, inputs, preprocess)
    launch  ``run_step``: centralization, each group's host scalars, the step's
            launches (strategies/: runs, then each parameter's own strategy)

Everything the optimizer knows about a parameter is in its record (``ParamSlot``,
slots.py), one table (``records``) in parameter order. Every input is checked
(``check_step``) before any kernel runs (``run_step``), so an error or a skipped step
leaves parameters and states bit-identical. Messages name the optimizer, the parameter
(index and name), the value and the rule. Also: groups, hyper, state, checkpoint, capture,
refresh rules (refresh.RefreshRules), prebuild. Only ``__init__.py`` imports this module."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from . import capture, checkpoint, gradcache, launch, preprocess, refresh, scalars, state
from optgen.core import formats, views
from . import checks, groups, prebuild, shards as shards_, storage, strategies, tensors
from .artifact import Artifact, KernelInfo
from .groups import DEFAULT_NO_DECAY, default_decay_filter   # noqa: F401 (re-exported)
from .checks import NONFINITE                                # noqa: F401 (re-exported)
from .preprocess import NORM_EPS                             # noqa: F401 (re-exported)
from .slots import ParamSlot, RecordTable
from .strategies import StepInputs
from .sparse import RowSparse
from .tensors import aligned_full


class Optimizer(refresh.RefreshRules, RecordTable):
    """Steps arrays (numpy, torch, CuPy) in place with an artifact's kernels.

    ``backend="reference"`` runs the reference interpreter instead of the compiled
    kernels (same IR, same host scalars): the oracle used by the tests.
    See README ("The runtime") for every argument.
    """

    def __init__(self, artifact: Artifact, params: Any, *,
                 backend: str = "compiled", lazy_update: bool | None = None,
                 multi_tensor: bool = True, capturable: bool = False,
                 param_names: Sequence[str] | None = None,
                 name_filters: Mapping[str, Any] | None = None,
                 lr_mult: Mapping | None = None, wd_mult: Mapping | None = None,
                 decay_filter: Any = "default", multi_precision: bool = False,
                 clip_global_norm: float | None = None, nonfinite: str | None = None,
                 loss_scale: float = 1.0, begin_num_update: int = 0,
                 state_format: Any = None, state_format_min_size: int = formats.MIN_SIZE,
                 stochastic_rounding: bool = False, master_format: Any = None, seed: int = 0,
                 shards: shards_.Shards | None = None, **hyper: Any):
        self.artifact = artifact
        self.name = name = artifact.name
        if backend not in ("compiled", "reference"):
            raise ValueError(f"{name}: backend must be 'compiled' or 'reference', got {backend!r}")
        self.backend = backend
        if lazy_update is None:
            lazy_update = artifact.lazy_update_default
        self.lazy_update = checks.check_bool(name, "lazy_update", lazy_update)
        self.multi_precision = checks.check_master(name, multi_precision, master_format)
        self.multi_tensor = checks.check_bool(name, "multi_tensor", multi_tensor)
        self._scalars = capture.scalar_buffers(name, checks.check_bool(name, "capturable", capturable),
                                  shards, clip_global_norm or nonfinite)
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
        entries, parsed = groups.parse(name, params, artifact.hypers)
        arrays = [e.array for e in entries]
        libs = checks.check_params(name, artifact, arrays, self.multi_precision, backend)
        names = checks.check_names(name, [e.name for e in entries], param_names, len(arrays))
        self._slots: tuple[ParamSlot, ...] = tuple(   # the record table (slots.py)
            ParamSlot(i, e.array, libs[i], names[i], e.group, views.dims(tuple(e.array.shape)),
                      steps=self.t, split=shards_.split(shards, i))
            for i, e in enumerate(entries))
        defaults = {h: info.default for h, info in artifact.hypers.items()}
        top = groups.alias(name, artifact.hypers, hyper)
        self._defaults, self._default_lr = self._resolve(defaults, None, top)
        self._groups: list[groups.RuntimeGroup] = []
        for g in parsed:
            h, lr = self._resolve(self._defaults, self._default_lr, g.overrides)
            self._groups.append(groups.RuntimeGroup(h, lr, set(g.overrides),
                                                      g.grad_centralization))
        checks.check_centralization(name, self._slots,
                                    [g.grad_centralization for g in self._groups])
        self._centralized = [s for s in self._slots if self._groups[s.group].grad_centralization]

        # per parameter: flags set by shape and name, multipliers
        for s, shape in zip(self._slots, shards_.whole_shapes(arrays, shards)):
            s.fixed_flags = groups.shape_flags(artifact.shape_flags, self._groups[s.group].hyper, shape)
        for s, by_name in zip(self._slots, groups.name_flags(
                name, artifact.name_flags, name_filters, names)):
            s.fixed_flags.update(by_name)
        groups.decay_filter(name, decay_filter, self._slots, self._groups)

        # states, kernels and launches
        self.state_format = formats.mastered(name, formats.rounded(
            name, formats.request(name, state_format), stochastic_rounding), master_format)
        self.seed = checks.check_seed(name, seed)    # of stochastic rounding
        for s, fmt in zip(self._slots, state.formatted(
                name, artifact, self.state_format, shards_.whole_shapes(arrays, shards),
                state_format_min_size)):
            s.formatted = fmt
        self._launch = launch.Launcher(name, artifact, backend, self._slots)
        self._launches: strategies.Launches | None = None   # None: found next step
        self._grads = gradcache.GradCache(len(self._slots))   # the gradients last seen
        for mults, setter in ((lr_mult, self.set_lr_mult), (wd_mult, self.set_wd_mult)):
            if mults:
                setter(mults)
        # kernel arguments, master copies, flat chains (back to back: so are the states)
        self._storage = storage.Storage(name, self._slots, self._launch, self.multi_precision,
                                        self._grads)
        self._refreshing = any(k.refresh is not None for k in artifact.kernels)
        checks.check_kernels(name, artifact, self._slots, flags_of=self._flags,
                             multi_precision=self.multi_precision)
        checks.check_heads(name, artifact, self._slots, self._groups, self._flags)
        if prebuild.wanted(artifact):   # (matrix rules: no build during training)
            prebuild.build_now(self._launch, self._flags, bool(clip_global_norm or nonfinite))
        for i in range(len(self._slots)):
            self._ensure_state(i)

    # -- the record table (and records, params, names, state: slots.RecordTable) --------
    @property
    def groups(self) -> tuple[groups.RuntimeGroup, ...]:
        """The groups (hyperparameters and lr schedule); change them with set_hyper."""
        return tuple(self._groups)

    @property
    def shards(self) -> shards_.Shards | None:
        """The parameters split across ranks and their collective (None: none is)."""
        return self._shards

    def forget_kernels(self) -> None:
        """Prepare every kernel, state, plan and strategy again: flags or states changed."""
        for s in self._slots:
            s.forget_kernel()
        self._launches = None

    def watch(self, ready: Callable[[int], None], done: Callable[[int], None]) -> None:
        """``ready(i)`` before parameter ``i``'s kernels, ``done(i)`` after (offload)."""
        self._launch.watch(ready, done)

    # -- per parameter: flags, states, kernel --------------------------------------------
    def _flags(self, i: int) -> dict[str, bool]:
        """Parameter ``i``'s flags: its group's, then those set by its shape and name."""
        h = self._groups[self._slots[i].group].hyper
        return {**{n: h[n] for n in self.artifact.flags}, **self._slots[i].fixed_flags}

    def _state_init(self, slot: ParamSlot, s) -> tuple[float, str] | None:
        gi, art = slot.group, self.artifact
        return state.init_value(
            s, slot.state, self._flags(slot.index),
            lambda: scalars.group_env(art.hypers, self._groups[gi].hyper,
                                      self._lr_value(gi, self.t), 1.0, self.t),
            tensors.compute_dtype(tensors.dtype_name(slot.array, slot.lib)),
            art.stored if slot.formatted else {})

    def _ensure_state(self, i: int) -> None:
        s = self._slots[i]
        chain = self._slots[s.chain[0]:s.chain[1]] if s.chain else (s,)
        state.allocate(self.artifact.states, s, chain, self._state_init)
        state.allocate_correction(s, chain, self.artifact.state_format)

    def _param_kernel(self, i: int) -> KernelInfo:
        """Parameter ``i``'s kernel under the current flags, its states and strategy ready
        (cached: only a flag change, by set_hyper or load_state_dict, redoes this)."""
        s = self._slots[i]
        if s.kernel is not None:
            return s.kernel
        k = self._launch.select(i, self._flags(i))
        self._ensure_state(i)
        state.convert(s.state, s.lib, k)
        s.kernel = k
        self._launch.prepare(i, k)
        s.strategy = strategies.choose(self._launch, s, self.lazy_update)
        return k

    # -- hyperparameters ---------------------------------------------------------------
    def _resolve(self, current: Mapping[str, Any], current_lr, changes: Mapping[str, Any]
                 ) -> tuple[dict[str, Any], Callable | None]:
        return groups.resolve(self.name, self.artifact, self.t, current, current_lr, changes)

    def _lr_value(self, gi: int, step: int) -> float | None:
        return groups.lr_value(self.name, self.artifact.hypers, self._groups[gi], step)

    @property
    def hyper(self) -> dict[str, Any]:
        """The optimizer-wide hyperparameters (groups may override them; set_hyper)."""
        return dict(self._defaults)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Each group's parameters, names and hyperparameters (copies; the lr entry is
        the schedule where the group has one)."""
        return groups.describe(self._groups, self._slots)

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
        changes = groups.alias(self.name, self.artifact.hypers, changes)
        groups.check_shape_hypers(self.name, self.artifact.shape_flags, changes, self._groups)
        if group is not None and not (isinstance(group, int) and 0 <= group < len(self._groups)):
            raise ValueError(f"{self.name}: group must be an index below {len(self._groups)}, "
                             f"got {group!r}")
        targets = range(len(self._groups)) if group is None else [group]
        new = {gi: self._resolve(self._groups[gi].hyper, self._groups[gi].lr, changes)
               for gi in targets}
        checks.check_heads(self.name, self.artifact, self._slots, self._groups, self._flags, new)
        if group is None:
            self._defaults, self._default_lr = self._resolve(self._defaults, self._default_lr,
                                                             changes)
        for gi, (h, lr) in new.items():
            self._groups[gi].hyper, self._groups[gi].lr = h, lr
        if any(n in self.artifact.flags for n in changes):
            self.forget_kernels()   # kernels and state storage follow flags

    def set_lr_mult(self, mults: Mapping) -> None:
        """MXNet's per-parameter lr multipliers, by name or index: lr_i = lr * mult."""
        for i, v in groups.multipliers(self.name, "lr_mult", mults, self.names).items():
            self._slots[i].lr_mult = v
        self._launches = None      # (runs share one multiplier)

    def set_wd_mult(self, mults: Mapping) -> None:
        """MXNet's per-parameter weight-decay multipliers, by name or index."""
        for i, v in groups.multipliers(self.name, "wd_mult", mults, self.names).items():
            self._slots[i].wd_mult = v
        self._launches = None

    def _counts_set(self, indices: Sequence[int]) -> None:
        self._grads.changed(indices)   # (a run's verdict reads its members' step counts)

    # -- stepping ----------------------------------------------------------------------
    def step(self, grads: Sequence[Any], **inputs: Sequence[Any]) -> bool:
        """One update of every parameter that has a gradient, in place. Returns False
        when the step was skipped for a non-finite gradient (``nonfinite="skip"``).
        Extra inputs (SVRG: ``step(grads, grad_snapshot=[...], full_grad=[...])``) and
        statistics (THOR: ``A=[...], G=[...]``, None where there is none; read when
        ``refresh_due``) are passed by name. Kernels are found before anything changes."""
        with shards_.agreed(self._shards, self.name, grads):   # all ranks passed, or none
            checked = self.check_step(grads, **inputs)
        return self.run_step(checked)

    def check_step(self, grads: Sequence[Any], **inputs: Sequence[Any]) -> StepInputs:
        """Every check of a step, nothing changed: gradients, extra inputs, statistics,
        kernels, lr schedules; without split parameters the global norm and non-finite
        check. The torch drop-ins agree on it across ranks, then ``run_step``."""
        self.follow()                                  # parameters' data that moved
        return self._check(grads, inputs)

    def check_part(self, grads: Mapping[int, Any]) -> StepInputs:
        """``check_step`` for a part of a step stepped in parts (``run_step(...,
        count=False)`` each; the torch drop-ins' step inside backward): ``grads`` by
        index; moved data not followed (``follow()`` once a step); no extra inputs."""
        full: list[Any] = [None] * len(self._slots)
        for i, g in grads.items():
            full[i] = g
        return self._check(full, {}, sorted(grads))

    def _check(self, grads: Sequence[Any], inputs: dict[str, Any],
               parts: Sequence[int] | None = None) -> StepInputs:
        slots = self._slots
        grads, extra, stats = checks.gather(self.name, self.artifact, slots, grads, inputs,
                                            cache=self._grads, row_sparse=self._row_sparse,
                                            among=parts)
        present = [i for i, g in enumerate(grads) if g is not None] if parts is None else \
            [i for i in parts if grads[i] is not None]
        for i in (i for i in present if not slots[i].kernel):
            self._launch.select(i, self._flags(i))
        used = sorted({slots[i].group for i in present})
        out = StepInputs(grads, extra, self._refresh_due(grads, stats),
                         {gi: self._lr_value(gi, self.t) for gi in used})   # (schedules)
        if self._shards is None:
            out.scale, out.norm = self._grad_scale(grads)
            out.skips = out.scale is None
        out.parts = parts
        return out

    def _grad_scale(self, grads: list) -> tuple[float | None, float | None]:
        return preprocess.grad_scale(self.name, grads, self._slots, rescale=[
            g.hyper.get("rescale_grad", 1.0) for g in self._groups], loss_scale=self.loss_scale,
            clip_global_norm=self.clip_global_norm, nonfinite=self.nonfinite,
            shards=self._shards, squares=self._launch.squares)

    def run_step(self, step: StepInputs, skip: bool = False, count: bool = True) -> bool:
        """The step ``check_step`` gathered (``skip``: another rank's non-finite gradient);
        ``count=False``: a part (``check_part``), the update count ``t`` left as it is."""
        art, grads = self.artifact, step.grads
        scale, norm = (step.scale, step.norm) if self._shards is None else \
            self._grad_scale(grads)
        self.last_grad_norm = self.last_grad_norm if norm is None else norm
        if scale is None or skip:
            self.skipped_steps += 1
            return False
        if self._centralized:   # (new arrays: what the runs read this step)
            preprocess.centralize(grads, self._centralized)
            self._grads.replaced(grads, self._centralized)
        self.t += count
        step.t, step.seed, step.statistics, step.scalar_buffers = self.t, self.seed, art.statistics, \
            self._scalars
        step.envs = {gi: scalars.group_env(art.hypers, self._groups[gi].hyper, lr, scale,
                                           self.t) for gi, lr in step.lrs.items()}
        if self._scalars is not None:
            self._scalars.check_grads(grads, [s.lib for s in self._slots])
        self._launches_now().run(step)                         # launch
        return True

    def stage(self, grads: Sequence[Any], **inputs: Sequence[Any]) -> bool:
        """capturable=True: the host half of a step; a graph replay launches it."""
        capture.stage_ready(self.name, self._scalars, self._slots, self._centralized)
        self._scalars.staging = self._launch.dry = True
        try:
            return self.step(grads, **inputs)
        finally:
            self._scalars.staging = self._launch.dry = False

    def follow(self, masters: bool = False) -> None:   # p.data = new; masters: storage.py
        if self._storage.follow(self._scalars is not None and self._scalars.staging, masters):
            self._launches = None

    def repoint(self, i: int, array: Any) -> None:
        """Parameter ``i`` is ``array`` from now on (the torch layer's FSDP2 local shard
        or numpy view of a moved tensor); checked as moved data at the next step."""
        self._storage.repoint(i, array)

    def _row_sparse(self, slot: ParamSlot, g: RowSparse):
        """A valid RowSparse gradient, coalesced; dense without a lazy kernel or update."""
        checks.check_row_sparse(self.name, slot.index, slot.array, slot.lib, g,
                                self._groups[slot.group].grad_centralization)
        k = slot.kernel or self._launch.select(slot.index, self._flags(slot.index))
        if not self.lazy_update or k.lazy is None:
            return g.to_dense(slot.array.shape)
        return g.coalesce()

    def _launches_now(self) -> strategies.Launches:
        """The step's launches (found again after a flag, state, multiplier or storage
        change: strategies/__init__.py)."""
        if self._launches is None:
            self._launches = strategies.launches(
                self._launch, self._slots, self._storage.chains, self._param_kernel,
                self._grads, has_inputs=bool(self.artifact.inputs), multi=self.multi_tensor,
                shards=self._shards)
        return self._launches

    def _current_runs(self) -> dict[int, strategies.Strategy]:
        """First member -> each run of the current launches (flat, multi-tensor)."""
        return self._launches_now().runs

    # -- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs, as plain values and numpy copies (states, step counts,
        groups, multipliers, spec hash; an lr schedule resumes as the new one's, at ``t``)."""
        self.follow(masters=True)
        return checkpoint.state_dict(self)

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore a ``state_dict``; validated whole before anything is overwritten."""
        self.follow()     # (checkpoint masters stay where the weights are their rounding)
        plan = checkpoint.check(self, sd)
        checkpoint.restore_states(self._slots, plan["states"])
        self._defaults = plan["defaults"]
        for g, h in zip(self._groups, plan["groups"]):
            g.hyper = h
        self.t, self.skipped_steps = plan["t"], plan["skipped_steps"]
        for s, n, lm, wm, r in zip(self._slots, plan["steps"], plan["lr_mult"],
                                   plan["wd_mult"], plan["refreshed"]):
            s.steps, s.lr_mult, s.wd_mult, s.refreshed = n, lm, wm, r
        self.forget_kernels()

    def save(self, path: str) -> None:
        """Write ``state_dict()`` to ``path`` (npz + json, no pickle; atomic)."""
        checkpoint.save(path, self.state_dict())

    def load(self, path: str) -> None:
        """Restore a checkpoint written by ``save``."""
        self.load_state_dict(checkpoint.load(path))

    def __repr__(self) -> str:
        hp = ", ".join(f"{k}={v!r}" for k, v in self._defaults.items())
        return f"<optgen {self.name} ({len(self._slots)} params, {len(self._groups)} " \
            f"group(s), t={self.t}): {hp}>"


__all__ = ["Optimizer", "ParamSlot", "aligned_full", "default_decay_filter"]

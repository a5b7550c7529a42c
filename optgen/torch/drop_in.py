"""The base of the torch drop-ins: torch.optim's bookkeeping (param_groups, state,
state_dict, lr schedulers, torch.compile) around an optgen runtime optimizer that runs
the fused kernels. The seeds' classes (optgen/torch/seeds.py) and the torch forms
(optgen/torch/optim.py) subclass it; the package docstring says how to use them."""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from . import torch_checkpoints, offload as torch_offload, ops as torch_ops, fsdp, contract
from . import agreement as torch_agreement, sharded_checkpoint, state_load, in_backward, placement
from optgen.runtime import composition, flatten, get_artifact, groups
from optgen.core import hyper as hyper_rules
from optgen.runtime.optimizer import Optimizer as _Core
from .group_values import torch_view, current
from .eager import eager

RUNTIME_OPTIONS = ("target", "backend", "multi_precision", "multi_tensor", "clip_global_norm",
                   "nonfinite", "loss_scale", "state_format", "state_format_min_size", "stochastic_rounding",
                   "master_format", "seed")


class OptgenOptimizer(in_backward.StepInBackward, torch.optim.Optimizer):
    """The base of the generated classes: torch's bookkeeping around an optgen runtime
    optimizer that runs the fused kernels."""

    spec: str = ""
    base: str | None = None

    def __init__(self, params, *, flat: bool = False, **kwargs: Any):
        params = placement.listed(params, type(self).__name__, kwargs)
        art = self._prepare(flat, kwargs, params)
        given = groups.alias(art.name, art.hypers, kwargs)
        spec_defaults = {n: h.default for n, h in art.hypers.items()}
        hyper_rules.resolve(art.name, art.hypers, art.requirements, spec_defaults, given)
        super().__init__(params, torch_view(art, {**spec_defaults, **given}))

    def _prepare(self, flat: bool, kwargs: dict[str, Any], params: Any):
        """The runtime side, before torch's constructor: runtime options (popped from ``kwargs``;
        the target defaults to the parameters'), the table's check, the artifact (returned)."""
        if not isinstance(flat, bool):
            raise TypeError(f"flat must be True or False, got {flat!r}")
        self._flat = flat
        self._flat_grads: list[tuple[list, list, torch.Tensor]] = []
        options = {k: kwargs.pop(k) for k in RUNTIME_OPTIONS if k in kwargs}
        self._target = options.pop("target", None) or placement.default_target(params)
        self._options = options
        offload = kwargs.pop("offload", getattr(self, "offload", None))
        name = os.path.basename(self.spec)[:-3]
        self._agree = torch_agreement.check(name, kwargs.pop("agree", torch_agreement.AUTO))
        self._agreement: torch_agreement.Agreement | None = None   # (set with the core)
        torch_offload.check(name, offload, self._target, flat)
        self._active = contract.checked(name, flat, options, offload, self._agree,
                                        kwargs.get("step_in_backward"))   # (the table's)
        art = self._artifact = get_artifact(self.spec, self._target, base=self.base,
                                            state_format=options.get("state_format"),
                                            stochastic_rounding=options.get(
                                                "stochastic_rounding", False),
                                            master_format=options.get("master_format"))
        self._offload = torch_offload.HostCopies(art.name) if offload else None  # host copies
        self._setup_in_backward(kwargs.pop("step_in_backward", False), art)   # in_backward.py
        self._params: list = []   # the torch parameters, in the runtime's order
        self._core: _Core | None = None
        self._synced: list[dict[str, Any]] = []
        self._op_handle = torch_ops.register(self)   # torch.compile's view (optgen/torch/ops.py)
        self._op_tensors: tuple[list, list] = ([], [])
        return art

    # -- the runtime optimizer behind the torch interface --------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        placement.check_names(self._artifact.name, param_group, len(self.param_groups))
        super().add_param_group(param_group)   # (torch: (name, param) pairs -> param_names)
        if self._flat:
            self._adopt(self.param_groups[-1]["params"])
        self._core = self._rebuild(self._core)
        self._op_tensors = self._op_lists()
        self._mirror()   # opt.state holds every state from the start (DCP's get_state_dict
        # would otherwise run a step with lr 0 to create them, which lr > 0 rules refuse)

    def _op_lists(self) -> tuple[list, list]:
        """The tensors ``optgen::step`` takes and writes (torch.compile), in a fixed order."""
        states = [v for st in self._core.state for _, v in sorted(st.items())
                  if isinstance(v, torch.Tensor)]
        return list(self._params), states

    @torch.no_grad()
    def _adopt(self, params: list) -> None:
        """Move a group's parameters into one buffer (their values and Parameter objects
        kept) and give them gradient views of another, existing gradients copied."""
        if not params:
            return
        if any(fsdp.is_dtensor(p) for p in params):   # (before any copy)
            composition.refuse(self._artifact.name, "flat", "fsdp2")
        try:
            views = flatten([p.data for p in params])
            grads = flatten([p.grad if p.grad is not None else torch.zeros_like(p)
                             for p in params])
        except TypeError as e:
            raise TypeError(f"{self._artifact.name}: flat=True needs every parameter of a "
                            f"group on one device with one dtype ({e})") from None
        for p, v, g in zip(params, views, grads):
            p.data, p.grad = v, g
        buffer = grads[0].as_strided((sum(g.numel() for g in grads),), (1,),
                                     grads[0].storage_offset())
        self._flat_grads.append((params, grads, buffer))

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's zero_grad; flat groups then zero their gradient buffer in place (one op)
        and keep their views as ``.grad``, whatever ``set_to_none`` says. Under
        torch.compile the same in traceable form (torch's zero_grad disables dynamo)."""
        if torch.compiler.is_compiling():   # (param_groups would be guarded on lr)
            for p in self._op_tensors[0]:
                if p.grad is not None and set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()
        else:
            super().zero_grad(set_to_none=set_to_none)
        with torch.no_grad():
            for params, grads, buffer in self._flat_grads:
                buffer.zero_()
                for p, g in zip(params, grads):
                    if p.grad is not g:
                        p.grad = g

    def _group_hyper(self, group: dict[str, Any]) -> dict[str, Any]:
        """The spec's hyperparameters of a torch group (keys torch schedulers add, such as
        initial_lr, are not hyperparameters and are ignored), with one-element tensors read
        as floats: torch schedulers change a tensor lr in place (``fill_``), so a stored
        reference would never look changed to ``_sync``."""
        art = self._artifact
        known = {k: current(v) for k, v in group.items()
                 if k != "params" and groups.is_hyper_key(k, art.hypers)}
        return groups.alias(art.name, art.hypers, known)

    def _rebuild(self, old: _Core | None) -> _Core:
        """A runtime optimizer over the current groups, keeping existing states."""
        self._params = [p for g in self.param_groups for p in g["params"]]
        contract.check_groups(self._artifact.name, self._active, self.param_groups)
        fsdp.check(self._artifact.name, self._artifact, self._params,
                   self._options.get("clip_global_norm"))
        host = self._runtime_tensor
        groups = [{"params": [host(p) for p in g["params"]], **self._group_hyper(g)}
                  for g in self.param_groups]
        capturable = any(g.get("capturable") for g in self.param_groups)   # (torch forms)
        core = _Core(self._artifact, groups, shards=fsdp.splits(self._params),
                     param_names=placement.names(self.param_groups), decay_filter=None,
                     **self._options, **({"capturable": True} if capturable else {}))
        if self._offload is not None:
            core.watch(self._offload.ready, self._offload.done)
        if [id(host(p)) for p in self._params] != [id(q) for q in core.params]:
            raise RuntimeError(f"{self._artifact.name}: runtime and param_groups disagree")
        where = {} if old is None else {id(p): i for i, p in enumerate(old.params)}
        for j, p in enumerate(core.params):
            if id(p) in where:
                core.adopt(j, old.records[where[id(p)]])
        self._synced = [self._group_hyper(g) for g in self.param_groups]
        self._agreement = torch_agreement.choose(self._agree, core.shards)
        self._dtensors = any(fsdp.is_dtensor(p) for p in self._params)
        self._standins = self._dtensors or \
            type(self)._runtime_tensor is not OptgenOptimizer._runtime_tensor
        return core

    def _runtime_tensor(self, p: Any) -> Any:
        """What the runtime steps for parameter ``p`` (the same object at every call):
        its host copy (offload), its local shard (DTensor), or ``p``."""
        return self._offload.master(p) if self._offload else fsdp.local(p)

    def _follow(self, runtime: bool = True, masters: bool = False) -> None:
        """Follow moved data (``p.data = new``) as torch.optim does: the runtime stand-ins
        (FSDP2 local shards, SparseAdam's numpy views: new ones), offload's host copies
        (taken again), the runtime's arrays (storage.py; its step does it: ``runtime``)."""
        if self._offload is not None:
            self._offload.follow(self._params)
        elif self._standins:
            for i, (p, x) in enumerate(zip(self._params, self._core.params)):
                if self._runtime_tensor(p) is not x:
                    self._core.repoint(i, self._runtime_tensor(p))
        if runtime:   # (else the runtime's step follows; masters: as a step reads them)
            self._core.follow(masters)

    def _sync(self) -> None:
        """Pass changed group values (an lr scheduler's new lr) to the runtime optimizer."""
        for gi, group in enumerate(self.param_groups):
            now = self._group_hyper(group)
            if now != self._synced[gi]:
                changed = {k: v for k, v in now.items() if self._synced[gi].get(k) != v}
                self._core.set_hyper(group=gi, **changed)
                self._synced[gi] = now

    def _mirror(self) -> None:
        """``self.state[p]``: the runtime's state tensors (shared), scalar states as
        floats, and ``step`` as a float32 tensor (torch's convention), updated in place."""
        kinds = self._kinds()
        for p, slot in zip(self._params, self._core.records):
            st, core = self.state[p], slot.state
            if "step" not in st or any(st.get(n) is not v and fsdp.local(st.get(n)) is
                                       not v for n, v in core.items() if not isinstance(v, np.floating)):
                st.clear()
                st.update((n, fsdp.shown(p, v, kinds.get(n, "param")))
                          for n, v in core.items() if not isinstance(v, np.floating))
                st["step"] = torch.tensor(0.0)
                self._op_tensors = self._op_lists()
            for n, v in core.items():
                if isinstance(v, np.floating):
                    st[n] = float(v)
            st["step"].fill_(float(slot.steps))

    @property
    def refresh_due(self) -> bool:
        """Whether the next step() runs the spec's refresh rule (THOR: it then needs the
        statistics, which ``KFACStatistics`` collects only on such steps)."""
        try:
            self._sync()
        except (TypeError, ValueError):   # the step raises it, on every rank at once
            pass                          # (agreement.py): not here, on this rank alone
        return self._core.refresh_due

    @torch.no_grad()
    def step(self, closure=None, **statistics):
        """One update of every parameter with a ``.grad``; returns the closure's loss.
        Statistics (THOR's ``A=[...], G=[...]``, one per parameter of the optimizer, in
        its order) go to the refresh rule (``KFACStatistics.collect`` builds them)."""
        loss = self._run_closure(closure)
        if self._in_backward:   # (the hooks stepped: optgen/torch/in_backward.py)
            return self._step_held(loss, statistics)
        if not torch.compiler.is_compiling():
            return self._step_plain(loss, statistics)
        if self._dtensors:   # (fake DTensors cannot run the op: eagerly, a graph break)
            return self._step_eagerly(loss, statistics)
        if torch.compiler.is_compiling():   # one opaque op (optgen/torch/ops.py)
            if statistics:
                raise TypeError(f"{self._artifact.name}: statistics ({', '.join(statistics)})"
                                " are not passed to a step under torch.compile; step "
                                "eagerly on refresh steps")
            params, states = self._op_tensors
            torch.ops.optgen.step(self._op_handle, params, [p.grad for p in params], states)
            return loss

    @torch.no_grad()
    def _step_plain(self, loss: Any, statistics: dict[str, Any]) -> Any:
        if "zero1" in self._active:   # (ZeRO-1's load_state_dict writes opt.state itself)
            self._take_written()
        self._step_now([p.grad for p in self._params], statistics)
        return loss

    _step_eagerly = eager(_step_plain)

    @torch.no_grad()
    def stage(self) -> None:
        """``capturable=True``: the host half of the next step (each ``.grad`` read as
        ``step()`` reads it) before each replay of a graph that captured ``step()``
        (runtime/capture.py)."""
        self._opt_called = True
        self._sync()
        self._follow(runtime=False)
        self._core.stage(self._kernel_grads([fsdp.local(p.grad) for p in self._params]))
        self._mirror()

    # torch's lr schedulers wrap an optimizer's step (to record _opt_called, which
    # _step_now sets) unless it says it is wrapped already; dynamo skips their wrapper (it
    # lives in torch/optim/lr_scheduler.py), which would break a compiled step's graph.
    step._wrapped_by_lr_sched = True

    def _step_now(self, grads: list, statistics: dict[str, Any]) -> None:
        """Everything that may refuse the step (pending hyperparameter changes, the
        runtime's checks) on every rank, the ranks' agreement (optgen/torch/agreement.py:
        every rank steps or none does), then the step."""
        self._opt_called = True   # what torch's lr schedulers check (see after step)
        checked, skip = torch_agreement.run(self._agreement, self._artifact.name,
                                            lambda: self._checked(grads, statistics), grads)
        if self._core.run_step(checked, skip) and self._offload is not None:
            self._offload.finish()   # (buckets go back as they are stepped)
        self._mirror()

    def _checked(self, grads: list, statistics: dict[str, Any]):
        self._sync()
        self._follow(runtime=False)
        grads = self._kernel_grads(grads)
        if self._offload is None:   # (a DTensor's gradient: its local shard)
            return self._core.check_step([fsdp.local(g) for g in grads] if
                                         self._dtensors else grads, **statistics)
        return self._core.check_step(self._offload.grads_to_host(
            self._params, grads, wait_all=bool(self._core.clip_global_norm or
                                               self._core.nonfinite)), **statistics)

    def _kernel_grads(self, grads: list) -> list:
        """The gradients as the runtime takes them (SparseAdam: row-sparse)."""
        for i, g in enumerate(grads):
            if g is not None and g.is_sparse:
                raise TypeError(f"{self._artifact.name}: parameter {i} has a sparse .grad; "
                                "optgen.torch optimizers take dense gradients")
        return grads

    @torch.no_grad()
    def _step_op(self, params: list, grads: list, states: list) -> None:
        """``optgen::step``'s body: the eager step on this optimizer's own tensors, with
        copies that functionalization passed taken in and given back."""
        own_params, own_states = self._op_tensors
        torch_ops.stepped([*params, *states], [*own_params, *own_states],
                          lambda: self._step_now(grads, {}))

    # -- checkpoints ---------------------------------------------------------------------
    def state_dict(self, format: str = "optgen") -> dict[str, Any]:
        """torch's state_dict with the spec's state names, or (``format="torch"``) the
        one torch.optim's optimizer of the same algorithm loads (optgen/torch/torch_checkpoints.py)."""
        if format not in ("optgen", "torch"):
            raise ValueError(f"state_dict format must be 'optgen' or 'torch', got {format!r}")
        blocked = [i for i, (p, s) in enumerate(zip(self._params, self._core.records))
                   if s.formatted and fsdp.sharded(p)]
        if blocked:   # (DCP would take their per-shard block scales for whole tensors)
            raise ValueError(f"{self._artifact.name}: parameter {blocked[0]} is sharded and "
                             "keeps q8/q4 states in per-shard blocks, which state_dict (and "
                             "torch.distributed.checkpoint) cannot describe; save them with "
                             "opt.save(folder), which reshards at load")
        self._follow(masters=True)
        self._take_written()
        self._mirror()
        sd = super().state_dict()
        shapes = dict(enumerate(tuple(p.shape) for g in self.param_groups for p in g["params"]))
        return torch_checkpoints.to_torch(self._artifact.name, sd, self._artifact.stored, shapes) \
            if format == "torch" else state_load.named(sd, self._artifact.stored)

    def save(self, path: str | os.PathLike) -> None:
        """optgen's checkpoint file (runtime/checkpoint.py: npz + json, no pickle) of
        states, step counts and hyperparameters. With parameters sharded across ranks
        (FSDP2: DTensors) ``path`` is a folder and every rank writes its shards (collective);
        ``load`` then reads it at any world size (optgen/torch/sharded_checkpoint.py)."""
        if any(fsdp.is_dtensor(p) for p in self._params):   # (alike on every rank)
            sharded_checkpoint.save(self._core, self._params, self._kinds(), os.fspath(path),
                                    prepare=lambda: (self._sync(), self._follow()))
        else:
            self._sync()
            self._follow()
            self._core.save(path)

    def load(self, path: str | os.PathLike) -> None:
        """Restore what ``save`` wrote (checked whole first); the groups' hyperparameters
        become the checkpoint's, in ``param_groups`` too. With DTensor parameters a
        collective, a folder or a file alike: every rank loads or none does."""
        self._follow()   # (then the checkpoint's master copies win)
        split = any(fsdp.is_dtensor(p) for p in self._params)
        if split or os.path.isdir(path):
            sharded_checkpoint.load(self._core, self._params, self._kinds(), os.fspath(path),
                                    collective=split)
        else:
            self._core.load(path)
        if self._offload is not None:
            self._offload.refresh(self._params)
        for group, core_group in zip(self.param_groups, self._core.groups):
            group.update(self._group_values(group, core_group.hyper))
        self._synced = [self._group_hyper(g) for g in self.param_groups]
        self._mirror()

    def _group_values(self, group: dict[str, Any], hyper: dict[str, Any]) -> dict[str, Any]:
        """Spec-named hyperparameters as ``group`` holds them (the inverse of
        ``_group_hyper``)."""
        return torch_view(self._artifact, hyper)

    def _optgen_form(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """``state_dict`` with this optimizer's state names: a torch.optim checkpoint of
        the same algorithm is converted (optgen/torch/torch_checkpoints.py)."""
        if torch_checkpoints.is_torch(state_dict, {n for st in self._core.state for n in st}):
            return torch_checkpoints.to_optgen(self._artifact.name, self.param_groups, state_dict)
        return state_dict

    def _take_written(self) -> None:   # (not FSDP2's views: they are new DTensors)
        if not self._standins and state_load.written(self.state, self._params, self._core.state):
            self.load_state_dict(torch.optim.Optimizer.state_dict(self))

    def _kinds(self) -> dict[str, str]:
        return {s.name: s.shape for s in self._artifact.states}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load, with every state checked against this optimizer's layout first
        (a wrong shape or a missing state is a ValueError and changes nothing). A
        torch.optim checkpoint of the same algorithm is converted first (torch_checkpoints)."""
        self._follow()   # (data moved before the load: the checkpoint's master copies win)
        state_dict = self._optgen_form(state_dict)
        core = self._core
        plan = state_load.plan(self._artifact.name, state_dict, self.param_groups,
                               self._params, core.state, self._artifact.state_format,
                               self._artifact.stored)
        super().load_state_dict(state_dict)
        if self._offload is not None:   # the model's weights may have been loaded before
            self._offload.refresh(self._params)
        state_load.copy_in(core.state, plan, self._params)
        core.set_step_counts({i: int(rec["step"]) for i, rec in plan})
        core.restore_refreshes([i for i, _ in plan])
        core.t = max((s.steps for s in core.records), default=0)
        core.forget_kernels()
        self._synced = [{} for _ in self.param_groups]   # re-send every group's values
        if self._artifact.name_flags and placement.names(self.param_groups, core.names):
            self._core = self._rebuild(core)   # (renamed: the name flags follow the names)
            self._op_tensors = self._op_lists()
        self._sync()
        self._mirror()

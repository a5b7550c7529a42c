"""The step inside backward: ``step_in_backward=True`` on every optgen.torch optimizer
steps each parameter as soon as its gradient is complete and releases that gradient,
so a full set of gradients never exists at once.

    opt = optgen.torch.AdamW(model.parameters(), lr=1e-3, step_in_backward=True)
    loss.backward()            # steps every parameter; each .grad is None afterwards
    sched.step()               # (opt.step(); opt.zero_grad() may stay: nothing to do)

How: a ``register_post_accumulate_grad_hook`` on each parameter that requires a
gradient steps that parameter alone through the runtime's step in parts
(``Optimizer.check_part``, then ``run_step(..., count=False)``: the checks and kernels
of a whole step, one parameter, its own step count, its group's values of now), then
sets its ``.grad`` to None. What one backward steps is one step: its first hook passes
changed group values on and follows moved data (what ``step()`` does first), and a
callback at the end of the backward sets the runtime's update count ``t`` (the most
steps any parameter has taken: a reentrant checkpoint's inner backward, a backward of
its own, ends before the outer one), mirrors the step counts into ``opt.state`` and
tells lr schedulers the optimizer stepped.
A hook that raises (a gradient the checks refuse) leaves its parameter, its state and
its ``.grad`` as they were; parameters stepped earlier in that backward stay stepped.

Accumulation: inside ``with opt.accumulating():`` the hooks step nothing and the
gradients add up as usual; the next backward outside steps with the sums (or
``opt.step()`` steps every parameter still holding a gradient, and releases it).

DDP: a parameter's gradient is complete only after its bucket's all-reduce, which a
gradient hook fires before. ``opt.attach(ddp_model)`` registers a DDP communication
hook that averages each bucket (all-reduce, as DDP does) and steps its parameters when
that completes; their gradients (DDP writes them back at the end of backward) are
released after it. ``accumulating()`` then enters ``ddp_model.no_sync()`` as well.

Refused at construction (ValueError naming the option and the rule): what reads every
gradient before any update (``clip_global_norm``, ``nonfinite="skip"``), ``flat=True``
groups, ``offload``, inputs or statistics passed to ``step()`` (SVRG, THOR), a step
agreement across ranks (``agree=<group>``), being ZeroRedundancyOptimizer's local
optimizer (ZeRO-1); when a group is added: ``capturable=True`` and FSDP2's DTensor
parameters. Under torch.compile the hooks run eagerly (``torch.compiler.disable``).
What the loop around the backward does (DDP without ``attach``, a GradScaler, a clip
after backward, plain accumulation, the Hugging Face Trainer) is checked before a
backward's first step by optgen/torch/in_backward_guard.py.
Imports: fsdp, in_backward_guard.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import threading
import weakref
from typing import Any, Iterator

import torch
from torch.autograd import Variable

from . import fsdp, in_backward_guard

RULE = "step_in_backward steps each parameter as its gradient completes"


def refusal(art: Any, flat: bool, options: dict[str, Any], offload: Any, agree: Any
            ) -> str | None:
    """Why these options cannot step inside backward (None: they can)."""
    if options.get("clip_global_norm") is not None:
        return "clip_global_norm needs every gradient first (the norm of all of them)"
    if options.get("nonfinite") == "skip":
        return ("nonfinite='skip' needs every gradient first (one non-finite gradient "
                "skips every parameter's update); nonfinite='raise' works")
    if flat:
        return "flat=True steps a whole group with one launch, after all its gradients"
    if offload is not None:
        return f"offload={offload!r} with it is not built (bucketed host copies)"
    if art.inputs or art.statistics:
        return (f"{art.name} takes {', '.join([*art.inputs, *art.statistics])} passed to "
                "step(), which backward cannot pass")
    if agree is not None and not isinstance(agree, str):
        return ("agree=<group> makes the ranks agree on each step before it changes "
                "anything; inside backward each rank steps alone")
    if _made_by_zero():
        return ("under ZeroRedundancyOptimizer (ZeRO-1) each rank's optimizer holds its "
                "partition and would step it with the rank's own gradient, before DDP "
                "averages it; step after backward (step_in_backward=False), or use DDP "
                "with opt.attach(ddp_model)")
    return None


def _made_by_zero() -> bool:
    """Whether torch's ZeroRedundancyOptimizer is making this optimizer (the local
    optimizer of its rank's partition): a ZeroRedundancyOptimizer up the call stack."""
    zero = getattr(getattr(torch.distributed, "optim", None), "ZeroRedundancyOptimizer", None)
    frame = sys._getframe(1)
    while zero is not None and frame is not None:
        if isinstance(frame.f_locals.get("self"), zero):
            return True
        frame = frame.f_back
    return False


class StepInBackward:
    """The torch drop-ins' step inside backward (a base of OptgenOptimizer, which holds
    ``_core``, ``_params``, ``_sync``, ``_follow``, ``_mirror``, ``_step_now``)."""

    _in_backward = False

    def _setup_in_backward(self, on: Any, art: Any) -> None:
        """The ``step_in_backward`` option, checked against the others (``_prepare``)."""
        if not isinstance(on, bool):
            raise TypeError(f"{art.name}: step_in_backward must be True or False, got {on!r}")
        why = on and refusal(art, self._flat, self._options, self._offload, self._agree)
        if why:
            raise ValueError(f"{art.name}: {RULE}; {why}")
        self._in_backward = on
        if not on:
            return
        self._held = 0                       # depth of accumulating()
        self._part_lock = threading.RLock()  # (DDP: buckets complete on gloo's threads)
        self._by_ddp: dict[int, Any] = {}    # id(p) -> the attached DDP model stepping p
        self._ddp_stepped: list = []         # parameters a DDP hook stepped this backward
        self._round: Any = None              # the graph task of the open step
        self._index: tuple[Any, dict[int, int]] = (None, {})
        self._guard = in_backward_guard.Guard(art.name)   # the loop around the backwards

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if not self._in_backward:
            return
        group, why = self.param_groups[-1], None
        if group.get("capturable"):
            why = "capturable=True steps in a captured graph, not in backward"
        elif any(fsdp.is_dtensor(p) for p in group["params"]):
            why = "FSDP2's DTensor parameters are stepped by shards after their reduce-scatter"
        if why:
            self.param_groups.pop()
            raise ValueError(f"{self._artifact.name}: {RULE}; {why}")
        me = weakref.ref(self)
        for p in group["params"]:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(functools.partial(_grad_ready, me))

    @contextlib.contextmanager
    def accumulating(self) -> Iterator[None]:
        """Backwards inside add their gradients up and step nothing (with an attached
        DDP model: under its ``no_sync()``); the next backward outside steps with the
        sums, as ``backward(); ...; backward(); step()`` does."""
        if not self._in_backward:
            raise ValueError(f"{self._artifact.name}: accumulating() is for optimizers "
                             "made with step_in_backward=True (otherwise backward "
                             "accumulates until step() anyway)")
        with contextlib.ExitStack() as stack:
            for ref in {id(r): r for r in self._by_ddp.values()}.values():
                if ref() is not None:
                    stack.enter_context(ref().no_sync())
            self._held += 1
            try:
                yield
            finally:
                self._held -= 1

    def attach(self, ddp_model: Any) -> None:
        """Step this optimizer's parameters of ``ddp_model`` (DistributedDataParallel)
        after their bucket's all-reduce: its communication hook averages each bucket,
        then steps its parameters (call once, before the first backward)."""
        from torch.nn.parallel import DistributedDataParallel
        name = self._artifact.name
        if not self._in_backward:
            raise ValueError(f"{name}: attach(ddp_model) is for step_in_backward=True")
        if not isinstance(ddp_model, DistributedDataParallel):
            raise TypeError(f"{name}: attach takes a DistributedDataParallel model, got "
                            f"{type(ddp_model).__name__}")
        if ddp_model.find_unused_parameters:
            raise ValueError(f"{name}: {RULE}; with find_unused_parameters=True a bucket "
                             "does not say which of its parameters had no gradient")
        mine = {id(p) for p in self._params}
        params = [p for p in ddp_model.parameters() if p.requires_grad and id(p) in mine]
        if not params:
            raise ValueError(f"{name}: none of the DDP model's parameters is this "
                             "optimizer's")
        group = ddp_model.process_group
        ddp_model.register_comm_hook((weakref.ref(self), group), _all_reduce_then_step)
        # (weakly: the optimizer must not keep the DDP model, and through it its process
        # group, alive; a process group released last on its own worker thread, where a
        # bucket's step runs, joins that thread: std::terminate at exit)
        self._by_ddp.update((id(p), weakref.ref(ddp_model)) for p in params)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._in_backward:
            self._guard.looped()   # (the loop calls it: see in_backward_guard.py)
        super().zero_grad(set_to_none=set_to_none)

    # -- the hooks -----------------------------------------------------------------------
    def _grad_ready(self, p: torch.Tensor) -> None:
        """``p``'s gradient is complete: step ``p`` and release the gradient (not inside
        accumulating(), nor for the parameters an attached DDP model steps)."""
        if self._held or id(p) in self._by_ddp or id(p) not in self._positions() or \
                self._guard.holds():
            return   # (not stepped here; a group whose adding failed: not this optimizer's)
        self._guard.stepping(self, [p])   # (may refuse: before anything changes)
        in_backward = self._open_round()
        self._step_part([p], [p.grad])
        p.grad = None
        if not in_backward:
            self._close_round()

    @torch.compiler.disable
    def _bucket_ready(self, bucket: Any, group: Any) -> torch.futures.Future:
        """A DDP bucket's gradients are summed locally: average them over the ranks (the
        sum's all-reduce divided by the world size, as DDP), then step this optimizer's
        parameters of the bucket with their averages (views of the bucket)."""
        import torch.distributed as dist
        buffer = bucket.buffer()
        held = self._held or self._guard.holds()   # (accelerate's sync_each_batch)
        pairs = [(p, g) for p, g in zip(bucket.parameters(), bucket.gradients())
                 if id(p) in self._by_ddp and not held]
        if pairs:
            self._guard.stepping(self, [p for p, _ in pairs], "attach_ddp")
            self._open_round()
        buffer.div_(dist.get_world_size(group))
        done = dist.all_reduce(buffer, group=group, async_op=True).get_future()
        me = weakref.ref(self)   # (the callback runs on the process group's thread)

        def step(fut: torch.futures.Future) -> torch.Tensor:
            fut.wait()
            opt = me()
            if pairs and opt is not None:
                opt._step_part([p for p, _ in pairs], [g for _, g in pairs])
                with opt._part_lock:
                    opt._ddp_stepped.extend(p for p, _ in pairs)
            return buffer

        return done.then(step)

    # -- one backward: its first part opens the step, a callback at its end closes it ---
    def _open_round(self) -> bool:
        """Before a part of this backward: the step's start, once (group values passed
        on, moved data followed); False outside a backward (the caller closes)."""
        task = torch._C._current_graph_task_id()
        with self._part_lock:
            if task == -1 or task != self._round:
                self._sync()
                self._follow()
                self._round, self._ddp_stepped = task, []
                self._round_scalars: dict = {}
                if task != -1:   # (after DDP's own end-of-backward callback: see _ended)
                    Variable._execution_engine.queue_callback(self._ended)
        return task != -1

    @torch.compiler.disable
    def _ended(self) -> None:
        Variable._execution_engine.queue_callback(self._close_round)

    @torch.compiler.disable
    def _close_round(self) -> None:
        """The end of a backward that stepped: the update count set, step counts
        mirrored, the gradients DDP wrote back released."""
        with self._part_lock:
            core = self._core
            core.t = max(core.t, max((s.steps for s in core.records), default=0))
            for p in self._ddp_stepped:
                p.grad = None
            self._round, self._ddp_stepped = None, []
            self._opt_called = True   # (torch's lr schedulers read it)
            self._mirror()

    def _positions(self) -> dict[int, int]:
        """id(p) -> p's index in the runtime, for this optimizer's parameters."""
        at, index = self._index
        if at is not self._params:   # (add_param_group made a new list)
            index = {id(p): i for i, p in enumerate(self._params)}
            self._index = (self._params, index)
        return index

    @torch.no_grad()
    def _step_part(self, params: list, grads: list) -> None:
        """Step ``params`` (this optimizer's) with ``grads``, as one part of the step."""
        with self._part_lock:
            index = self._positions()
            core = self._core
            part = core.check_part({index[id(p)]: g for p, g in
                                    zip(params, self._kernel_grads(grads))})
            part.shared = self._round_scalars   # (one backward's parts: equal host scalars
            core.run_step(part, count=False)    # for equal kernel, group and step count)

    @staticmethod
    def _run_closure(closure: Any) -> Any:
        """``step(closure)``'s closure, with gradients on; its loss (None: no closure)."""
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def _step_held(self, loss: Any, statistics: dict[str, Any]) -> Any:
        """``step()`` after its closure (whose backward stepped): the parameters still
        holding a gradient (accumulated under ``accumulating()``; normally none), their
        gradients released; returns the closure's ``loss``."""
        if statistics:
            raise TypeError(f"{self._artifact.name}: {RULE}; step() takes no statistics")
        self._guard.looped()
        held = [p for p in self._params if p.grad is not None]
        if any(id(p) in self._by_ddp for p in held):
            raise ValueError(f"{self._artifact.name}: gradients accumulated under "
                             "accumulating() on a DDP model were never all-reduced; run "
                             "the last micro-batch's backward outside accumulating()")
        if held:
            self._step_now([p.grad for p in self._params], {})
            for p in held:
                p.grad = None
        self._opt_called = True
        return loss


@torch.compiler.disable   # (a compiled train step's backward runs its hooks eagerly)
def _grad_ready(me: weakref.ref, p: torch.Tensor) -> None:
    """The post-accumulate-grad hook of ``p``: steps it, through its optimizer if alive."""
    opt = me()
    if opt is not None:
        opt._grad_ready(p)


def _all_reduce_then_step(state, bucket):   # (DDP refuses other annotations than its own)
    """DDP's communication hook of an attached optimizer (``state``: a weak reference to
    it, the process group)."""
    me, group = state
    opt = me()
    if opt is None:
        raise RuntimeError("the optimizer attached to this DDP model was deleted")
    return opt._bucket_ready(bucket, group)

"""The step inside backward: ``step_in_backward=True`` on every optgen.torch optimizer
steps the parameters as their gradients complete and releases those gradients, so a
full set of gradients never exists at once.

    opt = optgen.torch.AdamW(model.parameters(), lr=1e-3, step_in_backward=True)
    loss.backward()            # steps every parameter; each .grad is None afterwards
    sched.step()               # (opt.step(); opt.zero_grad() may stay: nothing to do)

How: a ``register_post_accumulate_grad_hook`` on each parameter; the parameters are in
buckets (in_backward_buckets.py: small gradients together, up to 1 MiB), and the hook
completing a bucket's last gradient steps the bucket through the runtime's step in parts
(``Optimizer.check_part``, then ``run_step(..., count=False)``: the checks and kernels of
a whole step, one multi-tensor launch per kernel and group, the parameters' own step
counts, their groups' values of now), then sets their ``.grad`` to None. One backward
is one step: its first part passes changed group values on and follows moved data (as
``step()`` first does), and a callback at its end sets the update count ``t`` (the most
steps any parameter has taken: a reentrant checkpoint's inner backward ends before the
outer one), steps the parameters still holding a gradient (below; accumulated ones this
backward did not reach, buckets left incomplete), mirrors the step counts into
``opt.state`` and tells lr schedulers the optimizer stepped.
Which hooks step (in_backward_hooks.py): the newest step-in-backward optimizer's on a
parameter (an older one's do nothing; its step() and accumulating() raise); frozen
parameters carry hooks too (one unfrozen later steps). A hook inside a nested backward
(a reentrant checkpoint's segment) holds its gradient, which may be partial (shared
weights), for the end of the outermost backward, as do that parameter's hooks later.
A hook that raises (a gradient the checks refuse) leaves its bucket's parameters, their
states and ``.grad`` as they were; buckets stepped earlier in that backward stay stepped.

Accumulation: inside ``with opt.accumulating():`` the hooks step nothing and the
gradients add up as usual; the next backward outside steps with the sums (or
``opt.step()`` steps every parameter still holding a gradient, and releases it).

DDP: a parameter's gradient is complete only after its bucket's all-reduce, which a
gradient hook fires before. ``opt.attach(ddp_model)`` registers a DDP communication
hook that averages each bucket (all-reduce, as DDP does) and steps its parameters when
that completes; their gradients (DDP writes them back at the end of backward) are
released after it. ``accumulating()`` then enters ``ddp_model.no_sync()`` as well.
FSDP2: ``fully_shard`` calls its sharded parameters' hooks itself, after each layer's
reduce-scatter, with the averaged shard as ``.grad``: a ``fully_shard``-ed module's
parameters are a bucket, stepped as step() steps shards (fsdp.py), the ranks' parts
alike; the ranks agree on each part's checks first (agreement.py); no ``attach``.

Refused at construction (ValueError naming the option and the rule): what reads every
gradient before any update (``clip_global_norm``, ``nonfinite="skip"``), ``flat=True``
groups, ``offload``, inputs or statistics passed to ``step()`` (SVRG, THOR), a step
agreement across ranks (``agree=<group>``), being ZeroRedundancyOptimizer's local
optimizer (ZeRO-1); when a group is added: ``capturable=True``. Under torch.compile
the hooks run eagerly (``torch.compiler.disable``).
What the loop around the backward does (DDP without ``attach``, a GradScaler, a clip
after backward, plain accumulation, the Hugging Face Trainer) is checked before a
backward's first step by optgen/torch/in_backward_guard.py.
Imports: agreement, eager, fsdp, in_backward_{buckets,hooks,guard}, optgen.runtime.composition.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from typing import Any, Iterator

import torch
from torch.autograd import Variable

from . import agreement as torch_agreement, fsdp, in_backward_buckets as buckets, \
    in_backward_guard, in_backward_hooks as hooks
from .eager import eager
from optgen.runtime import composition

RULE = "step_in_backward steps each parameter as its gradient completes"


class StepInBackward:
    """The torch drop-ins' step inside backward (a base of OptgenOptimizer, which holds
    ``_core``, ``_params``, ``_sync``, ``_follow``, ``_mirror``, ``_step_now``)."""

    _in_backward = False

    def _setup_in_backward(self, on: Any, art: Any) -> None:
        """The ``step_in_backward`` option, checked against the others (``_prepare``)."""
        if not isinstance(on, bool):
            raise TypeError(f"{art.name}: step_in_backward must be True or False, got {on!r}")
        why = on and in_backward_guard.refusal(art)
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
        self._nested: set[int] = set()       # id(p): reached by a nested backward (held)
        self._stepped: set[int] = set()      # id(p): stepped by its hook this backward
        self._partial: set[int] = set()      # id(p): of those, reached by a nested one after
        self._watched: dict[int, Any] = {}   # id(node): nodes whose end closes the step
        self._guard = in_backward_guard.Guard(art.name)   # the loop around the backwards
        self._accumulated = False            # accumulating() entered since the last step
        self._buckets: buckets.Buckets | None = None   # (in_backward_buckets.py)
        self._outer: tuple = (-1,)   # the backward last seen not nested: task, held, buckets

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if not self._in_backward:
            return
        group = self.param_groups[-1]
        if group.get("capturable"):
            self.param_groups.pop()
            composition.refuse(self._artifact.name, "step_in_backward", "capturable")
        hooks.hook_all(group["params"], functools.partial(_grad_ready, weakref.ref(self)))
        self._fsdp_groups = in_backward_guard.fsdp_groups(   # (the modules are sharded now)
            [p for g in self.param_groups for p in g["params"]])
        hooks.claim(group["params"], self)   # (in_backward_hooks.py: the newest owns)

    @contextlib.contextmanager
    def accumulating(self) -> Iterator[None]:
        """Backwards inside add their gradients up and step nothing (with an attached
        DDP model: under its ``no_sync()``); the next backward outside steps with the
        sums, as ``backward(); ...; backward(); step()`` does."""
        if not self._in_backward:
            raise ValueError(f"{self._artifact.name}: accumulating() is for optimizers "
                             "made with step_in_backward=True (otherwise backward "
                             "accumulates until step() anyway)")
        self._check_owner("accumulating")
        with contextlib.ExitStack() as stack:
            for ref in {id(r): r for r in self._by_ddp.values()}.values():
                if ref() is not None:
                    stack.enter_context(ref().no_sync())
            self._held += 1
            self._accumulated = True   # (until a stepping backward or step() ends)
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
        if any(map(fsdp.is_dtensor, self._params)):
            composition.refuse(name, "attach_ddp", "fsdp2")
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
        """``p``'s gradient is complete: once its bucket's are, step them and release the
        gradients (not in accumulating() or accelerate's non-final micro-batches, nor for
        parameters an attached DDP model steps or a newer optimizer owns). In a nested
        backward (a reentrant checkpoint's) the gradient may be partial: it is held for
        the end of the outermost backward, as is ``p`` in later backwards. The guard
        checks the loop before a step."""
        task = torch._C._current_graph_task_id()
        if task == self._outer[0] != -1:   # (seen: the user's backward, its holding)
            _, held, bucket_of = self._outer
        else:   # (the buckets of now: owners and an attach change between backwards)
            self._buckets = buckets.current(  # (FSDP2: a fully_shard-ed module's a bucket)
                self._buckets, self._params, self._hooked, (hooks.claims(), len(self._by_ddp)),
                lambda: self._fsdp_groups)
            bucket_of = self._buckets.of
            if id(p) not in bucket_of:
                return   # (not stepped here; a group whose adding failed: not its own)
            held, node = self._held or self._guard.holds(), hooks.enclosing_node()
            if node is not None:
                with self._part_lock:
                    self._nested.add(id(p))
                    if not held:
                        self._hold(p, node)
                return
            if not held and task != -1:   # (its first gradient: the loop checked, the step
                self._guard.stepping(self, [])   # opened and, FSDP2, agreed across ranks)
                torch_agreement.run(self._agreement, self._artifact.name, self._open_round, [])
            self._outer = (task, held, bucket_of)
        bucket = bucket_of.get(id(p))
        if bucket is None or held or (id(p) in self._nested and self._open_round()):
            return   # (nested: held, the end of this backward steps it: _close_round)
        with self._part_lock:   # (the bucket's members that arrived, once the last has)
            ready = [p] if task == -1 else bucket.arrive(p, task, self._nested)
        if ready is None or not (ready := [q for q in ready if q.grad is not None and (
                not self._nested or id(q) not in self._nested)]):
            return   # (not complete; or arrived, then a nested backward reached it: held)
        self._guard.stepping(self, ready)   # (may refuse: before anything changes)
        in_backward = self._open_round()
        self._step_part(ready, [q.grad for q in ready])
        for q in ready:
            q.grad = None
        if in_backward:
            self._stepped.update(map(id, ready))
        else:
            self._close_round()

    def _hooked(self, p: torch.Tensor) -> bool:
        """Whether ``p``'s hooks step it here (not a newer optimizer's, not DDP's)."""
        return hooks.owns(self, p) and id(p) not in self._by_ddp

    def _hold(self, p: torch.Tensor, node: Any) -> None:
        """``p``'s gradient, from a backward nested in ``node``'s, waits for the end of the
        outermost backward (the close is queued there once ``node`` has run). One already
        stepped in this backward (its outer gradient completed first) is not stepped again:
        the close drops what came after and raises."""
        if id(p) in self._stepped:
            self._partial.add(id(p))
        if id(node) not in self._watched:
            self._watched[id(node)] = node
            hooks.after(node, weakref.ref(self), "_node_ran")

    def _node_ran(self) -> None:
        """A node that ran a nested backward has run (this is the backward that ran it):
        queue the close here, or, still nested, after the node running this one."""
        node = hooks.enclosing_node()
        with self._part_lock:
            if node is None:
                self._open_round()
            elif id(node) not in self._watched:
                self._watched[id(node)] = node
                hooks.after(node, weakref.ref(self), "_node_ran")

    def _check_owner(self, item: str) -> None:
        """Refuse ``item`` (the table's: "step_in_backward" for step(), "accumulating") on
        an optimizer that a newer step-in-backward one has replaced."""
        if not hooks.owns_all(self, self._params):
            composition.refuse(self._artifact.name, item, "replaced_optimizer")

    @eager
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
                self._stepped = set()
                self._round_scalars: dict = {}
                if task != -1:   # (after DDP's own end-of-backward callback: see _ended)
                    Variable._execution_engine.queue_callback(self._ended)
        return task != -1

    @eager
    def _ended(self) -> None:
        Variable._execution_engine.queue_callback(self._close_round)

    @eager
    def _close_round(self) -> None:
        """The end of a backward that stepped: the gradients DDP wrote back released, the
        parameters still holding a gradient stepped with it and released (those held from
        nested backwards; those whose hook did not fire: accumulated under accumulating()
        and not reached by this backward), the update count set, step counts mirrored."""
        with self._part_lock:
            for p in self._ddp_stepped:
                p.grad = None
            partial = [(i, p) for i, p in enumerate(self._params) if id(p) in self._partial] \
                if self._partial else []
            for _, p in partial:
                p.grad = None
            held = [p for p in self._params if p.grad is not None and self._hooked(p)]
            if held:   # (one part; a refusal leaves them and the open step as they are)
                self._guard.stepping(self, held)
                self._step_part(held, [p.grad for p in held])
                for p in held:
                    p.grad = None
            core = self._core
            core.t = max(core.t, max((s.steps for s in core.records), default=0))
            self._round, self._ddp_stepped = None, []
            self._accumulated = False
            self._stepped, self._watched, self._partial = set(), {}, set()
            self._opt_called = True   # (torch's lr schedulers read it)
            self._mirror()
        if partial:
            raise ValueError(
                f"{self._artifact.name}: {RULE}; parameters "
                f"{', '.join(f'{i} {tuple(p.shape)}' for i, p in partial)} were stepped when "
                "their gradient completed in the outer backward, then a reentrant "
                "checkpoint's backward added to it (a weight used outside a "
                "use_reentrant=True segment, after it, and inside it): this backward stepped "
                "them with that part of their gradient only. Later backwards hold them to "
                "their end; resume from a checkpoint, or use use_reentrant=False")

    def _positions(self) -> dict[int, int]:
        """id(p) -> p's index in the runtime, for this optimizer's parameters."""
        if self._index[0] is not self._params:   # (add_param_group made a new list)
            self._index = (self._params, {id(p): i for i, p in enumerate(self._params)})
        return self._index[1]

    @torch.no_grad()
    def _step_part(self, params: list, grads: list) -> None:
        """Step ``params`` (this optimizer's) with ``grads``, as one part of the step.
        FSDP2 shards: the ranks agree on the part's checks first (agreement.py), as on
        step()'s: a failure on one rank raises on every rank, nothing changed."""
        with self._part_lock:
            index, core = self._positions(), self._core
            given = dict(zip((index[id(p)] for p in params),
                             self._kernel_grads(list(map(fsdp.local, grads)))))
            part, _ = torch_agreement.run(self._agreement, self._artifact.name,
                                          lambda: core.check_part(given),
                                          [given.get(i) for i in range(len(self._params))])
            part.shared = self._round_scalars   # (one backward's parts: equal host scalars
            core.run_step(part, count=False)    # for equal kernel, group and step count)

    @staticmethod
    def _run_closure(closure: Any) -> Any:
        """``step(closure)``'s closure, with gradients on; its loss (None: no closure)."""
        with torch.enable_grad():
            return None if closure is None else closure()

    def _step_held(self, loss: Any, statistics: dict[str, Any]) -> Any:
        """``step()`` after its closure (whose backward stepped): the parameters still
        holding a gradient (accumulated under ``accumulating()``; normally none), their
        gradients released; returns the closure's ``loss``."""
        if statistics:
            raise TypeError(f"{self._artifact.name}: {RULE}; step() takes no statistics")
        self._check_owner("step_in_backward")
        self._guard.looped()
        held = [p for p in self._params if p.grad is not None]
        if any(id(p) in self._by_ddp for p in held):
            if not self._accumulated:
                composition.refuse(self._artifact.name, "attach_ddp", "freeze_unfreeze")
            raise ValueError(f"{self._artifact.name}: gradients accumulated under "
                             "accumulating() on a DDP model were never all-reduced; run "
                             "the last micro-batch's backward outside accumulating()")
        if held:
            self._step_now([p.grad for p in self._params], {})
            for p in held:
                p.grad = None
        self._accumulated = False
        self._opt_called = True
        return loss


@eager   # (a compiled train step's backward runs its hooks eagerly)
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

"""The step inside backward against what training loops do by default: DDP without
``opt.attach``, a GradScaler, ``clip_grad_norm_`` after backward, plain gradient
accumulation, the Hugging Face Trainer. optgen/torch/in_backward.py steps; a ``Guard``
(one per optimizer made with ``step_in_backward=True``) decides, before a backward's
first step changes anything, whether the loop around it can take that step. The texts
are runtime/composition.py's; raised through ``composition.refuse``.

At a backward's first step (``Guard.stepping``, called before any parameter of it is
stepped):

- **DDP**: a DistributedDataParallel model holding parameters of this optimizer that
  ``opt.attach`` did not attach: their hooks would step on each rank's own gradient,
  before the all-reduce, and DDP would write the average back for ``opt.step()`` to
  step again. Refused ("step_in_backward with ddp"). The models are found among the live
  objects (``gc``) once, at the first backward that steps while torch.distributed is
  initialized (a DDP model exists from before its first forward).
- **GradScaler**: the backward's root is a product with a constant (what
  ``scaler.scale(loss)`` makes: the roots are read from ``torch.autograd.backward``'s
  frame on the stack of the thread running it) and an enabled GradScaler holds a scale
  (found by ``gc`` once, the first time such a root is seen). Refused: the hooks would
  step with the scaled gradient, and GradScaler's skip of a whole step at an inf needs
  every gradient first. ``loss_scale=s`` (a fixed scale divided in each kernel) is the
  scaling that steps inside backward; all micro-batches inside ``accumulating()`` then
  ``scaler.step(opt)`` compose (``opt.step()`` steps the held, unscaled gradients).
- **The Hugging Face Trainer** running this backward (a ``Trainer`` up the stack whose
  optimizer is, or wraps, this one) with ``max_grad_norm > 0`` (its default 1.0): refused
  (its clip after backward would find every gradient released and clip nothing). Other
  code up the stack that names ``clip_grad_norm_`` (or ``clip_grad_value_``): a
  UserWarning, once per optimizer (whether that call runs cannot be known here).
- **Plain accumulation**: a parameter stepped again with no ``opt.step()`` or
  ``opt.zero_grad()`` since, in a loop that calls one of them: refused before it is
  stepped. A loop that calls neither before its first accumulated step learns it at that
  call (``looped``), after the first step's micro-batches each stepped.

Also here, read at construction: ``refusal`` (a rule that cannot step inside backward)
and ``made_by_zero`` (by optgen/torch/contract.py): whether torch's
ZeroRedundancyOptimizer up the call stack is making the optimizer; and for the buckets
(in_backward_buckets.py), ``fsdp_groups``: the parameters FSDP2 reduce-scatters together.

Composes: accelerate's ``GradientState.sync_gradients`` False (the Trainer's and
``accelerator.accumulate()``'s non-final micro-batches) holds a backward as
``accumulating()`` does (``holds``): the final micro-batch steps with the sums.
Imports: eager, optgen.runtime.composition.
"""
from __future__ import annotations

import gc
import sys
import threading
import warnings
import weakref
from types import FrameType
from typing import Any, Iterable

import torch

from optgen.runtime import composition
from .eager import eager

CLIPS = frozenset({"clip_grad_norm_", "clip_grad_norm", "clip_grad_value_"})
LIBRARIES = frozenset({"torch", "transformers", "accelerate", "optgen"})   # not the loop's code


class Guard:
    """One optimizer's view of the loop around its backwards (see the module docstring)."""

    def __init__(self, owner: str):
        self.owner = owner
        self.stepped: set[int] = set()   # id(p) stepped since the loop's last step()/zero_grad()
        self.twice = False               # one of them stepped twice since then
        self.loop_calls = False          # the loop has called step() or zero_grad()
        self.task: Any = None            # the graph task whose first step was checked
        self.ddp: list[weakref.ref] | None = None       # (None: not looked for yet)
        self.scalers: list[weakref.ref] | None = None
        self.warned = False

    @staticmethod
    def holds() -> bool:
        """Whether accelerate says this backward is a non-final micro-batch."""
        state = sys.modules.get("accelerate.state")
        shared = getattr(getattr(state, "GradientState", None), "_shared_state", None)
        return isinstance(shared, dict) and shared.get("sync_gradients", True) is False

    @eager
    def stepping(self, opt: Any, params: Iterable[torch.Tensor],
                 by: str = "step_in_backward") -> None:
        """``params`` of ``opt`` are about to be stepped by this backward (``by`` their
        hooks, or "attach_ddp": a bucket of an attached DDP model): refuse what the loop
        around it cannot take, before anything changes."""
        task = torch._C._current_graph_task_id()
        if task == -1 or task != self.task:
            self.task = task
            self._first_step(opt, by)
        ids = list(map(id, params))
        if not self.stepped.isdisjoint(ids):
            if self.loop_calls:
                composition.refuse(self.owner, by, "plain_accumulation")
            self.twice = True
        self.stepped.update(ids)

    @eager
    def looped(self) -> None:
        """The loop called ``opt.step()`` or ``opt.zero_grad()``."""
        twice, self.twice, self.loop_calls = self.twice, False, True
        self.stepped.clear()
        if twice:
            composition.refuse(self.owner, "step_in_backward", "plain_accumulation")

    # -- a backward's first step -----------------------------------------------------------
    def _first_step(self, opt: Any, by: str) -> None:
        roots, callers = _backward_stack()
        if self._unattached(opt):
            composition.refuse(self.owner, "step_in_backward", "ddp")
        if _scaled(roots) and self._scaler_holds_a_scale():
            composition.refuse(self.owner, by, "GradScaler")
        trainer = _trainer(callers, opt)
        if trainer is not None and (getattr(trainer.args, "max_grad_norm", 0) or 0) > 0:
            composition.refuse(self.owner, "step_in_backward", "hf_trainer")
        if trainer is None and not self.warned:
            where = _clipping(callers)
            if where is not None:   # (attributed to the loop's line that ran backward)
                self.warned = True
                code, text = where.f_code, composition.verdict(by, "clip_grad_norm").text
                names = ", ".join(sorted(CLIPS.intersection(code.co_names)))
                warnings.warn_explicit(
                    f"{self.owner}: {by} with clip_grad_norm: {text} ({code.co_name} names "
                    f"{names})", UserWarning, code.co_filename, where.f_lineno,
                    module=str(where.f_globals.get("__name__", "")))

    def _unattached(self, opt: Any) -> bool:
        """Whether a DDP model holds parameters of ``opt`` that ``opt.attach`` did not."""
        if self.ddp is None:
            dist = torch.distributed
            if not (dist.is_available() and dist.is_initialized()):
                return False   # (looked for at a later backward, once initialized)
            from torch.nn.parallel import DistributedDataParallel
            self.ddp = [weakref.ref(m) for m in _instances(DistributedDataParallel)]
        if not self.ddp:
            return False
        mine = {id(p) for p in opt._params}
        for ref in self.ddp:
            model = ref()
            if model is not None and any(id(p) in mine and id(p) not in opt._by_ddp
                                         for p in _ddp_params(model)):
                return True
        return False

    def _scaler_holds_a_scale(self) -> bool:
        if self.scalers is None:
            self.scalers = [weakref.ref(s) for s in _instances(torch.amp.GradScaler)]
        live = [s() for s in self.scalers]
        return any(s is not None and s.is_enabled() and getattr(s, "_scale", None) is not None
                   for s in live)


def refusal(art: Any) -> str | None:
    """Why this rule cannot step inside backward (None: it can); the other options
    against it: the composition table (runtime/composition.py, optgen/torch/contract.py)."""
    if art.inputs or art.statistics:
        return (f"{art.name} takes {', '.join([*art.inputs, *art.statistics])} passed to "
                "step(), which backward cannot pass")
    if any(k.global_sums for k in art.kernels):   # (the others' do not exist yet)
        return f"{art.name} sums over the gradients of every parameter each step (global_sum)"
    return None


# -- what the stack and the live objects say ---------------------------------------------
def made_by_zero() -> bool:
    """Whether torch's ZeroRedundancyOptimizer is making this optimizer (the local
    optimizer of its rank's partition): a ZeroRedundancyOptimizer up the call stack."""
    zero = getattr(getattr(torch.distributed, "optim", None), "ZeroRedundancyOptimizer", None)
    frame = sys._getframe(1)
    while zero is not None and frame is not None:
        if isinstance(frame.f_locals.get("self"), zero):
            return True
        frame = frame.f_back
    return False


def _backward_stack() -> tuple[list[torch.Tensor], list[FrameType]]:
    """The roots of the backward running now (``torch.autograd.backward``'s ``tensors``,
    its outermost call) and the frames that called it, innermost first; empty lists
    when no thread is in it (a backward not started from Python). Hooks of CUDA
    tensors run on autograd's device threads: then the caller is another thread."""
    code = torch.autograd.backward.__code__
    here = threading.get_ident()
    stacks = [sys._getframe(1)] + [f for t, f in sys._current_frames().items() if t != here]
    for frame in stacks:
        frames = []
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
        at = [i for i, f in enumerate(frames) if f.f_code is code]
        if at:
            given = frames[at[-1]].f_locals.get("tensors")
            given = given if isinstance(given, (tuple, list)) else (given,)
            return [t for t in given if isinstance(t, torch.Tensor)], frames[at[-1] + 1:]
    return [], []


def _scaled(roots: list[torch.Tensor]) -> bool:
    """Whether a root is a product with a constant tensor (``GradScaler.scale``'s)."""
    for r in roots:
        fn = r.grad_fn
        if fn is not None and fn.name() == "MulBackward0" and \
                any(nxt is None for nxt, _ in fn.next_functions):
            return True
    return False


def _trainer(callers: list[FrameType], opt: Any) -> Any:
    """The Hugging Face Trainer up the stack whose optimizer is (or wraps) ``opt``."""
    cls = getattr(sys.modules.get("transformers.trainer"), "Trainer", None)
    if cls is None:
        return None
    for f in callers:
        if "self" not in f.f_code.co_varnames[:1]:
            continue
        t = f.f_locals.get("self")
        if isinstance(t, cls):
            inner = getattr(t, "optimizer", None)
            for _ in range(4):   # (accelerate's AcceleratedOptimizer holds it as .optimizer)
                if inner is opt:
                    return t
                inner = getattr(inner, "optimizer", None)
    return None


def _clipping(callers: list[FrameType]) -> FrameType | None:
    """The first caller outside the libraries whose code names a gradient clip."""
    for f in callers:
        if str(f.f_globals.get("__name__", "")).split(".")[0] in LIBRARIES:
            continue
        if not CLIPS.isdisjoint(f.f_code.co_names):
            return f
    return None


def fsdp_groups(params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The parameters of ``params`` that FSDP2 reduce-scatters together: one list per
    ``fully_shard``-ed module (its parameters but those of the ``fully_shard``-ed modules
    inside it), in ``params``' order; none where FSDP2 is not imported or no parameter
    is a DTensor. (The modules are found among the live objects.)"""
    cls = getattr(sys.modules.get("torch.distributed.fsdp"), "FSDPModule", None)
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    if cls is None or dtensor is None or not any(isinstance(p, dtensor) for p in params):
        return []
    where, found = {id(p): i for i, p in enumerate(params)}, []
    for m in _instances(cls):
        inner = {id(q) for sub in m.modules() if sub is not m and isinstance(sub, cls)
                 for q in sub.parameters()}
        mine = sorted({where[id(q)] for q in m.parameters()
                       if id(q) in where and id(q) not in inner})
        if mine:
            found.append([params[i] for i in mine])
    return found


def _instances(cls: type) -> list:
    """The live instances of ``cls`` and its subclasses (an instance refers to its type:
    no isinstance on every object, which can run a module's ``__getattr__``)."""
    types, todo = set(), [cls]
    while todo:
        c = todo.pop()
        if c not in types:
            types.add(c)
            todo.extend(c.__subclasses__())
    return [o for o in gc.get_referrers(*types) if type(o) in types]


def _ddp_params(model: Any) -> list[torch.Tensor]:
    """The parameters a DDP model all-reduces (those it does not ignore, with gradients)."""
    params = getattr(model, "_module_parameters", None)
    if params is None:
        params = list(model.module.parameters())
    return [p for p in params if p.requires_grad]

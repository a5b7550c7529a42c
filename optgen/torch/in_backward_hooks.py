"""The hooks of the step inside backward (optgen/torch/in_backward.py): which optimizer
owns a parameter, the hooks themselves, and in which backward a hook runs.

- Ownership: the newest ``step_in_backward`` optimizer made on a parameter (or given it
  by ``add_param_group``) owns it; an older one's hooks on it then do nothing, and the
  older one's ``step()`` and ``accumulating()`` raise (``claim``, ``owns``; ``claims``
  counts the claims, so an optimizer may keep what it found until the next one).
- Hooks go on every floating-point parameter, frozen ones too (``hook_all``): a hook
  outlives ``requires_grad_`` changes, so a parameter unfrozen after construction steps
  when its gradient completes, and a frozen one gets no gradient and never steps.
- Nesting (``enclosing_node``): a reentrant checkpoint's node recomputes its segment and
  runs a backward of its own inside the backward the user called; each such backward
  accumulates into ``.grad`` and fires the hooks again, so a hook there cannot know
  whether the gradient is complete. The optimizer holds such gradients and steps them
  when the outermost backward ends (``after``: a node's post hook, run in the backward
  that ran the node). FSDP2 calls the hooks of its sharded parameters itself, once their
  reduce-scatter is done, from its post-backward (a Python node of the outer backward):
  such a gradient is complete, whatever node runs it.

Imports: eager.
"""
from __future__ import annotations

import functools
import inspect
import sys
import weakref
from typing import Any, Callable, Iterable

import torch

from .eager import eager

# id(p) -> (weak reference to p, weak reference to its owner)
_OWNERS: dict[int, tuple[weakref.ref, weakref.ref]] = {}

_APPLY = torch.autograd.function.BackwardCFunction.apply.__code__   # a Python node's backward


_CLAIMS = [0]   # claims made so far: what ``owns`` answers changes only with it
_ALL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # opt -> owns_all's answer


def claim(params: Iterable[torch.Tensor], opt: Any) -> None:
    """``opt`` steps ``params`` from now on (it is the newest optimizer made on them)."""
    for p in params:
        key = id(p)
        _OWNERS[key] = (weakref.ref(p, functools.partial(_forget, key)), weakref.ref(opt))
    _CLAIMS[0] += 1


def claims() -> int:
    """How many claims were made: ``owns(opt, p)`` for a live ``p`` stays as it was
    while this does (an owner that dies leaves its parameters to no one)."""
    return _CLAIMS[0]


def _forget(key: int, ref: weakref.ref) -> None:
    entry = _OWNERS.get(key)
    if entry is not None and entry[0] is ref:
        del _OWNERS[key]


def owns_all(opt: Any, params: list) -> bool:
    """Whether ``opt`` owns each of ``params`` (the answer kept for this list until the
    next claim: step() asks every step)."""
    kept = _ALL.get(opt)
    if kept is None or kept[0] != _CLAIMS[0] or kept[1] is not params:
        kept = _ALL[opt] = (_CLAIMS[0], params, all(owns(opt, p) for p in params))
    return kept[2]


def owns(opt: Any, p: torch.Tensor) -> bool:
    """Whether ``opt`` is the newest step-in-backward optimizer made on ``p``."""
    entry = _OWNERS.get(id(p))
    return entry is not None and entry[0]() is p and entry[1]() is opt


def hook_all(params: Iterable[torch.Tensor], hook: Callable) -> None:
    """A post-accumulate-grad hook on each floating-point parameter. One that does not
    require a gradient now gets it too (requires_grad on for the registration only: torch
    refuses hooks on such tensors, and a hook stays through later ``requires_grad_``)."""
    for p in params:
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)
        elif p.is_floating_point() or p.is_complex():
            p.requires_grad_(True)
            try:
                p.register_post_accumulate_grad_hook(hook)
            finally:
                p.requires_grad_(False)


def enclosing_node() -> Any:
    """The autograd node whose backward runs the current backward (a reentrant
    checkpoint's node, running its segment's own backward), or None: the current backward
    is the one the user called, or the hook is FSDP2's, after its reduce-scatter. (A
    Python node's backward runs in ``BackwardCFunction.apply`` on the thread running the
    outer backward, the device's thread included.)"""
    frame, reduce = sys._getframe(1), _fsdp_reduce()
    while frame is not None:
        if frame.f_code is reduce:
            return None
        if frame.f_code is _APPLY:
            return frame.f_locals.get("self")
        frame = frame.f_back
    return None


def _fsdp_reduce() -> Any:
    """The code of FSDP2's reduce-scatter after backward (``foreach_reduce``, which calls
    the sharded parameters' post-accumulate-grad hooks), where FSDP2 is imported."""
    found = getattr(sys.modules.get("torch.distributed.fsdp._fully_shard._fsdp_collectives"),
                    "foreach_reduce", None)
    return getattr(inspect.unwrap(found), "__code__", None) if found is not None else None


def after(node: Any, me: weakref.ref, then: str) -> None:
    """Call ``me().<then>()`` when ``node`` has run, in the backward that ran it."""
    node.register_hook(functools.partial(_ran, me, then))


@eager
def _ran(me: weakref.ref, then: str, grad_inputs: Any, grad_outputs: Any) -> None:
    opt = me()
    if opt is not None:
        getattr(opt, then)()

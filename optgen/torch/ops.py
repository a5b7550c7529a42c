"""What torch.compile sees of an optgen.torch step: one custom op, ``optgen::step``.

    torch._dynamo.config.trace_autograd_ops = True     # backward in the same graph
    @torch.compile(fullgraph=True)
    def train_step(x, y):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

Under torch.compile, ``OptgenOptimizer.step`` calls ``torch.ops.optgen.step(handle,
params, grads, states)``: an opaque op that mutates the parameters and every state tensor
(``mutates_args``), whose fake implementation does nothing (an in-place step has no
outputs). Dynamo never traces into the runtime, so the compiled graph holds no numpy,
no scalar-expression parsing and no tvm_ffi call: the whole step (checks, counting,
preprocessing, host scalars, every kernel call) runs when the op runs.

Host scalars (lr, bias corrections, schedules) are computed inside the op from the
optimizer's groups as of that call. The graph reads no hyperparameter, so dynamo puts
no guard on one: an lr scheduler that changes ``group["lr"]`` between compiled calls
causes no recompile and no kernel rebuild. ``handle`` is an integer naming the
optimizer (a guarded constant: one per optimizer, never changing).

Functionalization may hand the op copies of the parameters and states instead of the
tensors themselves (AOTAutograd writes them back after the graph); the op then steps
the optimizer's own tensors after taking the copies' values, and writes the results
into the copies, so both ways end with the same parameters and states.
"""
import itertools
import weakref
from typing import List, Optional

import torch
from torch import Tensor

_live: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
_handles = itertools.count(1)


def register(optimizer: object) -> int:
    """A new handle for ``optimizer`` (held weakly: the op does not keep it alive)."""
    handle = next(_handles)
    _live[handle] = optimizer
    return handle


# The annotations are the op's schema (torch.library reads them): no string annotations.
@torch.library.custom_op("optgen::step", mutates_args=("params", "states"))
def step(handle: int, params: List[Tensor], grads: List[Optional[Tensor]],
         states: List[Tensor]) -> None:
    """One step of the optimizer ``handle`` names (``OptgenOptimizer._step_op``)."""
    optimizer = _live.get(handle)
    if optimizer is None:
        raise RuntimeError(f"optgen::step: no live optimizer has handle {handle} (a compiled "
                           "function kept a handle to an optimizer that was deleted)")
    optimizer._step_op(params, grads, states)


@step.register_fake
def _step_fake(handle: int, params: List[Tensor], grads: List[Optional[Tensor]],
               states: List[Tensor]) -> None:
    """Nothing to allocate: the step writes its inputs in place and returns nothing."""
    return None


def stepped(given: List[Tensor], own: List[Tensor], run) -> None:
    """Run ``run()`` (which steps the ``own`` tensors) so that ``given`` ends as ``own``
    does: where functionalization passed a copy, the own tensor takes the copy's value
    first and gives the result back after."""
    if len(given) != len(own):
        raise RuntimeError(f"optgen::step: {len(given)} tensors passed, the optimizer has "
                           f"{len(own)} (its parameters or states changed after compiling)")
    copies = [(g, o) for g, o in zip(given, own) if g is not o and (
        g.data_ptr() != o.data_ptr() or g.stride() != o.stride())]
    for g, o in copies:
        if g.shape != o.shape:
            raise RuntimeError(f"optgen::step: a tensor of shape {tuple(g.shape)} was passed "
                               f"for one of shape {tuple(o.shape)}")
        o.copy_(g)
    run()
    for g, o in copies:
        g.copy_(o)

"""``eager(fn)``: ``torch.compiler.disable(fn)`` without importing torch._dynamo when
optgen.torch is imported (0.5-0.7 s of ``import optgen.torch``). Until something
imports torch._dynamo (torch.compile does) nothing can compile a caller, so ``fn`` runs
as it is; from then on calls go through ``torch.compiler.disable(fn)``, made once: a
compiled train step's backward runs the hooks eagerly, as with the decorator itself.
Outside any compiled code (no frame being traced, no frame-evaluation callback set:
nothing would catch ``fn``'s frames) ``fn`` runs directly, as ``disable``'s wrapper
would run it (about 1.5 us less a call: the step inside backward's hook runs per
parameter).
Imports: nothing of optgen's."""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable


def eager(fn: Callable) -> Callable:
    disabled: list[Callable] = []

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        if disabled:
            if disabled[1]() or disabled[2]() is not None:
                return disabled[0](*args, **kwargs)
            return fn(*args, **kwargs)   # (no frame is being compiled or caught: as is)
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        import torch
        disabled.extend((torch.compiler.disable(fn), torch.compiler.is_compiling,
                         torch._C._dynamo.eval_frame.get_eval_frame_callback))
        return disabled[0](*args, **kwargs)
    return run

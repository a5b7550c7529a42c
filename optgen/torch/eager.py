"""``eager(fn)``: ``torch.compiler.disable(fn)`` without importing torch._dynamo when
optgen.torch is imported (0.5-0.7 s of ``import optgen.torch``). Until something
imports torch._dynamo (torch.compile does) nothing can compile a caller, so ``fn`` runs
as it is; from then on calls go through ``torch.compiler.disable(fn)``, made once: a
compiled train step's backward runs the hooks eagerly, as with the decorator itself.
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
            return disabled[0](*args, **kwargs)
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        import torch
        disabled.append(torch.compiler.disable(fn))
        return disabled[0](*args, **kwargs)
    return run

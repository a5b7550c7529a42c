"""Matrix rules build every library a run needs when the optimizer is made.

A variant's library (a parameter dtype and flag values) is otherwise compiled when its
kernels are first called, which for an elementwise rule is a few seconds at the first
step. A matrix rule's library holds its products and is much longer to build (SOAP's:
tens of seconds on a small CPU), so the Optimizer of a matrix rule builds at
construction, in one build, the variants of every parameter's kernel under its flags,
and the sum-of-squares pass that ``clip_global_norm`` and ``nonfinite`` run; training
then builds nothing unless a flag is changed (``set_hyper``). A refresh rule (SOAP's
basis, Shampoo's roots, THOR's inverses) runs on the host and needs no library.

May import: launch, tensors.
"""
from __future__ import annotations

from typing import Any, Callable

from . import launch as launch_, tensors


def wanted(artifact: Any) -> bool:
    """Whether an optimizer of ``artifact`` builds its libraries when it is made: the
    rule multiplies matrices or refreshes states on a schedule."""
    return any(k.matrix or k.refresh is not None for k in artifact.kernels)


def build_now(launcher: launch_.Launcher, flags_of: Callable[[int], dict[str, bool]],
              norms: bool) -> None:
    """Build (those not built yet, in one build) and load the libraries of every
    parameter's kernel under its flags (``flags_of(i)``); ``norms``: also the
    sum-of-squares pass of each parameter dtype. A variant that cannot be had is a
    VariantNotBuilt here (a prebuilt artifact without it)."""
    if not launcher.compiled:
        return
    n = len(launcher.slots)
    kernels = [launcher.select(i, flags_of(i), load=False) for i in range(n)]
    launcher.artifact.ensure(sorted({k.variant for k in kernels if k.functions}))
    for i in range(n):
        launcher.select(i, flags_of(i))
    if norms and launch_.SUM_OF_SQUARES is not None:
        for s in launcher.slots:
            dtype = tensors.dtype_name(s.array, s.lib)
            if dtype not in launcher.norms:
                launcher.norms[dtype] = launch_.SUM_OF_SQUARES(launcher.artifact, dtype, True)

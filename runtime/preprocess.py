"""What happens to the gradients of a step before the kernels see them: the loss scale
and the global-norm clip coefficient (one factor, fused into the kernels through the
spec's rescale_grad), the non-finite check, and gradient centralization.

May import: tensors, sparse. Imports no other runtime module.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from . import tensors
from .sparse import RowSparse

NORM_EPS = 1e-6   # clip coefficient max_norm / (norm + eps), as torch.nn.utils.clip_grad_norm_


def grad_scale(owner: str, grads: Sequence[Any], libs: Sequence[str],
               group_of: Sequence[int], rescale: Sequence[float], loss_scale: float,
               clip_global_norm: float | None, nonfinite: str | None,
               names: Sequence[str | None]) -> tuple[float | None, float | None]:
    """(scale, norm): the factor every gradient is multiplied by this step,
    1/loss_scale times the global-norm clip coefficient, and the global norm of the
    gradients as the kernels see them (``rescale[group]`` is each group's
    rescale_grad); norm is None when it was not computed (neither clipping nor a
    non-finite check). scale is None (norm NaN) when a gradient is not finite and
    ``nonfinite == "skip"``; with ``"raise"`` that is a FloatingPointError."""
    scale = 1.0 / loss_scale
    if clip_global_norm is None and nonfinite is None:
        return scale, None

    def values(i: int, g) -> tuple[Any, str]:   # the array holding g's values, its library
        return (g.rows, "numpy") if isinstance(g, RowSparse) else (g, libs[i])

    total = 0.0
    for i, g in enumerate(grads):
        if g is None:
            continue
        r = rescale[group_of[i]] * scale
        total += tensors.sum_of_squares(*values(i, g)) * r * r
    if not math.isfinite(total):
        bad = next((i for i, g in enumerate(grads)
                    if g is not None and not tensors.all_finite(*values(i, g))), None)
        if bad is not None:
            if nonfinite == "skip":
                return None, math.nan
            raise FloatingPointError(f"{owner}: gradient {bad}"
                                     f"{f' ({names[bad]})' if names[bad] else ''} "
                                     "has NaN or Inf values; the step was not applied "
                                     "(nonfinite='skip' skips such steps)")
    norm = math.sqrt(total)
    if clip_global_norm is not None:
        scale *= min(1.0, clip_global_norm / (norm + NORM_EPS))
    return scale, norm


def centralize(grads: list, libs: Sequence[str], which: Sequence[int]) -> None:
    """Replace the dense gradients of parameters ``which`` (groups with
    grad_centralization) by their centralized copies."""
    for i in which:
        g = grads[i]
        if g is not None and not isinstance(g, RowSparse):
            grads[i] = tensors.centralize(g, libs[i])

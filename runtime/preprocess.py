"""What happens to the gradients of a step before the kernels see them: the loss scale
and the global-norm clip coefficient (one factor, fused into the kernels through the
spec's rescale_grad), the non-finite check, and gradient centralization.

May import: shards, tensors, sparse. Imports no other runtime module.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from . import shards as shards_
from . import tensors
from .sparse import RowSparse

NORM_EPS = 1e-6   # clip coefficient max_norm / (norm + eps), as torch.nn.utils.clip_grad_norm_
# A kernel forms each square in its dtype (float32 for float32 and 16-bit gradients) and
# sums in float64; a gradient whose squares overflowed is summed again with its scale
# times RESCUE: every finite float32 value's square fits then (|x| * 2**-64 < 2**64),
# and the sum divided by RESCUE**2 (a power of two: exact) is the float64 one.
RESCUE = 2.0 ** -64


def grad_scale(owner: str, grads: Sequence[Any], slots: Sequence[Any], *,
               rescale: Sequence[float], loss_scale: float, clip_global_norm: float | None,
               nonfinite: str | None, shards: Any = None,
               squares: Callable[[int, Any], float | None] | None = None
               ) -> tuple[float | None, float | None]:
    """(scale, norm): the factor every gradient is multiplied by this step,
    1/loss_scale times the global-norm clip coefficient, and the global norm of the
    gradients as the kernels see them (``slots``: the parameters' records;
    ``rescale[group]`` is each group's rescale_grad); norm is None when it was not computed (neither clipping nor a
    non-finite check). scale is None (norm NaN) when a gradient is not finite and
    ``nonfinite == "skip"``; with ``"raise"`` that is a FloatingPointError.
    ``squares(i, g, r)``: the sum of the squares of a dense gradient times r by a kernel
    (summed in float64, each square in the kernel's dtype: an infinite sum is taken again
    scaled, so finite float32 gradients give a finite norm; None: no kernel, then the
    array library's float64 pass)."""
    scale = 1.0 / loss_scale
    if clip_global_norm is None and nonfinite is None:
        return scale, None

    def values(i: int, g) -> tuple[Any, str]:   # the array holding g's values, its library
        return (g.rows, "numpy") if isinstance(g, RowSparse) else (g, slots[i].lib)

    parts = [0.0, 0.0]      # (parameters split across ranks, whole ones)
    for i, g in enumerate(grads):
        if g is None:
            continue
        r = rescale[slots[i].group] * scale
        sq = None if squares is None or isinstance(g, RowSparse) else squares(i, g, r)
        if sq is not None and not math.isfinite(sq):   # an overflow, or a non-finite value
            again = squares(i, g, r * RESCUE)
            sq = again / (RESCUE * RESCUE) if again is not None else sq
        parts[shards_.split(shards, i) is None] += \
            tensors.sum_of_squares(*values(i, g)) * r * r if sq is None else sq
    bad = None              # a non-finite gradient (not an overflow of the sum)
    if not math.isfinite(parts[0] + parts[1]):
        bad = next((i for i, g in enumerate(grads)
                    if g is not None and not tensors.all_finite(*values(i, g))), None)
    total, elsewhere = parts[0] + parts[1], False
    if shards is not None:   # every rank: the same total, and whether any rank has one
        total, elsewhere = shards_.sum_of_squares(shards, parts[0], parts[1], bad is not None)
    if bad is not None or elsewhere:
        if nonfinite == "skip":
            return None, math.nan
        name = None if bad is None else slots[bad].name
        where = "a gradient on another rank" if bad is None else \
            f"gradient {bad}{f' ({name})' if name else ''}"
        raise FloatingPointError(f"{owner}: {where} has NaN or Inf values; the step was "
                                 "not applied (nonfinite='skip' skips such steps)")
    norm = math.sqrt(total)
    if clip_global_norm is not None:
        scale *= min(1.0, clip_global_norm / (norm + NORM_EPS))
    return scale, norm


def centralize(grads: list, which: Sequence[Any]) -> None:
    """Replace the dense gradients of the parameters ``which`` (their records: groups
    with grad_centralization) by their centralized copies."""
    for s in which:
        g = grads[s.index]
        if g is not None and not isinstance(g, RowSparse):
            grads[s.index] = tensors.centralize(g, s.lib)

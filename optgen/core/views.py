"""The ``[B, R, C]`` view of a parameter that kernels and the reference interpreter share.

``B = prod(shape[:-2])``, ``R = shape[-2]``, ``C = shape[-1]`` for two or more
dimensions, ``[1, 1, n]`` below that. A value that varies along ``axes`` (a subset of
"brc") is stored with the extents of those axes: per element ``[B, R, C]``, row states
``[B, R]`` (shape[:-1]), column states ``[B, C]`` (shape[:-2] + shape[-1:]).

Matrix rules (2-D parameters, B = 1) name a value's shape with two capital letters
instead: "RC" (the parameter's R x C), "RR", "CC" and "CR"; kernels of view "matrix"
receive such arrays as 2-D ``(R, C)``, ``(R, R)``, ... arrays.
"""
from __future__ import annotations

import math

import numpy as np

from optgen.core.formats.registry import FLAT_VIEWS

AXES = "brc"


def dims(shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(shape) >= 2:
        return math.prod(shape[:-2]), shape[-2], shape[-1]
    return 1, 1, math.prod(shape)


MATRIX_DIMS = {"R": 1, "C": 2}     # a matrix code's letter -> index into (B, R, C)


def is_matrix(axes: str) -> bool:
    return bool(axes) and axes[0] in MATRIX_DIMS


def shape_env(shape: tuple[int, ...]) -> dict[str, int]:
    """The names a shape flag's rule reads (``spec.shape_flag``): ndim, numel, and rows
    and cols (R and C of the view)."""
    _, r, c = dims(tuple(shape))
    return {"ndim": len(shape), "numel": math.prod(shape), "rows": r, "cols": c}


def state_shape(param_shape: tuple[int, ...], shape_kind: str) -> tuple[int, ...]:
    """The array shape of a state of ``shape_kind`` ("param", "row", "col", or the
    matrices "rr" (R x R) and "cc" (C x C))."""
    if shape_kind == "param":
        return tuple(param_shape)
    if shape_kind in ("rr", "cc"):
        n = dims(tuple(param_shape))[MATRIX_DIMS[shape_kind[0].upper()]]
        return (n, n)
    if len(param_shape) >= 2:
        return tuple(param_shape[:-1]) if shape_kind == "row" else \
            tuple(param_shape[:-2]) + tuple(param_shape[-1:])
    b, r, c = dims(param_shape)
    return (r,) if shape_kind == "row" else (c,)


def extents(d: tuple[int, int, int], axes: str) -> tuple[int, ...]:
    if is_matrix(axes):
        return tuple(d[MATRIX_DIMS[a]] for a in axes)
    return tuple(d[AXES.index(a)] for a in axes)


def as_kernel(arr: np.ndarray, axes: str, d: tuple[int, int, int], view: str) -> np.ndarray:
    """How a kernel of ``view`` ("flat", "3d" or "matrix") receives an array holding
    ``axes``."""
    if view in FLAT_VIEWS or not axes:
        return arr.reshape(-1)
    return arr.reshape(extents(d, axes))


def broadcastable(arr: np.ndarray, axes: str, d: tuple[int, int, int]) -> np.ndarray:
    """``arr`` reshaped to 3 dimensions, with extent 1 on the axes it does not hold (a
    matrix: ``(1, rows, cols)``)."""
    if is_matrix(axes):
        return arr.reshape((1, *extents(d, axes)))
    return arr.reshape(tuple(d[k] if a in axes else 1 for k, a in enumerate(AXES)))

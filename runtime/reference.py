"""The reference interpreter: evaluates a kernel's IR (as the manifest stores it) with numpy.

It is the oracle for "compiled kernel == spec": same IR, same host scalars, evaluated in
the kernel's dtype (float32 or float64) without TVM, on the ``[B, R, C]`` view
(runtime.views). Reductions accumulate in float64 and are rounded once to the dtype,
as the kernels do; everything is computed from the old values, then returned.
Arrays of another dtype (float16 states, the float16/bfloat16 gradients of a
mixed-precision kernel) are read cast to the kernel dtype.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from .views import AXES, broadcastable

LOW_COPY = "w_low"   # the low-precision parameter of a mixed-precision kernel

_UNARY = {"sqrt": np.sqrt, "exp": np.exp, "log": np.log, "abs": np.abs, "sign": np.sign,
          "neg": np.negative, "not": np.logical_not}
_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
           "pow": np.power, "min": np.minimum, "max": np.maximum, "lt": np.less,
           "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
           "ne": np.not_equal, "and": np.logical_and, "or": np.logical_or}


def evaluate(ir: dict, dtype: str, arrays: Mapping[str, np.ndarray],
             axes: Mapping[str, str], scalars: Mapping[str, float],
             d: tuple[int, int, int]) -> dict[str, np.ndarray]:
    """New values of every output, each shaped like its array in ``arrays`` and of its
    dtype, except ``w_low`` (mixed precision): the new ``w`` in the kernel dtype, which
    rounds when assigned into the low-precision parameter (it need not be in ``arrays``).

    ``arrays`` maps buffer names to arrays, ``axes`` their axes, ``d`` the view's
    ``(B, R, C)``."""
    dt = np.dtype(dtype).type
    vals: list = []
    with np.errstate(all="ignore"):
        for rec in ir["nodes"]:
            op = rec["op"]
            a = [vals[i] for i in rec.get("args", ())]
            if op == "const":
                v = dt(rec["value"]) if rec["dtype"] == "float" else bool(rec["value"])
            elif op in ("param", "grad", "state"):
                name = rec["name"]
                v = broadcastable(arrays[name], axes[name], d)
                if v.dtype != dt:  # float16 state, low-precision gradient: computed in dt
                    v = v.astype(dt)
            elif op == "hyper":
                v = dt(scalars[rec["name"]])
            elif op == "reduce":
                red = tuple(AXES.index(x) for x in rec["name"])
                full = np.broadcast_to(a[0], d).astype(np.float64)
                v = np.sum(full, axis=red, keepdims=True)
                if rec["value"] == "mean":
                    v = v / np.float64(math.prod(d[k] for k in red))
            elif op == "pow":  # in float64, rounded once (as the kernels)
                v = np.power(np.asarray(a[0], np.float64), np.asarray(a[1], np.float64))
            elif op == "rsqrt":
                v = dt(1) / np.sqrt(a[0])
            elif op == "where":
                v = np.where(a[0], a[1], a[2])
            elif op in _UNARY:
                v = _UNARY[op](a[0])
            else:
                v = _BINARY[op](a[0], a[1])
            if rec["dtype"] == "float":
                v = np.asarray(v, dtype=dt) if isinstance(v, np.ndarray) else dt(v)
            vals.append(v)
        out = {}
        for name, i in ir["outputs"].items():
            like = arrays["w"] if name == LOW_COPY else arrays[name]
            target = broadcastable(like, axes[name], d)
            out[name] = np.broadcast_to(np.asarray(vals[i], dtype=dt), target.shape) \
                .reshape(like.shape).astype(like.dtype)
        return out

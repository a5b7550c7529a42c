"""The reference interpreter: evaluates a kernel's IR (as the manifest stores it) with numpy.

It is the oracle for "compiled kernel == spec": same IR, same host scalars, evaluated
elementwise in the parameter's dtype (float32 or float64) without TVM.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

_UNARY = {"sqrt": np.sqrt, "exp": np.exp, "log": np.log, "abs": np.abs, "sign": np.sign,
          "neg": np.negative, "not": np.logical_not}
_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
           "pow": np.power, "min": np.minimum, "max": np.maximum, "lt": np.less,
           "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
           "ne": np.not_equal, "and": np.logical_and, "or": np.logical_or}


def evaluate(ir: dict, dtype: str, arrays: Mapping[str, np.ndarray],
             scalars: Mapping[str, float]) -> dict[str, np.ndarray]:
    """New values of every output, as fresh arrays of ``arrays["w"]``'s shape."""
    dt = np.dtype(dtype).type
    shape = arrays["w"].shape
    vals: list = []
    with np.errstate(all="ignore"):
        for rec in ir["nodes"]:
            op = rec["op"]
            a = [vals[i] for i in rec.get("args", ())]
            if op == "const":
                v = dt(rec["value"]) if rec["dtype"] == "float" else bool(rec["value"])
            elif op in ("param", "grad", "state"):
                v = arrays[rec["name"]]
            elif op == "hyper":
                v = dt(scalars[rec["name"]])
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
        return {name: np.broadcast_to(np.asarray(vals[i], dtype=dt), shape).copy()
                for name, i in ir["outputs"].items()}

"""The reference interpreter: evaluates a kernel's IR (as the manifest stores it) with numpy.

It is the oracle for "compiled kernel == spec": same IR, same host scalars, evaluated in
the kernel's dtype (float32 or float64) without TVM, on the ``[B, R, C]`` view
(runtime.views). Reductions accumulate in float64 and are rounded once to the dtype,
as the kernels do; everything is computed from the old values, then returned.
Arrays of another dtype (float16 states, the float16/bfloat16 gradients of a
mixed-precision kernel) are read cast to the kernel dtype.

Matrix rules (2-D parameters) evaluate products with ``np.matmul`` in the kernel dtype and
``repeat`` as a Python loop over the body's nodes; the refresh rule's ``inverse`` is
``np.linalg.inv`` and ``inverse_root`` ``eigh`` (both in float64), ``power_qr`` ``eigh``
or ``qr`` and ``eigen_order`` a sort by Rayleigh quotient (both in the evaluation's
dtype: float64, or float32 for SOAP's refresh in its authors' precision). Statistics are
arrays like the states.
"""
from __future__ import annotations

import math
from typing import Collection, Mapping

import numpy as np

from .rounding import nearest_bfloat16
from .views import AXES, broadcastable, extents

LOW_COPY = "w_low"   # the low-precision parameter of a mixed-precision kernel

_UNARY = {"sqrt": np.sqrt, "exp": np.exp, "log": np.log, "abs": np.abs, "sign": np.sign,
          "neg": np.negative, "not": np.logical_not}
# the C library's functions (optgen.ir.LIBM) and copysign: evaluated in float64 and
# rounded once to the kernel dtype, the most exact value a float32 kernel can return
_LIBM = {"atan": np.arctan, "atan2": np.arctan2, "tanh": np.tanh, "erf": None,
         "log1p": np.log1p, "expm1": np.expm1, "sinh": np.sinh, "cosh": np.cosh,
         "copysign": np.copysign}
_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
           "pow": np.power, "min": np.minimum, "max": np.maximum, "lt": np.less,
           "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
           "ne": np.not_equal, "and": np.logical_and, "or": np.logical_or}


def evaluate(ir: dict, dtype: str, arrays: Mapping[str, np.ndarray],
             axes: Mapping[str, str], scalars: Mapping[str, float],
             d: tuple[int, int, int], raw: Collection[str] = (),
             given: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
    """New values of every output, each shaped like its array in ``arrays`` and of its
    dtype, except ``w_low`` (mixed precision): the new ``w`` in the kernel dtype, which
    rounds when assigned into the low-precision parameter. Given in ``arrays``, ``w_low``
    is read too: where it is not ``w`` rounded, it is the master (``adopted``),
    and the outputs in ``raw``, also in the kernel dtype (the caller rounds them:
    stochastic rounding, optgen/core/rounding.py).

    ``arrays`` maps buffer names to arrays, ``axes`` their axes, ``d`` the view's
    ``(B, R, C)``. ``given`` holds reductions' values by buffer name (the totals of
    sums over all parameters, ``partial_sums``), read in place of this tensor's."""
    dt = np.dtype(dtype).type
    nodes = ir["nodes"]
    vals: list = [None] * len(nodes)
    body_of = _loop_bodies(nodes)
    inside = {k for body in body_of.values() for k in body}
    fixed = {ir["reductions"][n]: v for n, v in (given or {}).items()}

    def node_value(k: int):
        rec = nodes[k]
        op = rec["op"]
        a = [vals[i] for i in rec.get("args", ())]
        if op == "const":
            v = dt(rec["value"]) if rec["dtype"] == "float" else bool(rec["value"])
        elif op in ("param", "grad", "state", "stat"):
            name = rec["name"]
            v = broadcastable(arrays[name], axes[name], d)
            if v.dtype != dt:  # float16 state, low-precision gradient: computed in dt
                v = v.astype(dt)
            if name == "w" and LOW_COPY in arrays:   # (mixed: see ``adopted``)
                v = adopted(v, broadcastable(arrays[LOW_COPY], axes[LOW_COPY], d), dt)
        elif op in ("hyper", "t"):
            v = dt(scalars[rec["name"]])
        elif k in fixed:
            v = np.full((1, 1, 1), fixed[k], np.float64)
        elif op == "reduce" and "mat" in nodes[rec["args"][0]]:   # a whole matrix
            v = np.sum(a[0], dtype=np.float64).reshape(1, 1, 1)
            if rec["value"] == "mean":
                v = v / np.float64(np.size(a[0]))
        elif op == "reduce" and len(a) == 2:   # over groups of rows (heads): per row
            heads = int(round(float(a[1])))
            rows = np.broadcast_to(a[0], (d[0], d[1], 1)).astype(np.float64)
            v = np.sum(rows.reshape(d[0], heads, d[1] // heads), axis=2, keepdims=True)
            if rec["value"] == "mean":
                v = v / np.float64(d[1] // heads)
            v = np.repeat(v, d[1] // heads, axis=2).reshape(d[0], d[1], 1)
        elif op == "reduce":
            red = tuple(AXES.index(x) for x in rec["name"])
            full = np.broadcast_to(a[0], d).astype(np.float64)
            v = np.sum(full, axis=red, keepdims=True)
            if rec["value"] == "mean":
                v = v / np.float64(math.prod(d[k] for k in red))
        elif op == "matmul":
            v = _matmul(nodes, rec["args"], a[0], a[1])
        elif op == "transpose":
            v = np.swapaxes(a[0], -1, -2)
        elif op == "identity":
            v = np.eye(d[1] if rec["name"] == "R" else d[2], dtype=dt)[None]
        elif op == "inverse":
            v = np.linalg.inv(np.asarray(a[0], np.float64))
        elif op == "inverse_root":
            v = inverse_root(a[0], float(a[1]))
        elif op == "power_qr":
            v = power_qr(a[0], a[1])
        elif op == "eigen_order":
            v = eigen_order(a[0], a[1])
        elif op == "loop":
            count = rec["value"]
            count = int(round(float(scalars[count]))) if isinstance(count, str) else count
            var, result = rec["args"][2], rec["args"][1]
            x = a[0]
            for _ in range(count):
                vals[var] = x
                for j in body_of[k]:
                    vals[j] = node_value(j)
                x = vals[result]
            v = x
        elif op == "pow":  # in float64, rounded once (as the kernels)
            v = np.power(np.asarray(a[0], np.float64), np.asarray(a[1], np.float64))
        elif op == "rsqrt":
            v = dt(1) / np.sqrt(a[0])
        elif op == "round_bf16":
            v = nearest_bfloat16(a[0])
        elif op == "lerp":   # torch.lerp's rounding (optgen.ir): one fma, in float64
            small = np.abs(a[2]) < 0.5
            coeff = np.where(small, a[2], a[2] - dt(1))
            diff = np.asarray(a[1] - a[0], dt)
            base = np.where(small, a[0], a[1])
            v = np.asarray(coeff, np.float64) * diff + np.asarray(base, np.float64) \
                if dt is np.float32 else coeff * diff + base
        elif op == "where":
            v = np.where(a[0], a[1], a[2])
        elif op in _LIBM:
            wide = [np.asarray(x, np.float64) for x in a]
            v = _erf(wide[0]) if op == "erf" else _LIBM[op](*wide)
        elif op in _UNARY:
            v = _UNARY[op](a[0])
        else:
            v = _BINARY[op](a[0], a[1])
        if rec["dtype"] == "float":
            v = np.asarray(v, dtype=dt) if isinstance(v, np.ndarray) else dt(v)
        return v

    with np.errstate(all="ignore"):
        for k, rec in enumerate(nodes):
            if k not in inside and rec["op"] != "loopvar":
                vals[k] = node_value(k)
        out = {}
        for name, i in ir["outputs"].items():
            like = arrays["w"] if name == LOW_COPY else arrays[name]
            target = broadcastable(like, axes[name], d)
            out[name] = np.broadcast_to(np.asarray(vals[i], dtype=dt), target.shape) \
                .reshape(like.shape).astype(dt if name in raw else like.dtype)
        return out


_erf = np.frompyfunc(math.erf, 1, 1)   # (numpy has no erf; math.erf is libm's)


def adopted(master: np.ndarray, low: np.ndarray, dt: type) -> np.ndarray:
    """A mixed-precision master as the kernels read it: the master where the
    low-precision weight ``low`` is its rounding to nearest even (bit for bit), else the
    weight (written from outside the optimizer: it wins)."""
    same = master.astype(low.dtype).view(np.uint16) == low.view(np.uint16)
    return np.where(same, master, low.astype(dt))


def partial_sums(ir: dict, dtype: str, arrays: Mapping[str, np.ndarray],
                 axes: Mapping[str, str], scalars: Mapping[str, float],
                 d: tuple[int, int, int], names: Collection[str]) -> dict[str, float]:
    """This tensor's parts of the sums over all parameters ``names`` (reduction buffers):
    float64 sums of their operands, as the kernels' first pass fills them."""
    nodes = ir["nodes"]
    operands = {n: nodes[ir["reductions"][n]]["args"][0] for n in names}
    sub = {"nodes": nodes, "reductions": {},
           "outputs": {f"_op{j}": i for j, i in enumerate(operands.values())}}
    shapes = {f"_op{j}": nodes[i]["axes"] for j, i in enumerate(operands.values())}
    like = {o: np.empty(extents(d, a), np.dtype(dtype)) for o, a in shapes.items()}
    out = evaluate(sub, dtype, {**arrays, **like}, {**axes, **shapes}, scalars, d)
    return {n: float(np.sum(out[f"_op{j}"], dtype=np.float64)) for j, n in enumerate(names)}


def _loop_bodies(nodes: list[dict]) -> dict[int, list[int]]:
    """loop node -> the nodes of its body (those that depend on its loop variable), in
    order; they are evaluated once per repetition, not in the main sweep."""
    out = {}
    for k, rec in enumerate(nodes):
        if rec["op"] != "loop":
            continue
        inside = {rec["args"][2]}
        body = []
        for j in range(rec["args"][2] + 1, k):
            if any(x in inside for x in nodes[j].get("args", ())):
                inside.add(j)
                body.append(j)
        out[k] = body
    return out


def _matmul(nodes: list[dict], args, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b``; a product with an ``eigen_order`` permutation (``x @ P``, ``P.T @ x``)
    is the gather it amounts to, exactly the product's values without its n^3 work."""
    kind = [nodes[i]["op"] if nodes[i]["op"] != "transpose"
            else "T" + nodes[nodes[i]["args"][0]]["op"] for i in args]
    if kind[1] == "eigen_order":          # x @ P: x's columns in P's order
        order = np.argmax(b, axis=-2)[..., None, :]
        shape = np.broadcast_shapes(a.shape[:-2], order.shape[:-2]) + a.shape[-2:]
        return np.take_along_axis(np.broadcast_to(a, shape),
                                  np.broadcast_to(order, shape), axis=-1)
    if kind[0] == "Teigen_order":         # P^T @ x: x's rows in P's order
        order = np.argmax(a, axis=-1)[..., :, None]
        shape = np.broadcast_shapes(b.shape[:-2], order.shape[:-2]) + b.shape[-2:]
        return np.take_along_axis(np.broadcast_to(b, shape),
                                  np.broadcast_to(order, shape), axis=-2)
    return np.matmul(a, b)


def inverse_root(x: np.ndarray, root: float) -> np.ndarray:
    """``x^(-1/root)`` of each symmetric matrix of the stack ``x`` ([B, N, N]) by eigh in
    float64; eigenvalues <= 0 (round-off below the damping) give 0 (a pseudo-inverse)."""
    x = np.asarray(x, np.float64)
    lam, q = np.linalg.eigh((x + np.swapaxes(x, -1, -2)) / 2)
    pos = lam > 0
    scale = np.where(pos, np.power(np.where(pos, lam, 1.0), -1.0 / root), 0.0)
    return (q * scale[..., None, :]) @ np.swapaxes(q, -1, -2)


def power_qr(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """One QR power iteration Q = qr(x @ q) per matrix of the stack (in their dtype); a
    basis never fit (q zero, a state's initial value) is x's eigenvectors by descending
    eigenvalue (eigh)."""
    x, q = np.asarray(x), np.asarray(q)
    out = np.empty(np.broadcast_shapes(x.shape, q.shape), np.result_type(x, q))
    for b in range(out.shape[0]):
        xb, qb = x[min(b, len(x) - 1)], q[min(b, len(q) - 1)]
        if not qb.any():
            out[b] = np.linalg.eigh((xb + xb.T) / 2)[1][:, ::-1]
        else:
            out[b] = np.linalg.qr(xb @ qb)[0]
    return out


def eigen_order(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The permutation matrix P per matrix of the stack that orders the columns of q by
    descending estimated eigenvalue q_j^T x q_j (q @ P is sorted; ties keep their order),
    the estimates in x's and q's dtype."""
    x, q = np.asarray(x), np.asarray(q)
    out = np.empty(np.broadcast_shapes(x.shape, q.shape), np.result_type(x, q))
    eye = np.eye(x.shape[-1])
    for b in range(out.shape[0]):
        xb, qb = x[min(b, len(x) - 1)], q[min(b, len(q) - 1)]
        estimate = np.einsum("ij,ij->j", qb, xb @ qb)
        out[b] = eye[:, np.argsort(-estimate, kind="stable")]
    return out

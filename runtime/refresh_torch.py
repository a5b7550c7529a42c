"""A refresh rule (runtime/refresh.py) evaluated with torch where the parameter lives, for
torch parameters: the reference interpreter's values (optgen/core/reference.py: the same
IR, dtype and order of operations) without a host copy, with torch.linalg's QR and eigh.

Two shortcuts, both exact rewrites of the same products: ``eigen_order``'s permutation P
is kept as its index (``x @ P`` and ``P^T @ x`` are gathers of columns or rows), and
``power_qr(x, q @ eigen_order(x, q))`` reuses the ``x @ q`` that ordering computed
((x q) P = x (q P)): SOAP's statistic times its basis is formed once per refresh, as the
authors' and heavyball's code form it.

A rule with a node outside ``OPS`` (one that reads the parameter itself, repeats a body,
reduces or rounds; THOR's, Shampoo's and SOAP's have none) runs on the numpy path.

May import: views (torch when called).
"""
from __future__ import annotations

from typing import Any, Mapping

from optgen.core.views import AXES, extents, is_matrix

_UNARY = {"sqrt": "sqrt", "exp": "exp", "log": "log", "abs": "abs", "sign": "sign",
          "neg": "neg", "not": "logical_not"}
_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "min": "minimum",
           "max": "maximum", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq",
           "ne": "ne", "and": "logical_and", "or": "logical_or"}
OPS = frozenset({"const", "grad", "state", "stat", "hyper", "t", "matmul", "transpose",
                 "identity", "inverse", "inverse_root", "power_qr", "eigen_order", "where",
                 "pow", *_UNARY, *_BINARY})


def evaluable(ir: dict) -> bool:
    """Whether every node of the refresh ``ir`` is one this module evaluates."""
    return all(n["op"] in OPS for n in ir["nodes"])


class _Order:
    """``eigen_order(x, q)``'s permutation P as the index of q's columns in order
    (q @ P = q[..., order]); ``xq`` is the product x @ q it was computed from;
    ``transposed``: P^T."""

    def __init__(self, order: Any, xq: Any, transposed: bool = False) -> None:
        self.order, self.xq, self.transposed = order, xq, transposed

    def dense(self) -> Any:
        """The permutation matrix (stack [B, n, n])."""
        import torch
        n = self.order.shape[-1]
        eye = torch.eye(n, dtype=self.xq.dtype, device=self.xq.device)
        p = eye[:, self.order].movedim(1, 0)       # [B, n, n]: column j = e_order[j]
        return p.transpose(-1, -2) if self.transposed else p


def evaluate(ir: dict, dtype: str, read: Mapping[str, Any], axes: Mapping[str, str],
             scalars: Mapping[str, float], d: tuple[int, int, int]) -> dict[str, Any]:
    """New values (torch tensors of ``dtype``, [B, ...] stacks as the reference returns
    them before reshaping) of the refresh ``ir``'s outputs; ``read`` maps the buffers it
    reads (states, statistics, ``grad``) to arrays (torch, or numpy statistics)."""
    import torch
    dt = getattr(torch, dtype)
    device = next((v.device for v in read.values() if isinstance(v, torch.Tensor)), None)
    nodes = ir["nodes"]
    vals: list = [None] * len(nodes)

    def tensor(value: Any) -> Any:
        return torch.tensor(value, dtype=dt if isinstance(value, float) else torch.bool,
                            device=device)

    def dense(v: Any) -> Any:
        return v.dense() if isinstance(v, _Order) else v

    for k, rec in enumerate(nodes):
        op, args = rec["op"], rec.get("args", ())
        a = [vals[i] for i in args]
        if op == "const":
            v = tensor(float(rec["value"]) if rec["dtype"] == "float" else bool(rec["value"]))
        elif op in ("state", "stat", "grad"):
            name = rec["name"]
            x = torch.as_tensor(read[name], device=device)
            v = x.detach().reshape(_shape(axes[name], d)).to(dt)
        elif op in ("hyper", "t"):
            v = tensor(float(scalars[rec["name"]]))
        elif op == "matmul":
            v = _matmul(a[0], a[1], dense)
        elif op == "transpose":
            v = _Order(a[0].order, a[0].xq, not a[0].transposed) \
                if isinstance(a[0], _Order) else a[0].transpose(-1, -2)
        elif op == "identity":
            v = torch.eye(d[1] if rec["name"] == "R" else d[2], dtype=dt, device=device)[None]
        elif op == "inverse":   # (float64, as the reference)
            v = torch.linalg.inv(dense(a[0]).double())
        elif op == "inverse_root":
            v = _inverse_root(dense(a[0]), float(a[1]))
        elif op == "eigen_order":
            v = _eigen_order(dense(a[0]), dense(a[1]))
        elif op == "power_qr":
            v = _power_qr(nodes, args, vals, dense)
        elif op == "where":
            v = torch.where(*[dense(x) for x in a])
        elif op == "pow":   # in float64, rounded once (as the kernels)
            v = torch.pow(dense(a[0]).double(), dense(a[1]).double())
        elif op in _UNARY:
            v = getattr(torch, _UNARY[op])(dense(a[0]))
        else:
            v = getattr(torch, _BINARY[op])(dense(a[0]), dense(a[1]))
        if rec["dtype"] == "float" and not isinstance(v, _Order) and v.dtype != dt:
            v = v.to(dt)
        vals[k] = v
    held = {x.untyped_storage().data_ptr() for x in read.values() if isinstance(x, torch.Tensor)}
    out = {name: dense(vals[i]) for name, i in ir["outputs"].items()}
    # (an output that is a view of a buffer read, e.g. a state kept, must not see the
    # caller's writes of the other outputs)
    return {n: v.clone() if v.untyped_storage().data_ptr() in held else v
            for n, v in out.items()}


def store(states: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Write ``evaluate``'s values into the states (torch tensors), each in its dtype."""
    import torch
    with torch.no_grad():
        for name, value in new.items():
            states[name].copy_(value.reshape(states[name].shape))


def _shape(axes: str, d: tuple[int, int, int]) -> tuple[int, ...]:
    """The reference's 3-D view of an array holding ``axes`` (views.broadcastable)."""
    if is_matrix(axes):
        return (1, *extents(d, axes))
    return tuple(d[k] if a in axes else 1 for k, a in enumerate(AXES))


def _matmul(a: Any, b: Any, dense) -> Any:
    """``a @ b``; a product with a permutation (``x @ P``, ``P^T @ x``) is a gather."""
    import torch
    if isinstance(b, _Order) and not b.transposed and not isinstance(a, _Order):
        return torch.take_along_dim(a, b.order[..., None, :], dim=-1)
    if isinstance(a, _Order) and a.transposed and not isinstance(b, _Order):
        return torch.take_along_dim(b, a.order[..., :, None], dim=-2)
    return dense(a) @ dense(b)


def _eigen_order(x: Any, q: Any) -> _Order:
    """The order of q's columns by descending estimate q_j^T x q_j (ties keep theirs)."""
    import torch
    xq = x @ q
    estimate = (q * xq).sum(dim=-2)
    return _Order(torch.argsort(-estimate, dim=-1, stable=True), xq)


def _power_qr(nodes: list[dict], args, vals: list, dense) -> Any:
    """``qr(x @ q)`` per matrix of the stack, or (``q`` zero: a basis never fit) x's
    eigenvectors by descending eigenvalue; ``q = q0 @ eigen_order(x, q0)`` takes the
    ordering's ``x @ q0`` in that order."""
    import torch
    x, q = dense(vals[args[0]]), vals[args[1]]
    prod = None
    src = nodes[args[1]]
    if src["op"] == "matmul":
        q0, p = src["args"]
        order = vals[p]
        if isinstance(order, _Order) and not order.transposed \
                and nodes[p]["args"] == [args[0], q0]:
            prod = torch.take_along_dim(order.xq, order.order[..., None, :], dim=-1)
    q = dense(q)
    shape = torch.broadcast_shapes(x.shape, q.shape)
    out = torch.empty(shape, dtype=x.dtype, device=x.device)
    for b in range(shape[0]):
        xb, qb = x[min(b, len(x) - 1)], q[min(b, len(q) - 1)]
        if not bool(qb.any()):
            out[b] = torch.linalg.eigh((xb + xb.T) / 2)[1].flip(-1)
        else:
            out[b] = torch.linalg.qr(xb @ qb if prod is None else prod[min(b, len(prod) - 1)])[0]
    return out


def _inverse_root(x: Any, root: float) -> Any:
    """``x^(-1/root)`` per symmetric matrix by eigh in float64; eigenvalues <= 0 give 0."""
    import torch
    x = x.double()
    lam, q = torch.linalg.eigh((x + x.transpose(-1, -2)) / 2)
    pos = lam > 0
    scale = torch.where(pos, torch.where(pos, lam, 1.0) ** (-1.0 / root), 0.0)
    return (q * scale[..., None, :]) @ q.transpose(-1, -2)

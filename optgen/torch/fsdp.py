"""DTensor parameters (FSDP2's ``fully_shard``) for the torch drop-ins: each rank steps
its local shard, zero-copy, and keeps its states as shards.

The runtime optimizer sees the local tensors (``DTensor._local_tensor``: FSDP2's
persistent sharded storage, so a step writes the parameter in place); the drop-in's
``opt.state[p]`` shows each state as a DTensor with the parameter's mesh and placements,
so torch's and DCP's state-dict machinery see sharded states.

Rules that read other elements than their own see the whole parameter: the runtime
sums the float64 partial reductions of every shard between the passes that compute them
and the passes that read them (runtime/shards.py), with one all-reduce per reduction
level for all parameters of a step over the mesh dimension the parameters are split
on; ``clip_global_norm`` and the non-finite check add the split gradients' sums of
squares the same way. This needs a split of the first dimension (``Shard(0)``, FSDP2's
default) on one mesh dimension. A matrix rule's whole-matrix passes (Muon's
Newton-Schulz) run on one owner rank per matrix, its rows exchanged by all-to-all
(runtime/exchange.py); Shampoo's and SOAP's whole-matrix states live on that owner
(runtime/owned.py); q8/q4 states keep per-shard blocks, formatted by the whole
parameter's size. Refused on a sharded parameter (a ValueError at construction, raised
alike on every rank before any collective, so no rank waits on another): a rule that
refreshes from statistics the trainer passes (THOR), other splits where the rule
reduces or multiplies matrices, offload and flat groups. Equal meshes (compared by value: ``fully_shard``
without a mesh builds one per call) are one mesh.
Replicated DTensors are whole on every rank and take any rule.
"""
from __future__ import annotations

import math
import sys
from typing import Any

import torch

from optgen.runtime import exchange, owned, shards
from optgen.core import views


def _dtensor() -> Any:
    """torch.distributed.tensor where it is imported (None otherwise): a DTensor exists
    only once its module is, so ``import optgen.torch`` does not import it (0.5-0.8 s)."""
    return sys.modules.get("torch.distributed.tensor")


def is_dtensor(t: Any) -> bool:
    m = _dtensor()
    return m is not None and isinstance(t, m.DTensor)


def local(t: Any) -> Any:
    """The local tensor of a DTensor (the storage itself, not a copy); anything else as is."""
    return t._local_tensor if is_dtensor(t) else t


def sharded(p: Any) -> bool:
    """Whether this rank holds only part of ``p`` (a placement other than Replicate over
    a mesh dimension with more than one rank)."""
    return is_dtensor(p) and any(
        not isinstance(pl, _dtensor().Replicate) and p.device_mesh.size(d) > 1
        for d, pl in enumerate(p.placements))


def mesh_key(mesh: Any) -> tuple:
    """A device mesh by value: device type, the ranks' layout and the dimension names.
    ``fully_shard`` without a mesh (torch's documented per-layer use) builds a new,
    equal mesh at every call: equal meshes are one mesh."""
    return (mesh.device_type, tuple(mesh.mesh.shape), tuple(mesh.mesh.flatten().tolist()),
            mesh.mesh_dim_names)


def _mesh_text(mesh: Any) -> str:
    names = f" (dimensions {', '.join(mesh.mesh_dim_names)})" if mesh.mesh_dim_names else ""
    return f"a {mesh.device_type} mesh of ranks {mesh.mesh.tolist()}{names}"


def _refused(artifact: Any) -> str | None:
    """Why a rule cannot step a shard even with its reductions summed and its matrix
    passes run whole on an owner rank (None: it can)."""
    why = owned.refused(artifact)
    if why is not None:
        return f"keeps whole-matrix states and {why}"
    for k in artifact.kernels:
        if k.matrix:
            try:
                exchange.region(k.launches, k.buffer_axes, tuple(k.workspaces),
                                held=owned.held(artifact))
            except exchange.Unsupported as e:
                return f"multiplies whole matrices and {e}"
    return None


def _reduces(artifact: Any) -> bool:
    return any(ln["kind"] == "reduce" for k in artifact.kernels for ln in k.launches)


def _split_dim(p: Any) -> int | None:
    """The mesh dimension a parameter's first dimension is split on, when that is its
    only split (``Shard(0)``); None otherwise."""
    dt = _dtensor()
    cut = [d for d, pl in enumerate(p.placements)
           if not isinstance(pl, dt.Replicate) and p.device_mesh.size(d) > 1]
    if len(cut) == 1 and isinstance(p.placements[cut[0]], dt.Shard) and \
            p.placements[cut[0]].dim == 0:
        return cut[0]
    return None


def check(owner: str, artifact: Any, params: list, clip_global_norm: Any) -> None:
    """Sharded parameters against the rule (ValueError naming the parameter and the
    rule); parameters of one optimizer on one mesh, split on one of its dimensions.
    (DTensors against other options: the composition table, optgen/torch/contract.py.)"""
    dts = [(i, p) for i, p in enumerate(params) if is_dtensor(p)]
    if not dts:
        return
    meshes: dict[tuple, tuple[int, Any]] = {}
    for i, p in dts:
        meshes.setdefault(mesh_key(p.device_mesh), (i, p.device_mesh))
    if len(meshes) > 1:
        (i, a), (j, b) = list(meshes.values())[:2]
        raise ValueError(f"{owner}: parameters {i} and {j} are DTensors on different device "
                         f"meshes ({_mesh_text(a)} and {_mesh_text(b)}); one optimizer steps "
                         "parameters of one mesh")
    whole = _reduces(artifact) or any(k.matrix for k in artifact.kernels) or \
        clip_global_norm is not None or \
        any(s.shape in ("row", "col") for s in artifact.states)
    dims = {}
    for i, p in dts:
        if not sharded(p):
            continue
        why = _refused(artifact)
        if why is None and whole and _split_dim(p) is None:
            why = ("reduces over the whole tensor or multiplies whole matrices, which "
                   "runs across shards only for a split of the first dimension (Shard(0), "
                   "FSDP2's default)")
        if why is not None:
            raise ValueError(
                f"{owner}: parameter {i} is sharded ({', '.join(map(str, p.placements))} over "
                f"{p.device_mesh.size()} ranks) and its rule {why}: stepping shards apart "
                "would be wrong (use DDP or ZeRO-1, which keep every tensor whole on the "
                "rank that steps it)")
        dims.setdefault(_split_dim(p), i)
    if whole and len(dims) > 1:
        (a, i), (b, j) = list(dims.items())[:2]
        raise ValueError(f"{owner}: parameters {i} and {j} are split on different mesh "
                         f"dimensions ({a} and {b}); one optimizer sums reductions over one")


class MeshSum:
    """runtime/shards.Collective over one mesh dimension: one float64 all-reduce (sum)
    of every array given, packed into one buffer on the mesh's device; one all-to-all
    (``all_to_all_single`` with split sizes) per dtype for the rows exchanged."""

    def __init__(self, mesh: Any, dim: int):
        self.group = mesh.get_group(dim)
        self.device = torch.device(mesh.device_type)
        self.rank, self.size = mesh.get_local_rank(dim), mesh.size(dim)

    def all_to_all(self, sends: list[list[Any]], recvs: list[list[Any]]) -> None:
        dtypes = {a.dtype for part in (*sends, *recvs) for a in part}
        for dt in sorted(dtypes, key=str):
            out = [[a for a in part if a.dtype == dt] for part in sends]
            into = [[a for a in part if a.dtype == dt] for part in recvs]
            flat = torch.cat([a.reshape(-1) for part in out for a in part] or
                             [torch.empty(0, dtype=dt, device=self.device)])
            got = torch.empty(sum(a.numel() for part in into for a in part), dtype=dt,
                              device=self.device)
            torch.distributed.all_to_all_single(
                got, flat, [sum(a.numel() for a in part) for part in into],
                [sum(a.numel() for a in part) for part in out], group=self.group)
            at = 0
            for part in into:
                for a in part:
                    a.copy_(got[at:at + a.numel()].view(a.shape))
                    at += a.numel()

    def all_reduce(self, arrays: list[Any]) -> None:
        flat = torch.cat([torch.as_tensor(a).reshape(-1).to(self.device, torch.float64)
                          for a in arrays])
        torch.distributed.all_reduce(flat, group=self.group)
        at = 0
        for a in arrays:
            n = a.numel() if isinstance(a, torch.Tensor) else a.size
            part = flat[at:at + n]
            if isinstance(a, torch.Tensor):
                a.copy_(part.view(a.shape))
            else:
                a[...] = part.cpu().numpy().reshape(a.shape)
            at += n


def splits(params: list) -> shards.Shards | None:
    """What the runtime needs to step these parameters' shards (None: none is split):
    each sharded parameter's split axis and whole shape, and the mesh collective."""
    cut = [p if sharded(p) and _split_dim(p) is not None else None for p in params]
    first = next((p for p in cut if p is not None), None)
    if first is None:
        return None
    return shards.Shards(
        [None if p is None else shards.Split(shards.axis_of_dim0(p.ndim), tuple(p.shape))
         for p in cut], MeshSum(first.device_mesh, _split_dim(first)))


def shown(p: Any, state: Any, kind: str = "param") -> Any:
    """A state tensor as ``opt.state[p]`` shows it: for a DTensor parameter a DTensor
    over the same storage and mesh, of the whole state's shape: a state of the
    parameter's shape takes its placements; a row or column state (``kind``) is split
    where it holds the split axis (row states of a row-split matrix) and whole on every
    rank otherwise (its column states, summed across ranks each step). Anything else
    as is, and so is a whole-matrix state (R x R, C x C: whole on its owner rank,
    runtime/owned.py)."""
    if not is_dtensor(p) or not isinstance(state, torch.Tensor) or kind in owned.WHOLE_MATRIX:
        return state
    dt = _dtensor()
    if kind not in ("row", "col") or tuple(state.shape) == tuple(p._local_tensor.shape):
        if tuple(state.shape) != tuple(p._local_tensor.shape):
            return state
        return dt.DTensor.from_local(state, p.device_mesh, p.placements, run_check=False,
                                     shape=p.shape, stride=p.stride())
    axes = "br" if kind == "row" else "bc"
    split = shards.axis_of_dim0(p.ndim) in axes
    placements = [pl if isinstance(pl, dt.Shard) and pl.dim == 0 and split else dt.Replicate()
                  for pl in p.placements]
    if any(isinstance(pl, dt.Shard) and pl.dim != 0 for pl in p.placements):
        return state          # (no row/column rule runs on such a split: see check)
    shape = views.state_shape(tuple(p.shape), kind)
    stride = tuple(math.prod(shape[d + 1:]) for d in range(len(shape)))
    return dt.DTensor.from_local(state, p.device_mesh, placements, run_check=False,
                                 shape=torch.Size(shape), stride=stride)


# -- for sharded checkpoints (optgen/torch/sharded_checkpoint.py) ----------------------
def rows(p: Any) -> tuple[int, int] | None:
    """This rank's rows ``[start, stop)`` of a parameter split on its first dimension
    (torch.chunk's split, as DTensor's Shard(0)); None for a parameter held whole."""
    if not sharded(p) or _split_dim(p) is None:
        return None
    d = _split_dim(p)
    return exchange.rows_of(p.shape[0], p.device_mesh.size(d), p.device_mesh.get_local_rank(d))

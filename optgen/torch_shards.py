"""DTensor parameters (FSDP2's ``fully_shard``) for the torch drop-ins: each rank steps
its local shard, zero-copy, and keeps its states as shards.

The runtime optimizer sees the local tensors (``DTensor._local_tensor``: FSDP2's
persistent sharded storage, so a step writes the parameter in place); the drop-in's
``opt.state[p]`` shows each state as a DTensor with the parameter's mesh and placements,
so torch's and DCP's state-dict machinery see sharded states.

A rule is exact on a shard only if every element's update reads nothing outside its
own element: no whole-tensor reduction (LAMB's and LARS's trust ratios, Adafactor's RMS
and row/column statistics), no matrix product (Muon, THOR), no host scalar read from the
parameter's shape, no row/column state; and no ``clip_global_norm``. Those need the
partial sums of every shard (an all-reduce between the reduction and update passes),
which is not built: a sharded parameter with such a rule is a ValueError at
construction, raised alike on every rank before any collective, so no rank waits on
another. Replicated DTensors are whole on every rank and take any rule.
"""
from __future__ import annotations

from typing import Any

from optgen.runtime import scalar_expr

try:
    from torch.distributed.tensor import DTensor, Replicate
except ImportError:   # a torch built without torch.distributed
    DTensor = Replicate = None


def is_dtensor(t: Any) -> bool:
    return DTensor is not None and isinstance(t, DTensor)


def local(t: Any) -> Any:
    """The local tensor of a DTensor (the storage itself, not a copy); anything else as is."""
    return t._local_tensor if is_dtensor(t) else t


def sharded(p: Any) -> bool:
    """Whether this rank holds only part of ``p`` (a placement other than Replicate over
    a mesh dimension with more than one rank)."""
    return is_dtensor(p) and any(not isinstance(pl, Replicate) and p.device_mesh.size(d) > 1
                                 for d, pl in enumerate(p.placements))


def _whole_tensor_rule(artifact: Any) -> str | None:
    """Why a rule cannot step a shard on its own (None: it can)."""
    for k in artifact.kernels:
        if k.matrix:
            return "multiplies whole matrices"
        if any(n.startswith("_red") for n in k.buffer_axes):
            return "reduces over the whole tensor (norms, means)"
        if any({"rows", "cols"} & scalar_expr.names(e) for e in k.host_scalars.values()):
            return "reads the parameter's shape"
    if any(s.shape in ("row", "col") for s in artifact.states):
        return "keeps row or column statistics"
    return None


def check(owner: str, artifact: Any, params: list, clip_global_norm: Any, offload: Any,
          flat: bool) -> None:
    """Sharded parameters against the rule and options (ValueError naming the
    parameter and the rule); parameters of one optimizer on one mesh."""
    dts = [(i, p) for i, p in enumerate(params) if is_dtensor(p)]
    if not dts:
        return
    meshes = {id(p.device_mesh): (i, p.device_mesh) for i, p in dts}
    if len(meshes) > 1:
        (i, a), (j, b) = list(meshes.values())[:2]
        raise ValueError(f"{owner}: parameters {i} and {j} are DTensors on different device "
                         f"meshes ({a} and {b}); one optimizer steps parameters of one mesh")
    if offload or flat:
        raise ValueError(f"{owner}: DTensor parameters with "
                         f"{'offload' if offload else 'flat=True'} are not built")
    for i, p in dts:
        if not sharded(p):
            continue
        why = _whole_tensor_rule(artifact)
        if why is None and clip_global_norm is not None:
            why = "clip_global_norm needs the norm of every gradient"
        if why is None and any(v.startswith("q8:") for v in artifact.stored.values()):
            why = "keeps q8 states, whose 256-element blocks would start at each shard"
        if why is not None:
            raise ValueError(
                f"{owner}: parameter {i} is sharded ({', '.join(map(str, p.placements))} over "
                f"{p.device_mesh.size()} ranks) and its rule {why}: stepping shards apart "
                "would be wrong, and the cross-shard all-reduce is not built yet (use DDP or "
                "ZeRO-1, which keep every tensor whole on the rank that steps it)")


def shown(p: Any, state: Any) -> Any:
    """A state tensor as ``opt.state[p]`` shows it: for a DTensor parameter a DTensor
    over the same storage, mesh and placements; anything else as is."""
    if not is_dtensor(p) or not hasattr(state, "shape") or tuple(state.shape) != \
            tuple(p._local_tensor.shape):
        return state
    return DTensor.from_local(state, p.device_mesh, p.placements, run_check=False,
                              shape=p.shape, stride=p.stride())

"""Shampoo and SOAP on FSDP2 shards (gloo), for tests/test_distributed_owner.py: each
split matrix's whole-matrix states live on one owner rank (runtime/owned.py).

    python tests/distributed_owner_run.py MODE WORLD RANK PORT OUT.npz
    # MODE: owner | optgen-load (after an owner run at world size 2, same folder)

Each rank trains on its own part of every batch (FSDP2 averages the gradients by
reduce-scatter). Written per optimizer: the whole parameters after ``STEPS`` steps, the
averaged gradients of every step (gathered, to replay them in one process), the bytes
this rank sent per all-to-all, each parameter's owner, the held states' shapes here,
a run resumed from ``state_dict()`` at step ``STEPS // 2`` (same world size), and
DCP checkpoints across world sizes (``resharded``).
"""
from __future__ import annotations

import copy
import os

import numpy as np
import torch

import optgen.torch as ot

STEPS = 20
# precondition_frequency 4: Shampoo's roots at steps 1, 5, 9, 13, 17 (the Shampoo
# direction from step 5), SOAP's basis at steps 2, 6, 10, 14, 18. Shampoo's epsilon
# keeps its roots of the rank-deficient statistics (a 3-row layer) well conditioned:
# with 1e-12 an inverse fourth root of eigenvalues at round-off size amplifies float32
# rounding of the gradients to percent-level differences
RULES = {"shampoo": ("Shampoo", dict(lr=1e-2, precondition_frequency=4, epsilon=1e-4,
                                     weight_decay=0.01)),
         "soap": ("SOAP", dict(lr=1e-2, precondition_frequency=4))}


def model() -> torch.nn.Module:
    """A 2-layer MLP: a (32, 16) weight and a 3-row (3, 32) one (uneven shards: 2 + 1
    rows at world size 2; 1 + 1 + 1 + 0 at 4)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(64, 16, generator=g), torch.randn(64, 3, generator=g)


def make(name: str, params) -> torch.optim.Optimizer:
    cls, kw = RULES[name]
    return getattr(ot, cls)(params, **kw)


def loss(net, step: int, part) -> torch.Tensor:
    x, y = batch(step)
    return ((net(part(x)) - part(y)) ** 2).mean()


def single(name: str, grads: list[list[np.ndarray]] | None = None,
           steps: range = range(STEPS), load: str | None = None, save: str | None = None
           ) -> list[np.ndarray]:
    """One process: ``steps`` on the whole batches, or on the given gradients; first
    loading a DCP checkpoint (``load``: saved at another world size), last saving one."""
    net = model()
    opt = make(name, net.parameters())
    if load:
        dcp_load(net, opt, load)
    for t in steps:
        opt.zero_grad()
        if grads is None:
            loss(net, t, lambda a: a).backward()
        else:
            for p, g in zip(net.parameters(), grads[t]):
                p.grad = torch.from_numpy(g.copy())
        opt.step()
    if save:
        dcp_save(net, opt, save)
    return [p.detach().numpy().copy() for p in net.parameters()]


def dcp_save(net, opt, folder: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(net, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=folder)


def dcp_load(net, opt, folder: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    msd, osd = get_state_dict(net, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(net, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _sharded(world: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    net = model()
    mesh = init_device_mesh("cpu", (world,))
    for layer in (net[0], net[2], net):
        fully_shard(layer, mesh=mesh)
    return net


def _whole(net) -> list[np.ndarray]:
    return [p.full_tensor().detach().numpy().copy() for p in net.parameters()]


def resharded(name: str, world: int, folder: str) -> list[np.ndarray]:
    """DCP checkpoints across world sizes, every rank on the whole batches (so the
    averaged gradient is the one-process gradient): the first half saved here for the
    test process to load in one process, and its one-process first half loaded here
    for the second half."""
    def whole(a):
        return a
    net = _sharded(world)
    opt = make(name, net.parameters())
    for t in range(STEPS // 2):
        opt.zero_grad()
        loss(net, t, whole).backward()
        opt.step()
    dcp_save(net, opt, os.path.join(folder, f"{name}-w{world}"))
    opt.save(os.path.join(folder, f"{name}-optgen-w{world}"))   # (optgen's own: a folder)
    if torch.distributed.get_rank() == 0:
        np.savez(os.path.join(folder, f"{name}-optgen-w{world}-model.npz"), *_whole(net))
    else:
        _whole(net)   # (a collective)
    net = _sharded(world)
    opt = make(name, net.parameters())
    dcp_load(net, opt, os.path.join(folder, f"{name}-w1"))
    for t in range(STEPS // 2, STEPS):
        opt.zero_grad()
        loss(net, t, whole).backward()
        opt.step()
    return _whole(net)


def optgen_load(world: int, folder: str) -> dict[str, np.ndarray]:
    """``opt.load`` of the folders ``opt.save`` wrote at world size 2 (every rank on the
    whole batches), at this world size: the second half's parameters."""
    from torch.distributed.tensor import distribute_tensor
    out = {}
    for name in RULES:
        net = _sharded(world)
        where = os.path.join(folder, f"{name}-optgen-w2")
        with np.load(where + "-model.npz") as z, torch.no_grad():
            for i, p in enumerate(net.parameters()):
                p.copy_(distribute_tensor(torch.from_numpy(z[f"arr_{i}"]), p.device_mesh,
                                          p.placements))
        opt = make(name, net.parameters())
        opt.load(where)
        for t in range(STEPS // 2, STEPS):
            opt.zero_grad()
            loss(net, t, lambda a: a).backward()
            opt.step()
        out.update((f"{name}/optgen/{i}", w) for i, w in enumerate(_whole(net)))
    return out


def owner_runs(world: int, rank: int, folder: str) -> dict[str, np.ndarray]:
    part = (lambda a: a.chunk(world)[rank])
    out: dict[str, np.ndarray] = {}
    for name in RULES:
        net = _sharded(world)
        opt = make(name, net.parameters())
        core = opt._core
        out[f"{name}/owners"] = np.array([-1 if s.split is None or s.split.owner is None
                                          else s.split.owner for s in core.records])
        half_sd = half_w = None
        for t in range(STEPS):
            if t == STEPS // 2:
                half_sd = copy.deepcopy(opt.state_dict())
                half_w = [p._local_tensor.detach().clone() for p in net.parameters()]
            opt.zero_grad()
            loss(net, t, part).backward()
            for i, p in enumerate(net.parameters()):   # (a collective: every rank)
                out[f"{name}/grad/{t}/{i}"] = p.grad.full_tensor().numpy().copy()
            opt.step()
        out.update((f"{name}/{i}", w) for i, w in enumerate(_whole(net)))
        out[f"{name}/moved"] = np.array(core.shards.moved, dtype=np.int64)
        out[f"{name}/sent"] = np.array(core.shards.log, dtype=np.int64)
        for i, st in enumerate(core.state):
            for n, v in st.items():
                if isinstance(v, torch.Tensor):
                    out[f"{name}/shape/{i}/{n}"] = np.array(tuple(v.shape), dtype=np.int64)
        # resumed: a new model and optimizer from the step-STEPS//2 weights and state_dict
        net2 = _sharded(world)
        with torch.no_grad():
            for p, w in zip(net2.parameters(), half_w):
                p._local_tensor.copy_(w)
        opt2 = make(name, net2.parameters())
        opt2.load_state_dict(half_sd)
        for t in range(STEPS // 2, STEPS):
            opt2.zero_grad()
            loss(net2, t, part).backward()
            opt2.step()
        out.update((f"{name}/resumed/{i}", w) for i, w in enumerate(_whole(net2)))
        out.update((f"{name}/dcp/{i}", w) for i, w in enumerate(resharded(name, world, folder)))
    return out


def results_of(mode: str, world: int, folder: str) -> dict[str, np.ndarray]:
    rank = torch.distributed.get_rank()
    return owner_runs(world, rank, folder) if mode == "owner" else optgen_load(world, folder)


if __name__ == "__main__":
    import distributed_run   # (tests/ is the script's folder)
    distributed_run.serve(results_of)

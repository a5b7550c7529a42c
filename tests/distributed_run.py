"""One training run of a small model under torch.distributed (gloo), for
tests/test_distributed.py: the test runs this file in ``world`` processes and compares
what each writes with a single-process run of ``train`` in the test process.

    python tests/distributed_run.py MODE WORLD RANK PORT OUT.npz
    # MODE: ddp | zero | fsdp | fsdp-docs | fsdp-bad | fsdp-q | fsdp-split | dcp-save | dcp-load | optgen-save | optgen-load

Every rank trains on the same data, so DDP's averaged gradient is each rank's own (a sum
of equal values divided by the world size) and ZeRO-1's ranks, which step only their
partition of the parameters and broadcast it, see the gradients of the unsharded run.
FSDP2 (``fully_shard`` per layer and on the model, a CPU mesh) averages by
reduce-scatter and each rank steps its shards of every parameter; the full parameters
are gathered after the run. An optimizer whose rule needs whole tensors is refused at
construction on every rank: its message is written instead of parameters.
"""
from __future__ import annotations

import os
import sys

from typing import Callable

import numpy as np
import torch

import optgen.torch as ot

HERE = os.path.dirname(os.path.abspath(__file__))

# catalog drop-in -> its hyperparameters (momentum, weight decay and clipping moved off
# their defaults where the optimizer has them)
OPTIMIZERS = {
    "adam": ("Adam", dict(lr=1e-2, weight_decay=0.01)),
    "adamw": ("AdamW", dict(lr=1e-2, weight_decay=0.1)),
    "sgd": ("SGD", dict(lr=0.05, momentum=0.9, weight_decay=1e-3)),
    "lion": ("Lion", dict(lr=1e-3, weight_decay=0.1)),
    "lamb": ("LAMB", dict(lr=1e-2, weight_decay=0.01)),
    "lars": ("LARS", dict(lr=0.05, momentum=0.9, weight_decay=1e-3)),
    "adafactor": ("Adafactor", dict(lr=1e-2, relative_step=False)),
    # state formats (docs/state-formats.md): every tensor formatted
    "adamw-bf16": ("AdamW", dict(lr=1e-2, weight_decay=0.1, state_format="bf16",
                                 state_format_min_size=0)),
    "adam-q8": ("Adam", dict(lr=1e-2, weight_decay=0.01, state_format="q8",
                             state_format_min_size=0)),
    "adam-q4": ("Adam", dict(lr=1e-2, weight_decay=0.01, state_format="q4",
                             state_format_min_size=0)),
    # a user spec with two levels of whole-tensor reductions (tests/specs/centered_nsgd.py)
    "centered-nsgd": ("tests/specs/centered_nsgd.py", dict(lr=1e-2)),
    # the global norm over every gradient, with a non-finite check
    "adamw-clip": ("AdamW", dict(lr=1e-2, clip_global_norm=0.05, nonfinite="skip")),
    # a matrix rule: Muon's Newton-Schulz on the two weights (a tall (32, 16) and a wide
    # (3, 32): at world size 4 one rank holds none of its rows), AdamW on the biases; on
    # FSDP2 shards each weight is whole on one owner rank for the iterations
    "muon": ("Muon", dict(lr=0.02, momentum=0.95, weight_decay=0.01)),
    # states and a master copy in host memory (FSDP2: refused)
    "adamw-offload": ("AdamW", dict(lr=1e-2, weight_decay=0.1, offload="cpu")),
    # a torch form (torch.optim.AdamW's signature and rule)
    "torch-adamw": ("torch:AdamW", dict(lr=1e-2, weight_decay=0.1)),
    # LAMB where the first layer's top rows are 100x the rest: per-shard norms would
    # differ from the whole tensor's by far (rank 0 holds those rows at world size 2)
    "lamb-skewed": ("LAMB", dict(lr=1e-2, weight_decay=0.01)),
    # the same with the all-reduce of the partial sums taken out (each rank sums its own
    # shard only): must differ from the single-process run, or the test could not fail
    "lamb-skewed-unsummed": ("LAMB", dict(lr=1e-2, weight_decay=0.01)),
}
SENT: dict[str, list[int]] = {}   # FSDP2: values per all-reduce of the optimizer, by name
# rules that reduce over whole tensors: on FSDP2 shards the sums go through float64
# all-reduces, so they match the single-process run to float32 rounding, not bitwise
REDUCING = ("lamb", "lars", "adafactor", "centered-nsgd", "adamw-clip", "lamb-skewed",
            "lamb-skewed-unsummed", "muon")
MOVED: dict[str, list[int]] = {}   # FSDP2: bytes this rank sent per all-to-all, by name
STEPS = 20
LAUNCHES: dict[str, list[str]] = {}


# torch's FSDP2 documentation as a user copies it (``fsdp-docs``): ``fully_shard`` on
# each layer, then on the model, no mesh given (each call makes its own, equal mesh);
# every rank trains on its own part of the batch. One optimizer per drop-in family: a
# seed form, a torch form, a rule with reductions, a user spec, a matrix rule, q8 states
DOCS = ("adam", "torch-adamw", "lamb", "centered-nsgd", "muon", "adam-q8")


def optimizer_class(name: str) -> type:
    cls = OPTIMIZERS[name][0]
    if cls.startswith("torch:"):
        return getattr(ot, cls[len("torch:"):])
    if cls.endswith(".py"):
        return ot.make(os.path.join(os.path.dirname(HERE), cls))
    return ot.make("lars", base="momentum") if cls == "LARS" else getattr(ot.seeds, cls)


def setup(name: str, mode: str = "single") -> tuple:
    """A 2-layer MLP (float32), the module that runs it, optimizer ``name`` and the
    data. ``mode``: single (no process group), ddp, zero, fsdp."""
    torch.manual_seed(0)
    # the last layer has 3 outputs: at world size 4 its weight and bias split 1, 1, 1, 0
    # rows, so one rank holds empty shards (it still takes part in every all-reduce)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 3))
    if "-skewed" in name:
        with torch.no_grad():
            model[0].weight[:16] *= 100.0
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 16, generator=g), torch.randn(64, 3, generator=g)
    net = torch.nn.parallel.DistributedDataParallel(model) if mode == "ddp" else model
    if mode == "fsdp-docs":
        from torch.distributed.fsdp import fully_shard
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
        world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
        x, y = x.chunk(world)[rank], y.chunk(world)[rank]
    if mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
        for layer in (model[0], model[2], model):
            fully_shard(layer, mesh=mesh)
    cls, kw = optimizer_class(name), OPTIMIZERS[name][1]
    if mode == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, **kw)
    else:
        opt = cls(model.parameters(), **kw)
    if name.endswith("-unsummed") and mode.startswith("fsdp") and opt._core._shards:
        opt._core._shards.collective = _NoSum()
    return model, net, opt, x, y


def run_steps(net, opt, x, y, steps: int) -> None:
    for _ in range(steps):
        opt.zero_grad()
        loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        opt.step()


def whole(model) -> list[np.ndarray]:
    return [(p.full_tensor() if type(p).__name__ == "DTensor" else p).detach().numpy().copy()
            for p in model.parameters()]


def train(name: str, mode: str = "single") -> list[np.ndarray]:
    """``STEPS`` steps of optimizer ``name`` (see ``setup``); the parameters afterwards."""
    model, net, opt, x, y = setup(name, mode)
    run_steps(net, opt, x, y, STEPS)
    if mode.startswith("fsdp"):   # the states are shards of the parameters' shape and placement
        SENT[name] = list(opt._core._shards.log) if opt._core._shards else []
        # (issue 31: the launches stepping this rank's shards, by strategy)
        LAUNCHES[name] = sorted(type(r).__name__ for r in opt._core._current_runs().values())
        MOVED[name] = list(opt._core._shards.moved) if opt._core._shards else []
        p = next(model.parameters())
        assert all(type(v).__name__ == "DTensor" for n, v in opt.state[p].items()
                   if isinstance(v, torch.Tensor) and v.shape == p.shape), sorted(opt.state[p])
    return whole(model)


# resharding checkpoints: STEPS // 2 steps at one world size, saved with
# torch.distributed.checkpoint, loaded at another, STEPS // 2 more
RESHARDED = ("adam", "lamb", "adafactor", "muon")
# optgen's own checkpoints also reshard q8 states (DCP refuses per-shard blocks)
RESHARDED_OPTGEN = ("adam-q8",)


def resharded_names(how: str) -> tuple[str, ...]:
    return RESHARDED + (RESHARDED_OPTGEN if how == "optgen" else ())


def resharded(mode: str, folder: str) -> dict[str, np.ndarray]:
    """``dcp-save``: the first half of the run, saved under ``folder`` with
    torch.distributed.checkpoint; ``dcp-load``: the saved state loaded into a new FSDP2
    model and optimizer at this world size, the second half, and the parameters.
    ``optgen-save``/``optgen-load``: the same with optgen's sharded ``opt.save`` and
    ``opt.load`` (the model's weights travel as whole arrays beside it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.tensor import distribute_tensor
    how, action = mode.split("-")
    out = {}
    for name in resharded_names(how):
        model, net, opt, x, y = setup(name, "fsdp")
        where = os.path.join(folder, f"{how}-{name}")
        if action == "save":
            run_steps(net, opt, x, y, STEPS // 2)
        if how == "optgen" and action == "save":
            opt.save(where)
            weights = whole(model)   # (a collective: every rank gathers)
            if torch.distributed.get_rank() == 0:
                np.savez(where + "-model.npz", *weights)
            continue
        if how == "optgen":
            with np.load(where + "-model.npz") as z, torch.no_grad():
                for i, p in enumerate(model.parameters()):
                    p.copy_(distribute_tensor(torch.from_numpy(z[f"arr_{i}"]), p.device_mesh,
                                              p.placements))
            opt.load(where)
        else:
            msd, osd = get_state_dict(model, opt)
            state = {"model": msd, "optim": osd}
            if action == "save":
                dcp.save(state, checkpoint_id=where)
                continue
            dcp.load(state, checkpoint_id=where)
            set_state_dict(model, opt, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
        run_steps(net, opt, x, y, STEPS - STEPS // 2)
        out.update((f"{name}/{i}", p) for i, p in enumerate(whole(model)))
    return out


# q8/q4 states on shards: per-shard blocks, checked against the paper's quantizer
# applied to each rank's rows (tests/test_state_formats_oracle.py)
Q_STEPS = 10


def q_data() -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """A (1001, 5) parameter (5005 elements: q8/q4 by the default 4096-element minimum,
    though each shard is smaller; its blocks cross the shards' edges) and a (37,) one
    (full precision), and Q_STEPS gradients of each: alike on every rank."""
    g = torch.Generator().manual_seed(2)
    params = [torch.randn(1001, 5, generator=g), torch.randn(37, generator=g)]
    return params, [[torch.randn(p.shape, generator=g) for p in params]
                    for _ in range(Q_STEPS)]


def q_shards(fmt: str) -> dict[str, np.ndarray]:
    """Adam with ``fmt`` states on the ``q_data`` parameters split on every rank: after
    each step this rank's codes and block scales of each state and its rows."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    whole, grads = q_data()
    params = [torch.nn.Parameter(distribute_tensor(t, mesh, [Shard(0)])) for t in whole]
    opt = ot.seeds.Adam(params, lr=1e-2, state_format=fmt)
    out = {"formatted": np.array([s.formatted for s in opt._core.records])}
    for t, gs in enumerate(grads):
        for p, g in zip(params, gs):
            p.grad = distribute_tensor(g, mesh, [Shard(0)])
        opt.step()
        st = opt._core.state[0]
        out.update((f"{fmt}/{t}/{n}", st[n].numpy().copy()) for n in st
                   if not isinstance(st[n], np.floating))
        out[f"{fmt}/{t}/w"] = params[0]._local_tensor.numpy().copy()
    out[f"{fmt}/stored"] = np.array(sorted(opt._artifact.stored))
    try:
        opt.state_dict()
        out[f"{fmt}/state_dict"] = np.array("")
    except ValueError as e:
        out[f"{fmt}/state_dict"] = np.array(f"{type(e).__name__}: {e}")
    return out


def split_data() -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A (1001, 5) bfloat16 parameter and Q_STEPS bfloat16 gradients: alike on every rank."""
    g = torch.Generator().manual_seed(3)
    return torch.randn(1001, 5, generator=g).bfloat16(), \
        [torch.randn(1001, 5, generator=g).bfloat16() for _ in range(Q_STEPS)]


def split_shards(world: int = 0) -> dict[str, np.ndarray]:
    """AdamW with a split8 master (docs/state-formats.md) on the ``split_data`` parameter,
    split on every rank (``world`` 0: whole, one process): this rank's rows of the weight
    and of its correction after Q_STEPS steps."""
    whole, grads = split_data()
    if world:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor
        mesh = init_device_mesh("cpu", (world,))
        p = torch.nn.Parameter(distribute_tensor(whole, mesh, [Shard(0)]))
    else:
        p = torch.nn.Parameter(whole.clone())
    opt = ot.AdamW([p], lr=1e-2, weight_decay=0.1, master_format="split8")
    for g in grads:
        p.grad = distribute_tensor(g, mesh, [Shard(0)]) if world else g.clone()
        opt.step()
    local = p._local_tensor if world else p.detach()
    return {"split8/w": local.view(torch.int16).numpy().copy(),
            "split8/corr": opt.state_dict()["state"][0]["w__corr"].numpy().copy()
            if not world else opt._core.state[0]["w__corr"].numpy().copy()}


class _NoSum:
    def all_reduce(self, arrays: list) -> None:
        """Sums nothing: each rank keeps its own shard's partial sums (the mutant)."""


def run_all(mode: str) -> dict[str, np.ndarray]:
    """Every optimizer's parameters, or (a refused optimizer) its error message."""
    results = {}
    for name in DOCS if mode == "fsdp-docs" else OPTIMIZERS:
        try:
            params = train(name, mode)
        except ValueError as e:
            results[f"{name}/error"] = np.array(str(e))
            continue
        results.update((f"{name}/{i}", p) for i, p in enumerate(params))
        if name in SENT:
            results[f"{name}/sent"] = np.array(SENT[name], dtype=np.int64)
            results[f"{name}/launches"] = np.array(" ".join(LAUNCHES[name]))
            results[f"{name}/moved"] = np.array(MOVED[name], dtype=np.int64)
    return results


def bad_steps() -> dict[str, np.ndarray]:
    """FSDP2 LAMB where one rank's step is bad (rank 1: a NaN gradient; then a float64
    gradient; then no gradient where the others have one): what each rank raised,
    whether its parameters stayed as they were, and that the next good step runs on
    every rank (no rank waits on another); then parameters of two meshes in one
    optimizer."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=mesh)
    opt = ot.LAMB(model.parameters(), lr=1e-2, nonfinite="raise")
    x, y = torch.randn(64, 16), torch.randn(64, 8)
    out = {}
    for case in ("nan", "dtype", "layout", "good"):
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        g = model[0].weight.grad
        if rank == 1 and case == "nan":
            g._local_tensor[0, 0] = float("nan")
        if rank == 1 and case == "dtype":
            g._local_tensor = g._local_tensor.double()
        if rank == 1 and case == "layout":   # a gradient the other ranks have
            model[2].bias.grad = None
        before = [p._local_tensor.clone() for p in model.parameters()]
        try:
            opt.step()
            out[f"{case}/raised"] = np.array("")
        except Exception as e:   # noqa: BLE001 (the test reads what was raised)
            out[f"{case}/raised"] = np.array(f"{type(e).__name__}: {e}")
        out[f"{case}/unchanged"] = np.array(all(torch.equal(a, p._local_tensor) for a, p in
                                                zip(before, model.parameters())))
    # parameters on two really different meshes (the ranks in another order) in one
    # optimizer: refused at once; an equal mesh made again (fully_shard without a mesh
    # does that per call) is the same mesh
    from torch.distributed.device_mesh import DeviceMesh
    world = torch.distributed.get_world_size()
    for case, other_mesh in (("meshes", DeviceMesh("cpu", list(reversed(range(world))))),
                             ("equal-meshes", init_device_mesh("cpu", (world,)))):
        other = torch.nn.Linear(4, 4)
        fully_shard(other, mesh=other_mesh)
        try:
            ot.LAMB([*model.parameters(), *other.parameters()], lr=1e-2)
            out[f"{case}/raised"] = np.array("")
        except ValueError as e:
            out[f"{case}/raised"] = np.array(f"{type(e).__name__}: {e}")
    # refused at construction on every rank, before any collective: a matrix rule with
    # whole-matrix states (THOR's R x R and C x C inverses), offload, flat groups
    for case, make in (("thor", lambda: ot.seeds.THOR(model.parameters(), lr=1e-2)),
                       ("offload", lambda: ot.AdamW(model.parameters(), offload="cpu")),
                       ("flat", lambda: ot.AdamW(model.parameters(), flat=True))):
        try:
            make()
            out[f"{case}/raised"] = np.array("")
        except (TypeError, ValueError) as e:
            out[f"{case}/raised"] = np.array(f"{type(e).__name__}: {e}")
    return out


def serve(results: Callable[[str, int, str], dict[str, np.ndarray]]) -> None:
    """One rank of a test run: argv MODE WORLD RANK PORT OUT.npz; joins the gloo group,
    saves ``results(mode, world, folder)`` (``folder``: a checkpoint folder beside the
    results) and leaves."""
    mode, world, rank, port, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        sys.argv[4], sys.argv[5]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        np.savez(out, **results(mode, world, os.path.join(os.path.dirname(out), "ckpt")))
    finally:
        torch.distributed.destroy_process_group()
    # torch 2.13's ZeroRedundancyOptimizer over gloo aborts about every other process at
    # interpreter exit ("terminate called without an active exception": a pt_gloo_runloop
    # thread takes the GIL during Py_Finalize), with torch.optim.Adam as with optgen
    # (docs/distributed.md). The results are saved and the group is gone: skip finalization.
    sys.stdout.flush()
    os._exit(0)


def results_of(mode: str, world: int, folder: str) -> dict[str, np.ndarray]:
    if mode.endswith(("-save", "-load")):   # the checkpoint lives beside the results
        return resharded(mode, folder)
    return bad_steps() if mode == "fsdp-bad" else \
        {**q_shards("q8"), **q_shards("q4")} if mode == "fsdp-q" else \
        split_shards(world) if mode == "fsdp-split" else run_all(mode)


if __name__ == "__main__":
    serve(results_of)

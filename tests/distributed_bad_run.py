"""Bad input on one rank of a distributed step, for tests/test_distributed_bad_inputs.py,
which runs this file in ``world`` processes (gloo):

    python tests/distributed_bad_run.py MODES WORLD RANK PORT OUT.npz
    # MODES: ddp, zero, fsdp or several, comma-separated (one process group for all)

The 2-layer MLP of tests/distributed_run.py with LAMB (per-tensor trust ratios; DDP and
FSDP2 also clip by the global norm, which FSDP2 sums across ranks; ZeRO-1 broadcasts
each partition after its step), ``nonfinite="raise"``. After ``GOOD`` good steps, rank 1
alone spoils one step per case: a bad hyperparameter (lr = -1), a float64 gradient, a
NaN gradient. Each rank records what it raised, how long that took and whether its
parameters and states stayed as they were; then one more good step and the whole
parameters. The process group's timeout is short, so a rank left waiting in a
collective shows as an error within seconds, not as a hang.
"""
from __future__ import annotations

import datetime
import os
import sys
import time
import traceback

import numpy as np
import torch

import optgen.torch as ot

TIMEOUT_S = 20
GOOD = 2
CASES = ("hyper", "dtype", "nan")


def options(mode: str) -> dict:
    clip = {} if mode == "zero" else {"clip_global_norm": 1.0}   # (ZeRO-1: a partition's)
    # DDP and ZeRO-1 steps have no collective of their own: they agree when asked to
    agree = {"agree": torch.distributed.group.WORLD} if mode in ("ddp", "zero") else {}
    return dict(lr=1e-2, weight_decay=0.01, nonfinite="raise", **clip, **agree)


def build(mode: str) -> tuple:
    """The model, the module that runs it, the optimizer and the data (``single``: no
    process group)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 3))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 16, generator=g), torch.randn(64, 3, generator=g)
    net = torch.nn.parallel.DistributedDataParallel(model) if mode == "ddp" else model
    if mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
        for layer in (model[0], model[2], model):
            fully_shard(layer, mesh=mesh)
    if mode == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=ot.seeds.LAMB,
                                      **options(mode))
    else:
        opt = ot.seeds.LAMB(model.parameters(), **options(mode))
    return model, net, opt, x, y


def backward(net, opt, x, y) -> None:
    opt.zero_grad()
    ((net(x) - y) ** 2).mean().backward()


def _local(t):
    return t._local_tensor if type(t).__name__ == "DTensor" else t


def _inner(opt):
    return getattr(opt, "optim", opt)    # ZeRO-1: this rank's optgen optimizer


def snapshot(model, opt) -> list[np.ndarray]:
    states = [v for st in _inner(opt)._core.state for _, v in sorted(st.items())]
    return [np.array(_local(t).detach().numpy() if isinstance(t, torch.Tensor) else t)
            for t in [*model.parameters(), *states]]


def spoil(case: str, opt) -> None:
    """Rank 1's bad input for ``case``, in this rank's optgen optimizer's first
    parameter (under ZeRO-1 one of its partition)."""
    p = _inner(opt).param_groups[0]["params"][0]
    if case == "hyper":
        opt.param_groups[0]["lr"] = -1.0      # (ZeRO-1 passes it to its optimizer)
    elif case == "dtype":
        g = _local(p.grad)
        g.data = g.data.double()
    elif case == "nan":
        _local(p.grad).view(-1)[0] = float("nan")


def bad_steps(mode: str) -> dict[str, np.ndarray]:
    rank = torch.distributed.get_rank()
    model, net, opt, x, y = build(mode)
    for _ in range(GOOD):
        backward(net, opt, x, y)
        opt.step()
    out = {}
    if mode == "ddp":     # whole parameters, the default agree: the step sends nothing
        w = torch.nn.Parameter(torch.ones(3))
        plain = ot.seeds.LAMB([w], lr=1e-2)
        w.grad = torch.ones(3) * (1 + torch.distributed.get_rank())
        plain.step()
        out["default-agrees"] = plain._agreement is not None
    for case in CASES:
        backward(net, opt, x, y)
        if rank == 1:
            spoil(case, opt)
        before = snapshot(model, opt)
        start = time.perf_counter()
        try:
            opt.step()
            out[f"{case}/raised"] = ""
        except Exception as e:   # noqa: BLE001 (the test reads what was raised)
            out[f"{case}/raised"] = f"{type(e).__name__}: {e}"
        out[f"{case}/seconds"] = time.perf_counter() - start
        out[f"{case}/unchanged"] = all(np.array_equal(a, b, equal_nan=True)
                                       for a, b in zip(before, snapshot(model, opt)))
        opt.param_groups[0]["lr"] = options(mode)["lr"]
    try:
        backward(net, opt, x, y)
        opt.step()
        out["good/raised"] = ""
        for i, p in enumerate(model.parameters()):
            out[f"good/{i}"] = (p.full_tensor() if mode == "fsdp" else p).detach().numpy()
    except Exception as e:   # noqa: BLE001
        out["good/raised"] = f"{type(e).__name__}: {e}"
    return {k: np.array(v) for k, v in out.items()}


def single() -> list[np.ndarray]:
    """The one-process run: ``GOOD`` + 1 good steps."""
    model, net, opt, x, y = build("single")
    for _ in range(GOOD + 1):
        backward(net, opt, x, y)
        opt.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


def main() -> None:
    modes, world, rank, port, out = sys.argv[1].split(","), int(sys.argv[2]), \
        int(sys.argv[3]), sys.argv[4], sys.argv[5]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.distributed.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    try:
        np.savez(out, **{f"{mode}/{k}": v for mode in modes
                         for k, v in bad_steps(mode).items()})
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)   # (gloo's threads at interpreter exit: tests/distributed_run.py)


if __name__ == "__main__":
    main()

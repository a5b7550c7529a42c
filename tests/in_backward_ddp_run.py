"""One rank of the DDP run of tests/test_step_in_backward.py, or (``train(world=1)``)
the single-process run it is compared with.

    python tests/in_backward_ddp_run.py RANK PORT OUT.npz     # world size 2, gloo

The ranks train AdamW with ``step_in_backward=True`` on their halves of each global
batch of 16 rows, the optimizer attached to the DDP model (``opt.attach(ddp)``: the
step after each bucket's all-reduce; small buckets, so there are several); step 3
accumulates two micro-batches (the first one's forward and backward under
``opt.accumulating()``, which enters DDP's no_sync). They train twice: with DDP's
gradients as views of its buckets (``gradient_as_bucket_view=True``) and as copies.
The single process trains the same model on whole batches with the ordinary step.
DDP's average of the halves' mean losses' gradients is the whole batch's; the
parameters must agree to float32 rounding. First, the DDP model without
``opt.attach``: the first backward must be refused on each rank, every parameter as
it was (``unattached``). While they train, the parts the buckets step and the kernel
launches are counted (``count_launches``): one launch a bucket.
"""
from __future__ import annotations

import contextlib
import datetime
import sys

import numpy as np
import torch

import optgen.torch as ot

STEPS, ROWS = 8, 16


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 4))


def rows(i: int, world: int, rank: int):
    g = torch.Generator().manual_seed(i)
    x, y = torch.randn(ROWS, 8, generator=g), torch.randn(ROWS, 4, generator=g)
    part = ROWS // world
    return x[rank * part:(rank + 1) * part], y[rank * part:(rank + 1) * part]


def train(world: int, rank: int, views: bool = True) -> list[np.ndarray]:
    net = model()
    ddp = None
    if world > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.002,
                                                        gradient_as_bucket_view=views)
    opt = ot.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1, step_in_backward=ddp is not None)
    if ddp is not None:
        opt.attach(ddp)
    forward = ddp or net
    for i in range(STEPS):
        micro = (2 * i, 2 * i + 1) if i == 3 else (2 * i,)
        for k, j in enumerate(micro):
            x, y = rows(j, world, rank)
            held = ddp is not None and k < len(micro) - 1   # (DDP: forward inside, too)
            with opt.accumulating() if held else contextlib.nullcontext():
                (torch.nn.functional.mse_loss(forward(x), y) / len(micro)).backward()
        if ddp is None:
            opt.step()
            opt.zero_grad()
        else:
            assert all(p.grad is None for p in net.parameters()), "a gradient was kept"
    steps = [float(opt.state[p]["step"]) for p in net.parameters()]
    assert steps == [STEPS] * len(steps), steps
    return [p.detach().numpy().copy() for p in net.parameters()]


def unattached(rank: int) -> str:
    """The step inside backward under DDP without ``opt.attach(ddp)``: the refusal's
    message ('' when the backward was not refused); no parameter may have changed."""
    net = model()
    ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.002)
    opt = ot.AdamW(net.parameters(), lr=1e-2, step_in_backward=True)
    before = [p.detach().clone() for p in net.parameters()]
    x, y = rows(0, 2, rank)
    try:
        torch.nn.functional.mse_loss(ddp(x), y).backward()
    except ValueError as e:
        assert all(torch.equal(a, p) for a, p in zip(before, net.parameters())), \
            "a parameter changed before the refusal"
        assert all(int(s["step"]) == 0 for s in opt.state.values())
        return str(e)
    return ""


def count_launches() -> dict[str, int]:
    """Counts, from now on, the parts the attached DDP buckets step and the kernel
    launches: multi-tensor lists (``fused``) and single tensors."""
    from optgen.runtime import launch
    from optgen.torch import in_backward
    counts = {"parts": 0, "fused": 0, "single": 0}
    for cls, name, key in ((in_backward.StepInBackward, "_step_part", "parts"),
                           (launch.Launcher, "run_fused", "fused"),
                           (launch.Launcher, "run", "single")):
        def counted(*args, _orig=getattr(cls, name), _key=key, **kwargs):
            counts[_key] += 1
            return _orig(*args, **kwargs)
        setattr(cls, name, counted)
    return counts


def main() -> None:
    rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
        timeout=datetime.timedelta(seconds=60))
    try:
        refused = unattached(rank)
        counts = count_launches()
        params = {views: train(world=2, rank=rank, views=views) for views in (True, False)}
    finally:
        torch.distributed.destroy_process_group()
    np.savez(out, refused=np.array(refused), **{f"{views}-{i}": p for views, ps in
                                                params.items() for i, p in enumerate(ps)},
             **{f"count-{k}": np.array(v) for k, v in counts.items()})


if __name__ == "__main__":
    main()

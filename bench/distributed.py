#!/usr/bin/env python
"""Optimizer steps under FSDP2 (``fully_shard``), side by side in the same processes:
optgen AdamW, LAMB and Muon against torch.optim.AdamW (foreach; fused where this torch has
it for the device), at world sizes 1, 2 and 4 (gloo on CPU; NCCL on GPUs).

    python bench/distributed.py                         # BERT-base shapes, worlds 1 2 4
    python bench/distributed.py --layers 2 --worlds 2   # smaller
    python bench/distributed.py --device cuda --worlds 1 2   (one GPU per rank)

The model is BERT-base's 199 parameter tensors (embeddings, 12 layers, pooler), each
sharded on its first dimension across the ranks. Only the optimizer step is timed
(gradients are set once; a step does not read them as new): every rank steps its
shards; the median over repetitions of the slowest rank is reported. The optimizer's
own collectives are counted by optgen's runtime (LAMB: the float64 sums of ||w|| and
||update|| per tensor, in one all-reduce per step, plus the 32-byte agreement of the
step's checks); torch's AdamW and optgen's Adam send nothing; Muon moves each 2-D
tensor's rows to its owner rank and back (two all-to-alls: bytes summed over the ranks,
next to what gathering every matrix on every rank would receive). FSDP's own traffic (the
gradients' reduce-scatter and the parameters' all-gather in forward) is the same for
every optimizer and is not part of a step. A script, not a test.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from optgen.benchmark import Contender, interleave  # noqa: E402
from params import bert_base_shapes  # noqa: E402


def bert_shapes(layers: int) -> list[tuple[int, ...]]:
    """BERT-base (uncased) parameter shapes: embeddings, ``layers`` layers, pooler."""
    return [shape for _, shape in bert_base_shapes(layers)]


def rank_main(world: int, rank: int, port: str, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor
    import optgen.torch as ot

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    mesh = init_device_mesh(args.device, (world,))
    gen = torch.Generator().manual_seed(0)
    shapes = bert_shapes(args.layers)

    def model() -> torch.nn.Module:
        m = torch.nn.Module()
        for i, s in enumerate(shapes):
            m.register_parameter(f"p{i}", torch.nn.Parameter(
                torch.randn(s, generator=gen).mul_(0.02).to(args.device)))
        fully_shard(m, mesh=mesh)
        for p in m.parameters():
            g = torch.randn(p.shape, generator=gen).mul_(1e-3).to(args.device)
            p.grad = distribute_tensor(g, mesh, p.placements)
        return m

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def slowest_rank(step, inner: int) -> float:
        """A sample: every rank starts together; the slowest rank's seconds per step."""
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(inner):
            step()
        sync()
        t = torch.tensor([(time.perf_counter() - t0) / inner])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    fused = {"fused": True} if cuda else {"foreach": True}
    rows = {
        "torch AdamW " + next(iter(fused)): lambda ps: torch.optim.AdamW(ps, lr=1e-4, **fused),
        "optgen AdamW": lambda ps: ot.AdamW(ps, lr=1e-4),
        "optgen LAMB": lambda ps: ot.LAMB(ps, lr=1e-4),
        # Newton-Schulz on every 2-D tensor, each whole on one owner rank (AdamW on the
        # others): two all-to-alls per step (runtime/exchange.py)
        "optgen Muon": lambda ps: ot.seeds.Muon(ps, lr=1e-4),
    }
    results = {}
    for name, make in rows.items():
        m = model()
        opt = make(list(m.parameters()))
        for _ in range(2):
            opt.step()
        sent = getattr(getattr(opt, "_core", None), "_shards", None)
        before = sent.values if sent else 0
        moved = len(sent.moved) if sent else 0
        # one row at a time: the counters are read around its own steps
        c = Contender(name, opt.step)
        interleave([c], args.reps, warmup=0, sample=slowest_rank)
        per_step = ((sent.values - before) / args.reps) if sent else 0.0
        # all-to-all bytes per step, summed over the ranks (what crosses the network)
        a2a = torch.tensor([float(sum(sent.moved[moved:])) / args.reps if sent else 0.0])
        dist.all_reduce(a2a)
        results[name] = {"ms": 1e3 * c.median, "bytes": 8 * per_step,
                         "rounds": (len(sent.log) / (args.reps + 2)) if sent else 0,
                         "a2a": float(a2a), "a2a_rounds": (len(sent.moved) / (args.reps + 2))
                         if sent else 0}
        del opt, m
    if rank == 0:
        print(json.dumps({"world": world, "tensors": len(shapes),
                          "params": sum(int(torch.tensor(s).prod()) for s in shapes),
                          "rows": results}))
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)   # (gloo teardown: docs/distributed.md)


def launch(world: int, args: argparse.Namespace) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    threads = str(max(1, (os.cpu_count() or 1) // world))
    env = dict(os.environ, OMP_NUM_THREADS=threads, TVM_NUM_THREADS=threads)
    cmd = [sys.executable, os.path.abspath(__file__), "--rank-of", str(world), "--port", port,
           "--layers", str(args.layers), "--reps", str(args.reps), "--device", args.device]
    procs = [subprocess.Popen(cmd + ["--rank", str(r)], env=env, stdout=subprocess.PIPE,
                              text=True) for r in range(world)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"world size {world}: a rank failed")
    return json.loads(outs[0].strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--rank-of", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_of:
        rank_main(args.rank_of, args.rank, args.port, args)
        return
    print(f"FSDP2 optimizer step, BERT-base shapes ({args.layers} layers), {args.device}, "
          f"median of {args.reps} (slowest rank)")
    print(f"{'world':>5} {'row':<20} {'ms':>9} {'vs torch':>9} {'opt bytes/step':>15} "
          f"{'B/tensor':>9} {'all-reduces':>11} {'a2a bytes/step':>15} {'B/param':>8} "
          f"{'all-to-alls':>11} {'gather-all bytes':>16}")
    for world in args.worlds:
        r = launch(world, args)
        base = next(v["ms"] for k, v in r["rows"].items() if k.startswith("torch"))
        # gathering every 2-D tensor whole on every rank instead: each rank receives
        # the (W - 1) / W of it it lacks, 4 B per element: (W - 1) x its bytes in all
        matrices = sum(math.prod(s) for s in bert_shapes(args.layers) if len(s) == 2)
        for name, v in r["rows"].items():
            gather = 4 * (world - 1) * matrices if "Muon" in name else 0
            print(f"{world:>5} {name:<20} {v['ms']:>9.2f} {v['ms'] / base:>8.2f}x "
                  f"{v['bytes']:>15.0f} {v['bytes'] / r['tensors']:>9.1f} {v['rounds']:>11.1f} "
                  f"{v['a2a']:>15.0f} {v['a2a'] / r['params']:>8.3f} {v['a2a_rounds']:>11.1f} "
                  f"{gather:>16.0f}")


if __name__ == "__main__":
    main()

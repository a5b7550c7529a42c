#!/usr/bin/env python
"""Bytes per parameter at the peak of a training step on each rank of FSDP2
(``fully_shard`` on each transformer block, then on the model; gloo, CPU processes on
this machine), for optgen's 5-byte AdamW (bf16 weights, split8 master, q8 states) with
and without the step inside backward, and torch's AdamW for reference.

    python bench/memory_fsdp.py                    # GPT-2 shape, 5.3M parameters, world 2
    python bench/memory_fsdp.py --world 4 --rows "in-backward"

Each rank counts its own storages as bench/memory_bench.py does (bench/memory_count.py:
the sharded parameters, their ``.grad``, the optimizer's master and states, and memory
no walk reached, at every hook, before and after ``opt.step()``), over the parameters
of the whole model: a rank holding 1/W of everything reads 1/W of the one-process
figure. FSDP2's own transient buffers (a block's gathered weights, its unsharded
gradient and the reduce-scatter's buffers: one block's worth, freed as backward moves
on) are not parameters, gradients or optimizer state, and are not counted. A script,
not a test (tests/test_step_in_backward_fsdp.py tests the step itself).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_bench import LR, ModelSpec, build_model, optgen_adamw, train_step  # noqa: E402
from memory_count import KINDS, measure  # noqa: E402

FIVE = dict(master_format="split8", state_format="q8")
ROWS = {   # name -> (the weights' dtype, the optimizer's maker)
    "torch AdamW fp32 (foreach)": (torch.float32,
                                   lambda p: torch.optim.AdamW(p, lr=LR, foreach=True)),
    "optgen AdamW bf16 + split8 + q8": (torch.bfloat16, optgen_adamw(**FIVE)),
    "optgen AdamW bf16 + split8 + q8 + in-backward": (
        torch.bfloat16, optgen_adamw(**FIVE, step_in_backward=True)),
}


def sharded(ms: ModelSpec, dtype: torch.dtype) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    model = build_model(ms, dtype)
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    blocks = model.transformer.h if ms.kind == "gpt2" else \
        [m for m in model if isinstance(m, torch.nn.Linear)]
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def rank_main(rank: int, world: int, port: str, rows: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    ms, results = ModelSpec(), []
    try:
        for name, (dtype, make) in ROWS.items():
            if not re.search(rows, name):
                continue
            peak = measure(sharded(ms, dtype), make, train_step(ms))
            pp = peak.per_param()
            results.append({"config": name, "params": peak.n_params, "peak_at": peak.peak.where,
                            **{k: pp[k] for k in (*KINDS, "total")},
                            "steady": peak.per_param(peak.steady)["total"]})
        with open(out, "w", encoding="utf-8") as f:
            json.dump(results, f)
    finally:
        torch.distributed.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rows", default="", help="a regular expression: rows whose name matches")
    ap.add_argument("--json", metavar="PATH", help="also write rank 0's results as JSON")
    ap.add_argument("--bucket-bytes", type=int, help="the step inside backward's buckets: "
                    "at most this many bytes of gradients (default: optgen's)")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)   # (a rank's process)
    ap.add_argument("--port", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.bucket_bytes is not None:
        from optgen.torch import in_backward_buckets
        in_backward_buckets.BUCKET_BYTES = a.bucket_bytes
    if a.rank is not None:
        rank_main(a.rank, a.world, a.port, a.rows, a.out)
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    outs = [f"/tmp/memory_fsdp_{os.getpid()}_{r}.json" for r in range(a.world)]
    env = dict(os.environ, OMP_NUM_THREADS="1", TVM_NUM_THREADS="1")
    more = [] if a.bucket_bytes is None else ["--bucket-bytes", str(a.bucket_bytes)]
    procs = [subprocess.Popen([sys.executable, __file__, "--world", str(a.world), "--rows",
                               a.rows, "--rank", str(r), "--port", port, "--out", outs[r],
                               *more], env=env) for r in range(a.world)]
    if any(p.wait() for p in procs):
        print("a rank failed", file=sys.stderr)
        return 1
    ranks = []
    for o in outs:
        with open(o, encoding="utf-8") as f:
            ranks.append(json.load(f))
        os.remove(o)
    ms = ModelSpec()
    print(f"model: GPT2LMHeadModel(n_embd={ms.width}, n_layer={ms.layers}, vocab={ms.vocab}), "
          f"batch {ms.batch}x{ms.context} per rank, {ranks[0][0]['params']:,} parameters; "
          f"FSDP2 at world {a.world} (gloo, CPU); torch {torch.__version__}; bytes per "
          "parameter of the model held by each rank at its peak\n")
    head = (f"{'config':<46} {'rank':>4} {'weights':>7} {'master':>6} {'grads':>6} "
            f"{'states':>6} {'other':>6} {'total':>6} {'x world':>7} {'steady':>6}  peak at")
    print(head)
    print("-" * len(head))
    for i in range(len(ranks[0])):
        for r, res in enumerate(ranks):
            x = res[i]
            print(f"{x['config']:<46} {r:>4} {x['weights']:7.3f} {x['master']:6.3f} "
                  f"{x['grads']:6.3f} {x['states']:6.3f} {x['other']:6.3f} {x['total']:6.3f} "
                  f"{x['total'] * a.world:7.3f} {x['steady']:6.3f}  {x['peak_at']}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"world": a.world, "ranks": ranks}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

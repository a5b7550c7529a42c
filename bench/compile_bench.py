#!/usr/bin/env python
"""A compiled train step, side by side: optgen.torch.AdamW vs torch.optim.AdamW(fused)
under torch.compile, on the same MLP, batches and threads, in one process.

    python bench/compile_bench.py                      # 4 x 1024 MLP, batch 64, 30 reps
    python bench/compile_bench.py --width 2048 --reps 50 --json compile.json
    python bench/compile_bench.py --quiet-pools      # idle thread pools sleep (bench/README.md)

Rows (each its own model copy, repetitions interleaved by optgen.benchmark, medians of
wall time per step):
- optgen, one graph: forward + backward + ``opt.step()`` + ``zero_grad`` compiled with
  ``fullgraph=True`` (backward traced: torch's ``trace_autograd_ops``); the step is the
  ``optgen::step`` custom op.
- torch fused, compiled: the same function compiled without fullgraph (torch.optim's
  step breaks the graph on purpose around itself: ``torch/optim/optimizer.py``,
  ``_use_grad``), the fused CPU AdamW kernel in the step.
- optgen and torch fused eager, the same steps uncompiled.
The ratio is optgen's compiled step time over torch's compiled step time. Timings are
noisy on a shared VM (+-30 %); this is a script, not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import time

from optgen.benchmark import Contender, interleave, quiet_pools


def mlp(width: int, depth: int):
    import torch   # (after main's --quiet-pools: the pool settings are read when it loads)
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json")
    ap.add_argument("--quiet-pools", action="store_true",
                    help="OMP_WAIT_POLICY=passive and TVM_THREAD_POOL_SPIN_COUNT=0 (unless set): "
                         "idle pool threads sleep instead of spinning into the next row")
    a = ap.parse_args()
    if a.quiet_pools:
        quiet_pools()
    import torch
    import optgen.torch as ot
    torch._dynamo.config.trace_autograd_ops = True
    x, y = torch.randn(a.batch, a.width), torch.randn(a.batch, 1)

    def contender(make_opt, compiled: bool, fullgraph: bool):
        model = mlp(a.width, a.depth)
        opt = make_opt(model.parameters())

        def train_step():
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()
        fn = torch.compile(train_step, fullgraph=fullgraph) if compiled else train_step
        t = time.perf_counter()
        for _ in range(3):       # compile and warm up
            fn()
        return fn, time.perf_counter() - t

    rows = {
        "optgen compiled (fullgraph)": contender(
            lambda p: ot.AdamW(p, lr=1e-4, weight_decay=0.01), True, True),
        "torch fused compiled": contender(
            lambda p: torch.optim.AdamW(p, lr=1e-4, weight_decay=0.01, fused=True), True, False),
        "optgen eager": contender(lambda p: ot.AdamW(p, lr=1e-4, weight_decay=0.01), False, False),
        "torch fused eager": contender(
            lambda p: torch.optim.AdamW(p, lr=1e-4, weight_decay=0.01, fused=True), False, False),
    }
    contenders = [Contender(name, fn) for name, (fn, _) in rows.items()]
    interleave(contenders, a.reps, warmup=0)        # (warmed up above, compiles included)
    times = {c.name: c.median * 1e3 for c in contenders}
    n = sum(p.numel() for p in mlp(a.width, a.depth).parameters())
    print(f"MLP {a.depth} x {a.width} ({n / 1e6:.2f}M params), batch {a.batch}, "
          f"{torch.get_num_threads()} threads, {a.reps} reps, medians:")
    result = {"params": n, "threads": torch.get_num_threads(), "rows": {}}
    for name, (_, warm) in rows.items():
        med = times[name]
        result["rows"][name] = {"ms": med, "first_3_calls_s": warm}
        print(f"  {name:30s} {med:8.2f} ms/step   (first 3 calls {warm:.1f} s)")
    ratio = (result["rows"]["optgen compiled (fullgraph)"]["ms"]
             / result["rows"]["torch fused compiled"]["ms"])
    result["ratio_compiled"] = ratio
    print(f"optgen / torch fused, compiled: {ratio:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

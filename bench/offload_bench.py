#!/usr/bin/env python
"""Offloaded Adam steps, side by side: optgen ``offload="cpu"`` (gradient to the host,
CPU kernel on host states, parameter back) against the same step without offload, and
torch's fused CPU Adam doing the offloaded work on the same kind of buffers (copy the
gradient into a host buffer, step host states, copy the parameter back).

    python bench/offload_bench.py                     # 10M fp32 parameters, 20 reps
    python bench/offload_bench.py --n 100000000 --quiet-pools

Without a GPU the "device" is CPU memory, so the copies are memcpy-speed host copies: the
rows measure optgen's CPU step and the bookkeeping offload adds, not PCIe. Interleaved
repetitions, medians; a script, not a test.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from adam_bench import quiet_pools  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quiet-pools", action="store_true",
                    help="OMP_WAIT_POLICY=passive, TVM_THREAD_POOL_SPIN_COUNT=0 (bench/README.md)")
    a = ap.parse_args()
    if a.quiet_pools:
        quiet_pools()
    import torch
    import optgen.torch as ot

    def param():
        p = torch.nn.Parameter(torch.randn(a.n, generator=torch.Generator().manual_seed(0)))
        p.grad = torch.randn(a.n, generator=torch.Generator().manual_seed(1)).clamp_(0.1, 1.0)
        return p

    p1, p2, p3 = param(), param(), param()
    offloaded = ot.Adam([p1], lr=1e-4, offload="cpu")
    kept = ot.Adam([p2], lr=1e-4)
    host_w, host_g = p3.detach().clone(), torch.empty(a.n)
    host_w.grad = host_g
    fused = torch.optim.Adam([host_w], lr=1e-4, fused=True)

    def torch_offloaded():
        host_g.copy_(p3.grad)
        fused.step()
        with torch.no_grad():
            p3.copy_(host_w)

    rows = {"optgen offload=cpu": offloaded.step, "optgen (states beside params)": kept.step,
            "torch fused, offloaded by hand": torch_offloaded}
    for fn in rows.values():
        fn()
    times = {k: [] for k in rows}
    for r in range(a.reps):
        names = list(rows)
        for name in names[r % 3:] + names[:r % 3]:
            t = time.perf_counter()
            rows[name]()
            times[name].append((time.perf_counter() - t) * 1e3)
    print(f"Adam, {a.n:,} fp32 parameters, {torch.get_num_threads()} threads, {a.reps} reps:")
    ref = statistics.median(times["torch fused, offloaded by hand"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:32s} {med:8.2f} ms   x torch offloaded {med / ref:.2f}")


if __name__ == "__main__":
    main()

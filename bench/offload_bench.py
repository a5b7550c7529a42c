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

from optgen.benchmark import Contender, interleave, quiet_pools


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

    rows = [Contender("optgen offload=cpu", offloaded.step),
            Contender("optgen (states beside params)", kept.step),
            Contender("torch fused, offloaded by hand", torch_offloaded)]
    interleave(rows, a.reps, warmup=1)
    print(f"Adam, {a.n:,} fp32 parameters, {torch.get_num_threads()} threads, {a.reps} reps:")
    ref = rows[-1].median
    for c in rows:
        print(f"  {c.name:32s} {c.median * 1e3:8.2f} ms   x torch offloaded {c.median / ref:.2f}")


if __name__ == "__main__":
    main()

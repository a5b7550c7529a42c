#!/usr/bin/env python
"""Step time of the matrix optimizers (Muon, Shampoo, SOAP) on one transformer-sized layer.

    python bench/matrix_step_bench.py                          # 768x3072, llvm, float32
    python bench/matrix_step_bench.py --shapes 768x3072,4096x4096 --target cuda

Per optimizer and shape: the median of ``--reps`` steps that do not refresh (Muon never
does), and the extra time of a step that refreshes (Shampoo: two eigendecompositions;
SOAP: the re-sort and QR power iteration of both bases and m's rotation into them, eigh
at the first fit, before the second step), both in ms. The refresh runs on
the host in float64 (numpy); on cuda the statistics are copied to the host for it.
With ``--target cuda`` the arrays are CuPy arrays and every step is synchronized.
Shampoo and SOAP refresh every 10 steps here (their defaults: 20 and 10).
This is a script, not a test: it asserts no timings.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import optgen

SPECS = {"muon": {}, "shampoo": dict(precondition_frequency=10),
         "soap": dict(precondition_frequency=10)}


def _timed(opt, grads, sync) -> float:
    t0 = time.perf_counter()
    opt.step(grads)
    sync()
    return 1e3 * (time.perf_counter() - t0)


def bench(name: str, shape: tuple[int, int], target: str, reps: int) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal(shape).astype(np.float32)
    g = [(rng.standard_normal(shape) * 0.01).astype(np.float32) for _ in range(4)]
    sync = lambda: None   # noqa: E731
    if target == "cuda":
        import cupy
        w, g = cupy.asarray(w), [cupy.asarray(x) for x in g]
        sync = cupy.cuda.Device().synchronize
    opt = optgen.create(name, [w], target=target, **SPECS[name])
    steady, refresh = [], []
    for k in range(reps + 2):
        due = bool(opt.refresh_due)
        ms = _timed(opt, [g[k % len(g)]], sync)
        if k >= 2:        # (the first steps: the first refresh, lazy allocations)
            (refresh if due else steady).append(ms)
    base = statistics.median(steady)
    extra = statistics.median(refresh) - base if refresh else float("nan")
    return base, extra


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="768x3072")
    ap.add_argument("--target", default="llvm", choices=["llvm", "cuda"])
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--only", default=",".join(SPECS))
    args = ap.parse_args()
    print(f"target {args.target}, float32, load average {os.getloadavg()[0]:.1f}")
    print(f"{'shape':<10} {'optimizer':<8} {'step ms':>9} {'refresh +ms':>12}")
    for text in args.shapes.split(","):
        shape = tuple(int(x) for x in text.split("x"))
        for name in args.only.split(","):
            base, extra = bench(name, shape, args.target, args.reps)
            print(f"{text:<10} {name:<8} {base:>9.1f} {extra:>12.1f}", flush=True)


if __name__ == "__main__":
    main()

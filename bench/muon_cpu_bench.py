#!/usr/bin/env python
"""One Muon step on the CPU, side by side in one process: torch.optim.Muon,
optgen.torch.Muon (the torch form: Newton-Schulz in bfloat16, its products in torch's
bfloat16 matmul), optgen.torch.seeds.Muon (the seed form: Newton-Schulz in float32,
compiled products) and heavyball's Muon (bfloat16 Newton-Schulz, torch.compile'd step).

    python bench/muon_cpu_bench.py [--shapes 1024x1024,512x2048] [--reps 9]
                                   [--threads N] [--cpu-time]

Float32 weights, lr 0.02, one gradient reused. The contenders step in turn (interleaved)
after ``--warmup`` steps each (builds, heavyball's compilation); the medians of
``--reps`` steps and their ratio to torch's are printed with the load average around
the run. heavyball's Muon is its own rule (its momentum and scaling), timed for speed
only. ``--threads N`` sets torch's threads and optgen's kernel threads. On a machine
that other jobs load, wall times mostly measure the wait for a core; ``--cpu-time``
(with ``--threads 1``: all work on the calling thread) times each step by the CPU time
of that thread instead. This is a script, not a test: it asserts no timings.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import optgen
import optgen.torch as ot


def contenders():
    makers = {"torch.optim.Muon (bf16 NS)": lambda ps: torch.optim.Muon(ps, lr=0.02),
              "optgen.torch.Muon (bf16 NS)": lambda ps: ot.Muon(ps, lr=0.02),
              "optgen seeds.Muon (fp32 NS)": lambda ps: ot.seeds.Muon(ps, lr=0.02)}
    try:
        import heavyball
        makers["heavyball 3.2 Muon (bf16 NS)"] = lambda ps: heavyball.Muon(ps, lr=0.02)
    except ImportError:
        print("heavyball is not installed (pip install heavyball): its row is left out")
    return makers


def bench(shape: tuple[int, int], reps: int, warmup: int,
          clock=time.perf_counter) -> dict[str, float]:
    gen = torch.Generator().manual_seed(0)
    w0, g0 = torch.randn(shape, generator=gen) * 0.02, torch.randn(shape, generator=gen)
    steps = {}
    for name, make in contenders().items():
        p = torch.nn.Parameter(w0.clone())
        p.grad = g0.clone()
        try:
            opt = make([p])
            for _ in range(warmup):
                p.grad = g0.clone()
                opt.step()
        except Exception as e:  # noqa: BLE001 (reported as the row)
            print(f"  {name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        steps[name] = (opt, p)
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(reps):
        for name, (opt, p) in steps.items():
            p.grad = g0.clone()   # (heavyball takes the gradient away in its step)
            t0 = clock()
            opt.step()
            times[name].append(1e3 * (clock() - t0))
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1024x1024,512x2048")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--cpu-time", action="store_true",
                    help="the calling thread's CPU time per step (needs --threads 1)")
    args = ap.parse_args()
    if args.cpu_time and args.threads != 1:
        ap.error("--cpu-time counts the calling thread only: use it with --threads 1")
    if args.threads:
        torch.set_num_threads(args.threads)
        optgen.set_num_threads(args.threads)
    clock = time.thread_time if args.cpu_time else time.perf_counter
    load0 = os.getloadavg()[0]
    for text in args.shapes.split(","):
        shape = tuple(int(x) for x in text.split("x"))
        ms = bench(shape, args.reps, args.warmup, clock)
        base = next((v for k, v in ms.items() if k.startswith("torch")), None)
        what = "CPU time" if args.cpu_time else "wall time"
        print(f"Muon step {shape[0]}x{shape[1]}, median {what} of {args.reps}")
        for k, v in ms.items():
            ratio = f"{v / base:6.2f}x torch" if base else ""
            print(f"  {k:30} {v:9.1f} ms  {ratio}")
    print(f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"torch threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()

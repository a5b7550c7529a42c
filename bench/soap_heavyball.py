#!/usr/bin/env python
"""SOAP on one 512 x 2048 float32 weight: optgen.torch.SOAP beside heavyball's compiled
SOAP (heavyball 3.2.1, ``heavyball.SOAP``), both refreshing their bases every
``--frequency`` steps, in one process, interleaved.

    python bench/soap_heavyball.py                    # 512x2048, frequency 10
    python bench/soap_heavyball.py --shape 1024x1024 --windows 7

Each contender is made and stepped until its first refresh period is over (optgen builds
its kernels when it is made; heavyball compiles its step on the first ones), then the
two take turns, one window of ``--frequency`` steps each (one refresh in each window).
Printed per contender: the median over windows of the mean step time (what a run pays
per step, refreshes included), the median plain step and the median refresh step, and
the time to make it and take its first steps; the ratio is heavyball's mean step over
optgen's. Both refresh in float32 with torch (eigh, ordering, QR power iteration), as the
SOAP authors' code does; optgen's step is its generated kernels, heavyball's is compiled
by inductor. The load average is printed: on a shared machine the
timings are noisy, and only the ratio within one run means much. Asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import optgen.torch as otorch


def _make(name: str, w: torch.nn.Parameter, freq: int):
    if name == "optgen":
        return otorch.SOAP([w], lr=3e-3, betas=(0.9, 0.95), shampoo_beta=0.95,
                           weight_decay=0.01, precondition_frequency=freq)
    import heavyball
    return heavyball.SOAP([w], lr=3e-3, betas=(0.9, 0.95), shampoo_beta=0.95,
                          weight_decay=0.01, precondition_frequency=freq)


def _steps(opt, w, grads, n: int) -> list[float]:
    out = []
    for k in range(n):
        w.grad = grads[k % len(grads)]
        t0 = time.perf_counter()
        opt.step()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="512x2048")
    ap.add_argument("--frequency", type=int, default=10)
    ap.add_argument("--windows", type=int, default=5)
    args = ap.parse_args()
    shape = tuple(int(x) for x in args.shape.split("x"))
    torch.manual_seed(0)
    grads = [torch.randn(shape) * 0.01 for _ in range(4)]
    runs = {}
    for name in ("optgen", "heavyball"):
        w = torch.nn.Parameter(torch.randn(shape) * 0.02)
        t0 = time.perf_counter()
        opt = _make(name, w, args.frequency)
        made = time.perf_counter() - t0
        first = _steps(opt, w, grads, args.frequency + 2)   # first fit, compile, refresh
        runs[name] = dict(opt=opt, w=w, made=made, first=sum(first), windows=[],
                          steps=[], refresh=[])
    for _ in range(args.windows):
        for name, r in runs.items():
            times = _steps(r["opt"], r["w"], grads, args.frequency)
            r["windows"].append(sum(times) / len(times))
            ordered = sorted(times)
            r["refresh"].append(ordered[-1])
            r["steps"] += ordered[:-1]
    print(f"SOAP {args.shape} float32, frequency {args.frequency}, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads, load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'':<10} {'mean step ms':>13} {'plain step ms':>14} {'refresh step ms':>16} "
          f"{'made + first steps s':>21}")
    for name, r in runs.items():
        print(f"{name:<10} {1e3 * statistics.median(r['windows']):>13.1f} "
              f"{1e3 * statistics.median(r['steps']):>14.1f} "
              f"{1e3 * statistics.median(r['refresh']):>16.1f} "
              f"{r['made'] + r['first']:>21.1f}")
    ratio = [h / o for h, o in zip(runs["heavyball"]["windows"], runs["optgen"]["windows"])]
    print(f"heavyball / optgen mean step: {statistics.median(ratio):.2f} "
          f"(windows: {', '.join(f'{x:.2f}' for x in ratio)})")


if __name__ == "__main__":
    main()

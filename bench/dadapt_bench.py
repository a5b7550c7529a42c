"""optgen.torch.DAdaptAdam beside the authors' dadaptation.DAdaptAdam (pip package
``dadaptation``) and torch.optim.Adam (an anchor: a plain Adam step of the same
tensors), float32 on the CPU: the median time of one optimizer step over the same
parameters and gradients, the three stepped in turn in one process.

    python bench/dadapt_bench.py                  # 2 transformer-MLP-like blocks: 12 tensors, 9.4M values
    python bench/dadapt_bench.py --width 256 --layers 2 --repeats 50

Each ``step()`` of both D-Adaptation classes computes the two sums over all parameters
and the update; optgen's runs a first kernel pass per tensor (the sums' parts), adds them
on the host and runs the update pass.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import optgen.torch


def model_params(width: int, layers: int) -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width),
                   torch.nn.LayerNorm(width)]
    params = [p for b in blocks for p in b.parameters()]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-2
    return params


def timed(opt: torch.optim.Optimizer, repeats: int) -> list[float]:
    for _ in range(3):
        opt.step()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        opt.step()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the contenders")
    args = ap.parse_args()
    import dadaptation
    contenders = {
        "optgen.torch.DAdaptAdam": lambda ps: optgen.torch.DAdaptAdam(ps),
        "dadaptation.DAdaptAdam (authors)": lambda ps: dadaptation.DAdaptAdam(ps),
        "torch.optim.Adam (anchor, foreach)": lambda ps: torch.optim.Adam(ps, foreach=True),
    }
    params = {name: model_params(args.width, args.layers) for name in contenders}
    opts = {name: make(params[name]) for name, make in contenders.items()}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, opt in opts.items():
            times[name] += timed(opt, args.repeats)
    n = sum(p.numel() for p in params["optgen.torch.DAdaptAdam"])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{len(params['optgen.torch.DAdaptAdam'])} tensors, {n:,} float32 values, "
          f"{torch.get_num_threads()} torch threads, load average {load:.2f}; "
          f"{args.rounds * args.repeats} steps each")
    authors = times["dadaptation.DAdaptAdam (authors)"]
    base, best = statistics.median(authors), min(authors)
    print(f"  {'':36s} {'median':>10s} {'best':>10s}   median, best / the authors'")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:36s} {med * 1e3:7.2f} ms {min(ts) * 1e3:7.2f} ms   "
              f"{med / base:5.2f}x {min(ts) / best:5.2f}x")


if __name__ == "__main__":
    main()

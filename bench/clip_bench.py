"""The cost of ``clip_global_norm``: optgen.torch.AdamW with and without it, beside
torch.nn.utils.clip_grad_norm_ + torch.optim.AdamW (foreach) as the anchor, float32 on
the CPU, the same tensors and gradients, the rows stepped in turn in one process;
median and best time of one ``step()`` (the anchor's includes its clip_grad_norm_).

    python bench/clip_bench.py                 # 12 tensors, 9.4M values
    python bench/clip_bench.py --width 256 --repeats 50

optgen's global norm is the reduction pass of specs/_sum_of_squares.py on each gradient
(float64 sums, added on the host), then the step with the clip factor in its scalars.
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
    params = []
    for _ in range(layers):
        for m in (torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width),
                  torch.nn.LayerNorm(width)):
            params += list(m.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    return params


class TorchClipped:
    """torch.nn.utils.clip_grad_norm_ then torch.optim.AdamW (foreach): the anchor."""

    def __init__(self, params, max_norm: float):
        self.params, self.max_norm = params, max_norm
        self.opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)

    def step(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        self.opt.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = {
        "optgen AdamW": lambda ps: optgen.torch.AdamW(ps, lr=1e-3),
        "optgen AdamW, clip_global_norm=1": lambda ps: optgen.torch.AdamW(
            ps, lr=1e-3, clip_global_norm=1.0),
        "torch clip_grad_norm_ + AdamW": lambda ps: TorchClipped(ps, 1.0),
    }
    params = {name: model_params(args.width, args.layers) for name in rows}
    opts = {name: make(params[name]) for name, make in rows.items()}
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, opt in opts.items():
            for _ in range(3):
                opt.step()
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                opt.step()
                times[name].append(time.perf_counter() - t0)
    n = sum(p.numel() for p in params["optgen AdamW"])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{len(params['optgen AdamW'])} tensors, {n:,} float32 values, "
          f"{torch.get_num_threads()} torch threads, load average {load:.2f}; "
          f"{args.rounds * args.repeats} steps each")
    plain = times["optgen AdamW"]
    print(f"  {'':34s} {'median':>10s} {'best':>10s}   median, best / optgen AdamW")
    for name, ts in times.items():
        print(f"  {name:34s} {statistics.median(ts) * 1e3:7.2f} ms {min(ts) * 1e3:7.2f} ms   "
              f"{statistics.median(ts) / statistics.median(plain):5.2f}x "
              f"{min(ts) / min(plain):5.2f}x")


if __name__ == "__main__":
    main()

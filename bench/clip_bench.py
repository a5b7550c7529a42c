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


def model_params(width: int, layers: int, grad_scale: float = 1.0
                 ) -> list[torch.nn.Parameter]:
    """The tensors of ``layers`` transformer-MLP-like blocks, with random gradients."""
    torch.manual_seed(0)
    params = []
    for _ in range(layers):
        for m in (torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width),
                  torch.nn.LayerNorm(width)):
            params += list(m.parameters())
    for p in params:
        p.grad = torch.randn_like(p) * grad_scale
    return params


class TorchClipped:
    """torch.nn.utils.clip_grad_norm_ then torch.optim.AdamW (foreach): the anchor."""

    def __init__(self, params, max_norm: float):
        self.params, self.max_norm = params, max_norm
        self.opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)

    def step(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        self.opt.step()


def interleaved(opts: dict, rounds: int, repeats: int) -> dict[str, list[float]]:
    """Seconds per ``step()`` of each optimizer, the rows in turn ``rounds`` times."""
    times: dict[str, list[float]] = {name: [] for name in opts}
    for _ in range(rounds):
        for name, opt in opts.items():
            for _ in range(3):
                opt.step()
            for _ in range(repeats):
                t0 = time.perf_counter()
                opt.step()
                times[name].append(time.perf_counter() - t0)
    return times


def report(params: list, times: dict[str, list[float]], base: str) -> None:
    """The rows' median and best times and their ratios over row ``base``'s."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{len(params)} tensors, {sum(p.numel() for p in params):,} float32 values, "
          f"{torch.get_num_threads()} torch threads, load average {load:.2f}; "
          f"{len(times[base])} steps each")
    ref = times[base]
    print(f"  {'':36s} {'median':>10s} {'best':>10s}   median, best / {base}")
    for name, ts in times.items():
        print(f"  {name:36s} {statistics.median(ts) * 1e3:7.2f} ms {min(ts) * 1e3:7.2f} ms   "
              f"{statistics.median(ts) / statistics.median(ref):5.2f}x "
              f"{min(ts) / min(ref):5.2f}x")


def arguments(doc: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the rows")
    return ap.parse_args()


def main() -> None:
    args = arguments(__doc__)
    rows = {
        "optgen AdamW": lambda ps: optgen.torch.AdamW(ps, lr=1e-3),
        "optgen AdamW, clip_global_norm=1": lambda ps: optgen.torch.AdamW(
            ps, lr=1e-3, clip_global_norm=1.0),
        "torch clip_grad_norm_ + AdamW": lambda ps: TorchClipped(ps, 1.0),
    }
    params = {name: model_params(args.width, args.layers) for name in rows}
    times = interleaved({name: make(params[name]) for name, make in rows.items()},
                        args.rounds, args.repeats)
    report(params["optgen AdamW"], times, "optgen AdamW")


if __name__ == "__main__":
    main()

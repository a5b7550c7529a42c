#!/usr/bin/env python
"""A training step with the step inside backward against the ordinary step, side by side.

    python bench/in_backward_bench.py                      # 100 and 400 Linear(32, 32), 100 Linear(256, 256)
    python bench/in_backward_bench.py --layers 100 --width 256 --reps 60

Two copies of one model (a stack of Linear layers, batch 8) train with
``optgen.torch.AdamW``: one ``backward(); step(); zero_grad()``, one made with
``step_in_backward=True`` (backward steps each parameter). After a warm-up the
repetitions alternate between them, so the machine's drift hits both alike; the script
prints each one's median step time, their ratio and the extra time per parameter tensor
(the in-backward step launches each parameter alone, after its own checks). Read medians
and ratios, never one run: shared VMs are noisy. It asserts no timings; it checks that
both copies end at the same parameters.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import optgen.torch as ot


def model(layers: int, width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def run(layers: int, width: int, reps: int) -> None:
    x = torch.randn(8, width)
    nets = {"ordinary": model(layers, width), "in backward": model(layers, width)}
    opts = {k: ot.AdamW(n.parameters(), lr=1e-4, step_in_backward=k == "in backward")
            for k, n in nets.items()}
    times: dict[str, list[float]] = {k: [] for k in nets}
    for r in range(reps + 5):
        for k in (list(nets) if r % 2 else list(nets)[::-1]):
            t = time.perf_counter()
            nets[k](x).square().mean().backward()
            opts[k].step()
            opts[k].zero_grad()
            if r >= 5:
                times[k].append(time.perf_counter() - t)
    for p, q in zip(*(n.parameters() for n in nets.values())):
        assert torch.allclose(p, q, rtol=0, atol=1e-6), "the two runs differ"
    med = {k: statistics.median(v) for k, v in times.items()}
    tensors = len(list(nets["ordinary"].parameters()))
    print(f"{layers} x Linear({width}, {width}), {tensors} tensors: ordinary "
          f"{med['ordinary'] * 1e3:.2f} ms, in backward {med['in backward'] * 1e3:.2f} ms "
          f"(x{med['in backward'] / med['ordinary']:.2f}; "
          f"{(med['in backward'] - med['ordinary']) / tensors * 1e6:+.0f} us per tensor)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="*", default=None)
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1, help="torch's CPU threads")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    shapes = [(n, a.width or 32) for n in a.layers] if a.layers else \
        [(100, 32), (400, 32), (100, 256)] if a.width is None else [(100, a.width)]
    for layers, width in shapes:
        run(layers, width, a.reps)


if __name__ == "__main__":
    main()

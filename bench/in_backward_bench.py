#!/usr/bin/env python
"""A training step with the step inside backward against the ordinary step, side by side.

    python bench/in_backward_bench.py                      # 200 Linear(64, 64), 100 and 400 Linear(32, 32), 100 Linear(256, 256)
    python bench/in_backward_bench.py --layers 100 --width 256 --reps 60

Two copies of one model (a stack of Linear layers, batch 8) train with
``optgen.torch.AdamW``: one ``backward(); step(); zero_grad()``, one made with
``step_in_backward=True`` (backward steps the parameters in buckets as their gradients
complete: optgen/torch/in_backward_buckets.py). After a warm-up the repetitions
alternate between them, so the machine's drift hits both alike; the script prints each
one's median step time (wall clock and the process's CPU time), the median of the
ratios of neighbouring repetitions, the extra time per parameter tensor and the number
of buckets. ``--threads`` sets torch's threads and the optgen kernels' (one each by
default). Read medians and ratios, never one run: shared VMs are noisy. It asserts no
timings; it checks that both copies end at the same parameters.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import optgen.runtime
import optgen.torch as ot


def model(layers: int, width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def run(layers: int, width: int, reps: int) -> None:
    x = torch.randn(8, width)
    nets = {"ordinary": model(layers, width), "in backward": model(layers, width)}
    opts = {k: ot.AdamW(n.parameters(), lr=1e-4, step_in_backward=k == "in backward")
            for k, n in nets.items()}
    wall: dict[str, list[float]] = {k: [] for k in nets}
    cpu: dict[str, list[float]] = {k: [] for k in nets}
    for r in range(reps + 5):
        for k in (list(nets) if r % 2 else list(nets)[::-1]):
            t, c = time.perf_counter(), time.process_time()
            nets[k](x).square().mean().backward()
            opts[k].step()
            opts[k].zero_grad()
            if r >= 5:
                wall[k].append(time.perf_counter() - t)
                cpu[k].append(time.process_time() - c)
    for p, q in zip(*(n.parameters() for n in nets.values())):
        assert torch.allclose(p, q, rtol=0, atol=1e-6), "the two runs differ"
    tensors = len(list(nets["ordinary"].parameters()))
    buckets = len(opts["in backward"]._buckets.sizes())
    for name, times in (("wall", wall), ("cpu", cpu)):
        med = {k: statistics.median(v) for k, v in times.items()}
        paired = statistics.median(b / a for a, b in zip(times["ordinary"], times["in backward"]))
        print(f"{layers} x Linear({width}, {width}), {tensors} tensors in {buckets} buckets, "
              f"{name}: ordinary {med['ordinary'] * 1e3:.2f} ms, in backward "
              f"{med['in backward'] * 1e3:.2f} ms (x{med['in backward'] / med['ordinary']:.2f}, "
              f"paired x{paired:.2f}; "
              f"{(med['in backward'] - med['ordinary']) / tensors * 1e6:+.0f} us per tensor)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="*", default=None)
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch's CPU threads and the optgen kernels'")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    optgen.runtime.set_num_threads(a.threads)
    shapes = [(n, a.width or 32) for n in a.layers] if a.layers else \
        [(200, 64), (100, 32), (400, 32), (100, 256)] if a.width is None else [(100, a.width)]
    for layers, width in shapes:
        run(layers, width, a.reps)


if __name__ == "__main__":
    main()

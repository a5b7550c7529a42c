#!/usr/bin/env python
"""The step time of q8 states as they are now (Adam's ``v`` coded as sqrt(v): "q8:usqrt")
against q8's earlier form (``v`` coded as itself: bench/q8_legacy.py), side by side in one
process: the two optimizers step the same tensors' copies in turn, and each
configuration's time is the median over the rounds of its CPU time a step (one TVM
thread, one torch thread: CPU time is what a loaded machine leaves honest).

    python bench/q8_step_bench.py                    # 10M parameters in 4 tensors
    python bench/q8_step_bench.py --million 2 --rounds 15

Configurations: ``fp32+q8`` (float32 parameters, q8 states) and ``bf16+split8+q8`` (the
5-byte step: bfloat16 weights, master_format="split8", q8 states), each in both forms,
torch's fused float32 AdamW beside them for scale. Prints each median and the ratio
new / old.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TVM_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.q8_legacy import legacy_q8  # noqa: E402


def make(config: str, sizes: list[int], legacy: bool, cache: str):
    import optgen.torch as ot
    bf16 = config.startswith("bf16")
    params = [torch.nn.Parameter(torch.randn(n, dtype=torch.bfloat16 if bf16 else torch.float32)
                                 * 0.1) for n in sizes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-2
    if config == "torch fused":
        return params, torch.optim.AdamW(params, lr=1e-3, fused=True)
    kw = {"master_format": "split8"} if bf16 else {}
    with legacy_q8(cache) if legacy else contextlib.nullcontext():
        opt = ot.AdamW(params, lr=1e-3, state_format="q8", **kw)
        opt.step()                       # (builds and loads its kernels here)
    return params, opt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--million", type=float, default=10.0, help="parameters, in millions")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--steps", type=int, default=3, help="steps per round and optimizer")
    a = ap.parse_args()
    torch.set_num_threads(1)
    n = int(a.million * 1e6)
    sizes = [n // 2, n // 4, n // 8, n - n // 2 - n // 4 - n // 8]
    runs = {}
    with tempfile.TemporaryDirectory(prefix="optgen-q8-legacy-") as cache:
        for config in ("fp32+q8", "bf16+split8+q8"):
            for legacy in (False, True):
                runs[f"{config} {'old' if legacy else 'new'}"] = make(config, sizes, legacy, cache)
        runs["torch fused fp32"] = make("torch fused", sizes, False, cache)
        times = {k: [] for k in runs}
        for r in range(a.rounds):
            order = list(runs) if r % 2 == 0 else list(reversed(runs))
            for k in order:
                _, opt = runs[k]
                t0 = time.process_time()
                for _ in range(a.steps):
                    opt.step()
                times[k].append((time.process_time() - t0) / a.steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{n:,} parameters in {len(sizes)} tensors, one thread, {a.rounds} rounds x "
          f"{a.steps} steps, median CPU ms a step (load average "
          f"{os.getloadavg()[0]:.1f}):")
    for k, v in med.items():
        print(f"  {k:<24} {1e3 * v:9.2f} ms   ({med[k] / med['torch fused fp32']:.2f}x torch fused)")
    for config in ("fp32+q8", "bf16+split8+q8"):
        print(f"  {config}: new / old = {med[config + ' new'] / med[config + ' old']:.3f}")


if __name__ == "__main__":
    main()

"""Loose tensors, one launch (issue 31), CPU, side by side: optgen Adam on a list of loose
tensors (the default multi-tensor launch) against the same optimizer flattened
(``optgen.flatten`` per decay group), one call per tensor (``multi_tensor=False``) and
torch's fused AdamW, on BERT-base's 199 tensors and on 100 tensors of 1,000 parameters.

    python bench/multitensor_bench.py                      # both sets, 10 interleaved reps
    python bench/multitensor_bench.py --sets small --reps 30
    python bench/multitensor_bench.py --json out.json

A script, not a test: it asserts no timing. Every row steps its own copy of the same
weights and gradients; after the reps the rows' weights are checked against the first
row's (optgen rows bit for bit; torch's largest difference is printed). Medians, in ms.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from optgen.benchmark import interleave, median  # noqa: E402
from contenders import (FUSED, OPTGEN, OPTGEN_FLAT, OPTGEN_PER, make_optgen,  # noqa: E402
                        make_torch_adam)
from params import bert_params, flat_params  # noqa: E402

SETS = {"bert": ("BERT-base, 199 tensors, Adam, wd 0.01 on weights",
                 lambda: bert_params(12, 30522)),
        "small": ("100 x 1k tensors, Adam", lambda: flat_params(100_000, 100))}
ROWS = (OPTGEN, OPTGEN_FLAT, OPTGEN_PER, FUSED)


def run_set(key: str, reps: int, warmup: int) -> dict:
    import torch
    title, make = SETS[key]
    ps = make()
    rows = [make_optgen(ps, "adam", OPTGEN), make_optgen(ps, "adam", OPTGEN_FLAT, flat=True),
            make_optgen(ps, "adam", OPTGEN_PER, multi_tensor=False),
            make_torch_adam(torch, ps, FUSED, fused=True)]
    if key == "small":                  # latency-bound: 20 steps a sample
        for c in rows:
            c.inner = 20
    interleave(rows, reps, warmup)
    first = rows[0].weights()
    for c in rows[1:]:
        w = c.weights()
        if c.name.startswith("optgen"):
            assert np.array_equal(w, first), f"{c.name} differs from {rows[0].name}"
        else:
            print(f"  {c.name}: max |w - {rows[0].name}| = {np.abs(w - first).max():.2e}")
    meds = {c.name: median(c.times) * 1e3 for c in rows}   # (times: seconds per call)
    print(f"\n{title}: {ps.n:,} parameters, median ms per step ({reps} reps)")
    for name, ms in meds.items():
        print(f"  {name:28s} {ms:9.3f}   x flat {ms / meds[OPTGEN_FLAT]:5.2f}"
              f"   x torch fused {ms / meds[FUSED]:5.2f}")
    return {"title": title, "params": ps.n, "tensors": len(ps.ws), "median_ms": meds,
            "samples_s": {c.name: c.times for c in rows}, "inner": rows[0].inner}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="bert,small", help="bert, small or both")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", help="write the medians and samples here")
    args = ap.parse_args(argv)
    out = {k: run_set(k, args.reps, args.warmup) for k in args.sets.split(",")}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Adam's final loss with each state format on problems whose states span many decades,
as a ratio to float32 states (docs/state-formats.md, "fp8: which values it holds").

    python bench/fp8_range.py                        # 3 seeds, every problem (minutes)
    python bench/fp8_range.py --seeds 5 --problems quadratic

Problems (the gradient is computed here in numpy; the step is optgen's compiled kernel
for the built formats, or this script's numpy model of a candidate format):

  quadratic  0.5 * sum(h * x**2), 50,000 parameters, curvatures h log-spaced over 6
             decades (1e-3 .. 1e3) and shuffled (a block of 256 holds all of them), a
             noisy gradient h * x + 0.1 * N(0, 1); lr 1e-2, 400 steps
  sparse     the same quadratic with h over 4 decades, where parameter i receives its
             gradient only with a probability log-spaced over 3 decades (1 .. 1e-3;
             a zero gradient otherwise: rows that sit idle for hundreds of steps, as
             rare tokens' embedding rows do); lr 1e-2, 400 steps
  features   least squares with 2,000 features whose scales are log-spaced over 6
             decades, a batch of 64 a step, noise 0.1; lr 1e-3, 400 steps

Rows: optgen's formats (fp32, bf16, q8, q4, fp8 and fp8 at 32 a block; the fp8 default
codes Adam's v as sqrt(v)), the mix {"m": "fp8", "v": "bf16"} (FP8-LM's choice: the second
moment in 16 bits), and numpy models of the earlier fp8 form, v coded as itself ("fp8 v
direct", at 256 and 32 a block; q8 with v coded as itself, "q8 v direct", as q8 coded it
before its square-root map). Each cell is the median over the seeds of final loss /
float32 states' final loss (the same seed: the same data and noise). A script, not a test.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import optgen  # noqa: E402
from optgen.core.formats import from_stored  # noqa: E402

F32 = np.float32
STEPS = 400


class Problem:
    """A seeded problem: ``x0``, ``grad(x, step)`` (its own noise stream), ``loss(x)``."""

    def __init__(self, name: str, seed: int):
        self.name, r = name, np.random.default_rng(seed)
        self.lr = 1e-3 if name == "features" else 1e-2
        if name == "features":
            n, self.batch = 2000, 64
            self.scales = (10.0 ** r.uniform(-3, 3, n)).astype(F32)
            self.w_true = r.standard_normal(n).astype(F32)
            self.x0 = np.zeros(n, F32)
            held = r.standard_normal((2048, n)).astype(F32) * self.scales
            self.held = (held, held @ self.w_true)
        else:
            n = 50_000
            decades = 6 if name == "quadratic" else 4
            self.h = np.logspace(-decades / 2, decades / 2, n).astype(F32)
            r.shuffle(self.h)
            self.p = np.ones(n) if name == "quadratic" else \
                r.permutation(np.logspace(0, -3, n))
            self.x0 = r.standard_normal(n).astype(F32)
        self.seed = seed

    def stream(self):
        return np.random.default_rng(self.seed + 1000)

    def grad(self, x: np.ndarray, r: np.random.Generator) -> np.ndarray:
        if self.name == "features":
            a = r.standard_normal((self.batch, x.size)).astype(F32) * self.scales
            y = a @ self.w_true + F32(0.1) * r.standard_normal(self.batch).astype(F32)
            return (a.T @ (a @ x - y) / F32(self.batch)).astype(F32)
        g = self.h * x + F32(0.1) * r.standard_normal(x.size).astype(F32)
        if self.name == "sparse":
            g = np.where(r.random(x.size) < self.p, g, F32(0))
        return g.astype(F32)

    def loss(self, x: np.ndarray) -> float:
        if self.name == "features":
            a, y = self.held
            return float(np.mean((a.astype(np.float64) @ x - y) ** 2))
        return 0.5 * float(np.sum(self.h.astype(np.float64) * x.astype(np.float64) ** 2))


def run_optgen(prob: Problem, fmt) -> float:
    opt = optgen.create("adam", [prob.x0.copy()], lr=prob.lr, state_format=fmt,
                        state_format_min_size=0)
    r = prob.stream()
    for _ in range(STEPS):
        opt.step([prob.grad(opt.params[0], r)])
    return prob.loss(np.asarray(opt.params[0]))


def run_model(prob: Problem, stored: dict[str, str]) -> float:
    """Adam as the kernels step it: the new states from the decoded old ones, the
    parameter from the new states before rounding, then each state stored in its format
    (the formats' numpy quantizers, ``from_stored``)."""
    fm, fv = (from_stored(stored[s]) for s in ("m", "v"))
    b1, b2, eps, lr = F32(0.9), F32(0.999), F32(1e-8), F32(prob.lr)
    x, m, v = prob.x0.copy(), np.zeros_like(prob.x0), np.zeros_like(prob.x0)
    r = prob.stream()
    for t in range(1, STEPS + 1):
        g = prob.grad(x, r)
        m = b1 * m + (F32(1) - b1) * g
        v = b2 * v + (F32(1) - b2) * g * g
        mh, vh = m / F32(1 - 0.9 ** t), v / F32(1 - 0.999 ** t)
        x = (x - lr * mh / (np.sqrt(vh) + eps)).astype(F32)
        m = fm.dequantize(fm.quantize(m), m.shape)
        v = fv.dequantize(fv.quantize(v), v.shape)
    return prob.loss(x)


ROWS = {   # name -> ("optgen", state_format) or ("model", stored texts of m and v)
    "fp32": ("optgen", None), "bf16": ("optgen", "bf16"), "q8": ("optgen", "q8"),
    "q4": ("optgen", "q4"), "fp8": ("optgen", "fp8"), "fp8@32": ("optgen", "fp8@32"),
    "m fp8 + v bf16": ("optgen", {"m": "fp8", "v": "bf16"}),
    "fp8 v sqrt (model)": ("model", {"m": "fp8:e4m3", "v": "fp8:e4m3sqrt"}),
    "fp8 v direct (model)": ("model", {"m": "fp8:e4m3", "v": "fp8:e4m3"}),
    "fp8@32 v direct (model)": ("model", {"m": "fp8:e4m3:32", "v": "fp8:e4m3:32"}),
    "q8 v sqrt (model)": ("model", {"m": "q8:signed", "v": "q8:usqrt"}),
    "q8 v direct (model)": ("model", {"m": "q8:signed", "v": "q8:unsigned"}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--problems", default="quadratic,sparse,features")
    ap.add_argument("--rows", default=",".join(ROWS))
    a = ap.parse_args()
    rows = a.rows.split(",")
    for name in a.problems.split(","):
        t0 = time.time()
        losses = {row: [] for row in rows}
        for seed in range(a.seeds):
            prob = Problem(name, seed)
            for row in rows:
                kind, fmt = ROWS[row]
                with np.errstate(all="ignore"):
                    losses[row].append(run_optgen(prob, fmt) if kind == "optgen"
                                       else run_model(prob, fmt))
        base = losses["fp32"]
        print(f"\n{name}: final loss / fp32 states' (median of {a.seeds} seeds; "
              f"fp32 median loss {statistics.median(base):.4g}; {time.time() - t0:.0f} s)")
        mean = statistics.mean(base)
        spread = 2 * statistics.stdev(base) if len(base) > 1 else 0.0
        print(f"  (within: a row's mean final loss inside fp32's mean +- 2 std over seeds, "
              f"{mean:.4g} +- {spread:.3g})")
        for row in rows:
            ratios = [x / b for x, b in zip(losses[row], base)]
            inside = abs(statistics.mean(losses[row]) - mean) <= spread
            print(f"  {row:<26} {statistics.median(ratios):10.3g}   "
                  f"({', '.join(f'{q:.3g}' for q in ratios)})  mean "
                  f"{statistics.mean(losses[row]):.4g} {'within' if inside else 'outside'}")


if __name__ == "__main__":
    main()

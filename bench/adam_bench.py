#!/usr/bin/env python
"""Side-by-side CPU Adam benchmark: optgen's fused kernel against torch, numpy and memory.

    python bench/adam_bench.py                       # 10M fp32 parameters, 20 reps
    python bench/adam_bench.py --n 1000003 --reps 40 --json out.json
    python bench/adam_bench.py --quiet-pools         # idle thread pools sleep (see README)
    python bench/adam_bench.py --quiet-pools --only "torch fused,optgen.torch,triad torch"
                                 # the memory configurations' steps (optgen.torch.AdamW)

Every Adam contender updates its own copy of the same n fp32 parameters (w, g, m, v) with
a fixed gradient. After a warm-up, the repetitions are interleaved: rep r times one step
of every contender, starting at contender r mod k, so the machine's drift hits all alike.
Read medians and ratios, never one run: these VMs are noisy (+-30 %) and shared.

The ``optgen.torch AdamW`` rows step torch parameters through the drop-in class: fp32,
q8 and fp8 states, and the in-backward 5-byte configuration (bfloat16 weights, a split8
correction, q8 states) timed as the fused step its hooks run, over the same gradient
set once (the hook's host work and the backward itself are not in it).

Adam fp32 moves 28 bytes per parameter (reads w, g, m, v; writes w, m, v). The bandwidth
anchor is a STREAM triad ``a = b + s*c``, counted as 12 bytes per element (STREAM's
convention) at its best time (STREAM's "best rate"): "x limit" is a contender's median over
28*n / that bandwidth. The triad's store to ``a`` costs a write-allocate read that STREAM
does not count, while Adam stores only to lines it has just read, so a bandwidth-bound Adam
lands *below* 1.0x the triad limit. The in-place axpy ``a += s*b`` has Adam's access pattern
(no write-allocate); "x axpy" uses its best bandwidth instead, the tighter ceiling.

This is a script, not a test: it asserts no timings. After timing it checks that every
Adam contender ended at the same weights as torch fused (all took the same steps); the
gradient is kept away from 0 so that optgen's eps convention (MXNet's, eps not
bias-corrected) and torch's agree to ~1e-6 relative.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from optgen.benchmark import (ORDERS, Contender, cpu_model, interleave,  # noqa: E402
                              quiet_pools, thread_env, wall_clock)
from bandwidth import (AXPY_TORCH, COPY_TORCH, TRIAD_NUMPY, TRIAD_TORCH,  # noqa: E402
                       make_numpy_triad, make_torch_axpy, make_torch_copy, make_torch_triad)
from contenders import (ADAM_B, DROP_IN_ROWS, FOREACH, FUSED, NUMPY_EXPR,  # noqa: E402
                        NUMPY_INPLACE, OPTGEN, SINGLE, state_row)
from params import ParamSet  # noqa: E402
from workloads import BNB, ROWS, STATE_FORMATS, TORCHAO  # noqa: E402

# the rows, in the order of the table; then the bandwidth anchors
ADAM_ROWS = (OPTGEN, *(state_row(f) for f in STATE_FORMATS), *DROP_IN_ROWS, BNB, TORCHAO,
             FUSED, FOREACH, SINGLE, NUMPY_EXPR, NUMPY_INPLACE)


def machine_info(torch) -> dict:
    """Call after optgen's first step: loading its runtime sets TVM_NUM_THREADS if unset."""
    return {"cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
            "cpu_model": cpu_model(), "torch_threads": torch.get_num_threads(),
            "env": thread_env(), "python": platform.python_version(),
            "numpy": np.__version__, "torch": torch.__version__}


# -- report ----------------------------------------------------------------------------
def summarize(contenders: list[Contender], n: int) -> tuple[list[dict], dict]:
    by_name = {c.name: c for c in contenders}

    def best_bw(name):  # STREAM's "best rate": the anchor's min time
        c = by_name.get(name)
        return c.bytes / c.best if c else None

    triad_name = TRIAD_TORCH if TRIAD_TORCH in by_name else TRIAD_NUMPY
    triad_bw, axpy_bw, copy_bw = best_bw(triad_name), best_bw(AXPY_TORCH), best_bw(COPY_TORCH)
    limit_s = ADAM_B * n / triad_bw if triad_bw else None
    axpy_limit_s = ADAM_B * n / axpy_bw if axpy_bw else None
    fused = by_name.get(FUSED)
    fused_med = fused.median if fused else None
    ref_w = fused.weights() if fused else None
    rows = []
    for c in contenders:
        med, adam = c.median, c.kind == "adam"
        row = {"contender": c.name, "kind": c.kind, "median_ms": med * 1e3,
               "min_ms": min(c.times) * 1e3, "gbps": c.gbps(med),
               "bytes_per_elem": c.bytes // n,
               "x_torch_fused": med / fused_med if adam and fused_med else None,
               "x_limit": med / limit_s if adam and limit_s else None,
               "x_axpy_limit": med / axpy_limit_s if adam and axpy_limit_s else None,
               "of_copy": c.gbps(med) / copy_bw * 1e9 if adam and copy_bw else None,
               "max_abs_diff_vs_fused": None, "note": c.note,
               "times_ms": [t * 1e3 for t in c.times]}
        if c.weights is not None and ref_w is not None:
            row["max_abs_diff_vs_fused"] = float(np.max(np.abs(c.weights() - ref_w)))
        rows.append(row)
    limits = {"triad": triad_name if triad_bw else None,
              "triad_gbps": triad_bw / 1e9 if triad_bw else None,
              "limit_ms": limit_s * 1e3 if limit_s else None,
              "axpy_gbps": axpy_bw / 1e9 if axpy_bw else None,
              "axpy_limit_ms": axpy_limit_s * 1e3 if axpy_limit_s else None,
              "copy_gbps": copy_bw / 1e9 if copy_bw else None}
    return rows, limits


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: list[dict], limits: dict) -> None:
    head = (f"{'contender':<28} {'median ms':>10} {'min ms':>9} {'GB/s':>7} "
            f"{'x fused':>8} {'x limit':>8} {'x axpy':>7} {'of copy':>8} {'max|w-w_fused|':>15}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['contender']:<28} {r['median_ms']:>10.3f} {r['min_ms']:>9.3f} "
              f"{r['gbps']:>7.1f} {fmt(r['x_torch_fused'], '>8.2f')} "
              f"{fmt(r['x_limit'], '>8.2f')} {fmt(r['x_axpy_limit'], '>7.2f')} "
              f"{fmt(r['of_copy'], '>8.2f')} "
              f"{fmt(r['max_abs_diff_vs_fused'], '>15.2e')}")
    print("(GB/s and the x columns use the median; GB/s counts each row's bytes: 28 B/param "
          "for fp32 Adam, the state format's for the others, 12 B/elem for the triad and "
          "axpy, 8 for the copy; 'of copy': GB/s over the copy's best)")
    if limits["limit_ms"] is not None:
        print(f"bandwidth-limit time = {ADAM_B} B x n / {limits['triad']} "
              f"best bandwidth ({limits['triad_gbps']:.1f} GB/s) = {limits['limit_ms']:.3f} ms"
              f" ('x limit')")
    if limits["axpy_limit_ms"] is not None:
        print(f"same from the in-place axpy's best bandwidth ({limits['axpy_gbps']:.1f} GB/s)"
              f" = {limits['axpy_limit_ms']:.3f} ms ('x axpy')")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000_000, help="parameters (default 10M)")
    ap.add_argument("--reps", type=int, default=20, help="interleaved repetitions (default 20)")
    ap.add_argument("--dtype", default="float32", choices=["float32"])
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per contender first")
    ap.add_argument("--inner", type=int, default=1,
                    help="steps per timed sample, for tiny n (default 1)")
    ap.add_argument("--tensors", type=int, default=1,
                    help="split the n parameters into this many tensors (default 1)")
    ap.add_argument("--skip", default="",
                    help="comma-separated prefixes of contender names to leave out")
    ap.add_argument("--only", default="",
                    help="comma-separated prefixes of the contender names to run (default: all)")
    ap.add_argument("--quiet-pools", action="store_true",
                    help="set OMP_WAIT_POLICY=passive and TVM_THREAD_POOL_SPIN_COUNT=0 (unless "
                         "set) before torch and TVM start, so idle pool threads sleep at once "
                         "instead of spinning into the next contender's step")
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="diagnostic: sleep this long (untimed) before each sample")
    ap.add_argument("--order", choices=ORDERS, default="interleave",
                    help="diagnostic: 'blocked' runs each contender's reps back to back")
    ap.add_argument("--cpu-time", action="store_true",
                    help="one thread for torch and TVM, and each sample is the process's "
                         "CPU time (time.process_time), not wall time: steadier than wall "
                         "time on a machine that runs other jobs")
    args = ap.parse_args(argv)
    if not 1 <= args.tensors <= args.n:
        ap.error("--tensors must be between 1 and --n")
    if args.quiet_pools:
        quiet_pools()

    if args.cpu_time:
        os.environ["TVM_NUM_THREADS"] = "1"      # (read when TVM's pool first starts)
    import torch
    torch.set_num_threads(1 if args.cpu_time else os.cpu_count())

    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(args.n).astype(args.dtype)
    g0 = rng.standard_normal(args.n)
    g0 = (g0 + np.copysign(0.1, g0)).astype(args.dtype)   # |g| >= 0.1: see the docstring
    ws = [np.ascontiguousarray(x) for x in np.array_split(w0, args.tensors)]
    gs = [np.ascontiguousarray(x) for x in np.array_split(g0, args.tensors)]

    ps = ParamSet(None, ws, gs, [False] * len(ws), 0.0)
    makers = {name: (lambda name=name: ROWS[name](torch, ps)) for name in ADAM_ROWS}
    makers[TRIAD_NUMPY] = lambda: make_numpy_triad(args.n)
    makers[TRIAD_TORCH] = lambda: make_torch_triad(torch, args.n)
    makers[AXPY_TORCH] = lambda: make_torch_axpy(torch, args.n)
    makers[COPY_TORCH] = lambda: make_torch_copy(torch, args.n)
    skip = [s.strip() for s in args.skip.split(",") if s.strip()]
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    contenders = [c for name, mk in makers.items()
                  if not any(name.startswith(s) for s in skip)
                  and (not only or any(name.startswith(s) for s in only))
                  for c in [mk()] if c is not None]
    for c in contenders:
        c.inner = args.inner
    del w0, g0

    load0 = os.getloadavg()[0]
    interleave(contenders, args.reps, args.warmup, args.order, args.gap_ms / 1e3,
               sample=wall_clock(time.process_time) if args.cpu_time else None)
    load1 = os.getloadavg()[0]
    info = machine_info(torch)
    info["loadavg_1min_before_after"] = [load0, load1]
    env = " ".join(f"{k}={v}" for k, v in info["env"].items() if v is not None) or "-"
    print(f"machine: os.cpu_count()={info['cpu_count']} ({info['affinity']} in affinity), "
          f"{info['cpu_model']}; python {info['python']}, numpy {info['numpy']}, "
          f"torch {info['torch']}; 1-min loadavg {load0:.2f} before, {load1:.2f} after")
    asked = "1 (--cpu-time: samples are CPU time)" if args.cpu_time else "os.cpu_count()"
    print(f"threads: torch.set_num_threads({asked}) -> torch.get_num_threads()="
          f"{info['torch_threads']}; thread env after the run: {env}; numpy: 1 thread")
    print(f"n={args.n:,} {args.dtype} in {args.tensors} tensor(s); {args.reps} reps "
          f"{args.order}{'d, rotating start' if args.order == 'interleave' else ''}"
          f"{f', {args.gap_ms:g} ms sleep before each sample' if args.gap_ms else ''}; "
          f"warmup {args.warmup}; {args.inner} step(s) per sample\n")
    rows, limits = summarize(contenders, args.n)
    print_table(rows, limits)
    print()
    for c in contenders:
        print(f"  {c.name}: {c.note}")

    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "machine": info, "limits": limits, "results": rows},
                      f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Side-by-side CPU Adam benchmark: optgen's fused kernel against torch, numpy and memory.

    python bench/adam_bench.py                       # 10M fp32 parameters, 20 reps
    python bench/adam_bench.py --n 1000003 --reps 40 --json out.json
    python bench/adam_bench.py --quiet-pools         # idle thread pools sleep (see README)

Every Adam contender updates its own copy of the same n fp32 parameters (w, g, m, v) with
a fixed gradient. After a warm-up, the repetitions are interleaved: rep r times one step
of every contender, starting at contender r mod k, so the machine's drift hits all alike.
Read medians and ratios, never one run: these VMs are noisy (+-30 %) and shared.

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
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-8
ADAM_BYTES_PER_PARAM = 28   # fp32: 4 arrays read, 3 written, 4 bytes each
BF16_STATE_BYTES_PER_PARAM = 20   # w, g read and w written at 4 bytes; m, v both ways at 2
Q8_STATE_BYTES_PER_PARAM = 16     # ... m, v codes both ways at 1 (absmax: 4 B per 256)
Q4_STATE_BYTES_PER_PARAM = 14     # ... m, v codes both ways at 1/2 (absmax: 4 B per 128)
TRIAD_BYTES_PER_ELEM = 12   # STREAM convention: read b, c; write a (axpy: read a, b; write a)
FUSED = "torch fused"
TRIAD_TORCH, TRIAD_NUMPY, AXPY_TORCH = ("triad torch (add out=)", "triad numpy (2 ufuncs)",
                                        "axpy torch (a.add_(b))")
THREAD_ENV = ("TVM_NUM_THREADS", "TVM_THREAD_POOL_SPIN_COUNT", "OMP_NUM_THREADS",
              "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


@dataclass
class Contender:
    name: str
    step: Callable[[], None]
    bytes_per_elem: int
    kind: str                                          # "adam" or "anchor"
    weights: Callable[[], np.ndarray] | None = None    # final w (flat), for the sanity check
    note: str = ""
    times: list[float] = field(default_factory=list)


# -- machine ---------------------------------------------------------------------------
def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what platform knows."""
    fallback = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), fallback)
    except OSError:   # no /proc (not Linux)
        return fallback


def machine_info(torch) -> dict:
    """Call after optgen's first step: loading its runtime sets TVM_NUM_THREADS if unset."""
    return {"cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
            "cpu_model": cpu_model(), "torch_threads": torch.get_num_threads(),
            "env": {k: os.environ.get(k) for k in THREAD_ENV},
            "python": platform.python_version(), "numpy": np.__version__,
            "torch": torch.__version__}


# -- Adam contenders (ws, gs: the parameter tensors and their gradients) ----------------
def make_optgen(ws, gs, state_format: str | None = None) -> Contender:
    """optgen's Adam; ``state_format`` "bf16" keeps m and v as bfloat16 (20 B/param),
    "q8" as block-wise 8-bit codes (16 B/param), "q4" as 4-bit ones (14 B/param)."""
    import optgen
    ws, gs = [w.copy() for w in ws], [g.copy() for g in gs]
    fmt = {} if state_format is None else {"state_format": state_format}
    opt = optgen.create("adam", ws, lr=LR, beta1=BETA1, beta2=BETA2, eps=EPS, **fmt)
    name = "optgen adam" + (f" {state_format} states" if state_format else "")
    moved = {None: ADAM_BYTES_PER_PARAM, "bf16": BF16_STATE_BYTES_PER_PARAM,
             "q8": Q8_STATE_BYTES_PER_PARAM, "q4": Q4_STATE_BYTES_PER_PARAM}[state_format]
    return Contender(name, lambda: opt.step(gs), moved, "adam", lambda: np.concatenate(ws),
                     note=f"opt.step(grads); artifact {os.path.basename(opt.artifact.path)}")


def make_torch_adam(torch, ws, gs, name: str, **kw) -> Contender:
    ps = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in ws]
    for p, g in zip(ps, gs):
        p.grad = torch.from_numpy(g.copy())
    opt = torch.optim.Adam(ps, lr=LR, betas=(BETA1, BETA2), eps=EPS, **kw)
    return Contender(name, opt.step, ADAM_BYTES_PER_PARAM, "adam",
                     lambda: np.concatenate([p.detach().numpy() for p in ps]),
                     note=f"torch.optim.Adam({', '.join(f'{k}={v}' for k, v in kw.items())})"
                          ".step(), grads set once")


def make_8bit(torch, ws, gs, name: str) -> Contender | None:
    """bitsandbytes' Adam8bit or torchao's AdamW8bit on CPU tensors, where installed
    (neither is a dependency: pip install bitsandbytes torchao); None otherwise."""
    try:
        if name.startswith("bitsandbytes"):
            import bitsandbytes as bnb
            make = lambda ps: bnb.optim.Adam8bit(ps, lr=LR, betas=(BETA1, BETA2), eps=EPS)
        else:
            from torchao.optim import AdamW8bit
            make = lambda ps: AdamW8bit(ps, lr=LR, betas=(BETA1, BETA2), eps=EPS,
                                        weight_decay=0.0)
    except ImportError as e:
        print(f"{name}: not run ({e})")
        return None
    ps = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in ws]
    for p, g in zip(ps, gs):
        p.grad = torch.from_numpy(g.copy())
    opt = make(ps)
    return Contender(name, opt.step, Q8_STATE_BYTES_PER_PARAM, "adam",
                     lambda: np.concatenate([p.detach().numpy() for p in ps]),
                     note=f"{type(opt).__module__}.{type(opt).__name__}.step() on CPU tensors")


def _bias(t: int) -> tuple[float, float]:
    """torch.optim.Adam's step size and 1/sqrt(bias correction 2) at step t."""
    return LR / (1 - BETA1 ** t), 1 / np.sqrt(1 - BETA2 ** t)


def make_numpy_expr(ws, gs) -> Contender:
    """The textbook numpy Adam: out-of-place expressions, fresh temporaries on every line."""
    sts = [{"w": w.copy(), "m": np.zeros_like(w), "v": np.zeros_like(w)} for w in ws]
    gs, t = [g.copy() for g in gs], [0]

    def step():
        t[0] += 1
        step_size, inv_sqrt_bc2 = _bias(t[0])
        for st, g in zip(sts, gs):
            st["m"] = BETA1 * st["m"] + (1 - BETA1) * g
            st["v"] = BETA2 * st["v"] + (1 - BETA2) * g * g
            st["w"] -= step_size * st["m"] / (np.sqrt(st["v"]) * inv_sqrt_bc2 + EPS)
    return Contender("numpy (out-of-place exprs)", step, ADAM_BYTES_PER_PARAM, "adam",
                     lambda: np.concatenate([st["w"] for st in sts]),
                     note="m = b1*m + (1-b1)*g ... ; single-threaded ufuncs, new temporaries")


def make_numpy_inplace(ws, gs) -> Contender:
    """numpy Adam with every ufunc writing into an existing array (out=, one scratch array)."""
    ws, gs = [w.copy() for w in ws], [g.copy() for g in gs]
    ms, vs = [np.zeros_like(w) for w in ws], [np.zeros_like(w) for w in ws]
    tmps, t = [np.empty_like(w) for w in ws], [0]

    def step():
        t[0] += 1
        step_size, inv_sqrt_bc2 = _bias(t[0])
        for w, g, m, v, tmp in zip(ws, gs, ms, vs, tmps):
            np.multiply(m, BETA1, out=m)
            np.multiply(g, 1 - BETA1, out=tmp)
            np.add(m, tmp, out=m)
            np.multiply(v, BETA2, out=v)
            np.multiply(g, g, out=tmp)
            np.multiply(tmp, 1 - BETA2, out=tmp)
            np.add(v, tmp, out=v)
            np.sqrt(v, out=tmp)
            np.multiply(tmp, inv_sqrt_bc2, out=tmp)
            np.add(tmp, EPS, out=tmp)
            np.divide(m, tmp, out=tmp)
            np.multiply(tmp, -step_size, out=tmp)
            np.add(w, tmp, out=w)
    return Contender("numpy (in-place, out=)", step, ADAM_BYTES_PER_PARAM, "adam",
                     lambda: np.concatenate(ws),
                     note="13 ufuncs with out= per tensor, one scratch array; single-threaded")


# -- bandwidth anchors -----------------------------------------------------------------
def make_numpy_triad(n: int) -> Contender:
    a, b, c = np.zeros(n, np.float32), np.full(n, 1.0, np.float32), np.full(n, 2.0, np.float32)
    s = np.float32(3.0)

    def step():
        np.multiply(c, s, out=a)
        np.add(a, b, out=a)
    return Contender(TRIAD_NUMPY, step, TRIAD_BYTES_PER_ELEM, "anchor",
                     note="np.multiply(c, s, out=a); np.add(a, b, out=a): single-threaded, "
                          "two passes over a")


def make_torch_triad(torch, n: int) -> Contender:
    a, b, c = torch.zeros(n), torch.full((n,), 1.0), torch.full((n,), 2.0)
    return Contender(TRIAD_TORCH, lambda: torch.add(b, c, alpha=3.0, out=a),
                     TRIAD_BYTES_PER_ELEM, "anchor",
                     note="torch.add(b, c, alpha=s, out=a): one pass, all torch threads")


def make_torch_axpy(torch, n: int) -> Contender:
    a, b = torch.zeros(n), torch.full((n,), 2.0)
    return Contender(AXPY_TORCH, lambda: a.add_(b, alpha=3.0), TRIAD_BYTES_PER_ELEM, "anchor",
                     note="a.add_(b, alpha=s): reads a, b, writes a in place, like Adam "
                          "(no write-allocate)")


# -- timing ----------------------------------------------------------------------------
def _sample(c: Contender, inner: int, gap_s: float) -> None:
    if gap_s:
        time.sleep(gap_s)                   # untimed: let the previous pool's threads idle
    t0 = time.perf_counter()
    for _ in range(inner):
        c.step()
    c.times.append((time.perf_counter() - t0) / inner)


def run(contenders: list[Contender], reps: int, warmup: int, inner: int,
        order: str = "interleave", gap_s: float = 0.0) -> None:
    for c in contenders:
        for _ in range(warmup):
            c.step()
    if order == "blocked":                  # diagnostic only: drift then biases the ratios
        for c in contenders:
            for _ in range(reps):
                _sample(c, inner, gap_s)
        return
    k = len(contenders)
    for rep in range(reps):
        start = rep % k                     # rotate the starting contender every rep
        for c in contenders[start:] + contenders[:start]:
            _sample(c, inner, gap_s)


# -- report ----------------------------------------------------------------------------
def summarize(contenders: list[Contender], n: int) -> tuple[list[dict], dict]:
    by_name = {c.name: c for c in contenders}

    def best_bw(name):  # STREAM's "best rate": the anchor's min time
        c = by_name.get(name)
        return TRIAD_BYTES_PER_ELEM * n / min(c.times) if c else None

    triad_name = TRIAD_TORCH if TRIAD_TORCH in by_name else TRIAD_NUMPY
    triad_bw, axpy_bw = best_bw(triad_name), best_bw(AXPY_TORCH)
    limit_s = ADAM_BYTES_PER_PARAM * n / triad_bw if triad_bw else None
    axpy_limit_s = ADAM_BYTES_PER_PARAM * n / axpy_bw if axpy_bw else None
    fused = by_name.get(FUSED)
    fused_med = statistics.median(fused.times) if fused else None
    ref_w = fused.weights() if fused else None
    rows = []
    for c in contenders:
        med, adam = statistics.median(c.times), c.kind == "adam"
        row = {"contender": c.name, "kind": c.kind, "median_ms": med * 1e3,
               "min_ms": min(c.times) * 1e3, "gbps": c.bytes_per_elem * n / med / 1e9,
               "bytes_per_elem": c.bytes_per_elem,
               "x_torch_fused": med / fused_med if adam and fused_med else None,
               "x_limit": med / limit_s if adam and limit_s else None,
               "x_axpy_limit": med / axpy_limit_s if adam and axpy_limit_s else None,
               "max_abs_diff_vs_fused": None, "note": c.note,
               "times_ms": [t * 1e3 for t in c.times]}
        if c.weights is not None and ref_w is not None:
            row["max_abs_diff_vs_fused"] = float(np.max(np.abs(c.weights() - ref_w)))
        rows.append(row)
    limits = {"triad": triad_name if triad_bw else None,
              "triad_gbps": triad_bw / 1e9 if triad_bw else None,
              "limit_ms": limit_s * 1e3 if limit_s else None,
              "axpy_gbps": axpy_bw / 1e9 if axpy_bw else None,
              "axpy_limit_ms": axpy_limit_s * 1e3 if axpy_limit_s else None}
    return rows, limits


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: list[dict], limits: dict) -> None:
    head = (f"{'contender':<28} {'median ms':>10} {'min ms':>9} {'GB/s':>7} "
            f"{'x fused':>8} {'x limit':>8} {'x axpy':>7} {'max|w-w_fused|':>15}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['contender']:<28} {r['median_ms']:>10.3f} {r['min_ms']:>9.3f} "
              f"{r['gbps']:>7.1f} {fmt(r['x_torch_fused'], '>8.2f')} "
              f"{fmt(r['x_limit'], '>8.2f')} {fmt(r['x_axpy_limit'], '>7.2f')} "
              f"{fmt(r['max_abs_diff_vs_fused'], '>15.2e')}")
    print("(GB/s and the x columns use the median; GB/s counts 28 B/param for Adam, "
          "12 B/elem for the anchors)")
    if limits["limit_ms"] is not None:
        print(f"bandwidth-limit time = {ADAM_BYTES_PER_PARAM} B x n / {limits['triad']} "
              f"best bandwidth ({limits['triad_gbps']:.1f} GB/s) = {limits['limit_ms']:.3f} ms"
              f" ('x limit')")
    if limits["axpy_limit_ms"] is not None:
        print(f"same from the in-place axpy's best bandwidth ({limits['axpy_gbps']:.1f} GB/s)"
              f" = {limits['axpy_limit_ms']:.3f} ms ('x axpy')")


def quiet_pools() -> None:
    """Idle thread pools sleep at once instead of spinning into the next contender's step:
    OMP_WAIT_POLICY=passive and TVM_THREAD_POOL_SPIN_COUNT=0, unless already set. Call it
    before torch and TVM start (libgomp reads it when torch loads, TVM when its pool starts)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")


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
    ap.add_argument("--quiet-pools", action="store_true",
                    help="set OMP_WAIT_POLICY=passive and TVM_THREAD_POOL_SPIN_COUNT=0 (unless "
                         "set) before torch and TVM start, so idle pool threads sleep at once "
                         "instead of spinning into the next contender's step")
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="diagnostic: sleep this long (untimed) before each sample")
    ap.add_argument("--order", choices=["interleave", "blocked"], default="interleave",
                    help="diagnostic: 'blocked' runs each contender's reps back to back")
    args = ap.parse_args(argv)
    if not 1 <= args.tensors <= args.n:
        ap.error("--tensors must be between 1 and --n")
    if args.quiet_pools:
        quiet_pools()

    import torch
    torch.set_num_threads(os.cpu_count())

    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(args.n).astype(args.dtype)
    g0 = rng.standard_normal(args.n)
    g0 = (g0 + np.copysign(0.1, g0)).astype(args.dtype)   # |g| >= 0.1: see the docstring
    ws = [np.ascontiguousarray(x) for x in np.array_split(w0, args.tensors)]
    gs = [np.ascontiguousarray(x) for x in np.array_split(g0, args.tensors)]

    makers = {
        "optgen adam": lambda: make_optgen(ws, gs),
        "optgen adam bf16 states": lambda: make_optgen(ws, gs, "bf16"),
        "optgen adam q8 states": lambda: make_optgen(ws, gs, "q8"),
        "optgen adam q4 states": lambda: make_optgen(ws, gs, "q4"),
        "bitsandbytes Adam8bit": lambda: make_8bit(torch, ws, gs, "bitsandbytes Adam8bit"),
        "torchao AdamW8bit": lambda: make_8bit(torch, ws, gs, "torchao AdamW8bit"),
        FUSED: lambda: make_torch_adam(torch, ws, gs, FUSED, fused=True),
        "torch foreach": lambda: make_torch_adam(torch, ws, gs, "torch foreach", foreach=True),
        "torch single-tensor": lambda: make_torch_adam(torch, ws, gs, "torch single-tensor",
                                                       foreach=False),
        "numpy (out-of-place exprs)": lambda: make_numpy_expr(ws, gs),
        "numpy (in-place, out=)": lambda: make_numpy_inplace(ws, gs),
        TRIAD_NUMPY: lambda: make_numpy_triad(args.n),
        TRIAD_TORCH: lambda: make_torch_triad(torch, args.n),
        AXPY_TORCH: lambda: make_torch_axpy(torch, args.n),
    }
    skip = [s.strip() for s in args.skip.split(",") if s.strip()]
    contenders = [c for name, mk in makers.items()
                  if not any(name.startswith(s) for s in skip) for c in [mk()] if c is not None]
    del w0, g0

    load0 = os.getloadavg()[0]
    run(contenders, args.reps, args.warmup, args.inner, args.order, args.gap_ms / 1e3)
    load1 = os.getloadavg()[0]
    info = machine_info(torch)
    info["loadavg_1min_before_after"] = [load0, load1]
    env = " ".join(f"{k}={v}" for k, v in info["env"].items() if v is not None) or "-"
    print(f"machine: os.cpu_count()={info['cpu_count']} ({info['affinity']} in affinity), "
          f"{info['cpu_model']}; python {info['python']}, numpy {info['numpy']}, "
          f"torch {info['torch']}; 1-min loadavg {load0:.2f} before, {load1:.2f} after")
    print(f"threads: torch.set_num_threads(os.cpu_count()) -> torch.get_num_threads()="
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

#!/usr/bin/env python
"""Side-by-side benchmark of optgen's CPU matmul kernels against numpy's BLAS (OpenBLAS).

    python bench/matmul_bench.py                    # every case, 15 repetitions (~4 min)
    python bench/matmul_bench.py --only 1024 --reps 20
    python bench/matmul_bench.py --json out.json

The cases are the products the matrix optimizers compute:

* a small digits MLP with weights [out, in] = 128x64, 64x128 and 10x64 (R x C): THOR's
  ``G_inv @ g`` (RxR @ RxC) and ``g @ A_inv`` (RxC @ CxC); Muon's Newton-Schulz step
  ``A = X @ X.T`` (RxC @ CxR), ``B = b*A + c*A@A`` (RxR @ RxR, the addend is the operand)
  and ``X' = a*X + B@X`` (RxR @ RxC, the addend is the right operand);
* squares 256, 512, 1024 (float32 and float64), and Muon's three products on a
  transformer MLP weight of 768x3072.

numpy computes the same expression: ``np.matmul(..., out=o)``, plus the epilogue with
numpy ops where there is one (the epilogue is O(R*C) against the product's O(R*C*K)).
GFLOP/s counts 2*M*N*K. "ratio" is optgen's median over numpy's: below 1 optgen is faster.

Timing: each repetition times a batch of calls of each contender (about 20 ms, so the
timer's resolution does not matter for the small products), alternating which contender
goes first; the table shows per-call medians over the repetitions, and the ratio of the
fastest batches as "min ratio". Both thread pools spin for a while after a call (TVM's
about 170 ms, OpenBLAS's about 0.1 s), and on 2 cores a spinning pool takes a core from
the other library; so each batch starts after a pause (``--gap``) in which the other
pool goes to sleep, and after one untimed call that wakes its own pool. These VMs are
shared and noisy (+-30 %, more under load; the load average is printed): compare only
numbers from one run, and read the min ratio next to the median one.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

# the TVM thread pool reads this once, at its first use: one thread per core we may run on
os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from optgen.compiler import tvm_backend  # noqa: E402
from optgen.compiler.matmul import MatmulPass, schedule_matmul  # noqa: E402
from optgen.benchmark import Contender, cpu_model, interleave, wall_clock  # noqa: E402

MUON_A, MUON_B, MUON_C = 3.4445, -4.7750, 2.0315    # Muon's Newton-Schulz coefficients
BATCH_SECONDS = 0.02     # a batch of calls lasts about this long
GAP_SECONDS = 0.3        # pause before each batch: longer than either pool spins after a call


@dataclass
class Kernel:
    """One generated PrimFunc and its numpy counterpart."""
    name: str
    matmul: MatmulPass
    shapes: Callable[[int, int], dict[str, tuple[int, int]]]   # (R, C) -> buffer shapes
    numpy: Callable[..., None]                                # numpy(out, *inputs, s)
    scalars: tuple[float, ...] = (1.0,)


def _np_gram(o, x, s):
    np.matmul(x, x.T, out=o)


def _np_plain(o, x, y, s):
    np.matmul(x, y, out=o)


def _np_muon_b(o, a, s):
    np.matmul(a, a, out=o)
    o *= s[0]
    o += s[1] * a


def _np_muon_x(o, b, x, s):
    np.matmul(b, x, out=o)
    o += s[0] * x


def kernels(dtype: str) -> list[Kernel]:
    tag = {"float32": "f32", "float64": "f64"}[dtype]
    return [
        Kernel(f"G@g {tag}", MatmulPass(f"thor_g_{tag}", dtype, [("g_inv", "RR"), ("g", "RC"), ("o", "RC")],
                                        "g_inv", "g", "o"),
               lambda r, c: {"g_inv": (r, r), "g": (r, c), "o": (r, c)}, _np_plain),
        Kernel(f"g@A {tag}", MatmulPass(f"thor_a_{tag}", dtype, [("g", "RC"), ("a_inv", "CC"), ("o", "RC")],
                                        "g", "a_inv", "o"),
               lambda r, c: {"g": (r, c), "a_inv": (c, c), "o": (r, c)}, _np_plain),
        Kernel(f"X@X.T {tag}", MatmulPass(f"muon_gram_{tag}", dtype, [("x", "RC"), ("o", "RR")],
                                          "x", "x", "o", trans_b=True),
               lambda r, c: {"x": (r, c), "o": (r, r)}, _np_gram),
        Kernel(f"cA@A+bA {tag}", MatmulPass(f"muon_b_{tag}", dtype, [("a", "RR"), ("o", "RR")],
                                            "a", "a", "o", n_scalars=2, alpha=0, beta=1, addend="a"),
               lambda r, c: {"a": (r, r), "o": (r, r)}, _np_muon_b, (MUON_C, MUON_B)),
        Kernel(f"aX+B@X {tag}", MatmulPass(f"muon_x_{tag}", dtype, [("b", "RR"), ("x", "RC"), ("o", "RC")],
                                           "b", "x", "o", beta=0, addend="x"),
               lambda r, c: {"b": (r, r), "x": (r, c), "o": (r, c)}, _np_muon_x, (MUON_A,)),
    ]


@dataclass
class Case:
    name: str
    kernel: Kernel
    r: int
    c: int
    flops: int = 0
    times: dict[str, list[float]] = field(default_factory=lambda: {"optgen": [], "numpy": []})
    err: float = 0.0


def cases() -> list[Case]:
    k32 = {k.matmul.symbol.rsplit("_", 1)[0]: k for k in kernels("float32")}
    k64 = {k.matmul.symbol.rsplit("_", 1)[0]: k for k in kernels("float64")}
    out = []
    for r, c in ((128, 64), (64, 128), (10, 64)):
        for k in k32.values():
            out.append(Case(f"mlp {r}x{c} {k.name}", k, r, c))
    for n in (256, 512, 1024):
        out += [Case(f"square {n} {k.name}", k, n, n) for k in (k32["thor_g"], k64["thor_g"])]
    for name in ("muon_gram", "muon_b", "muon_x"):
        out.append(Case(f"ffn 768x3072 {k32[name].name}", k32[name], 768, 3072))
    return out


def flops(case: Case) -> int:
    """2*M*N*K of the product (the epilogue is not counted)."""
    sh = case.kernel.shapes(case.r, case.c)
    p = case.kernel.matmul
    m, k = sh[p.a][::-1] if p.trans_a else sh[p.a]
    n = (sh[p.b][::-1] if p.trans_b else sh[p.b])[1]
    return 2 * m * n * k


def build(ks: list[Kernel], folder: str) -> dict[str, Callable]:
    """One library with every kernel, loaded the way optgen loads its artifacts."""
    funcs = {k.matmul.symbol: tvm_backend.parse_tvmscript(schedule_matmul(k.matmul), k.matmul.symbol)
             for k in ks}
    path = os.path.join(folder, "matmul.so")
    tvm_backend.build_library(funcs, tvm_backend.target_for("llvm"), path)
    from optgen.runtime import artifact
    artifact._load_tvm_runtime()
    import tvm_ffi
    module = tvm_ffi.load_module(path)
    return {sym: module[sym] for sym in funcs}


def run_case(case: Case, fn: Callable, reps: int, gap: float, rng: np.random.Generator) -> None:
    k, p = case.kernel, case.kernel.matmul
    dtype = np.dtype(p.dtype)
    shapes = k.shapes(case.r, case.c)
    arrays = {b: (rng.standard_normal(shapes[b]) / np.sqrt(max(shapes[b]))).astype(dtype)
              for b, _ in p.buffers if b != p.out}
    s = np.array(k.scalars, dtype)
    o_tvm, o_np = np.empty(shapes[p.out], dtype), np.empty(shapes[p.out], dtype)
    args = [arrays[b] if b != p.out else o_tvm for b, _ in p.buffers] + [s]
    inputs = [arrays[b] for b, _ in p.buffers if b != p.out]
    contenders = [Contender("optgen", lambda: fn(*args)),
                  Contender("numpy", lambda: k.numpy(o_np, *inputs, s))]
    sample = wall_clock()
    for c in contenders:                     # warm up, then calls per ~20 ms batch
        c.step()
        c.inner = max(1, int(BATCH_SECONDS / max(min(sample(c.step, 1) for _ in range(3)),
                                                 1e-7)))
    # each batch after a pause and one untimed call that wakes the own pool
    interleave(contenders, reps, warmup=0, gap_s=gap, wake=True)
    for c in contenders:
        case.times[c.name] = c.times
    case.flops = flops(case)
    case.err = float(np.abs(o_tvm - o_np).max() / max(np.abs(o_np).max(), 1e-30))


def blas_threads() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown (threadpoolctl is not installed)"
    info = [f"{i['internal_api']} {i.get('version')} ({i.get('architecture')}): {i['num_threads']} threads"
            for i in threadpool_info() if i.get("user_api") == "blas"]
    return "; ".join(info) or "no BLAS found by threadpoolctl"


def machine_info() -> dict:
    import tvm_ffi
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
            "affinity": len(os.sched_getaffinity(0)), "host_cpu": tvm_backend.host_cpu(),
            "optgen_threads": int(tvm_ffi.get_global_func("runtime.NumThreads")()),
            "numpy_blas": blas_threads(), "numpy": np.__version__,
            "apache-tvm": tvm_backend.tvm_version(), "platform": platform.platform(),
            "env": {k: os.environ.get(k) for k in ("TVM_NUM_THREADS", "OMP_NUM_THREADS",
                                                   "OPENBLAS_NUM_THREADS",
                                                   "TVM_THREAD_POOL_SPIN_COUNT")}}


def table(cs: list[Case]) -> str:
    """Medians; "min ratio" is the ratio of the fastest batches (less exposed to other load)."""
    rows = [f"{'case':<30} {'optgen ms':>10} {'numpy ms':>10} {'optgen GF/s':>12} "
            f"{'numpy GF/s':>11} {'ratio':>6} {'min ratio':>10} {'max rel err':>12}"]
    for c in cs:
        t_o, t_n = statistics.median(c.times["optgen"]), statistics.median(c.times["numpy"])
        rows.append(f"{c.name:<30} {t_o * 1e3:>10.4f} {t_n * 1e3:>10.4f} {c.flops / t_o / 1e9:>12.1f} "
                    f"{c.flops / t_n / 1e9:>11.1f} {t_o / t_n:>6.2f} "
                    f"{min(c.times['optgen']) / min(c.times['numpy']):>10.2f} {c.err:>12.1e}")
    return "\n".join(rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=15, help="repetitions (medians; at least 10)")
    ap.add_argument("--gap", type=float, default=GAP_SECONDS,
                    help="seconds to pause before each batch, so the other pool stops spinning")
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    ap.add_argument("--json", default=None, help="results file (default bench/results/matmul-<date>.json)")
    args = ap.parse_args(argv)
    if args.reps < 10:
        ap.error("--reps must be at least 10")
    load_start = os.getloadavg()           # before the build, which loads the machine itself
    selected = [c for c in cases() if args.only in c.name]
    if not selected:
        ap.error(f"no case matches {args.only!r}")
    ks = list({c.kernel.matmul.symbol: c.kernel for c in selected}.values())
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="optgen-matmul-") as folder:
        fns = build(ks, folder)
        build_s = time.perf_counter() - t0
        info = machine_info()
        print(f"# {info['cpu_model']}, {info['affinity']} cores ({info['host_cpu']}); optgen (TVM) "
              f"{info['optgen_threads']} threads; numpy {info['numpy']} BLAS: {info['numpy_blas']}")
        print(f"# {len(ks)} kernels built in {build_s:.1f} s; {args.reps} repetitions of ~20 ms batches, "
              f"{args.gap} s apart; per-call times")
        rng = np.random.default_rng(0)
        for c in selected:
            run_case(c, fns[c.kernel.matmul.symbol], args.reps, args.gap, rng)
    print(table(selected))
    print("# load average (1, 5, 15 min) at the start %.2f %.2f %.2f, at the end %.2f %.2f %.2f"
          % (*load_start, *os.getloadavg()))
    path = args.json or os.path.join(HERE, "results", f"matmul-{datetime.date.today()}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"machine": info, "loadavg_at_start": load_start, "loadavg_at_end": os.getloadavg(),
                   "reps": args.reps,
                   "gap_s": args.gap, "build_s": round(build_s, 2),
                   "command": " ".join([os.path.basename(sys.argv[0])] + (argv or sys.argv[1:])),
                   "cases": [{"name": c.name, "dtype": c.kernel.matmul.dtype, "r": c.r, "c": c.c,
                              "flops": c.flops, "max_rel_err": c.err,
                              "optgen_s": c.times["optgen"], "numpy_s": c.times["numpy"],
                              "optgen_median_s": statistics.median(c.times["optgen"]),
                              "numpy_median_s": statistics.median(c.times["numpy"])}
                             for c in selected]}, f, indent=1)
    print(f"# wrote {os.path.relpath(path)}")


if __name__ == "__main__":
    main()

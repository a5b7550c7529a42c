#!/usr/bin/env python
"""The optgen benchmark suite: every workload of the performance issue, side by side.

    python bench/suite.py                          # everything, about 10-15 min on 2 cores
    python bench/suite.py --quick                  # small sizes, few reps: a smoke run
    python bench/suite.py --workloads adam-10m,lamb-10m --reps 20
    python bench/suite.py --spin-pools             # leave the thread pools' spinning on

Each workload builds its contenders (each with its own copy of the same parameters,
gradients and states), warms every one up, then interleaves the repetitions: rep r
times every contender once, starting at contender r mod k. Tables show medians. After
timing, every optimizer contender's weights are compared with the workload's reference
(all took the same steps): a contender that computes something else is flagged.

Bandwidth: Adam fp32 moves 28 B per parameter (read w, g, m, v; write w, m, v). LAMB is
counted at the same minimal 28 B; its "two-pass" count is 44 B (one reduction pass
reading w, g, m, v for both norms, then the 28-B update). The limit is the best
STREAM-counted bandwidth (copy 8 B, triad 12 B per element, at their fastest rep) of
optgen's TVM anchors and torch's, over every anchor this run timed.

This is a script, not a test: it asserts no timings. It prints each goal of the issue
with the measured value and MET or MISSED. See bench/README.md.

The parts: workloads.py (the workloads, their contenders and goals, as data),
measure.py (runs one; the timing loop is optgen.benchmark's, the new-process programs
are children.py's), report.py (limit, columns, goals, tables, plot); contenders.py,
lamb_rows.py, bandwidth.py and params.py make the rows.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from optgen.benchmark import cpu_model, quiet_pools, thread_env  # noqa: E402
import measure  # noqa: E402
import report  # noqa: E402
from workloads import BY_NAME, QUICK, WORKLOADS, Sizes  # noqa: E402

NAMES = tuple(w.name for w in WORKLOADS)


# -- machine and main ----------------------------------------------------------------------
def _version(dist: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_info(torch) -> dict:
    import optgen
    with open("/proc/meminfo", encoding="ascii") as f:
        mem = next(int(line.split()[1]) for line in f if line.startswith("MemTotal"))
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
            "affinity": len(os.sched_getaffinity(0)), "mem_gib": round(mem / 2**20, 1),
            "platform": platform.platform(), "torch_threads": torch.get_num_threads(),
            "optgen_threads": optgen.get_num_threads(),
            "env": thread_env(),
            "versions": {d: _version(d) for d in ("optgen", "apache-tvm", "apache-tvm-ffi",
                                                  "numpy", "torch", "jax", "jaxlib", "optax")}
                        | {"python": platform.python_version()}}


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(NAMES),
                    help=f"comma list of: {', '.join(NAMES)} (default: all)")
    ap.add_argument("--reps", type=int, help="interleaved reps per workload (default 10; "
                    "--quick 3); build: --build-reps")
    ap.add_argument("--build-reps", type=int, help="new processes per build row (default 10)")
    ap.add_argument("--compile-reps", type=int,
                    help="cold torch.compile runs (default 3: each takes 15-45 s here)")
    ap.add_argument("--quick", action="store_true", help="small sizes, few reps: a smoke run")
    pools = ap.add_mutually_exclusive_group()
    pools.add_argument("--quiet-pools", action="store_true",
                       help="OMP_WAIT_POLICY=passive, TVM_THREAD_POOL_SPIN_COUNT=0 (the default)")
    pools.add_argument("--spin-pools", action="store_true",
                       help="leave both thread pools spinning after each call")
    ap.add_argument("--other-pools", default="adam-10m,small-100x1k",
                    help="workloads to rerun in a child process with the other pool setting "
                         "(default adam-10m,small-100x1k; '' for none)")
    today = datetime.date.today().isoformat()
    ap.add_argument("--json", default=os.path.join(HERE, "results", f"suite-{today}.json"),
                    help="where to write every sample (default bench/results/suite-<date>.json)")
    ap.add_argument("--plot", default=os.path.join(HERE, "results", f"suite-{today}.png"),
                    help="where to write the plot (default bench/results/suite-<date>.png)")
    ap.add_argument("--raw-json", help=argparse.SUPPRESS)       # child: raw workloads only
    args = ap.parse_args(argv)
    args.names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    bad = [w for w in args.names if w not in BY_NAME]
    if bad:
        ap.error(f"unknown workload(s) {', '.join(bad)}; known: {', '.join(NAMES)}")
    sz = dataclasses.replace(QUICK) if args.quick else Sizes()
    for k in ("reps", "build_reps", "compile_reps"):
        if getattr(args, k) is not None:
            if getattr(args, k) < 1:
                ap.error(f"--{k.replace('_', '-')} must be >= 1")
            setattr(sz, k, getattr(args, k))
    return args, sz


def run_other_pools(args, sz: Sizes, quiet: bool, set_here: list[str]) -> list[dict]:
    """The listed workloads again in a new process with the other pool setting."""
    names = [w.strip() for w in args.other_pools.split(",") if w.strip() in args.names]
    if not names:
        return []
    env = {k: v for k, v in os.environ.items() if k not in set_here}
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "raw.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--workloads", ",".join(names),
               "--reps", str(sz.reps), "--raw-json", raw,
               "--spin-pools" if quiet else "--quiet-pools"] + (["--quick"] if args.quick else [])
        print(f"[other pools] {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        subprocess.run(cmd, env=env, check=True)
        with open(raw, encoding="utf-8") as f:
            child = json.load(f)
    label = "spin" if quiet else "quiet"
    for wl in child["workloads"]:
        wl["name"] += f" [{label}]"
        wl["title"] += f", {label} pools"
    return child["workloads"]


def main(argv=None) -> int:
    args, sz = parse(argv)
    quiet = not args.spin_pools
    # read when libgomp loads (import torch) and when TVM's pool starts
    set_here = quiet_pools() if quiet else []
    import torch
    torch.set_num_threads(os.cpu_count())
    t_start, workloads = time.perf_counter(), []
    for name in args.names:
        print(f"[{time.perf_counter() - t_start:6.0f} s] {name} ...", file=sys.stderr, flush=True)
        workloads.append(measure.run(BY_NAME[name], torch, sz))
    if args.raw_json:
        with open(args.raw_json, "w", encoding="utf-8") as f:
            json.dump({"workloads": workloads}, f)
        return 0
    if args.other_pools:
        workloads += run_other_pools(args, sz, quiet, set_here)
    info = machine_info(torch)
    info["pools"] = "quiet" if quiet else "spin"
    info["wall_s"] = time.perf_counter() - t_start
    lim = report.limits(workloads)
    report.summarize(workloads, lim)
    by = {wl["name"]: wl for wl in workloads}
    gs = report.goals(by, lim)
    other = "spin" if quiet else "quiet"
    gs_other = [g for g in report.goals(by, lim, f" [{other}]") if g["status"] != "not run"]
    env = " ".join(f"{k}={v}" for k, v in info["env"].items() if v is not None) or "-"
    print(f"\n{info['date']}; {info['cpu_model']}, {info['cpu_count']} cores, "
          f"{info['mem_gib']} GiB; torch {info['versions']['torch']} "
          f"({info['torch_threads']} threads), optgen {info['optgen_threads']} threads; "
          f"{env}; pools {info['pools']}{' (QUICK: small sizes)' if args.quick else ''}\n")
    report.print_table(workloads, lim)
    report.print_memory(workloads)
    report.print_goals(gs + gs_other, args.quick)
    bad = report.mismatches(workloads)
    if bad:
        print(f"\nWARNING: weights differ from the reference by more than {report.DIFF_TOL:g} "
              f"({report.STATE_TOL:g} for low-bit states): "
              + "; ".join(bad))
    for path in (args.json, args.plot):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump({"args": vars(args),
                   "sizes": vars(sz), "machine": info, "limits": lim, "goals": gs + gs_other,
                   "workloads": workloads}, f, indent=1)
    report.plot(workloads, lim, args.plot,
                f"optgen suite {info['date'][:10]}, {info['cpu_model']} "
                f"({info['cpu_count']} cores), pools {info['pools']}"
                f"{', QUICK' if args.quick else ''}")
    print(f"\nwrote {args.json} and {args.plot} ({os.path.getsize(args.plot) // 1024} KB) "
          f"in {time.perf_counter() - t_start:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

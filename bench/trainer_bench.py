#!/usr/bin/env python
"""The optimizer step as a CPU trainer runs it: right after torch's forward/backward.

    python bench/trainer_bench.py                      # mlp, 10m, gpt2; 30 reps; + quiet child
    python bench/trainer_bench.py --workloads mlp --reps 50
    python bench/trainer_bench.py --quick              # small sizes, few reps: a smoke run

Each contender runs in a process of its own (``--rounds`` times, the order rotated),
as in a trainer with one optimizer; ``--shared-process`` interleaves them all in one
process instead (then a row's pool also runs while the other rows work: TVM's pool
workers spin, yielding, for 0.1-0.2 s after each use). In that process each rep runs,
for every contender in turn (starting at contender r mod k), a torch
forward/backward of a matmul-heavy MLP (batch 64, untimed), then that contender's
``opt.step()`` (timed): the step starts while torch's OpenMP threads still spin after
backward, as in a trainer (issue 36). Workloads:

- ``mlp``: the MLP's own 12.6M parameters (3 x Linear(2048, 2048)), AdamW;
- ``10m``: one 10M-parameter tensor, AdamW, after the MLP's forward/backward;
- ``gpt2``: GPT-2 small's 148 tensors (124M), AdamW, after the MLP's forward/backward.

Rows: ``torch fused`` (torch.optim.AdamW(fused=True)), ``optgen default``
(optgen.torch.AdamW, cpu pool "auto": torch's OpenMP runtime, or TVM's pool while the
machine is busy), ``optgen openmp pool`` (always OpenMP) and ``optgen tvm
pool`` (TVM's own thread pool: the behaviour before issue 36), set per row with
optgen.set_cpu_pool. Unless ``--no-quiet-child``, the same runs again in new processes
with quiet pools (OMP_WAIT_POLICY=passive, TVM_THREAD_POOL_SPIN_COUNT=0), rows tagged
[quiet]. The
parent process runs with none of THREAD_ENV set (what a user gets by default).

Each row is put on its pool before its forward/backward, so only what a trainer runs
lies between backward and the timed step, and reports which pool its timed steps
really ran on ("openmp 30/30"; "auto" moves to TVM's pool while the machine is busy).
Prints medians and ratios to torch fused; ``--json`` writes every sample. Every
contender's parameters (16 values of each tensor, so across processes too) are
compared with torch fused's after the run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from optgen.benchmark import QUIET_ENV, THREAD_ENV, rotations, thread_env  # noqa: E402

FUSED, DEFAULT = "torch fused", "optgen default"
OMP, TVM = "optgen openmp pool", "optgen tvm pool"
ROWS = (FUSED, DEFAULT, OMP, TVM)
POOLS = {DEFAULT: "auto", OMP: "openmp", TVM: "tvm"}
WORKLOADS = ("mlp", "10m", "gpt2")
GOAL = 1.0   # optgen default / torch fused, in the trainer-like loop


def gpt2_shapes(layers: int = 12, vocab: int = 50257, d: int = 768, ctx: int = 1024):
    """GPT-2 small's parameter shapes (HF order; 148 tensors, 124.4M at 12 layers)."""
    out = [(vocab, d), (ctx, d)]
    for _ in range(layers):
        out += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,),
                (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    return out + [(d,), (d,)]


def mlp(torch, width: int):
    nn = torch.nn
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width),
                         nn.ReLU(), nn.Linear(width, width))


class Row:
    """One contender: its own model (for the torch work), its parameters and optimizer."""

    def __init__(self, torch, name: str, work, params: list, grads: list | None) -> None:
        import optgen.torch as otorch
        self.name, self.work, self.params, self.grads = name, work, params, grads
        self.x = torch.randn(64, work[0].in_features, generator=torch.Generator().manual_seed(1))
        if name == FUSED:
            self.opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
        else:
            self.opt = otorch.AdamW(params, lr=1e-3)
        self.pool = POOLS.get(name, "auto")
        self.times: list[float] = []
        self.on_openmp = 0                    # timed steps whose loops ran on OpenMP

    def step(self) -> float:
        import optgen
        from optgen.runtime.backends import omp_pool
        # The pool is chosen before the forward: nothing but what a trainer runs may sit
        # between backward and the step, or torch's OpenMP threads stop spinning first
        # (the collision the OpenMP pool avoids is then not there to avoid).
        optgen.set_cpu_pool(self.pool)
        loss = self.work(self.x).square().mean()
        self.work.zero_grad(set_to_none=False)
        loss.backward()
        if self.grads is not None:            # the stepped tensors are not the MLP's
            for p, g in zip(self.params, self.grads):
                p.grad = g
        launches = omp_pool.omp_launches()
        t0 = time.perf_counter()
        self.opt.step()
        dt = time.perf_counter() - t0
        self.on_openmp += omp_pool.omp_launches() > launches
        return dt


def make_rows(torch, workload: str, quick: bool, names=ROWS) -> list[Row]:
    width = 512 if quick else 2048
    torch.manual_seed(0)                      # the same model in every process
    base = mlp(torch, width)
    rows = []
    for name in names:
        torch.manual_seed(0)
        work = mlp(torch, width)
        work.load_state_dict(base.state_dict())
        if workload == "mlp":
            rows.append(Row(torch, name, work, list(work.parameters()), None))
            continue
        shapes = ([(1_000_000 if quick else 10_000_000,)] if workload == "10m" else
                  gpt2_shapes(*((2, 5000) if quick else ())))
        gen = torch.Generator().manual_seed(2)
        params = [torch.randn(s, generator=gen).mul_(0.02).requires_grad_() for s in shapes]
        grads = [torch.randn(s, generator=gen).mul_(1e-3) for s in shapes]
        rows.append(Row(torch, name, work, params, grads))
    return rows


def run(workload: str, reps: int, warmup: int, quick: bool, names=ROWS) -> dict:
    import torch
    rows = make_rows(torch, workload, quick, names)
    for r in rows:
        for _ in range(warmup):
            r.step()
    load0 = os.getloadavg()[0]
    for r in rows:
        r.on_openmp = 0
    for idx in rotations(len(rows), reps):
        for i in idx:
            rows[i].times.append(rows[i].step())
    out = []
    for r in rows:
        # a few values of every tensor: rows run in other processes compare through it
        print_ = [float(v) for p in r.params for v in p.detach().reshape(-1)[:16]]
        out.append({"contender": r.name, "times_s": r.times, "fingerprint": print_,
                    "on_openmp": r.on_openmp if r.name != FUSED else None})
    n = sum(p.numel() for p in rows[0].params)
    return finish({"name": workload, "params": n, "tensors": len(rows[0].params),
                   "reps": reps, "loadavg_1min": [load0, os.getloadavg()[0]], "rows": out})


def finish(wl: dict) -> dict:
    """Each row's largest difference from torch fused (on the fingerprints) and the pool
    its timed steps really ran on ("openmp 30/30"; "-" for torch)."""
    ref = next((r["fingerprint"] for r in wl["rows"]
                if r["contender"].replace(" [quiet]", "") == FUSED), None)
    for r in wl["rows"]:
        if ref is not None and len(ref) == len(r["fingerprint"]):
            r["max_abs_diff"] = max(abs(a - b) for a, b in zip(r["fingerprint"], ref))
        else:
            r["max_abs_diff"] = float("nan")
        k, n = r["on_openmp"], len(r["times_s"])
        r["ran_on"] = "-" if k is None else ", ".join(
            f"{pool} {c}/{n}" for pool, c in (("openmp", k), ("tvm", n - k)) if c)
    return wl


def isolated(args, env: dict) -> dict:
    """Every contender in a process of its own, as in a trainer with one optimizer:
    TVM's pool workers spin (yielding) for about 0.1-0.2 s after each use, so a "tvm
    pool" row slows whatever runs after it in the same process. ``--rounds`` rounds,
    the contenders' order rotated each round; the samples of all rounds are merged."""
    per = max(1, -(-args.reps // args.rounds))
    merged: dict = {}
    for rnd in range(args.rounds):
        order = args.contenders[rnd % len(args.contenders):] + \
            args.contenders[:rnd % len(args.contenders)]
        for name in order:
            cmd = [sys.executable, os.path.abspath(__file__), "--no-quiet-child",
                   "--shared-process", "--json-stdout", "--contenders", name,
                   "--workloads", ",".join(args.names), "--reps", str(per),
                   "--warmup", str(args.warmup)] + (["--quick"] if args.quick else [])
            print(f"[{'quiet' if env else 'default'} round {rnd + 1}] {name} ...",
                  file=sys.stderr, flush=True)
            p = subprocess.run(cmd, env=dict(os.environ, **env), stdout=subprocess.PIPE,
                               text=True, check=True)
            got = json.loads(p.stdout.strip().splitlines()[-1])
            if not merged:
                merged = dict(got, workloads=[dict(w, rows=[]) for w in got["workloads"]])
            for mine, wl in zip(merged["workloads"], got["workloads"]):
                mine["loadavg_1min"] = [min(mine["loadavg_1min"][0], wl["loadavg_1min"][0]),
                                        max(mine["loadavg_1min"][1], wl["loadavg_1min"][1])]
                rows = {r["contender"]: r for r in mine["rows"]}
                for r in wl["rows"]:
                    if r["contender"] in rows:
                        mine_r = rows[r["contender"]]
                        mine_r["times_s"] += r["times_s"]
                        if mine_r["on_openmp"] is not None:
                            mine_r["on_openmp"] += r["on_openmp"]
                    else:
                        mine["rows"].append(r)
    for wl in merged["workloads"]:
        wl["reps"] = per * args.rounds
        wl["rows"].sort(key=lambda r: ROWS.index(r["contender"].replace(" [quiet]", "")))
        finish(wl)
    merged["process"] = "one per contender"
    return merged


def med_ms(row: dict) -> float:
    return 1e3 * statistics.median(row["times_s"])


def ratio(wl: dict, a: str, b: str = FUSED) -> float | None:
    """median(a) / median(b); the rows of a quiet run carry a " [quiet]" tag."""
    rows = {r["contender"].replace(" [quiet]", ""): r for r in wl["rows"]}
    a, b = a.replace(" [quiet]", ""), b.replace(" [quiet]", "")
    return med_ms(rows[a]) / med_ms(rows[b]) if a in rows and b in rows else None


def report(result: dict) -> None:
    print(f"\n{result['date']}; pools {result['pools']}; env "
          f"{' '.join(f'{k}={v}' for k, v in result['env'].items() if v) or '-'}; "
          f"torch {result['torch']} ({result['torch_threads']} threads), "
          f"optgen {result['optgen_threads']} threads; process: {result.get('process')}")
    for wl in result["workloads"]:
        print(f"{wl['name']:<14} {wl['params'] / 1e6:6.1f}M {wl['tensors']:4d} tensors, "
              f"{wl['reps']} reps, load {wl['loadavg_1min'][0]:.1f}->{wl['loadavg_1min'][1]:.1f}")
        for r in wl["rows"]:
            x = ratio(wl, r["contender"])
            print(f"   {r['contender']:<22} {med_ms(r):9.2f} ms  {x:5.2f}x fused  "
                  f"max|w - fused| {r['max_abs_diff']:.1e}  ran on {r.get('ran_on', '?')}")


def measure(names: list[str], reps: int, warmup: int, quick: bool,
            contenders=ROWS) -> dict:
    import torch
    import optgen
    quiet = all(os.environ.get(k) == v for k, v in QUIET_ENV.items())
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "pools": "quiet" if quiet else "default",
              "env": thread_env(), "torch": torch.__version__,
              "torch_threads": torch.get_num_threads(), "workloads": []}
    for name in names:
        print(f"[{result['pools']}] {name} ...", file=sys.stderr, flush=True)
        wl = run(name, reps, warmup, quick, contenders)
        if quiet:
            for r in wl["rows"]:
                r["contender"] += " [quiet]"
        result["workloads"].append(wl)
    optgen.set_cpu_pool("auto")
    result["optgen_threads"] = optgen.get_num_threads()
    result["cpu_pool"] = optgen.cpu_pool()["pool"]
    result["process"] = "shared"
    return result


def quiet_child(args) -> dict:
    """The same workloads in a new process with quiet pools."""
    env = dict(os.environ, **QUIET_ENV)
    cmd = [sys.executable, os.path.abspath(__file__), "--no-quiet-child", "--json-stdout",
           "--shared-process", "--contenders", ",".join(args.contenders),
           "--workloads", ",".join(args.names), "--reps", str(args.reps),
           "--warmup", str(args.warmup)] + (["--quick"] if args.quick else [])
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help=f"comma list of {', '.join(WORKLOADS)} (default: all)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    ap.add_argument("--no-quiet-child", action="store_true",
                    help="skip the rerun with quiet pools in a new process")
    ap.add_argument("--contenders", default=",".join(ROWS),
                    help=f"comma list of {', '.join(ROWS)} (default: all)")
    ap.add_argument("--shared-process", action="store_true",
                    help="all contenders interleaved in one process (each row's pool "
                    "then also runs while the other rows work)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="process per contender: this many rounds of --reps/rounds each")
    ap.add_argument("--json", help="write every sample here")
    ap.add_argument("--json-stdout", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    bad = [w for w in args.names if w not in WORKLOADS]
    bad += [c for c in args.contenders if c not in ROWS]
    if bad or args.reps < 1 or args.warmup < 0 or args.rounds < 1:
        ap.error(f"workloads must be among {', '.join(WORKLOADS)}, contenders among "
                 f"{', '.join(ROWS)} (got {bad}); reps >= 1, warmup >= 0, rounds >= 1")
    if args.json_stdout:
        print(json.dumps(measure(args.names, args.reps, args.warmup, args.quick,
                                 args.contenders)))
        return 0
    set_here = [k for k in THREAD_ENV if os.environ.get(k)]
    if set_here:
        print(f"note: {', '.join(set_here)} set in the environment: the default rows are "
              "not what a user gets by default", file=sys.stderr)
    if args.shared_process:
        results = [measure(args.names, args.reps, args.warmup, args.quick, args.contenders)]
        if not args.no_quiet_child:
            results.append(quiet_child(args))
    else:
        results = [isolated(args, {})]
        if not args.no_quiet_child:
            results.append(isolated(args, QUIET_ENV))
    for res in results:
        report(res)
    goals = goal_lines(results[0])
    for g in goals:
        print(g)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"runs": results}, f, indent=1)
    return 0


def goal_lines(result: dict) -> list[str]:
    out = []
    for wl in result["workloads"]:
        x = ratio(wl, DEFAULT)
        status = "not run" if x is None else ("MET" if x <= GOAL else "MISSED")
        value = "-" if x is None else f"{x:.2f}"
        out.append(f"  trainer {wl['name']}: optgen default / torch fused  "
                   f"{value}  <= {GOAL:g}  {status}")
    return out


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Cold build time: `optgen build` from the command line with an empty cache, beside
torch.compile's first call of torch.optim.AdamW's step and heavyball's compiled AdamW
step, each in a new process. Prints a table (docs/performance.md, "Build time").

    python bench/build_time_bench.py                         # 5 reps, the specs below
    python bench/build_time_bench.py --specs adam lamb --reps 7 --no-torch
    python bench/build_time_bench.py --baseline /tmp/optgen-old   # another checkout's optgen

Rows:
- ``optgen build SPEC``: `python -m optgen.cli build SPEC --target llvm` (the default
  variant: float32, default flags) with XDG_CACHE_HOME an empty folder (and no
  OPTGEN_CACHE_DIR): wall time of the process, and its user and system CPU time
  (less noisy than wall on a shared machine). Python's bytecode cache is on, as after
  a pip install (an untimed build of the first spec writes it). With ``--baseline DIR`` each spec also
  runs in DIR with DIR first on PYTHONPATH (a checkout of another optgen version: its
  optgen/ package; `git archive REV | tar -x -C DIR`), interleaved with this one rep by rep, the order alternating.
- ``torch.compile AdamW``: torch.optim.AdamW (its default foreach step) on a model of
  ``--params`` parameters (10 Linear layers), ``opt.step`` wrapped in a function compiled
  with torch.compile, an empty TORCHINDUCTOR_CACHE_DIR: the first call (compiles), and
  the median of the next steps (steady); and the whole process's wall and CPU time
  (import, compile, steps; Inductor compiles in worker processes, counted here).
- ``heavyball AdamW``: heavyball.AdamW on the same model (heavyball compiles its update
  functions with torch.compile): the first step, and the steady median.

Medians over the reps; timings on a shared VM vary by +-30 %: compare rows of one run.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECS = ["adam", "lamb", "prodigy", "came", "soap", "torch_muon", "shampoo"]


def run_child(argv: list[str], env: dict, cwd: str = ROOT) -> tuple[float, float, float, str]:
    """(wall s, user CPU s, system CPU s, stdout) of one new process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{p.stderr[-2000:]}")
    return wall, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime, p.stdout


def cold_build(spec: str, tree: str | None) -> tuple[float, float, float]:
    """One cold `optgen build spec`, in an empty cache; ``tree``: another optgen's
    checkout first on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPTGEN_CACHE_DIR", "PYTHONDONTWRITEBYTECODE")}
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([tree, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with tempfile.TemporaryDirectory(prefix="build-time-") as cache:
        env["XDG_CACHE_HOME"] = cache
        wall, user, system, out = run_child(   # (in the tree: `-m` puts it first on the path)
            [sys.executable, "-m", "optgen.cli", "build", spec, "--target", "llvm"], env,
            cwd=tree or ROOT)
    if not out.startswith("built:"):
        raise RuntimeError(f"optgen build {spec}: not a cold build:\n{out}")
    return wall, user, system


# -- the torch rows, each in a new process (``--child``) ----------------------------------
def _model(n: int):
    import torch
    torch.manual_seed(0)
    width = int((n // 10) ** 0.5)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(10)])
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    return model


def child(name: str, n: int, steps: int) -> dict:
    """First call and steady step (median of ``steps``) of a compiled optimizer step."""
    import torch
    model = _model(n)
    params = list(model.parameters())
    if name == "torch-compile":
        opt = torch.optim.AdamW(params, lr=1e-3)

        @torch.compile(fullgraph=False)
        def step():
            opt.step()
    else:
        import heavyball
        opt = heavyball.AdamW(params, lr=1e-3)
        step = opt.step
    grads = [p.grad for p in params]

    def with_grads():            # (heavyball consumes .grad: every step gets it back)
        for p, g in zip(params, grads):
            p.grad = g
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        with_grads()
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return {"first_s": first, "steady_s": statistics.median(times),
            "params": sum(p.numel() for p in params), "threads": torch.get_num_threads()}


def torch_row(name: str, n: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        wall, user, system, out = run_child([sys.executable, os.path.abspath(__file__),
                                             "--child", name, "--params", str(n),
                                             "--steps", str(steps)], env)
    return {**json.loads(out.strip().splitlines()[-1]), "process_wall_s": wall,
            "process_user_s": user, "process_sys_s": system}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--specs", nargs="*", default=SPECS)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--baseline", help="another optgen checkout, interleaved with this one")
    ap.add_argument("--no-torch", action="store_true", help="leave out the torch rows")
    ap.add_argument("--params", type=int, default=10_000_000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.params, args.steps)))
        return 0
    trees = {"this": None, **({"baseline": args.baseline} if args.baseline else {})}
    runs: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for tree in trees.values() if args.specs else ():   # (writes the bytecode cache)
        cold_build(args.specs[0], tree)
    for r in range(args.reps):
        for spec in args.specs:
            order = list(trees) if r % 2 == 0 else list(trees)[::-1]
            for tree in order:
                runs.setdefault((spec, tree), []).append(cold_build(spec, trees[tree]))
    if args.specs:
        print(f"cold `optgen build SPEC --target llvm`, empty cache, new process; median of "
              f"{args.reps} (wall, user CPU, system CPU), {os.cpu_count()} CPUs")
        print(f"{'row':<38} {'wall s':>8} {'min s':>7} {'user s':>8} {'sys s':>7}")
    table = {}
    for (spec, tree), rows in runs.items():
        wall, user, system = (statistics.median(x) for x in zip(*rows))
        label = f"optgen build {spec}" + (f" ({tree})" if args.baseline else "")
        table[label] = {"wall_s": wall, "user_s": user, "sys_s": system, "runs": rows}
        print(f"{label:<38} {wall:8.2f} {min(r[0] for r in rows):7.2f} {user:8.2f} {system:7.2f}")
    if not args.no_torch:
        print(f"\ncompiled optimizer steps, {args.params:,} parameters, new process, "
              "empty compile cache: first call (compiles) and steady step")
        print(f"{'row':<38} {'first s':>8} {'steady ms':>10}   process: wall s, user s, sys s")
        for name, label in (("torch-compile", "torch.compile AdamW"),
                            ("heavyball", "heavyball.AdamW (compiled)")):
            d = torch_row(name, args.params, args.steps)
            table[label] = d
            print(f"{label:<38} {d['first_s']:8.2f} {d['steady_s'] * 1e3:10.1f}   "
                  f"{d['process_wall_s']:.2f}, {d['process_user_s']:.2f}, "
                  f"{d['process_sys_s']:.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(table, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The command line: calls in child processes (a dead child is a crash of its call),
replay of one call, and the figures.

Part of the fuzzer (tests/fuzz/__init__.py says what it checks; ``python tests/fuzz/run.py``
runs it)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections import Counter

import numpy as np

from .case import Case
from .checks import BUG_KINDS
from .draw import RngDraw, artifact, spec_list
from .generate import generate
from .runner import run_case

RUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run.py")   # the script


# -- the script ------------------------------------------------------------------------
def case_for(seed: int, index: int, specs) -> Case:
    return generate(RngDraw(np.random.default_rng([seed, index])), specs)


def _worker(seed: int, start: int, stop: int, bases: bool) -> None:
    """Child process: one JSON line per call on stdout (a segfault's Python stack on stderr)."""
    import faulthandler
    faulthandler.enable()
    specs = spec_list(bases)
    for i in range(start, stop):
        try:
            case = case_for(seed, i, specs)
        except Exception as e:   # noqa: BLE001 - a bug of the generator (must not happen)
            print(json.dumps({"i": i, "spec": "?", "kind": "harness", "phase": "generate",
                              "exc": type(e).__name__, "message": str(e)[:300],
                              "detail": traceback.format_exc()[-1500:]}), flush=True)
            continue
        print(json.dumps({"i": i, "spec": case.spec + (f"+{case.base}" if case.base else ""),
                          "started": True}), flush=True)
        out = run_case(case)
        rec = {"i": i, "spec": case.spec + (f"+{case.base}" if case.base else ""), **out.to_json()}
        if not out.bug:
            rec.pop("detail", None)
            rec.pop("message", None) if out.kind != "typed" else None
        print(json.dumps(rec, default=str), flush=True)


def _run_chunk(seed, start, stop, bases, timeout) -> list[dict]:
    """Run calls [start, stop) in children; a dead child is a crash of its current call."""
    records = []
    while start < stop:
        cmd = [sys.executable, RUN, "--worker", str(seed), str(start),
               str(stop)] + (["--bases"] if bases else [])
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        current, done = None, set()
        for line in out.splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("started"):
                current = rec
                continue
            records.append(rec)
            done.add(rec["i"])
        if proc.returncode == 0:
            break
        # the child died (or hung) in the call it had started and not finished
        if current and current["i"] not in done:
            bad = current["i"]
        else:
            bad = max(done) + 1 if done else start
        records.append({"i": bad, "spec": current["spec"] if current else "?", "kind": "crash",
                        "phase": "child", "exc": f"child exit {proc.returncode}",
                        "detail": (err or "")[-1500:],
                        "replay": f"python tests/fuzz/run.py --replay {seed}:{bad}"})
        start = bad + 1
    return records


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Robustness fuzzing of the trainer-side runtime: "
                                 "random optimizer calls against every catalog spec.")
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the figures and every bug record here")
    ap.add_argument("--chunk", type=int, default=500, help="calls per child process")
    ap.add_argument("--jobs", type=int, default=1, help="child processes at a time")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per child")
    ap.add_argument("--bases", action="store_true", help="also LARS(adam) and SVRG(adam)")
    ap.add_argument("--replay", help="SEED:INDEX: run one call in-process and print it")
    ap.add_argument("--worker", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(*args.worker, args.bases)
        return 0
    if args.replay:
        seed, index = (int(x) for x in args.replay.split(":"))
        case = case_for(seed, index, spec_list(args.bases))
        print(case.short())
        out = run_case(case)
        print(json.dumps(out.to_json(), indent=1, default=str))
        return 1 if out.bug else 0

    t0 = time.time()
    for name, base in spec_list(args.bases):   # build (or load) every artifact once, here
        artifact(name, base)
    t_build = time.time() - t0
    t1 = time.time()
    chunks = [(s, min(s + args.chunk, args.calls)) for s in range(0, args.calls, args.chunk)]
    records: list[dict] = []
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for recs in pool.map(lambda c: _run_chunk(args.seed, c[0], c[1], args.bases, args.timeout),
                             chunks):
            records += recs
            print(f"  {len(records)} calls, {time.time() - t1:.0f} s", file=sys.stderr, flush=True)
    wall = time.time() - t1
    kinds = Counter(r["kind"] for r in records)
    typed = [r for r in records if r["kind"] == "typed"]
    bugs = [r for r in records if r["kind"] in BUG_KINDS]
    notes = sorted({n for r in records for n in r.get("notes", [])})
    figures = {
        "command": " ".join(["python", "tests/fuzz/run.py"] + (argv or sys.argv[1:])),
        "seed": args.seed, "calls": len(records), "wall_s": round(wall, 1),
        "artifacts_s": round(t_build, 1),
        "successes": kinds["ok"], "skipped_steps": kinds["skipped"],
        "successes_values_compared": sum(1 for r in records if r["kind"] in ("ok", "skipped")
                                         and r.get("values_compared")),
        "typed_failures": len(typed),
        "typed_by_exception": dict(Counter(r["exc"] for r in typed).most_common()),
        "typed_by_category": dict(Counter(f"{r['phase']}/{r['category']}"
                                          for r in typed).most_common()),
        "crashes": kinds["crash"], "mismatches": kinds["mismatch"],
        "other_bugs": {k: kinds[k] for k in BUG_KINDS
                       if k not in ("crash", "mismatch") and kinds[k]},
        "by_spec": dict(sorted(Counter(r["spec"] for r in records).items())),
        "untidy_messages": notes[:50],
        "bugs": bugs,
    }
    print(json.dumps({k: v for k, v in figures.items() if k != "bugs"}, indent=1))
    for b in bugs[:40]:
        print(f"BUG {b['kind']} call {b['i']} ({b['spec']}, {b.get('phase')}): {b.get('exc', '')} "
              f"{b.get('message', '')[:200]} | {b.get('detail', '')[:300]} | replay: "
              f"python tests/fuzz/run.py --replay {args.seed}:{b['i']}"
              f"{' --bases' if args.bases else ''}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1, default=str)
    return 1 if bugs else 0



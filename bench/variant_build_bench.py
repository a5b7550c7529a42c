#!/usr/bin/env python
"""Cold builds per target: one variant of each catalog spec, beside all its variants.

    python bench/variant_build_bench.py                       # llvm and cuda, every spec
    python bench/variant_build_bench.py --targets llvm --specs adam,lamb,adafactor
    python bench/variant_build_bench.py --no-all --json variants.json

Each build writes into an empty cache folder of its own (a cold build: the front end,
TVM and, for cuda, nvcc for sm_80 and sm_90), in this process after one warm-up build,
so TVM's import (printed once) is not counted: what a trainer waits for the first time
a step needs a variant. "one" is the default variant (float32 parameters, the default
flag values: what ``optgen build`` makes and a first step with default settings needs);
"all" is every variant (``optgen build --all-variants``: each dtype and flag
combination, a library each). Rows print as they finish, then the medians and the goals
(one variant: llvm < 2 s, cuda < 6 s). The load average is printed at the start and the
end: other work on the machine slows every row. A script, not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

GOALS = {"llvm": 2.0, "cuda": 6.0}   # seconds, a cold build of one variant
BASE = {"lars": "adam"}              # wrapper specs need a base optimizer


def cold_build(spec: str, target: str, variants: str) -> tuple[float, int]:
    """(seconds, variants built) of one build of ``spec`` into an empty cache folder."""
    from optgen.compiler import pipeline
    from optgen.core import catalog
    folder = tempfile.mkdtemp(prefix="optgen-variant-bench-")
    os.environ["OPTGEN_CACHE_DIR"] = folder
    try:
        start = time.perf_counter()
        r = pipeline.build(catalog.resolve(spec), target, base=BASE.get(spec),
                           variants=variants)
        return time.perf_counter() - start, len(r.built)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    from optgen.core import catalog
    from optgen.errors import BuildError, SpecError
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="llvm,cuda")
    ap.add_argument("--specs", help="comma-separated catalog names (default: all)")
    ap.add_argument("--no-all", action="store_true", help="time the one-variant builds only")
    ap.add_argument("--json", help="write every row as JSON")
    a = ap.parse_args()
    specs = a.specs.split(",") if a.specs else list(catalog.list_specs())
    targets = a.targets.split(",")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} cores)")
    start = time.perf_counter()
    from optgen.compiler import tvm_backend
    tvm_backend._tvm()
    print(f"TVM import (not counted below): {time.perf_counter() - start:.2f} s")
    rows: list[dict] = []
    for target in targets:
        cold_build("sgd", target, "default")     # warm-up: the toolchain's first run
        print(f"\n{target}: {'spec':<18} {'one (s)':>8} {'all (s)':>8} {'variants':>8} "
              f"{'all / variant (s)':>17}")
        for spec in specs:
            try:
                one, _ = cold_build(spec, target, "default")
                every, count = (None, None) if a.no_all else cold_build(spec, target, "all")
            except (BuildError, SpecError) as e:   # e.g. matrix rules: llvm only
                print(f"  {spec:<24} refused: {str(e).splitlines()[0][:90]}")
                continue
            rows.append({"target": target, "spec": spec, "one_s": one, "all_s": every,
                         "variants": count})
            tail = "" if every is None else f"{every:8.2f} {count:8d} {every / count:17.2f}"
            print(f"  {spec:<24} {one:8.2f} {tail}", flush=True)
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for target in targets:
        mine = [r for r in rows if r["target"] == target]
        if not mine:
            continue
        one = [r["one_s"] for r in mine]
        slow = [f"{r['spec']} {r['one_s']:.2f}" for r in mine if r["one_s"] >= GOALS[target]]
        line = (f"{target}: one variant median {statistics.median(one):.2f} s, max "
                f"{max(one):.2f} s over {len(one)} specs")
        if not a.no_all:
            every = [r["all_s"] for r in mine]
            line += (f"; all variants median {statistics.median(every):.2f} s, total "
                     f"{sum(every):.1f} s (one variant: total {sum(one):.1f} s)")
        print(line)
        verdict = "MET" if not slow else f"MISSED by {', '.join(slow)}"
        print(f"  goal: one variant < {GOALS[target]:.0f} s each: {verdict}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()

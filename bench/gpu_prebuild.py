#!/usr/bin/env python
"""Build, on a CPU machine with nvcc, every CUDA artifact the GPU tests and benchmarks
load, with all their variants, into the artifact cache ($OPTGEN_CACHE_DIR): each catalog
spec, plain and with bf16, bf16sr, q8, q4 and fp8 states (the matrix rules plain), the
reductions' wrappers, split masters, and what bench/cuda_bench.py steps. A refused format is printed,
not an error. Then, with ``--pack FILE``, the cache folder as one tar.xz that a GPU
machine unpacks into its cache: there the tests and benchmarks find every kernel built
and need TVM's runtime only (bench/gpu_run.sh).

    OPTGEN_CACHE_DIR=/tmp/gpucache python bench/gpu_prebuild.py [--jobs N] [--pack FILE]
"""
import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

FORMATS = [None, "bf16", "bf16sr", "q8", "q4", "fp8"]
QMIX = {"m": "q8@128", "v": "q4"}                # q8 and q4 in one kernel
EXTRA = [("lars", "momentum", None), ("adam", None, QMIX), ("adamw", None, QMIX),
         # bfloat16 weights with split masters (tests/test_gpu_formats.py's cases)
         *((name, None, fmt, master) for name, fmt in [
             ("adamw", None), ("adam", QMIX), ("lion", "fp8"), ("sgd", None),
             ("lamb", None), ("adamw", "q8")] for master in ("split16", "split8"))]


def build(job) -> str:
    import optgen
    from optgen.core import formats
    name, base, fmt, master = (*job, None)[:4]
    sr = fmt == "bf16sr"
    try:
        optgen.build(name, "cuda", base=base, variants="all",
                     state_format=formats.mastered(name, formats.rounded(
                         name, formats.request(name, "bf16" if sr else fmt), sr), master))
        return ""
    except Exception as e:  # noqa: BLE001 (a refusal is reported, the run goes on)
        return f"{name} {base} {fmt} {master}: {type(e).__name__}: {str(e)[:160]}"


def jobs() -> list:
    from optgen.core import catalog
    from optgen.compiler.loader import load_spec
    from optgen.compiler.verify import verify
    out = []
    for name, path in sorted(catalog.list_specs().items()):
        matrix = any(tr.matrix for tr in verify(load_spec(path)))
        base = "adam" if name == "lars" else None
        out += [(name, base, f) for f in ([None] if matrix else FORMATS)]
    return out + EXTRA


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--pack", help="write the cache folder as this .tar.xz")
    args = ap.parse_args()
    from optgen.core import cache
    todo, refused, t0 = jobs(), [], time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        for i, r in enumerate(pool.map(build, todo)):     # (printed as they finish: a
            print(f"{i + 1}/{len(todo)} {r or 'ok'}", flush=True)   # cut run says how far)
            if r:
                refused.append(r)
    print(f"{len(todo) - len(refused)} of {len(todo)} artifacts built in "
          f"{time.perf_counter() - t0:.0f} s into {cache.cache_dir()}; refused:")
    print("\n".join("  " + r for r in refused))
    if args.pack:
        # the artifacts' folders, not build locks or temporary folders
        names = sorted(n for n in os.listdir(cache.cache_dir())
                       if "-cuda-" in n and not n.startswith(".") and not n.endswith(".lock"))
        subprocess.run(["tar", "-C", cache.cache_dir(), "-cf", "-", *names],
                       stdout=open(args.pack + ".tar", "wb"), check=True)
        subprocess.run(["xz", "-T0", "-9", "-f", args.pack + ".tar"], check=True)
        os.replace(args.pack + ".tar.xz", args.pack)
        print(f"packed {len(names)} artifacts: {args.pack} "
              f"({os.path.getsize(args.pack) / 2**20:.1f} MiB)")
    sys.exit(0)


if __name__ == "__main__":
    main()

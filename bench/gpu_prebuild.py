#!/usr/bin/env python
"""Build, in parallel, every artifact the GPU tests load, with all its variants: each
elementwise catalog spec for cuda and llvm, plain and with bf16, bf16sr, q8 and q4
states (a refused format is printed, not an error). Run before ``pytest -n``: otherwise
the xdist workers build the variants they need as they run, each under the cache's
locks (a variant another worker builds is waited for, not built twice).

    python bench/gpu_prebuild.py [processes] [all]
"""
import sys
from concurrent.futures import ProcessPoolExecutor

# the plain artifacts by default; the formats' are built by the tests themselves (spread
# over the workers) unless asked for: python bench/gpu_prebuild.py 14 all
FORMATS = [None]
ALL_FORMATS = [None, "bf16", "bf16sr", "q8", "q4"]


def build(job: tuple[str, str, str | None]) -> str:
    import optgen
    name, target, fmt = job
    sr = fmt == "bf16sr"
    try:
        from optgen.core import formats
        optgen.build(name, target, base="adam" if name == "lars" else None, variants="all",
                     state_format=formats.rounded(name, formats.request(
                         name, "bf16" if sr else fmt), sr))
        return ""
    except Exception as e:  # noqa: BLE001 (a refusal is reported, the run goes on)
        return f"{name} {target} {fmt}: {type(e).__name__}: {str(e)[:160]}"


def main() -> None:
    from optgen.core import catalog
    from optgen.compiler.loader import load_spec
    from optgen.compiler.verify import verify
    names = sorted(n for n, path in catalog.list_specs().items()
                   if not any(tr.matrix for tr in verify(load_spec(path))))
    formats = ALL_FORMATS if sys.argv[2:] == ["all"] else FORMATS
    jobs = [(n, t, f) for n in names for f in formats for t in ("cuda", "llvm")]
    refused = []
    with ProcessPoolExecutor(int(sys.argv[1]) if len(sys.argv) > 1 else 14) as pool:
        for i, r in enumerate(pool.map(build, jobs)):     # (printed as they finish: a
            print(f"{i + 1}/{len(jobs)} {r or 'ok'}", flush=True)   # cut run still says how far)
            if r:
                refused.append(r)
    print(f"{len(jobs) - len(refused)} of {len(jobs)} artifacts built; refused:")
    print("\n".join("  " + r for r in refused))


if __name__ == "__main__":
    main()

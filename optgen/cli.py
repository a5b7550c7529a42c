"""The ``optgen`` command line.

Exit codes: 0 success, 2 a spec or usage error (one line, no traceback), 1 an internal
error (one line; set OPTGEN_DEBUG=1 for the traceback).
"""
from __future__ import annotations

import itertools
import json
import os
import sys
import time
import traceback
import warnings

from .cli_args import parser as _parser
from .errors import BuildError, SpecError


def _artifact(spec: str, target: str = "llvm", base: str | None = None, state_format=None):
    import optgen          # (its variants build on first use)
    return optgen.get_artifact(spec, target, base=base, state_format=state_format)


def _state_format(text: str | None):
    """--state-format: ``bf16`` or ``m=bf16,v=bf16``."""
    if text is None or "=" not in text:
        return text
    pairs = [p.split("=", 1) for p in text.split(",") if p.strip()]
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"--state-format {text!r}: write a format (bf16) or "
                         "state=format pairs (m=bf16,v=bf16)")
    return {n.strip(): f.strip() for n, f in pairs}


def _cmd_show(args) -> int:
    from optgen import commands
    if args.stage not in commands.STAGES:
        raise ValueError(f"unknown stage {args.stage!r}; stages: {', '.join(commands.STAGES)}")
    text = commands.stage_text(_artifact(args.spec, args.target, args.base), args.stage,
                               args.kernel)
    print(text.rstrip("\n"))
    return 0


def _cmd_check(args) -> int:
    from optgen import commands
    from optgen.core import progress
    failed = 0
    with progress.reporting():   # (past OPTGEN_PROGRESS_AFTER seconds, on stderr)
        for spec in args.specs:
            progress.task(f"check {spec}")
            art = _artifact(spec, base=args.base)
            for r in commands.check_each(art, seed=args.seed):   # (each line as it is done)
                print(_check_line(art.name, r), flush=True)
                failed += not r.ok
    if failed:
        print(f"optgen: check failed: {failed} kernel(s) differ from the reference "
              "interpreter (an optgen bug: please report it)", file=sys.stderr)
        return 1
    return 0


def _check_line(name: str, r) -> str:
    """One result of `optgen check` (a commands.CheckResult) as its line."""
    from optgen import commands
    flags = " ".join(f"{k}={v}" for k, v in r.flags.items()) or "(no flags)"
    if r.skipped:
        return f"{name} {r.dtype} {r.setting} {flags}: skipped ({r.skipped})"
    verdict = "ok" if r.ok else (
        f"FAILED (tolerance {commands.TOLERANCE[r.dtype]:.0e} exceeded in "
        + ", ".join(commands.describe(n) for n in r.failed) + ")")
    note = (f" (warning: the reference interpreter itself gives {r.nonfinite} NaN/inf "
            "values on random data: check the spec)" if r.nonfinite else "")
    return (f"{name} {r.dtype} {r.setting} {flags}: max error {r.max_rel:.2e} "
            f"in {commands.describe(r.worst)} (absolute {r.max_abs:.2e}) over "
            f"{commands.STEPS} steps: {verdict}{note}")


def _setting(text: str) -> tuple[str, object]:
    """``name=value`` of --set: a number, true/false/none, a tuple, else the text."""
    import ast
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"--set {text!r}: expected NAME=VALUE, e.g. --set lr=0.01")
    word = value.strip().lower()
    if word in ("true", "false", "none"):
        return name.strip(), {"true": True, "false": False, "none": None}[word]
    try:
        return name.strip(), ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        return name.strip(), value.strip()


def _cmd_bench(args) -> int:
    from optgen import commands
    import numpy as np
    import optgen
    hyper = dict(_setting(s) for s in args.set)
    fmt = _state_format(args.state_format)
    if fmt is not None:
        hyper["state_format"] = fmt
    art = _artifact(args.spec, base=args.base, state_format=fmt)
    try:                      # the settings' names and values, checked before any timing
        optgen.create(art, [np.zeros(1, args.dtype if args.dtype in art.dtypes
                                     else art.dtypes[0])], **hyper)
    except (TypeError, ValueError) as e:
        raise ValueError(f"--set: {e}") from None
    r = commands.bench(art, n=args.n, dtype=args.dtype, tensors=args.tensors,
                       reps=args.reps, flat=args.flat, **hyper)
    n = sum(r.sizes)
    print(f"{art.name} {r.dtype}: {n:,} parameters in {len(r.sizes)} "
          f"{'flat ' if args.flat else ''}tensor(s), "
          f"{r.threads} thread(s), {args.reps} interleaved reps (median, best)")
    limit = r.limit
    rows = [(f"{art.name} step", r.step, f"{r.step.bytes / n:.0f} B/parameter")] + \
        [(a.name, a, f"{a.bytes / n:.0f} B/element") for a in r.anchors.values()]
    for label, t, per in rows:
        print(f"  {label:<22} {t.median * 1e3:9.3f} ms {t.best * 1e3:9.3f} ms "
              f"{t.gbps(t.median):7.1f} GB/s  {t.bytes / t.median / limit:5.2f} of limit  ({per})")
    print(f"limit: {limit / 1e9:.1f} GB/s (the best anchor's best rep); the {art.name} step "
          f"would take {r.step.bytes / limit * 1e3:.3f} ms at the limit and reaches "
          f"{r.fraction:.2f} of it")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"spec": art.name, "dtype": r.dtype, "sizes": r.sizes,
                       "threads": r.threads, "hyper": {k: repr(v) for k, v in hyper.items()},
                       "limit_bytes_per_s": limit, "fraction_of_limit": r.fraction,
                       "timings": {t.name: {"bytes": t.bytes, "seconds": t.times}
                                   for t in [r.step, *r.anchors.values()]}}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


def _cmd_cache(args) -> int:
    from optgen import commands
    from optgen.core import cache
    if args.action == "clean":
        count, freed, busy = commands.clean_cache()
        print(f"removed {count} artifact(s), {commands.human(freed)}, from {cache.cache_dir()}"
              + (f"; kept {busy} folder(s) a running build writes" if busy else ""))
        return 0
    entries = commands.cache_entries()
    total = sum(e.bytes for e in entries)
    print(f"cache: {cache.cache_dir()}: {len(entries)} artifact(s), {commands.human(total)}")
    for e in entries:
        print(f"  {e.name}  {e.spec} for {e.target}, {commands.human(e.bytes)}")
    return 0


def _cmd_build(args) -> int:
    from optgen.compiler import targets
    from optgen.compiler.pipeline import build
    from optgen.compiler.ship import ship_squares
    from optgen.core import catalog, formats, progress
    names = [t.strip() for t in args.target.split(",") if t.strip()]
    if not names:
        raise ValueError("--target names no target (e.g. --target llvm,c)")
    tgs = [targets.get(name) for name in names]  # every name checked before anything is built
    if args.arch is not None and not any(t.takes_arch for t in tgs):
        raise ValueError(f"--arch applies to the {', '.join(targets.names_with_archs())} "
                         "target only")
    paths = [catalog.resolve(spec) for spec in args.specs]
    if args.base is not None:
        catalog.resolve(args.base)
    variants = "all" if args.all_variants else "default" if args.variant is None else \
        [v.strip() for v in args.variant.split(",") if v.strip()]
    start, built, total = time.perf_counter(), 0, len(paths) * len(names)
    with progress.reporting():   # (past OPTGEN_PROGRESS_AFTER seconds, on stderr)
        for k, (path, target) in enumerate(itertools.product(paths, names), 1):
            progress.task(f"{os.path.splitext(os.path.basename(path))[0]} for {target}"
                          + f" ({k} of {total})" * (total > 1))
            r = build(path, target, out=args.out, force=args.force, base=args.base,
                      arch=args.arch if targets.get(target).takes_arch else None,
                      state_format=formats.mastered("optgen build", formats.rounded(
                          "optgen build", formats.request(
                              "optgen build", _state_format(args.state_format)),
                          args.stochastic_rounding), args.master_format), variants=variants)
            if args.out is not None:    # (what clip_global_norm runs where nothing compiles)
                ship_squares(r, target, args.arch if targets.get(target).takes_arch else None)
            built += not r.cache_hit
            what = "cache hit" if r.cache_hit else "built"
            print(f"{what}: {r.name} for {target} in {r.seconds:.3f} s -> {r.path}", flush=True)
            more = len(r.variants) - len(r.have)
            print(f"  variants: {', '.join(r.have)}"
                  + f"; {more} more build on first use (--all-variants: now)" * bool(more))
            if target != targets.DEFAULT:
                print("  files: " + " ".join(sorted(f"{v}/{f}" for v in r.built
                                                     for f in os.listdir(f"{r.path}/{v}"))))
    if total > 1:
        print(f"summary: {total} artifacts ({len(paths)} spec(s) x {len(names)} target(s)): "
              f"{built} built, {total - built} cache hit(s), {time.perf_counter() - start:.1f} s")
    return 0


def _cmd_targets(args) -> int:
    from optgen.compiler import targets
    from optgen.runtime import backends
    for name, t in targets.TARGETS.items():
        # what the compiler can build and compile here, and what the runtime can load
        # and run (OpenCL compiles at load: its runtime answers both)
        st = {**targets.status(name), **backends.get(name).status()}
        kernels = ", ".join(t.dtypes) + (f"; mixed precision {', '.join(t.mixed)}"
                                         if t.mixed else "")
        print(f"{name}: {t.doc}\n  kernels: {kernels}")
        for what in ("build", "compile", "run"):
            print(f"  {what + ':':9}{st[what]}")
    return 0


def _cmd_list(args) -> int:
    from optgen import commands
    from optgen.compiler.loader import load_spec
    from optgen.core import cache, catalog
    for name, path in catalog.list_specs().items():
        spec = load_spec(path)
        first = " ".join(spec.doc.strip().split("\n\n")[0].split())  # the first paragraph
        print(f"{name}: {first}")
        for h in spec.hypers.values():
            i = h.info
            rule = f"; {i.constraint}" if i.constraint else ""
            print(f"    {i.name} ({i.type}, default {i.default!r}{rule}) {i.doc}")
        for n, (rule, doc) in spec.shape_flags.items():
            print(f"    {n} (flag set per parameter: {rule}) {doc}")
        for n, (exclude, doc) in spec.name_flags.items():
            print(f"    {n} (flag set per parameter: off for names containing "
                  f"{' or '.join(map(repr, exclude))}) {doc}")
        for s in spec.states.values():
            when = f", when {s.when}" if s.when else ""
            print(f"    state {s.name} (init {s.init!r}, {s.shape}{when}) {s.doc}")
    built: dict[str, list[str]] = {}
    for e in commands.cache_entries(sizes=False):
        built.setdefault(e.spec, []).append(e.target)
    print(f"\nbuilt in the cache ({cache.cache_dir()}): "
          + ("; ".join(f"{n} for {', '.join(sorted(set(t)))}" for n, t in sorted(built.items()))
             or "nothing yet"))
    return 0


def _notice(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings (a broken cached artifact being rebuilt) as one line, no source location."""
    text = str(message)
    print(text if text.startswith("optgen: ") else f"optgen: warning: {text}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # exits 2 on a usage error
    warnings.showwarning = _notice
    try:
        return {"build": _cmd_build, "list": _cmd_list, "targets": _cmd_targets,
                "show": _cmd_show, "check": _cmd_check, "bench": _cmd_bench,
                "cache": _cmd_cache}[args.command](args)
    except SpecError as e:
        print(f"optgen: spec error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into head & co.
        return 0
    except BuildError as e:  # a missing toolchain (nvcc, ROCm) or a failed native compile
        print(f"optgen: build error: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError) as e:
        print(f"optgen: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # an optgen bug or a broken toolchain: say so in one line
        if os.environ.get("OPTGEN_DEBUG"):
            traceback.print_exc()
        print(f"optgen: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
              " (set OPTGEN_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

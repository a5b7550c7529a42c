"""The ``optgen`` command line.

Exit codes: 0 success, 2 a spec or usage error (one line, no traceback), 1 an internal
error (one line; set OPTGEN_DEBUG=1 for the traceback).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings

from .errors import BuildError, SpecError

EXAMPLES = [   # (command line, what it does): `optgen --help` shows all, `optgen CMD --help` its own
    ("optgen build specs/adam.py", "build for this CPU into the cache (float32, default flags)"),
    ("optgen build adam --all-variants", "every dtype and flag combination now"),
    ("optgen build adam sgd --out build/", "build two catalog specs into build/"),
    ("optgen build adam --target llvm,c,opencl", "one spec for three targets, with a summary"),
    ("optgen build lars --base adam", "LARS around Adam"),
    ("optgen build specs/lamb.py --target cuda", "CUDA source, PTX and cubin (sm_80, sm_90)"),
    ("optgen build adam --target cuda --arch sm_90a", "cubin for one architecture"),
    ("optgen build adam --force", "rebuild although the cache is current"),
    ("optgen targets", "what this machine can build, compile, run"),
    ("optgen list", "the catalog with hyperparameters, and the cache"),
    ("optgen show adam --stage tvmscript", "a pipeline stage (spec, ir, tvmscript, source)"),
    ("optgen show adam --stage source --target cuda", "the generated CUDA source"),
    ("optgen show adam --stage ir --kernel adam_f32", "one kernel's IR"),
    ("optgen check specs/adam.py", "compiled kernels vs the reference interpreter"),
    ("optgen check adam lamb --seed 3", "two specs, other random data"),
    ("optgen bench adam", "step time and bandwidth vs this CPU's copy/triad/axpy"),
    ("optgen bench lamb --n 1000003 --tensors 10 --set weight_decay=0.01",
     "ten tensors, a hyperparameter set"),
    ("optgen bench adam --n 100000 --tensors 100 --flat", "100 tensors, one kernel call"),
    ("optgen cache", "where the artifact cache is and what it holds"),
    ("optgen cache clean", "remove every cached artifact"),
]


WIDE = 44   # a longer command line gets its explanation on the next line


def _examples(command: str | None = None) -> str:
    rows = [(c, what) for c, what in EXAMPLES
            if command is None or c.split()[1] == command]
    width = max([len(c) for c, _ in rows if len(c) <= WIDE] or [0]) + 2
    return "examples:\n" + "\n".join(f"  {c:<{width}}{what}" if len(c) <= WIDE else
                                      f"  {c}\n  {'':<{width}}{what}" for c, what in rows)


def _command(sub, name: str, **kw) -> argparse.ArgumentParser:
    return sub.add_parser(name, epilog=_examples(name),
                          formatter_class=argparse.RawDescriptionHelpFormatter, **kw)


def _parser() -> argparse.ArgumentParser:
    from optgen.compiler import targets   # (no TVM: the registry's modules import none)
    p = argparse.ArgumentParser(prog="optgen", description="Compile optimizer specs into fused "
                                "kernels.", epilog=_examples(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    b = _command(sub, "build", help="build specs into artifacts",
                       description="Build specs (a file or a catalog name) into an artifact "
                       "directory: manifest.json, wrapper, and a folder per variant (a "
                       "parameter dtype and flag values: its library and sources). The float32 "
                       "variant with default flags is built; the runtime builds the others "
                       "when a step first needs them.")
    b.add_argument("specs", nargs="+", help="spec file (specs/adam.py) or catalog name (adam)")
    b.add_argument("--target", default=targets.DEFAULT, help="target(s) to build for, "
                   f"comma-separated: {', '.join(targets.names())} (default "
                   f"{targets.DEFAULT}; `optgen targets` describes each)")
    b.add_argument("--arch", help=f"{', '.join(targets.names_with_archs())} only: "
                   "comma-separated GPU architectures nvcc compiles "
                   "PTX and cubin for (default sm_80,sm_90)")
    b.add_argument("--out", help="write <spec>-<target>/ under this folder instead of the cache")
    b.add_argument("--force", action="store_true", help="rebuild even when the cache is current")
    which = b.add_mutually_exclusive_group()
    which.add_argument("--all-variants", action="store_true", help="build every variant "
                       "(dtype and flag combination), e.g. for an --out artifact")
    which.add_argument("--variant", help="build these variants (comma-separated, e.g. "
                       "f32-use_nesterov,bf16: a dtype tag and the flags set on)")
    b.add_argument("--base", help="base optimizer of a wrapper spec (lars), e.g. --base adam")
    b.add_argument("--state-format", help="also build the kernels that store states in a "
                   "format: bf16, q8, q4 (every tensor state; q8@64 for another block "
                   "size) or per state, e.g. m=q4,v=bf16 (docs/state-formats.md)")
    b.add_argument("--stochastic-rounding", action="store_true",
                   help="bf16 states rounded stochastically, and the kernels for bfloat16 "
                   "parameters stepped without a master copy (stochastic_rounding=True)")
    _command(sub, "list", help="list the catalog's specs with their hyperparameters")
    _command(sub, "targets", help="list the targets and what this machine can do with each",
                   description="Every target, with whether this machine can build it (TVM "
                   "generates the code), compile it (a native toolchain makes a binary) and "
                   "run it (optgen's runtime executes the kernels).")
    sh = _command(sub, "show", help="print a pipeline stage of a spec (builds it if needed)",
                        description="Print one stage of a spec's pipeline, read from its "
                        "artifact: spec (the source), ir (the specialized IR of every kernel, "
                        "JSON), tvmscript (the scheduled kernels), source (the generated source "
                        "of the default variant, or --kernel's: LLVM IR, C, CUDA, OpenCL, ...).")
    sh.add_argument("spec", help="spec file or catalog name")
    sh.add_argument("--stage", default="tvmscript", help="spec, ir, tvmscript (default) or source")
    sh.add_argument("--target", default=targets.DEFAULT,
                    help=f"target of the artifact (default {targets.DEFAULT})")
    sh.add_argument("--kernel", help="one kernel's IR or TVMScript, e.g. adam_f32")
    sh.add_argument("--base", help="base optimizer of a wrapper spec (lars)")
    ch = _command(sub, "check", help="run a spec's compiled kernels against its reference "
                        "interpreter", description="Build the spec for this CPU, then step "
                        "its compiled kernels and the reference interpreter side by side on "
                        "random data (5 steps; shapes (37, 23), (1009,), (16,), (1,)) for "
                        "every dtype and flag combination, with default and with 'busy' "
                        "hyperparameters (each moved off its default: floats and integers to "
                        "another number, optional ones between None and a value), compare the "
                        "parameters and every state, and print the largest error and where it "
                        "is. Exit 1 if an error exceeds the tolerance (float32 1e-5, float64 "
                        "1e-12, relative to max(1, the array's largest value)), naming the "
                        "parameters or states that do.")
    ch.add_argument("specs", nargs="+", help="spec file or catalog name")
    ch.add_argument("--base", help="base optimizer of a wrapper spec (lars)")
    ch.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    be = _command(sub, "bench", help="time a spec's step against this CPU's memory bandwidth",
                        description="Build the spec for this CPU, then time its whole Python "
                        "step (opt.step on numpy arrays) next to three memory-bandwidth "
                        "anchors built for this CPU: copy a = b, triad a = b + s*c and the "
                        "in-place axpy a = a + s*b. Repetitions are interleaved; medians "
                        "are printed. A step must move the bytes of reading every parameter, "
                        "gradient, input and state and writing back the parameters and "
                        "states; 'of limit' is that over the step's median time, divided by "
                        "the best anchor's best bandwidth. An elementwise step is "
                        "memory-bound: 1.00 is the ceiling. Timings are noisy: compare "
                        "ratios, run twice. bench/ holds the side-by-side benchmarks "
                        "against torch and numpy.")
    be.add_argument("spec", help="spec file or catalog name")
    be.add_argument("--n", type=int, default=10_000_000,
                    help="number of parameters (default 10000000)")
    be.add_argument("--tensors", type=int, default=1,
                    help="split the parameters into this many tensors (default 1)")
    be.add_argument("--dtype", default="float32", help="float32 (default) or float64")
    be.add_argument("--reps", type=int, default=20, help="timed repetitions (default 20)")
    be.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a hyperparameter or flag, e.g. --set weight_decay=0.01 "
                    "--set use_nesterov=true (repeatable)")
    be.add_argument("--flat", action="store_true",
                    help="parameters and gradients each in one buffer (optgen.flatten): "
                    "an elementwise rule then steps all tensors with one kernel call")
    be.add_argument("--base", help="base optimizer of a wrapper spec (lars)")
    be.add_argument("--state-format", help="store the states in a format: bf16, q8, q4, or "
                    "per state, e.g. m=q8 (docs/state-formats.md)")
    be.add_argument("--json", metavar="PATH", help="also write every sample as JSON")
    ca = _command(sub, "cache", help="the artifact cache: where, what, how big; clean it",
                        description="Without an action, print the cache folder and each "
                        "artifact in it with its size. `optgen cache clean` removes them all. "
                        "The folder is $OPTGEN_CACHE_DIR, else $XDG_CACHE_HOME/optgen, else "
                        "~/.cache/optgen.")
    ca.add_argument("action", nargs="?", choices=["list", "clean"], default="list")
    return p


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
    failed = 0
    for spec in args.specs:
        art = _artifact(spec, base=args.base)
        for r in commands.check(art, seed=args.seed):
            flags = " ".join(f"{k}={v}" for k, v in r.flags.items()) or "(no flags)"
            if r.skipped:
                print(f"{art.name} {r.dtype} {r.setting} {flags}: skipped ({r.skipped})")
                continue
            verdict = "ok" if r.ok else (
                f"FAILED (tolerance {commands.TOLERANCE[r.dtype]:.0e} exceeded in "
                + ", ".join(commands.describe(n) for n in r.failed) + ")")
            note = (f" (warning: the reference interpreter itself gives {r.nonfinite} NaN/inf "
                    "values on random data: check the spec)" if r.nonfinite else "")
            print(f"{art.name} {r.dtype} {r.setting} {flags}: max error {r.max_rel:.2e} "
                  f"in {commands.describe(r.worst)} (absolute {r.max_abs:.2e}) over "
                  f"{commands.STEPS} steps: {verdict}{note}")
            failed += not r.ok
    if failed:
        print(f"optgen: check failed: {failed} kernel(s) differ from the reference "
              "interpreter (an optgen bug: please report it)", file=sys.stderr)
        return 1
    return 0


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
    from optgen.core import catalog, formats
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
    start, built = time.perf_counter(), 0
    for path in paths:
        for target in names:
            r = build(path, target, out=args.out, force=args.force, base=args.base,
                      arch=args.arch if targets.get(target).takes_arch else None,
                      state_format=formats.rounded("optgen build", formats.request(
                          "optgen build", _state_format(args.state_format)),
                          args.stochastic_rounding), variants=variants)
            built += not r.cache_hit
            what = "cache hit" if r.cache_hit else "built"
            print(f"{what}: {r.name} for {target} in {r.seconds:.3f} s -> {r.path}", flush=True)
            more = len(r.variants) - len(r.have)
            print(f"  variants: {', '.join(r.have)}"
                  + f"; {more} more build on first use (--all-variants: now)" * bool(more))
            if target != targets.DEFAULT:
                print("  files: " + " ".join(sorted(f"{v}/{f}" for v in r.built
                                                     for f in os.listdir(f"{r.path}/{v}"))))
    total = len(paths) * len(names)
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

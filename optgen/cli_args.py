"""The ``optgen`` command line's arguments: every subcommand, its options and help, and
the examples ``optgen --help`` and ``optgen CMD --help`` show. optgen/cli.py runs them.
"""
from __future__ import annotations

import argparse

EXAMPLES = [   # (command line, what it does): `optgen --help` shows all, `optgen CMD --help` its own
    ("optgen build specs/adam.py", "build for this CPU into the cache (float32, default flags)"),
    ("optgen build adam --all-variants", "every dtype and flag combination now"),
    ("optgen build adam sgd --out build/", "build two catalog specs into build/"),
    ("optgen build adam --target llvm,c,opencl", "one spec for three targets, with a summary"),
    ("optgen build lars --base adam", "LARS around Adam"),
    ("optgen build specs/lamb.py --target cuda", "CUDA source, PTX and cubin (sm_80, sm_90)"),
    ("optgen build adam --target cuda --arch sm_90a", "cubin for one architecture"),
    ("optgen build adam --force", "rebuild although the cache is current"),
    ("optgen build adam --master-format split16",
     "also the kernels for bfloat16 weights with a split master"),
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


def parser() -> argparse.ArgumentParser:
    from optgen.compiler import targets   # (no TVM: the registry's modules import none)
    from optgen.core import formats
    p = argparse.ArgumentParser(prog="optgen", description="Compile optimizer specs into fused "
                                "kernels.", epilog=_examples(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    b = _command(sub, "build", help="build specs into artifacts",
                       description="Build specs (a file or a catalog name) into an artifact "
                       "directory: manifest.json, wrapper, and a folder per variant (a "
                       "parameter dtype and flag values: its library and sources). The float32 "
                       "variant with default flags is built; the runtime builds the others "
                       "when a step first needs them. A build that takes longer than "
                       "$OPTGEN_PROGRESS_AFTER seconds (default 2) says on stderr what it is "
                       "doing (spec, target, variant, stage: trace, lower, compile, link), "
                       "a line at each new stage.")
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
    b.add_argument("--master-format", choices=formats.MASTERS,
                   help="also build the kernels for bfloat16 parameters stepped through a "
                   f"split master instead of a float32 copy: {', '.join(formats.MASTERS[1:])} "
                   "(optgen.get_artifact's master_format; fp32, the float32 master, is "
                   "the default and needs none)")
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
                        "parameters or states that do. Each line prints when it is done; a "
                        "variant is built when its first line needs it. Past "
                        "$OPTGEN_PROGRESS_AFTER seconds (default 2) a line on stderr says "
                        "what it is doing at each new stage, as `optgen build` does.")
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

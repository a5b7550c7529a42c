"""What the ``optgen show``, ``check`` and ``cache`` commands compute, apart from the CLI
(optgen/cli.py prints it).

- ``stage_text``: a spec's pipeline stages as text (spec source, IR, TVMScript, kernel
  source) read back from its artifact;
- ``check``: every (dtype, flags) kernel of a spec stepped side by side with the
  reference interpreter on random data; the largest error of the parameters and of
  every state against the tolerance, and where it is;
- ``bench``: one spec's step time and achieved bandwidth next to the memory-bandwidth
  anchors (copy, triad, axpy) on this CPU;
- ``cache_entries`` / ``clean_cache``: what the artifact cache holds.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optgen.benchmark import Contender, interleave
from optgen.runtime.artifact import Artifact, Variant
from optgen.core import cache
from optgen.core import hyper as hyper_rules

STAGES = ("spec", "ir", "tvmscript", "source")


def stage_text(art: Artifact, stage: str, kernel: str | None = None) -> str:
    """One stage of ``art``'s pipeline as text; ``kernel`` keeps one kernel's part of
    the IR and TVMScript (a symbol such as ``adam_f32_use_nesterov``). The source is that
    of the default variants' libraries, or of ``kernel``'s (built if needed)."""
    if stage == "spec":
        return _read(art, "spec.py")
    if stage == "ir":
        kernels = [k for k in art.manifest["kernels"] if kernel in (None, k["symbol"])]
        if not kernels:
            raise ValueError(_unknown_kernel(art, kernel))
        return "\n".join(json.dumps({"symbol": k["symbol"], "launches": k["launches"],
                                     "host_scalars": k["host_scalars"],
                                     "scalar_state_updates": k["scalar_state_updates"],
                                     "ir": k["ir"]}, indent=1) for k in kernels)
    if stage == "tvmscript":
        text = _read(art, "kernels.tvmscript.py")
        if kernel is None:
            return text
        own = re.compile(rf"def {re.escape(kernel)}(_p\d+|_lazy)?\(")   # its passes too
        funcs = [f for f in text.split("\n\n\n") if own.search(f)]
        if not funcs:
            raise ValueError(_unknown_kernel(art, kernel))
        return "\n\n\n".join(funcs)
    if stage == "source":
        owner = [k.variant for k in art.kernels if k.symbol == kernel]
        text = "\n".join(_read(v, source_file(v)) for v in map(
            art.variant, owner or ([] if kernel else art.default_variants)))
        if kernel is None:
            return text
        funcs = _source_functions(text, kernel)
        if not funcs:
            raise ValueError(_unknown_kernel(art, kernel))
        return "\n\n".join(funcs)
    raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")


def source_file(v: Variant) -> str:
    """A variant's generated source file, as its manifest records it."""
    return next(f for k, f in v.manifest["sources"].items() if k != "tvmscript")


def _source_functions(text: str, kernel: str) -> list[str]:
    """The function definitions of ``kernel`` (its passes, lazy variant, TVM's entry
    wrapper and compute function, CUDA's kernels) in generated source: LLVM IR, C, CUDA,
    OpenCL and Metal all open a definition on an unindented line ending in "{" and
    close it with "}" alone on a line."""
    own = re.compile(rf"(?<![A-Za-z0-9_])(?:__tvm_ffi_)?{re.escape(kernel)}(?:_p\d+)?"
                     r"(?:_lazy)?(?:_kernel(?:_\d+)?|_compute_)?(?![A-Za-z0-9_])")
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        if line[:1].strip() and line.rstrip().endswith("{") and own.search(line):
            end = next((j for j in range(i + 1, len(lines)) if lines[j] == "}"), len(lines) - 1)
            out.append("\n".join(lines[i:end + 1]))
            i = end
        i += 1
    return out


def _read(art: Artifact | Variant, name: str) -> str:
    with open(os.path.join(art.path, name), encoding="utf-8") as f:
        return f.read()


def _unknown_kernel(art: Artifact, kernel: str | None) -> str:
    return (f"{art.name} has no kernel {kernel!r}; kernels: "
            + ", ".join(k.symbol for k in art.kernels))


# -- check ------------------------------------------------------------------------------
SHAPES = [(37, 23), (1009,), (16,), (1,)]   # rows/columns, a prime, a vector width, one
STEPS = 5
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}   # relative to the tensor's scale (tests/helpers.py)


PARAM = "w"          # the parameters' entry in CheckResult.errors (states by their names)


@dataclass
class CheckResult:
    dtype: str
    setting: str                  # "default" or "busy" hyperparameters
    flags: dict[str, bool]
    max_abs: float                # the absolute error where max_rel is
    max_rel: float
    skipped: str | None = None    # why this combination was not run (a requirement)
    nonfinite: int = 0            # NaN/inf elements in the reference's result (a spec bug?)
    worst: str = PARAM            # where max_rel is: PARAM or a state's name
    errors: dict[str, float] = field(default_factory=dict)   # PARAM / state -> max_rel
    hyper: dict[str, Any] = field(default_factory=dict)      # the setting's values

    @property
    def ok(self) -> bool:
        return self.skipped is not None or self.max_rel <= TOLERANCE[self.dtype]

    @property
    def failed(self) -> list[str]:
        """What differs beyond the tolerance: PARAM and the states' names."""
        tol = TOLERANCE[self.dtype]
        return [n for n, e in self.errors.items() if not e <= tol] or \
            ([] if self.ok else [self.worst])


def describe(name: str) -> str:
    """An entry of ``CheckResult.errors`` in words: "the parameters", "state m"."""
    return "the parameters" if name == PARAM else f"state {name}"


def random_statistics(opt, rng: np.random.Generator) -> dict[str, list]:
    """Statistics for a spec that reads them (THOR's A and G) on a step that refreshes:
    for each 2-D parameter a random symmetric positive definite matrix, x^T x as a
    batch of inputs would give; {} on other steps and for other specs."""
    art = opt.artifact
    if not art.statistics or not opt.refresh_due:
        return {}
    out = {}
    for name, shape in art.statistics.items():
        mats = []
        for p in opt.params:
            n = None if p.ndim != 2 else p.shape[0] if shape == "rr" else p.shape[1]
            x = None if n is None else rng.standard_normal((n + 3, n))
            mats.append(None if x is None else x.T @ x)
        out[name] = mats
    return out


def check(art: Artifact, seed: int = 0) -> list[CheckResult]:
    """Step the compiled kernels and the reference interpreter side by side, STEPS steps
    on SHAPES, for every dtype and every combination of the spec's flags, with the
    default hyperparameters and with every one moved off its default ("busy": momentum,
    weight decay, clipping on, integers changed, optional ones between None and a
    value: ``optgen.core.hyper.busy_hypers``); then compare the parameters and every
    state (tensor and scalar): the largest error relative to max(1, the array's largest
    |reference value|) and where it is. The variants of those dtypes are built first."""
    import optgen
    user_flags, results = sorted(art.flags), []
    art.ensure([v for v, d in art.variants.items() if d["param_dtype"] in art.dtypes])
    for dtype, bits, setting in itertools.product(
            art.dtypes, itertools.product([False, True], repeat=len(user_flags)),
            ("default", "busy")):
        flags = dict(zip(user_flags, bits))
        hyper = hyper_rules.busy_hypers(art, flags) if setting == "busy" else flags
        rng = np.random.default_rng(seed)
        params = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
        try:
            twins = [optgen.create(art, [p.copy() for p in params], backend=b, **hyper)
                     for b in ("compiled", "reference")]
        except ValueError as e:      # a requirement rules this combination out
            results.append(CheckResult(dtype, setting, flags, 0.0, 0.0, skipped=str(e),
                                       hyper=dict(hyper)))
            continue
        for _ in range(STEPS):
            grads = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
            extra = {n: [rng.standard_normal(s).astype(dtype) for s in SHAPES]
                     for n in art.inputs}
            extra.update(random_statistics(twins[0], rng))
            for opt in twins:
                opt.step([g.copy() for g in grads],
                         **{n: [None if a is None else a.copy() for a in v]
                            for n, v in extra.items()})
        results.append(compare(twins[0], twins[1], dtype, setting, flags, dict(hyper)))
    return results


def compare(got, want, dtype: str, setting: str, flags: dict[str, bool],
            hyper: dict[str, Any]) -> CheckResult:
    """The parameters and every state of optimizer ``got`` against ``want``'s."""
    pairs = [(PARAM, a, b) for a, b in zip(got.params, want.params)]
    for sg, sw in zip(got.state, want.state):   # (a state one side lacks: inf)
        pairs += [(n, sg.get(n), sw.get(n)) for n in sorted({*sg, *sw})]
    errors: dict[str, float] = {}
    absolute: dict[str, float] = {}
    nonfinite = 0
    for name, a, b in pairs:
        err_abs, err_rel, bad = _error(a, b)
        nonfinite += bad
        absolute[name] = max(absolute.get(name, 0.0), err_abs)
        errors[name] = max(errors.get(name, 0.0), err_rel)
    worst = max(errors, key=lambda n: errors[n], default=PARAM)
    if errors.get(PARAM, 0.0) == errors.get(worst, 0.0):
        worst = PARAM                # (ties: the parameters)
    return CheckResult(dtype, setting, flags, absolute.get(worst, 0.0),
                       errors.get(worst, 0.0), nonfinite=nonfinite, worst=worst,
                       errors=errors, hyper=hyper)


def _error(got: Any, want: Any) -> tuple[float, float, int]:
    """(largest absolute error, largest relative to max(1, max|want|), NaN/inf
    elements of ``want``) of one array or scalar; inf where ``got`` has NaN/inf where
    ``want`` has none (or another inf)."""
    if got is None or want is None:
        return math.inf, math.inf, 0
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    nonfinite = int(np.count_nonzero(~np.isfinite(want)))
    if got.shape != want.shape or not np.array_equal(np.isnan(got), np.isnan(want)) or \
            not np.array_equal(got[np.isinf(want)], want[np.isinf(want)]):
        return math.inf, math.inf, nonfinite
    finite = np.isfinite(want)
    err = np.abs(got[finite] - want[finite])
    if not err.size:
        return 0.0, 0.0, nonfinite
    scale = max(1.0, float(np.max(np.abs(want[finite]), initial=0.0)))
    return float(err.max()), float(err.max()) / scale, nonfinite


# -- bench ------------------------------------------------------------------------------
@dataclass
class BenchResult:
    spec: str
    dtype: str
    sizes: list[int]               # parameter tensor sizes (elements)
    threads: int
    step: Contender                # the whole Python step, opt.step(grads)
    anchors: dict[str, Contender]  # copy, triad, axpy on the same element count

    @property
    def limit(self) -> float:
        """The bandwidth limit (bytes/s): the best of the anchors' best rates."""
        return max(a.bytes / a.best for a in self.anchors.values())

    @property
    def fraction(self) -> float:
        """The step's achieved bandwidth (at its median) over the limit."""
        return self.step.bytes / self.step.median / self.limit


def _split(n: int, tensors: int) -> list[int]:
    q, r = divmod(n, tensors)
    return [q + (i < r) for i in range(tensors)]


def _moved(opt, grads: list, inputs: dict[str, list]) -> int:
    """Bytes a step must move: read every parameter, gradient, input and state array,
    write back every parameter and state array (scalar states are not counted)."""
    arrays = 2 * sum(p.nbytes for p in opt.params) + sum(g.nbytes for g in grads)
    arrays += sum(a.nbytes for v in inputs.values() for a in v)
    for st in opt.state:
        arrays += 2 * sum(a.nbytes for a in st.values() if isinstance(a, np.ndarray)
                          and a.ndim > 0)
    return arrays


def bench(art: Artifact, n: int = 10_000_000, dtype: str = "float32", tensors: int = 1,
          reps: int = 20, seed: int = 0, flat: bool = False, **hyper) -> BenchResult:
    """Time ``reps`` steps of ``art`` on ``n`` parameters (split into ``tensors`` numpy
    arrays of plain numpy alignment) and the bandwidth anchors on ``n`` elements,
    interleaved by ``optgen.benchmark.interleave``: rep r times every contender once,
    starting at contender r mod k, after one warm-up call each. ``flat``: parameters
    and gradients each in one buffer (``optgen.flatten``), so an elementwise rule steps
    them with one call. ``hyper`` goes to the optimizer."""
    import optgen
    from optgen.compiler import anchors
    from optgen.runtime.threads import get_num_threads
    if dtype not in art.dtypes or dtype not in anchors.DTYPES:
        raise ValueError(f"bench: dtype {dtype!r} is not one of "
                         f"{', '.join(d for d in art.dtypes if d in anchors.DTYPES)}")
    if n < 1 or tensors < 1 or tensors > n or reps < 1:
        raise ValueError(f"bench: need n >= tensors >= 1 and reps >= 1 (n={n}, "
                         f"tensors={tensors}, reps={reps})")
    rng = np.random.default_rng(seed)
    sizes = _split(n, tensors)
    params = [rng.standard_normal(s, dtype=np.float64).astype(dtype) for s in sizes]
    # |g| in [0.1, 1): no zero denominators or sign(0) ties to make a spec's step atypical
    grads = [(np.sign(rng.standard_normal(s)) * rng.uniform(0.1, 1, s)).astype(dtype)
             for s in sizes]
    if flat:
        params, grads = optgen.flatten(params), optgen.flatten(grads)
    inputs = {name: [0.5 * g for g in grads] for name in art.inputs}
    opt = optgen.create(art, params, **hyper)
    opt.step(grads, **inputs)                 # warm-up: states allocated, handles cached
    step = Contender(f"{art.name} step", lambda: opt.step(grads, **inputs),
                     _moved(opt, grads, inputs))

    kernels = anchors.functions(dtype)
    a, b, c = (np.full(n, v, dtype=dtype) for v in (1.0, 2.0, 0.5))
    s = np.array([1e-3], dtype=dtype)
    arrays = {"a": a, "b": b, "c": c}
    rows = {}
    for name, (buffers, _, _) in anchors.KERNELS.items():
        fn, args = kernels[name], [arrays[x] for x in buffers] + [s]
        rows[name] = Contender(name, lambda fn=fn, args=args: fn(*args),
                               anchors.stream_bytes(name, dtype) * n)
    interleave([step, *rows.values()], reps, warmup=1)
    return BenchResult(art.name, dtype, sizes, get_num_threads(), step, rows)


# -- cache -------------------------------------------------------------------------------
@dataclass
class CacheEntry:
    name: str          # the folder name
    spec: str          # the optimizer's name, or "?" for a folder without a readable manifest
    target: str
    bytes: int


def _size(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            fp = os.path.join(dirpath, f)
            if not os.path.islink(fp):
                total += os.path.getsize(fp)
    return total


def cache_entries(sizes: bool = True) -> list[CacheEntry]:
    """The artifact folders in the cache; ``sizes=False`` skips walking their files
    (``bytes`` is then 0)."""
    root = cache.cache_dir()
    if not os.path.isdir(root):
        return []
    out = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name.startswith(".") or not os.path.isdir(path):
            continue
        try:
            with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
                m = json.load(f)
            spec, target = str(m.get("name", "?")), str(m.get("target", "?"))
        except (OSError, ValueError):
            spec, target = "?", "?"
        out.append(CacheEntry(name, spec, target, _size(path) if sizes else 0))
    return out


def clean_cache() -> tuple[int, int, int]:
    """Remove every artifact (and leftover) in the cache but those a build is writing:
    each is removed while holding its artifact's build lock, taken without waiting: a
    running build keeps its folders and lock file. (folders removed, bytes freed,
    folders kept for a running build)."""
    from optgen.compiler import pipeline     # (the build lock's protocol; no TVM import)
    root = cache.cache_dir()
    if not os.path.isdir(root):
        return 0, 0, 0
    count = freed = busy = 0
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if not os.path.isdir(path) or os.path.islink(path):
            continue
        leftover = pipeline._LEFTOVER.fullmatch(name)
        owner = leftover.group(1) if leftover else None if name.startswith(".") else name
        lock = os.path.join(root, f"{owner}.lock") if owner else None
        try:
            fd = pipeline._lock(lock, wait=False) if lock else None
        except OSError:        # (a lock file this user cannot open: not provably idle)
            fd = None
        if lock and fd is None:
            busy += 1
            continue
        try:
            freed += _size(path)
            shutil.rmtree(path, ignore_errors=True)
            count += 1
        finally:
            if fd is not None:
                pipeline._unlock(lock, fd)
    return count, freed, busy


def human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"

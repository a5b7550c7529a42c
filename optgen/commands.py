"""What the ``optgen show``, ``check`` and ``cache`` commands compute, apart from the CLI
(optgen/cli.py prints it).

- ``stage_text``: a spec's pipeline stages as text (spec source, IR, TVMScript, kernel
  source) read back from its artifact;
- ``check`` (optgen/checking.py): every (dtype, flags) kernel of a spec stepped side by
  side with the reference interpreter on random data; the largest error of the
  parameters and of every state against the tolerance, and where it is;
- ``bench``: one spec's step time and achieved bandwidth next to the memory-bandwidth
  anchors (copy, triad, axpy) on this CPU;
- ``cache_entries`` / ``clean_cache``: what the artifact cache holds.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass

import numpy as np

from optgen.benchmark import Contender, interleave
from optgen.checking import (PARAM, SHAPES, STEPS, TOLERANCE, CheckResult,  # noqa: F401
                             check, check_each, compare, describe,   # (check's home:
                             random_statistics)                      # optgen/checking.py)
from optgen.runtime.artifact import Artifact, Variant
from optgen.core import cache

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

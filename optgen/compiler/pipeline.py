"""The compiler pipeline, one visible stage per line of ``build``:

    load -> verify -> IR (specialize) -> lower -> schedule (CPU or GPU family)
         -> build (TVM) [-> device ABI (GPU targets) -> nvcc (cuda)] -> write artifact

``OPTGEN_DEBUG=1`` prints what each stage produced to stderr.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..errors import BuildError, SpecError
from optgen.runtime import cache
from optgen.runtime.artifact import Artifact, ArtifactError, runtime_files, warn_rebuild
from . import abi, nvcc, schedule_gpu, schedule_llvm, targets, tvm_backend
from .loader import load_spec
from .lower import DTYPE_TAG, LoweredKernel, lower
from .schedule_llvm import RED_SCALAR_SIZE
from .specialize import MASTER_DTYPE, MIXED_DTYPES, KernelIR, specialize
from .templates import render
from .verify import verify

DTYPES = ("float32", "float64")   # plain kernels: parameter, states and compute in one dtype
TARGETS = tuple(targets.TARGETS)
BUILD_COUNT = 0  # compilations this process ran (cache hits excluded); tests read it


@dataclass
class BuildResult:
    path: str
    cache_hit: bool
    seconds: float
    name: str


def _debug(stage: str, text: str) -> None:
    if os.environ.get("OPTGEN_DEBUG"):
        print(f"--- optgen: after {stage} ---\n{text}", file=sys.stderr)


def symbol_for(name: str, param_dtype: str, flags: dict[str, bool]) -> str:
    return "_".join([name, DTYPE_TAG[param_dtype], *(f for f, on in flags.items() if on)])


def variants(kirs: list[KernelIR], dtypes: tuple[str, ...] = DTYPES
             ) -> list[tuple[KernelIR, str, str]]:
    """(IR, compute dtype, parameter dtype) of every kernel: a plain IR compiles once per
    ``dtypes``, a mixed-precision IR once, in float32 (MASTER_DTYPE)."""
    return [(kir, dt, kir.param_dtype or dt) for kir in kirs
            for dt in ((MASTER_DTYPE,) if kir.param_dtype else dtypes)]


def kernel_irs(spec, traces, tg: targets.Target) -> list[KernelIR]:
    """The IRs a target gets: every flag combination, plain and in each mixed dtype the
    target has; without float16 on the target, no IR that stores float16; without
    64-bit integers, no row-sparse variant."""
    if tg.name != "llvm":
        matrix = next((tr for tr in traces if tr.matrix), None)
        if matrix is not None:
            raise BuildError(f"{spec.name} uses matrix products (flags {matrix.flags}), which "
                             f"optgen compiles for the llvm target only so far, not {tg.name}")
    kirs = [specialize(spec, tr, low, merge=tg.family == "cpu") for tr in traces
            for low in (None, *(() if tr.matrix else tg.mixed))]
    kirs = [k for k in kirs if tg.half_states or "float16" not in k.storage.values()]
    if not tg.lazy:
        for k in kirs:
            k.lazy = None
    return kirs


def schedule(k: LoweredKernel, tg: targets.Target) -> tuple[str, list | None]:
    """Stage 5 for a target: TVMScript text, and the device kernels' grids (GPU)."""
    if tg.family == "gpu":
        return schedule_gpu.schedule(k, tg.acc_dtype)
    # the C target gets scalar loops: TVM's C codegen cannot print vector sqrt, and gcc
    # vectorizes the scalar loops itself (tvm-notes §8)
    return schedule_llvm.schedule(k, vector=tg.name == "llvm"), None


def build(spec_path: str, target: str = "llvm", *, out: str | None = None,
          force: bool = False, base: str | None = None, arch: str | None = None) -> BuildResult:
    """Build (or find in the cache) the artifact of a spec file for ``target``; ``base``
    picks the base optimizer of a wrapper spec (LARS); ``arch`` the CUDA architectures
    nvcc compiles for (default sm_80,sm_90)."""
    start = time.perf_counter()
    tg = targets.get(target)
    archs = targets.parse_archs(arch) if target == "cuda" else ()
    if arch is not None and target != "cuda":
        raise ValueError(f"--arch applies to the cuda target only, not {target!r}")
    if target == "rocm" and targets.rocm_path() is None:
        raise BuildError("target rocm needs a ROCm toolchain (device libraries and ld.lld): "
                         "none found in $ROCM_PATH, /opt/rocm or next to hipcc on PATH")
    with open(spec_path, encoding="utf-8") as f:
        source = f.read()
    key = cache.artifact_key(source, cache.target_key(target, archs), base)
    if out is not None:
        dest = os.path.join(os.path.abspath(out),
                            cache.artifact_dirname(spec_path, target, None, base))
    else:
        dest = os.path.join(cache.cache_dir(),
                            cache.artifact_dirname(spec_path, target, key, base))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with _locked(dest + ".lock"):                    # one builder per artifact at a time
        if not force and _is_current(dest, key):
            return BuildResult(dest, True, time.perf_counter() - start, _name_of(dest))
        _remove_leftovers(dest)
        spec, kirs, lowered, scheduled = front_end(spec_path, tg, base)  # 1-5
        same = _same_functions(scheduled) if tg.family != "gpu" else {}
        scripts = {sym: text for sym, (text, _) in scheduled.items() if sym not in same}
        funcs = {sym: tvm_backend.parse_tvmscript(text, sym) for sym, text in scripts.items()}
        tmp = tempfile.mkdtemp(prefix=f".build-{os.path.basename(dest)}.",
                               dir=os.path.dirname(dest))
        try:
            with ThreadPoolExecutor(max_workers=1) as native:
                def start_nvcc(src: dict[str, str]):                 # 6c, during the export
                    return native.submit(nvcc.compile_all, src["cuda"], archs, tmp) \
                        if archs else None
                sources, nvcc_done = tvm_backend.build_library(       # 6 build
                    funcs, tvm_backend.target_for(target, archs[0] if archs else None),
                    os.path.join(tmp, "kernels.so"), then=start_nvcc)
                binaries = nvcc_done.result() if nvcc_done is not None else {}
            device = None
            if tg.family == "gpu":                                   # 6b device ABI
                device = abi.device_kernels(target, sources, lowered,
                                            {s: g for s, (_, g) in scheduled.items()})
            _write_artifact(tmp, spec, kirs, scripts, sources, key, target,
                            time.perf_counter() - start, tg, archs, device, binaries,
                            base, same)                              # 7 write
            _publish(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    global BUILD_COUNT
    BUILD_COUNT += 1
    return BuildResult(dest, False, time.perf_counter() - start, spec.name)


def front_end(spec_path: str, tg: targets.Target, base: str | None = None):
    """Stages 1-5, which need no TVM: the spec, its kernel IRs, the lowered passes and
    each pass's TVMScript text (and GPU grids) by symbol."""
    spec = load_spec(spec_path, base)                                # 1 load
    traces = verify(spec)                                            # 2 verify
    kirs = kernel_irs(spec, traces, tg)                              # 3 IR
    _debug("specialize", "\n".join(json.dumps(k.to_json(), indent=1) for k in kirs))
    lowered = [k for kir, dt, pdt in variants(kirs, tg.dtypes)        # 4 lower
               for k in lower(kir, dt, symbol_for(spec.name, pdt, kir.flags), tg.acc_dtype,
                              RED_SCALAR_SIZE if tg.family == "cpu" else None)]
    scheduled = {k.symbol: schedule(k, tg) for k in lowered}          # 5 schedule
    _debug("schedule", "\n\n".join(text for text, _ in scheduled.values()))
    return spec, kirs, lowered, scheduled


def _same_functions(scheduled: dict[str, tuple[str, list | None]]) -> dict[str, str]:
    """symbol -> an earlier symbol whose function is the same text but for its name.
    Flag combinations share many passes (every matmul of a matrix rule, a fallback rule
    under flags it ignores): each is compiled once and the launches name the first."""
    first: dict[str, str] = {}
    out = {}
    for sym, (text, _) in scheduled.items():
        canonical = text.replace(f"def {sym}(", "def _(").replace(f'"{sym}"', '"_"')
        out[sym] = first.setdefault(canonical, sym)
    return {s: f for s, f in out.items() if s != f}


def _is_current(dest: str, key: str) -> bool:
    """Whether ``dest`` holds the verified artifact of ``key``. One that exists but fails
    verification (corrupted, truncated, another optgen/TVM version) is reported with an
    ArtifactWarning and rebuilt, as is a cached one whose key is wrong; one of another
    key under --out (an edited spec) is rebuilt silently."""
    if not os.path.lexists(dest):
        return False
    try:
        found = Artifact.load(dest).key
    except ArtifactError as e:
        warn_rebuild(dest, e.problem)
        return False
    if found != key and os.path.dirname(dest) == cache.cache_dir():  # named by its key
        warn_rebuild(dest, f"its manifest's key {found[:16]}... is not {key[:16]}...")
    return found == key


# -- publishing -----------------------------------------------------------------------
# A build writes into a temporary folder beside dest (".build-<dest name>.<8 random>") and
# renames it into place, under an exclusive lock on "<dest>.lock": readers, which take no
# lock, see either no dest, the old one or the complete new one, never a partial folder
# (and a manifest.json only beside the files it records). Replacing a dest swaps the two
# folders in one rename (renameat2 RENAME_EXCHANGE, Linux) or, where that is missing,
# renames the old one aside first (dest is then briefly absent, never partial).
LEFTOVER_AGE_S = 3600  # another artifact's temporary folder older than this is abandoned
_LEFTOVER = re.compile(r"\.(?:build|old)-(?:.+\.)?[a-z0-9_]{8}")


@contextlib.contextmanager
def _locked(path: str):
    """An exclusive flock on ``path``, removed again on release so lock files do not
    pile up. A waiter that wakes on a lock file that was removed (or replaced) meanwhile
    retries on the current one, so two holders never coexist."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            current = os.stat(path) if os.path.exists(path) else None
        except BaseException:
            os.close(fd)
            raise
        if current is not None and (held.st_dev, held.st_ino) == (current.st_dev,
                                                                  current.st_ino):
            break
        os.close(fd)      # the holder before us removed this lock file: lock the new one
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)   # still holding the lock: waiters notice and retry
        os.close(fd)


def _rmtree(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _remove_leftovers(dest: str) -> None:
    """Temporary folders a killed build left: dest's own (safe, we hold its lock), and in
    the cache folder any other artifact's older than LEFTOVER_AGE_S (no live build is
    that old). A leftover is harmless meanwhile: readers never look at dot-folders."""
    parent, name = os.path.split(dest)
    own = re.compile(rf"\.(?:build|old)-{re.escape(name)}\.[a-z0-9_]{{8}}")
    sweep = parent == cache.cache_dir()
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for e in entries:
            if own.fullmatch(e.name):
                _rmtree(e.path)
            elif sweep and _LEFTOVER.fullmatch(e.name):
                with contextlib.suppress(OSError):
                    if now - e.stat(follow_symlinks=False).st_mtime > LEFTOVER_AGE_S:
                        _rmtree(e.path)


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False if unsupported."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None) \
        if sys.platform.startswith("linux") else None
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def _publish(tmp: str, dest: str) -> None:
    """Move the complete folder ``tmp`` to ``dest`` (caller holds dest's lock), readable
    as the umask allows (mkdtemp made it 0700)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    if not os.path.lexists(dest):
        os.rename(tmp, dest)
    elif _exchange(tmp, dest):
        _rmtree(tmp)                         # now the old artifact
    else:
        aside = tempfile.mkdtemp(prefix=f".old-{os.path.basename(dest)}.",
                                 dir=os.path.dirname(dest))
        os.rename(dest, os.path.join(aside, "old"))
        os.rename(tmp, dest)
        _rmtree(aside)


def _name_of(dest: str) -> str:
    with open(os.path.join(dest, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)["name"]


def _target_detail(tg: targets.Target, archs: tuple[str, ...]) -> dict:
    if tg.name == "llvm":
        return {"kind": "llvm", "mcpu": tvm_backend.host_cpu(), "machine": cache.machine()}
    if tg.name == "c":
        return {"kind": "c", "cc": os.environ.get("CC", "gcc"),
                "options": tvm_backend.C_OPTIONS}
    detail = {"kind": tg.name, "threads_per_block": schedule_gpu.THREADS}
    if archs:
        detail.update(archs=list(archs), nvcc=nvcc.version())
    return detail


def _write_artifact(folder: str, spec, kirs: list[KernelIR], scripts: dict[str, str],
                    sources: dict[str, str], key: str, target: str, seconds: float,
                    tg: targets.Target, archs: tuple[str, ...], device: dict | None,
                    binaries: dict[str, str], base: str | None = None,
                    same: dict[str, str] | None = None) -> None:
    import optgen
    kernels = []
    for kir, dt, pdt in variants(kirs, tg.dtypes):
        sym = symbol_for(spec.name, pdt, kir.flags)
        entry = {"symbol": sym, "dtype": dt, "param_dtype": pdt, **kir.to_json()}
        multi = len(entry["launches"]) > 1
        seg = tg.family == "cpu" and kir.segmentable
        for j, ln in enumerate(entry["launches"]):
            if ln["kind"] != "repeat":
                own = f"{sym}_p{j}" if multi else sym
                ln["symbol"] = (same or {}).get(own, own)
                if seg:       # the same pass over a flat run of tensors (lower, "_seg")
                    ln["seg_symbol"] = (same or {}).get(f"{own}_seg", f"{own}_seg")
        if entry["lazy"] is not None:
            entry["lazy"]["symbol"] = (same or {}).get(f"{sym}_lazy", f"{sym}_lazy")
        kernels.append(entry)
    hypers = [h.info for h in spec.hypers.values()]
    manifest = {
        "format": cache.FORMAT, "name": spec.name, "doc": spec.doc, "reference": spec.reference,
        "spec_file": os.path.basename(spec.file), "base": base, "key": key, "target": target,
        "target_detail": _target_detail(tg, archs),
        "optgen_version": optgen.__version__, "tvm_version": cache.tvm_version(),
        "hyperparameters": [h.to_json() for h in hypers],
        "requirements": [r.to_json() for r, _ in spec.requirements],
        "states": [{"name": s.name, "init": s.init, "shape": s.shape, "doc": s.doc,
                    "when": s.when, "half_when": s.half_when} for s in spec.states.values()],
        "shape_flags": {n: {"rule": r, "doc": d} for n, (r, d) in spec.shape_flags.items()},
        "name_flags": {n: {"exclude": list(x), "doc": d} for n, (x, d) in spec.name_flags.items()},
        "inputs": spec.inputs,
        "statistics": {n: {"shape": shape, "doc": doc}
                       for n, (shape, doc) in spec.statistics.items()},
        "accepted": spec.accepted,
        "lazy_update_default": spec.lazy_update_default,
        "reduction_buffer_size": RED_SCALAR_SIZE,
        "reduction_dtype": tg.acc_dtype,
        "abi": "each kernel runs its 'launches' in order; a launch is kernel(*buffers, "
               "scalars): buffers are contiguous arrays, updated in place except grad, viewed "
               "flat (n,) or as [B, R, C] (B = prod(shape[:-2]), R = shape[-2], C = "
               "shape[-1]; [1, 1, n] below 2-D) with row states [B, R] and column states "
               "[B, C]; '_red<k>' buffers are float64 workspaces (per-parameter values have "
               "reduction_buffer_size elements); scalars is one 1-D array of the kernel "
               "dtype holding the values named by 'scalars', in that order; a buffer named "
               "in 'storage' has the dtype given there (read through a cast to the kernel "
               "dtype, rounded to nearest even on store). A matrix rule's launches (view 'matrix') pass "
               "2-D arrays: the parameter (R, C), 'rr'/'cc' states (R, R)/(C, C), "
               "temporaries '_tmp<k>' and loop buffers '_loop<k>' of the shape their "
               "buffer_axes names (kernel dtype); a 'repeat' launch runs the next 'length' "
               "launches 'count' times (a hyperparameter); 'refresh' rules run on the host. "
               "A 'reduce' launch fills its 'red' buffer and those of 'also', and stores "
               "its 'outputs' (states that later launches read back). A launch's 'seg_symbol' "
               "is the same pass over a run of parameters whose buffers lie back to back: "
               "kernel(*buffers, _seg, scalars) with _seg the int64 offsets of the run's "
               "tensors (len = tensors + 1) and each '_red' buffer holding one reduction "
               "buffer per tensor. "
               "A kernel whose param_dtype "
               "(float16, bfloat16) differs from its dtype (float32) is mixed precision: w "
               "is the float32 master, 'w_low' (written, never read) receives the new w "
               "rounded to param_dtype, and grad and the extra inputs are param_dtype",
        "library": "kernels.so", "wrapper": f"{spec.name}_optimizer.py",
        "sources": {"tvmscript": "kernels.tvmscript.py",
                    **{k: f"kernels.{SOURCE_SUFFIX.get(k, k)}" for k in sources}},
        "binaries": binaries,
        "kernels": kernels, "build_seconds": round(seconds, 3),
    }
    if device is not None:
        manifest["device_abi"] = abi.DOC
        manifest["device_kernels"] = device
    files = {
        "kernels.tvmscript.py": "# TVMScript generated by optgen; one PrimFunc per kernel\n"
                                "from tvm.script import tirx as T\n\n\n"
                                + "\n\n".join(scripts.values()),
        "spec.py": spec.source,
        manifest["wrapper"]: render_wrapper(spec, hypers),
        **{f"kernels.{SOURCE_SUFFIX.get(k, k)}": text for k, text in sources.items()},
    }
    for name, text in files.items():
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(text)
    # what the runtime reads, with size and sha256: Artifact.load verifies them
    manifest["files"] = {n: cache.file_record(os.path.join(folder, n))
                         for n in runtime_files(manifest)}
    with open(os.path.join(folder, "manifest.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(manifest, indent=1))  # last: its presence marks completeness


SOURCE_SUFFIX = {"cuda": "cu", "opencl": "cl", "webgpu": "wgsl"}  # module kind -> file suffix


def class_name(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def render_wrapper(spec, hypers) -> str:
    def annotation(h):
        base = {"float": "float", "int": "int", "bool": "bool"}[h.type]
        return f"{base} | None" if h.optional else base
    return render("wrapper.py.j2", spec=spec, cls=class_name(spec.name), hypers=hypers, pyrepr=repr,
                  annotation=annotation)


__all__ = ["BUILD_COUNT", "BuildResult", "DTYPES", "MIXED_DTYPES", "SpecError", "build"]

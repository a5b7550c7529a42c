"""The compiler pipeline, one visible stage per line of ``build``:

    load -> verify -> IR (specialize) -> lower -> schedule (CPU or GPU family)
         -> build (TVM) [-> device ABI (GPU targets) -> nvcc (cuda)] -> write artifact

``OPTGEN_DEBUG=1`` prints what each stage produced to stderr.

Each stage is a module of optgen.compiler (its docstring lists them); ``variants`` says
which kernels a target gets and ``manifest`` writes the artifact's files. This module
runs the stages (``front_end`` for 1-5, which need no TVM; ``build`` for all) and
publishes the artifact: a temporary folder renamed into place under a file lock.
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
from optgen.core import formats
from optgen.runtime.artifact import Artifact, ArtifactError
from optgen.runtime.manifest import warn_rebuild
from . import abi, schedule_gpu, schedule_llvm, targets, tvm_backend
from .loader import load_spec
from .lower import LoweredKernel, lower
from .manifest import name_of, write_artifact
from .manifest import class_name, render_wrapper  # noqa: F401 (their old home)
from .schedule_llvm import RED_SCALAR_SIZE
from .specialize import MIXED_DTYPES
from .variants import DTYPES, kernel_irs, symbol_for, variants
from .verify import verify

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


def schedule(k: LoweredKernel, tg: targets.Target) -> tuple[str, list | None]:
    """Stage 5 for a target: TVMScript text, and the device kernels' grids (GPU)."""
    if tg.family == "gpu":
        return schedule_gpu.schedule(k, tg.acc_dtype)
    # a target without vector (C) gets scalar loops (targets/c.py says why)
    return schedule_llvm.schedule(k, vector=tg.vector), None


def build(spec_path: str, target: str = "llvm", *, out: str | None = None,
          force: bool = False, base: str | None = None, arch: str | None = None,
          state_format=None) -> BuildResult:
    """Build (or find in the cache) the artifact of a spec file for ``target``; ``base``
    picks the base optimizer of a wrapper spec (LARS); ``arch`` the CUDA architectures
    nvcc compiles for (default sm_80,sm_90); ``state_format`` adds the kernels that
    store states in a format (optgen.core.formats) beside the plain ones."""
    start = time.perf_counter()
    tg = targets.get(target)
    archs = targets.archs_for(tg, arch)
    tg.check_toolchain()
    with open(spec_path, encoding="utf-8") as f:
        source = f.read()
    req = formats.request("optgen build", state_format)
    fmt = formats.key(req)
    key = cache.artifact_key(source, tg.key(archs), base, fmt)
    if out is not None:
        dest = os.path.join(os.path.abspath(out),
                            cache.artifact_dirname(spec_path, target, None, base, fmt))
    else:
        dest = os.path.join(cache.cache_dir(),
                            cache.artifact_dirname(spec_path, target, key, base, fmt))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with _locked(dest + ".lock"):                    # one builder per artifact at a time
        if not force and _is_current(dest, key):
            return BuildResult(dest, True, time.perf_counter() - start, name_of(dest))
        _remove_leftovers(dest)
        spec, kirs, lowered, scheduled = front_end(spec_path, tg, base, req)  # 1-5
        same = _same_functions(scheduled) if tg.family != "gpu" else {}
        scripts = {sym: text for sym, (text, _) in scheduled.items() if sym not in same}
        funcs = {sym: tvm_backend.parse_tvmscript(text, sym) for sym, text in scripts.items()}
        tmp = tempfile.mkdtemp(prefix=f".build-{os.path.basename(dest)}.",
                               dir=os.path.dirname(dest))
        try:
            with ThreadPoolExecutor(max_workers=1) as native:
                def start_native(src: dict[str, str]):     # 6c (nvcc), during the export
                    return native.submit(tg.compile_native, src, archs, tmp)
                sources, native_done = tvm_backend.build_library(     # 6 build
                    funcs, tvm_backend.target_for(target, archs[0] if archs else None),
                    os.path.join(tmp, "kernels.so"), then=start_native)
                binaries = native_done.result()
            device = None
            if tg.family == "gpu":                                   # 6b device ABI
                device = abi.device_kernels(tg, tg.signatures(sources, tmp), lowered,
                                            {s: g for s, (_, g) in scheduled.items()})
            write_artifact(tmp, spec, kirs, scripts, sources, key, target,
                           time.perf_counter() - start, tg, archs, device, binaries,
                           base, same, state_format=req)             # 7 write
            _publish(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    global BUILD_COUNT
    BUILD_COUNT += 1
    return BuildResult(dest, False, time.perf_counter() - start, spec.name)


def front_end(spec_path: str, tg: targets.Target, base: str | None = None,
              state_format=None):
    """Stages 1-5, which need no TVM: the spec, its kernel IRs, the lowered passes and
    each pass's TVMScript text (and GPU grids) by symbol."""
    spec = load_spec(spec_path, base)                                # 1 load
    traces = verify(spec)                                            # 2 verify
    kirs = kernel_irs(spec, traces, tg, state_format)                # 3 IR
    _debug("specialize", "\n".join(json.dumps(k.to_json(), indent=1) for k in kirs))
    lowered = [k for kir, dt, pdt in variants(kirs, tg.dtypes)        # 4 lower
               for k in lower(kir, dt, symbol_for(spec.name, pdt, kir.flags, kir.state_format),
                              tg.acc_dtype,
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


__all__ = ["BUILD_COUNT", "BuildResult", "DTYPES", "MIXED_DTYPES", "SpecError", "build"]

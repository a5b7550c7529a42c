"""The compiler pipeline, one visible stage per line of ``build`` and ``_build_variants``:

    load -> verify -> IR (specialize) -> lower -> schedule (CPU or GPU family)
         -> build (TVM) [-> device ABI (GPU targets) -> nvcc (cuda)] -> write artifact

``OPTGEN_DEBUG=1`` prints what each stage produced to stderr.

Each stage is a module of optgen.compiler (its docstring lists them). Stages 1-5 need no
TVM and make the build plan (optgen.compiler.plan: per kernel and per pass its symbol,
TVMScript, grids, shape variables and buffers), which the later stages read: the TVM
build, the device ABI (``abi``) and the artifact's files (``manifest``).

An artifact is a folder: its manifest (every kernel of every variant, written from the
plan, no TVM) and one folder per *variant* (a parameter dtype and flag values: its
library, built by TVM and nvcc when first asked for). ``build`` publishes the artifact
and then the variants asked for (compiled together, into one library their folders
hold), each a temporary folder renamed into place under the artifact's file lock.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Sequence

from ..errors import BuildError, SpecError
from optgen.core import cache, filelocks, formats, progress
from optgen.core.manifest import (ArtifactError, VariantNotBuilt, load_variant, load_verified,
                                  warn_rebuild)
from . import abi, targets, tvm_backend
from .write_artifact import write_artifact, write_sources, write_variant
from .write_artifact import class_name, render_wrapper  # noqa: F401 (their old home)
from .plan import BuildPlan, make_plan, schedule  # noqa: F401 (schedule: its old home)
from .schedule_llvm import RED_SCALAR_SIZE  # noqa: F401 (tests read it)
from .specialize import MIXED_DTYPES
from .variants import DTYPES, kernel_irs, symbol_for, variants  # noqa: F401 (tests read them)

TARGETS = tuple(targets.TARGETS)
BUILD_COUNT = 0  # artifacts and variant libraries this process built (cache hits
#                  excluded); tests read it


@dataclass
class BuildResult:
    path: str
    cache_hit: bool       # nothing was built: the artifact and the variants were current
    seconds: float
    name: str
    built: list[str] = field(default_factory=list)   # the variants built now
    have: list[str] = field(default_factory=list)    # the variants the artifact holds
    variants: list[str] = field(default_factory=list)   # every variant it can hold


def build(spec_path: str, target: str = "llvm", *, out: str | None = None,
          force: bool = False, base: str | None = None, arch: str | None = None,
          state_format=None, variants: str | Sequence[str] | None = "default"
          ) -> BuildResult:
    """Build (or find in the cache) the artifact of a spec file for ``target`` and its
    ``variants``: "default" (the default flag values, float32: what ``optgen build``
    makes), "all", variant names, or None (none: the runtime builds each on first use).
    ``base`` picks the base optimizer of a wrapper spec (LARS); ``arch`` the CUDA
    architectures nvcc compiles for (default sm_80,sm_90); ``state_format`` adds the
    kernels that store states in a format (optgen.core.formats) beside the plain ones.
    ``force`` rebuilds the artifact and the variants asked for. The variants built here
    are compiled together, into one library their folders share."""
    global BUILD_COUNT
    start = time.perf_counter()
    tg = targets.get(target)
    archs = targets.archs_for(tg, arch)
    tg.check_toolchain()
    with open(spec_path, encoding="utf-8") as f:
        source = f.read()
    req = formats.request("optgen build", state_format)
    fmt = formats.key(req)
    key = cache.artifact_key(source, tg.key(archs), base, fmt,
                             machine_bound=tg.machine_bound)
    if out is not None:
        dest = os.path.join(os.path.abspath(out),
                            cache.artifact_dirname(spec_path, target, None, base, fmt))
    else:
        dest = os.path.join(cache.cache_dir(),
                            cache.artifact_dirname(spec_path, target, key, base, fmt))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with _locked(dest + ".lock"):                    # one builder per artifact at a time
        plan = None
        fresh = force or not _is_current(dest, key)
        if fresh:
            _remove_leftovers(dest)
            plan = _plan(spec_path, tg, base, req, key, force)           # 1-5
            tmp = _temp_folder("build", dest)
            try:
                write_artifact(tmp, plan, key, time.perf_counter() - start, archs)  # 7
                _publish(tmp, dest)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        manifest = load_verified(dest, lambda _, m: m)
        todo = [v for v in _wanted(manifest, variants)
                if force or not _variant_current(dest, manifest, v)]
        if todo:
            if not fresh:
                _remove_leftovers(dest)
            plan = plan or _plan(spec_path, tg, base, req, key, force)   # 1-5
            _build_variants(dest, plan, todo, key, archs)                # 6-7
    BUILD_COUNT += fresh + bool(todo)
    every = list(manifest["variants"])
    return BuildResult(dest, not fresh and not todo, time.perf_counter() - start,
                       manifest["name"], todo,
                       [v for v in every if os.path.isdir(os.path.join(dest, v))], every)


_PLANS: dict[tuple[str, str], BuildPlan] = {}   # the last plan made, by artifact key


def _plan(spec_path: str, tg: targets.Target, base: str | None, req, key: str,
          force: bool) -> BuildPlan:
    """``make_plan``, or the last build's of the same artifact in this process (variants
    built one by one, as ``optgen check`` does, make it once); ``force``: anew."""
    memo = (key, os.path.abspath(spec_path))
    if force or memo not in _PLANS:
        _PLANS.clear()
        _PLANS[memo] = make_plan(spec_path, tg, base, req)
    return _PLANS[memo]


def _wanted(manifest: dict, variants: str | Sequence[str] | None) -> list[str]:
    """The variant names ``build``'s ``variants`` asks for; an unknown one is a ValueError
    naming the artifact's variants."""
    known = manifest["variants"]
    if variants is None:
        return []
    if variants in ("default", "all"):
        return list(manifest["default_variants"] if variants == "default" else known)
    names = [variants] if isinstance(variants, str) else list(variants)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{manifest['name']} for {manifest['target']} has no variant "
                         f"{', '.join(map(repr, unknown))}; its variants: {', '.join(known)}")
    return list(dict.fromkeys(names))


def _build_variants(dest: str, plan: BuildPlan, names: list[str], key: str,
                    archs: tuple[str, ...]) -> None:
    """Stages 6-7 of the variants ``names``: one library of their functions (each once:
    launches of several variants may name one, ``plan.scripts``), its native binaries and
    device ABI, built in a temporary folder inside the artifact; then each variant's
    folder, its files (hard links to the library's) and its record, renamed to
    ``dest/<variant>`` (the caller holds the artifact's lock)."""
    start = time.perf_counter()
    tg = plan.target
    which = f"variant {names[0]}" if len(names) == 1 else \
        f"{len(names)} variants: {', '.join(names[:3])}{', ...' * (len(names) > 3)}"
    progress.stage("compile", which)
    funcs = {sym: tvm_backend.parse_tvmscript(text, sym)
             for sym, text in plan.scripts(names).items()}
    lib = _temp_folder("build", os.path.join(dest, names[0]))
    try:
        with ThreadPoolExecutor(max_workers=1) as native:
            def written(src: dict[str, str]):     # the sources, written once; the
                progress.stage("link", which)      # native step (6c: nvcc) runs
                write_sources(lib, src, tg)        # during export
                return native.submit(tg.compile_native, src, archs, lib)
            sources, native_done = tvm_backend.build_library(     # 6 build
                funcs, tvm_backend.target_for(tg.name, archs[0] if archs else None),
                os.path.join(lib, "kernels.so"), then=written)
            binaries = native_done.result()
        device = None
        if tg.family == "gpu":                                   # 6b device ABI
            device = abi.device_kernels(tg, tg.signatures(sources, lib), [
                p for k in plan.kernels if k.variant in names for p in k.passes])
        records = {f: cache.file_record(os.path.join(lib, f)) for f in os.listdir(lib)}
        for v in names:                                          # 7 write
            own = {p.symbol for k in plan.kernels if k.variant == v for p in k.passes}
            tmp = _temp_folder("build", os.path.join(dest, v))
            try:
                for f in records:
                    _link(os.path.join(lib, f), os.path.join(tmp, f))
                write_variant(tmp, plan, v, sources, key, time.perf_counter() - start,
                              archs, device and {s: e for s, e in device.items() if s in own},
                              binaries, records)
                _publish(tmp, os.path.join(dest, v))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    finally:
        shutil.rmtree(lib, ignore_errors=True)


def _link(src: str, dst: str) -> None:
    """``dst`` is ``src``'s file: a hard link, or a copy where links are not supported."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _variant_current(dest: str, manifest: dict, name: str) -> bool:
    """Whether ``dest`` holds variant ``name`` verified; a broken one is reported with an
    ArtifactWarning and rebuilt."""
    try:
        load_variant(dest, manifest, name)
    except VariantNotBuilt:
        return False
    except ArtifactError as e:
        warn_rebuild(os.path.join(dest, name), e.problem)
        return False
    return True


def front_end(spec_path: str, tg: targets.Target, base: str | None = None,
              state_format=None):
    """Stages 1-5 as the stages' outputs: the spec, its kernel IRs, the lowered passes
    and each pass's TVMScript text (and GPU grids) by symbol (the plan: ``make_plan``;
    products left to the runtime's BLAS have no text)."""
    plan = make_plan(spec_path, tg, base, state_format)
    return (plan.spec, plan.kirs, [p.lowered for p in plan.passes],
            {p.symbol: (p.script, p.grids) for p in plan.passes if not p.library})


def _is_current(dest: str, key: str) -> bool:
    """Whether ``dest`` holds the verified artifact of ``key``. One that exists but fails
    verification (corrupted, truncated, another optgen/TVM version) is reported with an
    ArtifactWarning and rebuilt, as is a cached one whose key is wrong; one of another
    key under --out (an edited spec) is rebuilt silently."""
    if not os.path.lexists(dest):
        return False
    try:
        found = load_verified(os.path.abspath(dest), _key_of)
    except ArtifactError as e:
        warn_rebuild(dest, e.problem)
        return False
    if found != key and os.path.dirname(dest) == cache.cache_dir():  # named by its key
        warn_rebuild(dest, f"its manifest's key {found[:16]}... is not {key[:16]}...")
    return found == key


def _key_of(path: str, manifest: dict) -> str:
    """A verified manifest's key; one without a string key is malformed."""
    if not isinstance(manifest["key"], str):
        raise TypeError(f"'key' is a {type(manifest['key']).__name__}, not a string")
    return manifest["key"]


# -- publishing -----------------------------------------------------------------------
# A build writes into a temporary folder beside dest (".build-<dest name>.k<kernel>-<8
# random>", ``<kernel>`` this kernel's boot: optgen/core/filelocks.py) and renames it into
# place, under an exclusive lock on "<dest>.lock": readers, which take no lock, see
# either no dest, the old one or the complete new one, never a partial folder (and a
# manifest.json only beside the files it records). Replacing a dest swaps the two
# folders in one rename (renameat2 RENAME_EXCHANGE, Linux) or, where that is missing,
# renames the old one aside first (dest is then briefly absent, never partial). Every
# temporary folder of a dest exists only while a builder holds dest's lock: whoever
# holds that lock, where a lock proves it (filelocks.provable), may remove them.
# A variant is published the same way inside its artifact (dest/<variant>, from
# dest/.build-<variant>...), under the artifact's lock too: the artifact is never
# replaced while a variant of it is written, and two processes that want the same
# variant build it once (the second finds it current).
_LEFTOVER = re.compile(r"\.(?:build|old)-(?:(.+)\.)?(?:k([0-9a-f]{8}|unknown)-)?[a-z0-9_]{8}")


def _lock(path: str, wait: bool = True) -> int | None:
    """An open descriptor holding the exclusive flock of lock file ``path`` (created if
    missing); None if ``wait`` is False and another holds it. A waiter that wakes on a
    lock file that was removed (or replaced) meanwhile retries on the current one, so
    two holders never coexist."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                return None
            held = os.fstat(fd)
            try:     # (another holder may unlink it at any moment: no exists-then-stat)
                current = os.stat(path)
            except FileNotFoundError:
                current = None
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        if current is not None and (held.st_dev, held.st_ino) == (current.st_dev,
                                                                  current.st_ino):
            return fd
        os.close(fd)      # the holder before us removed this lock file: lock the new one


def _unlock(path: str, fd: int) -> None:
    """Release ``_lock``'s lock, removing the lock file so lock files do not pile up
    (still holding the lock: waiters notice and retry)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    os.close(fd)


@contextlib.contextmanager
def _locked(path: str):
    """An exclusive flock on ``path`` for the block (``_lock``), removed on release."""
    fd = _lock(path)
    try:
        yield
    finally:
        _unlock(path, fd)


def _temp_folder(kind: str, dest: str) -> str:
    """A new temporary folder (``kind``: build or old) of ``dest``, beside it; only
    made while holding dest's lock."""
    tag = filelocks.kernel_tag() or "unknown"
    return tempfile.mkdtemp(prefix=f".{kind}-{os.path.basename(dest)}.k{tag}-",
                            dir=os.path.dirname(dest))


def _rmtree(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _remove_leftovers(dest: str) -> None:
    """Temporary folders that killed builds left (the caller holds dest's lock): dest's
    own, its variants' (inside it), and in the cache folder any other artifact's whose lock this takes without
    waiting (no build of it runs), where a lock proves it (filelocks.provable: a local
    file system, NFS with shared locks, or a folder of this kernel). A live build's
    folder is never removed; a leftover is harmless meanwhile (readers never look at
    dot-folders)."""
    with contextlib.suppress(OSError), os.scandir(dest) as inner:   # killed variant builds
        for e in inner:                 # (each held dest's lock: none runs now)
            m = _LEFTOVER.fullmatch(e.name)
            if m is not None and filelocks.provable(dest, _tag(m)):
                _rmtree(e.path)
    parent, name = os.path.split(dest)
    sweep = parent == cache.cache_dir()
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for e in entries:
            m = _LEFTOVER.fullmatch(e.name)
            if m is None or m.group(1) is None or (m.group(1) != name and not sweep):
                continue
            if not filelocks.provable(parent, _tag(m)):
                continue
            if m.group(1) == name:
                _rmtree(e.path)
                continue
            lock = os.path.join(parent, m.group(1) + ".lock")
            fd = _lock(lock, wait=False)
            if fd is not None:
                try:
                    _rmtree(e.path)
                finally:
                    _unlock(lock, fd)


def _tag(m: re.Match) -> str | None:
    """The kernel boot tag of a temporary folder's name (``_LEFTOVER``), if it has one."""
    return None if m.group(2) in (None, "unknown") else m.group(2)


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
        aside = _temp_folder("old", dest)
        os.rename(dest, os.path.join(aside, "old"))
        os.rename(tmp, dest)
        _rmtree(aside)


__all__ = ["BUILD_COUNT", "BuildResult", "DTYPES", "MIXED_DTYPES", "SpecError", "build"]

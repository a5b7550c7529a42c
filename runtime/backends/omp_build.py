"""Build, verify and load the OpenMP trampoline of omp_pool.py.

The compiler: ``$OPTGEN_CC`` where it is set (a name on PATH or a path), else the
first of ``cc``, ``gcc``, ``clang`` on PATH. ``$CC`` is not read: a variable set for
some other build must not decide what this process loads. The compiler's identity
(the path it was found at, that path resolved, its ``--version`` output), the flags,
the source and the machine make the key in the library's name, so another compiler or
an upgraded one builds its own library.

What is loaded: ``<cache>/pools/omp_launch-<machine>-<key>.so``, only when the folder
and the file belong to this user and others cannot write them, and the file's sha256
equals the one its sidecar (``.so.json``, written by the build) records. The file is
hashed and then loaded through the same open descriptor (``/proc/self/fd/N``), so what
was checked is what is mapped. A file that fails the check is rebuilt, never loaded.

A build is loaded from its temporary folder and checked for the trampoline's symbols
before it is moved into the cache: a compiler that fails, or writes something that
does not load, leaves nothing behind, and the next process tries again.
Every failure raises ``TrampolineError`` with the reason (omp_pool.py warns with it).
"""
from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile

from optgen.core.cache import cache_dir, machine

CANDIDATES = ("cc", "gcc", "clang")
FLAGS = ("-O2", "-shared", "-fPIC")
SYMBOLS = ("optgen_launch", "optgen_init", "optgen_set_mode", "optgen_set_omp",
           "optgen_set_tvm", "optgen_omp_launches", "optgen_busy")
_NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


class TrampolineError(RuntimeError):
    """The trampoline cannot be built or loaded; the message is the reason."""


@dataclasses.dataclass(frozen=True)
class Compiler:
    path: str       # where it was found (run as such: ccache-style wrappers read argv[0])
    real: str       # that path with links resolved
    version: str    # its ``--version`` output


def find_compiler() -> Compiler:
    """``$OPTGEN_CC``, else the first of cc, gcc, clang on PATH, with its identity."""
    wanted = os.environ.get("OPTGEN_CC", "").strip()
    path = shutil.which(wanted) if wanted else next(
        filter(None, map(shutil.which, CANDIDATES)), None)
    if not path:
        raise TrampolineError(f"OPTGEN_CC={wanted!r} is not an executable file" if wanted
                              else "no C compiler on PATH (looked for cc, gcc, clang; "
                              "OPTGEN_CC names another)")
    path = os.path.abspath(path)
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True,
                             timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        raise TrampolineError(f"{path} --version failed: {e}") from None
    if out.returncode != 0 or not out.stdout.strip():
        raise TrampolineError(f"{path} --version exited with status {out.returncode}"
                              f"{_tail(out.stderr)}")
    return Compiler(path, os.path.realpath(path), out.stdout.strip())


def library_name(source: str, cc: Compiler) -> str:
    """The cached library's file name: a hash of everything that decides its bytes."""
    h = hashlib.sha256()
    for part in (source, cc.path, cc.real, cc.version, " ".join(FLAGS), machine()):
        h.update(part.encode() + b"\0")
    return f"omp_launch-{machine()}-{h.hexdigest()[:24]}.so"


def folder() -> str:
    return os.path.join(cache_dir(), "pools")


def load(source: str) -> tuple[ctypes.CDLL, str]:
    """The trampoline compiled from ``source``, and a note ("" or why the cached file
    was rebuilt). Raises TrampolineError with the reason where it cannot be had."""
    cc = find_compiler()
    where = folder()
    try:
        os.makedirs(where, mode=0o700, exist_ok=True)
        dfd = os.open(where, _NOFOLLOW | os.O_DIRECTORY)
    except OSError as e:
        raise TrampolineError(f"the cache folder {where} cannot be used: {e}") from None
    try:
        bad = _unsafe(os.fstat(dfd), stat.S_ISDIR)
        if bad:
            raise TrampolineError(f"the cache folder {where} is {bad}: not loading from it")
        name = library_name(source, cc)
        lib, note = _cached(dfd, name)
        if lib is None:
            lib = _build(dfd, where, name, source, cc)
        return lib, note and f"{os.path.join(where, name)} {note}: rebuilt"
    finally:
        os.close(dfd)


def _unsafe(st: os.stat_result, kind) -> str:
    """Why a file or folder is not trusted ("" where it is)."""
    if not kind(st.st_mode):
        return "not a regular file or folder"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user ({os.geteuid()})"
    if st.st_mode & 0o022:
        return f"writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def _sha256(fd: int) -> str:
    h = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
    return h.hexdigest()


def _cached(dfd: int, name: str) -> tuple[ctypes.CDLL | None, str]:
    """The verified cached library, else (None, why it was not used: "" if absent)."""
    try:
        fd = os.open(name, _NOFOLLOW, dir_fd=dfd)
    except FileNotFoundError:
        return None, ""
    except OSError as e:
        return None, f"could not be opened ({e})"
    try:
        bad = _unsafe(os.fstat(fd), stat.S_ISREG)
        if bad:
            return None, f"is {bad}"
        recorded = _recorded_sha256(dfd, name + ".json")
        if recorded != _sha256(fd):
            return None, ("does not match the sha256 its build recorded" if recorded
                          else "has no valid record of its build")
        try:
            return _dlopen(fd), ""
        except TrampolineError as e:
            return None, f"did not load ({e})"
    finally:
        os.close(fd)


def _recorded_sha256(dfd: int, sidecar: str) -> str:
    try:
        fd = os.open(sidecar, _NOFOLLOW, dir_fd=dfd)
    except OSError:
        return ""
    try:
        if _unsafe(os.fstat(fd), stat.S_ISREG):
            return ""
        with os.fdopen(os.dup(fd), "rb") as f:
            return str(json.loads(f.read(1 << 16)).get("sha256", ""))
    except (OSError, ValueError, AttributeError):
        return ""
    finally:
        os.close(fd)


_DLOPENED: set[int] = set()   # descriptor numbers this process has dlopen-ed by name


def _dlopen(fd: int) -> ctypes.CDLL:
    """Load the open file itself (not a path someone could swap after the check). The
    loader takes a name it has loaded before for that library, so a descriptor number
    is used once."""
    held, num = [], fd
    try:
        while num in _DLOPENED:
            num = os.dup(fd)
            held.append(num)
        try:
            lib = ctypes.CDLL(f"/proc/self/fd/{num}")
        except OSError as e:
            raise TrampolineError(f"it does not load: {e}") from None
        _DLOPENED.add(num)
    finally:
        for h in held:
            os.close(h)
    missing = [s for s in SYMBOLS if not hasattr(lib, s)]
    if missing:
        raise TrampolineError(f"it lacks {', '.join(missing)}")
    return lib


def _build(dfd: int, where: str, name: str, source: str, cc: Compiler) -> ctypes.CDLL:
    """Compile into a private temporary folder, load and check it there, then record
    its sha256 and move it into the cache (renames: readers never see half a file)."""
    with tempfile.TemporaryDirectory(dir=where, prefix=".build-") as tmp:
        with open(os.path.join(tmp, "omp_launch.c"), "w", encoding="ascii") as f:
            f.write(source)
        try:     # relative names: the bytes do not depend on the temporary folder
            out = subprocess.run([cc.path, *FLAGS, "omp_launch.c", "-o", "lib.so"],
                                 cwd=tmp, capture_output=True, text=True, timeout=300,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as e:
            raise TrampolineError(f"{cc.path} failed to run: {e}") from None
        if out.returncode != 0:
            raise TrampolineError(f"{cc.path} exited with status {out.returncode}"
                                  f"{_tail(out.stderr)}")
        lib_path = os.path.join(tmp, "lib.so")
        try:
            fd = os.open(lib_path, _NOFOLLOW)
        except OSError as e:
            raise TrampolineError(f"{cc.path} wrote no library: {e}") from None
        try:
            os.fchmod(fd, 0o755)
            try:
                lib = _dlopen(fd)
            except TrampolineError as e:
                raise TrampolineError(f"what {cc.path} built is unusable: {e}") from None
            record = {"sha256": _sha256(fd), "compiler": cc.path, "resolved": cc.real,
                      "version": cc.version, "flags": list(FLAGS)}
        finally:
            os.close(fd)
        side = os.path.join(tmp, "lib.so.json")
        with open(side, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
        os.chmod(side, 0o644)
        os.replace(side, name + ".json", dst_dir_fd=dfd)
        os.replace(lib_path, name, dst_dir_fd=dfd)
        return lib


def _tail(text: str) -> str:
    text = (text or "").strip()
    return f": {text[-300:]}" if text else ""

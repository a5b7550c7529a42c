"""Atomic replacement of a file through a temporary file, and removal of the temporary
files that killed writers left.

``replacing(path)`` writes ``<name>.tmp-k<kernel>-<random>`` beside ``path``, fsyncs it
and renames it over ``path``. Its writer holds an exclusive flock on that file from
right after creating it until the rename is done (optgen/core/filelocks.py); the lock
goes with the process, however it ends. A save killed mid-write (``kill -9``, the OOM
killer) leaves the file behind, and nothing else would ever remove it, so every save
first removes the temporary files of its path that it can lock, where taking the lock
proves that no writer holds it: on a local file system, on NFS with shared locks, and
for a file of this kernel (``<kernel>``: its boot) on any file system.

Never removed: a file whose lock is held (a live writer, in whatever container, PID
namespace or user, whatever its hostname or /proc shows), a file this process writes,
a file of another machine where locks may be local to each machine, a file this
process may not open for writing, and the names earlier versions wrote
(``<name>.tmp-XXXXXXXX``, ``<name>.tmp-<host>-<pid>-<start>-XXXXXXXX``): their writers
took no lock, so nothing proves them abandoned; remove those by hand.

May import: the standard library, optgen.core.filelocks.
"""
from __future__ import annotations

import contextlib
import os
import re
import threading
from typing import BinaryIO, Iterator

from optgen.core import filelocks

# what follows "<name>.tmp-" in this module's names
_OURS = re.compile(r"k([0-9a-f]{8}|unknown)-[a-z0-9_]{8}")
# this process's temporary files: never swept by itself (on NFS a flock is a POSIX lock,
# which a process's own second descriptor would take, and release on closing)
_WRITING: set[str] = set()
_GUARD = threading.Lock()


def remove_abandoned(path: str | os.PathLike) -> list[str]:
    """Remove the temporary files of saves to ``path`` that no writer holds (see the
    module's docstring); the paths removed. Each is removed while holding its lock, and
    only if the path still names the file locked."""
    path = os.path.abspath(os.fspath(path))
    folder, base = os.path.dirname(path), os.path.basename(path) + ".tmp-"
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    gone = []
    for name in names:
        m = _OURS.fullmatch(name, len(base)) if name.startswith(base) else None
        if m is None:
            continue
        tmp = os.path.join(folder, name)
        with _GUARD:
            if tmp in _WRITING:
                continue
        if not filelocks.provable(folder, None if m.group(1) == "unknown" else m.group(1)):
            continue
        fd = filelocks.try_lock(tmp)
        if fd is None:
            continue
        try:
            os.remove(tmp)
            gone.append(tmp)
        except OSError:
            continue
        finally:
            os.close(fd)
    return gone


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file for ``path``'s new content. Leaving the block normally flushes and
    fsyncs it, renames it over ``path`` (readers see the old file or the new one, never
    half) and fsyncs the folder (the rename survives a power cut); an error removes it
    and leaves ``path`` as it was. Removes abandoned temporary files first."""
    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    remove_abandoned(path)
    tag = filelocks.kernel_tag() or "unknown"
    fd, tmp = filelocks.create_locked(folder, f"{os.path.basename(path)}.tmp-k{tag}-")
    with _GUARD:
        _WRITING.add(tmp)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    finally:
        with _GUARD:
            _WRITING.discard(tmp)
        os.close(fd)         # releases the lock, after the rename


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:        # a platform without directory handles: the rename still holds
        return
    try:
        os.fsync(fd)
    except OSError:        # a file system that cannot sync directories
        return
    finally:
        os.close(fd)

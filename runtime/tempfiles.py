"""Temporary files of atomic saves that name their writer, and removal of abandoned ones.

A save writes ``<name>.tmp-<host>-<pid>-<start>-<random>`` and renames it into place; a
save killed mid-write (``kill -9``, the OOM killer) leaves that file behind, and nothing
else would ever remove it (issue 36: 22 files of up to 40 MB after 15 kills). The next
save to the same path removes the ones it can prove abandoned: written on this host
(``<host>``: a hash of the host name, as a shared file system may hold other hosts'
saves) by a process that no longer runs: no process ``<pid>``, or one that started at
another time (``<start>``: the process's start time in clock ticks since boot, from
/proc, so a reused pid is not taken for the writer). Files of another host, of a live
writer, or of an unknown form (older versions' ``<name>.tmp-XXXXXXXX``) are kept.

May import: the standard library only.
"""
from __future__ import annotations

import hashlib
import os
import re
import socket
import tempfile

_NAME = re.compile(r"\.tmp-([0-9a-f]{8})-(\d+)-(\d+)-")


def _host() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot); None where it does not run
    or the platform has no /proc (then 0 stands for "unknown" in names)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return 0
    # field 22; the command (field 2) may hold spaces and parentheses: split after it
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def create(path: str) -> tuple[int, str]:
    """(fd, temp path) of a new temporary file beside ``path`` that names this process."""
    pid = os.getpid()
    prefix = f"{os.path.basename(path)}.tmp-{_host()}-{pid}-{start_time(pid) or 0}-"
    return tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=prefix)


def _alive(pid: int, start: int) -> bool:
    now = start_time(pid)
    if now is None:
        return False
    if now and start:
        return now == start
    try:                        # no /proc: is there a process with this pid at all?
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:             # it exists and belongs to someone else
        return True
    return True


def abandoned(path: str) -> list[str]:
    """The temporary files beside ``path`` whose writer provably no longer runs."""
    folder = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path) + ".tmp-"
    host, out = _host(), []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        m = _NAME.match(name, len(base) - 5) if name.startswith(base) else None
        if m is None or m.group(1) != host:
            continue
        pid, start = int(m.group(2)), int(m.group(3))
        if pid != os.getpid() and not _alive(pid, start):
            out.append(os.path.join(folder, name))
    return out


def remove_abandoned(path: str) -> list[str]:
    """Remove ``abandoned(path)``; the paths removed (one another process removed first,
    or that cannot be removed, is skipped)."""
    gone = []
    for p in abandoned(path):
        try:
            os.remove(p)
            gone.append(p)
        except OSError:
            continue
    return gone

"""Whether anyone may still be writing a file: exclusive ``flock`` locks, and where a
lock taken here proves anything.

A writer takes ``flock(LOCK_EX)`` on what it writes (a save's temporary file; a build's
lock file) right after creating it and holds it until it is done. The lock belongs to
the open file, not to a pid: it goes when the writer closes the file, exits or is
killed, and it is seen by every process on the same kernel, whatever PID namespace,
container, hostname or /proc mount (``hidepid``) it has. A process that takes the lock
without waiting (``LOCK_NB``) knows that no writer holds it, if every writer's lock is
visible here, which holds for:

- a file of a local file system (ext4, xfs, btrfs, tmpfs, overlay, ...): every
  process that can open it runs on this kernel;
- NFS mounted with ``local_lock=none`` (Linux's default): the client sends a flock to
  the server as a whole-file byte-range lock, which every client sees. A client cut off
  from the server for longer than its lease loses its locks (and its writes fail);
- on any file system, a file named with this kernel's tag (``kernel_tag``: a hash of
  /proc/sys/kernel/random/boot_id, one per boot, shared by all containers on it).

Elsewhere (NFS with ``local_lock=flock``/``all`` or ``nolock``, CIFS, Lustre, GPFS,
FUSE, an unknown type), a lock may be local to each machine: a file of another
machine, or of an unknown kernel, is never taken for abandoned. Hostnames, pids and
/proc decide nothing.

Why flock: a POSIX record lock (``lockf``, ``F_SETLK``) belongs to the process and goes
when the process closes any descriptor of the file (a sweep in the writer's own process
would release the writer's lock); flock (like Linux's OFD locks) belongs to the open
file, and exists on macOS and the BSDs too. Linux's NFS client emulates flock with a
whole-file POSIX lock, so there a process must not sweep its own files
(runtime/tempfiles.py keeps a list of them).

May import: the standard library only.
"""
from __future__ import annotations

import functools
import hashlib
import os
import stat
import tempfile

try:
    import fcntl
except ImportError:     # no flock (Windows): nothing is ever proven abandoned
    fcntl = None

# file systems only this kernel can have mounted read-write
LOCAL = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "overlay",
                   "zfs", "f2fs", "bcachefs", "jfs", "reiserfs", "nilfs2", "hfsplus",
                   "vfat", "exfat", "ntfs3"})


@functools.cache
def kernel_tag() -> str | None:
    """8 hex digits naming this kernel's boot (None where it cannot be read)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read().strip()
    except OSError:
        return None
    return hashlib.sha256(boot).hexdigest()[:8] if boot else None


def _mount(folder: str) -> tuple[str, str] | None:
    """(file system type, its super options) of the mount holding ``folder``."""
    try:
        dev = os.stat(folder).st_dev
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    want = f"{os.major(dev)}:{os.minor(dev)}"
    for line in lines:
        fields = line.split()
        if len(fields) > 3 and fields[2] == want and " - " in line:
            rest = line.split(" - ", 1)[1].split()
            return rest[0], rest[2] if len(rest) > 2 else ""
    return None


def locks_shared(folder: str) -> bool:
    """Whether a flock on a file in ``folder`` is seen by every process that could
    write it, on any machine (see the module's docstring)."""
    mount = _mount(folder)
    if mount is None:
        return False
    kind, options = mount
    if kind in LOCAL:
        return True
    return kind in ("nfs", "nfs4") and "local_lock=none" in options.split(",")


def provable(folder: str, tag: str | None) -> bool:
    """Whether a lock taken here on a file in ``folder`` named with kernel ``tag`` (None:
    no tag) proves its writer gone."""
    if fcntl is None:
        return False
    mine = kernel_tag()
    return (tag is not None and mine is not None and tag == mine) or locks_shared(folder)


def _same(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        now = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


def try_lock(path: str) -> int | None:
    """An open descriptor of the regular file ``path`` holding its exclusive flock, or
    None where another open file holds it (a live writer), the file is gone or was
    replaced meanwhile, or cannot be opened for writing (an exclusive lock on NFS needs
    that; another user's file stays). Close it to release the lock."""
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _same(fd, path):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def create_locked(folder: str, prefix: str) -> tuple[int, str]:
    """(fd, path) of a new file ``<prefix><8 random>`` in ``folder`` that this process
    holds the exclusive flock of. Created (O_EXCL) before it is locked: a sweep that
    locked and removed it in between makes the lock land on a removed file, which is
    noticed (the path no longer names it) and a new file made."""
    while True:
        fd, path = tempfile.mkstemp(dir=folder, prefix=prefix)
        if fcntl is None:
            return fd, path
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)    # waits only while a sweep looks at it
            if _same(fd, path):
                return fd, path
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)

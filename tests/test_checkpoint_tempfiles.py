"""A save killed mid-write leaves ``<name>.tmp-*``; the next save to that path removes the
temporary files no writer holds (each writer holds an exclusive flock on its own from
creation to rename) and never one a live writer holds: in this PID namespace, in
another one with the same hostname, stalled mid-write or between write and rename."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

import optgen
from optgen.core import filelocks
from optgen.runtime import tempfiles

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs POSIX processes")

# a child that saves and stops mid-write (np.savez wrote 1 MB of the file) or after the
# whole file is written, before the rename; a line on its stdin lets it finish
SAVER = textwrap.dedent("""
    import sys, numpy as np, optgen
    w = [np.zeros(100_000, np.float32)]
    opt = optgen.create("adam", w)
    opt.step([np.ones_like(w[0])])
    savez = np.savez
    def stalled(f, **arrays):
        if sys.argv[2] == "mid-write":
            f.write(b"x" * 1_000_000)
        else:
            savez(f, **arrays)
        f.flush()
        print("writing", flush=True)
        sys.stdin.readline()
        f.seek(0)
        f.truncate()
        savez(f, **arrays)
    np.savez = stalled
    opt.save(sys.argv[1])
    print("saved", flush=True)
""")


def _saver(path, stall="mid-write", wrap=()):
    p = subprocess.Popen([*wrap, sys.executable, "-c", SAVER, str(path), stall],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    if line != "writing":
        p.kill()
        pytest.fail(f"the saver did not start writing: {line!r} {p.communicate()}")
    return p


def _finish(saver):
    """Let a stalled saver go on; what it printed after and its exit status."""
    out, _ = saver.communicate("go\n", timeout=120)
    return out.strip(), saver.returncode


def _temps(folder):
    return sorted(n for n in os.listdir(folder) if ".tmp-" in n)


def _opt():
    w = [np.zeros(100_000, np.float32)]
    opt = optgen.create("adam", w)
    opt.step([np.ones_like(w[0])])
    return opt


def _unshare() -> list[str]:
    """The command prefix running a process in a new PID namespace (with its own /proc,
    the same hostname), or a skip naming why it cannot run here."""
    tool = shutil.which("unshare")
    if tool is None:
        pytest.skip("unshare (util-linux) is not installed")
    wrap = [tool, "--pid", "--fork", "--mount-proc", "--kill-child"]
    r = subprocess.run([*wrap, "true"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"unshare --pid is not permitted here (needs root or CAP_SYS_ADMIN): "
                    f"{r.stderr.strip()}")
    return wrap


@pytest.mark.parametrize("where", ["this PID namespace", "another PID namespace"])
@pytest.mark.parametrize("stall", ["mid-write", "before-rename"])
def test_a_live_writers_temp_survives_a_save_and_its_rename_succeeds(where, stall,
                                                                      tmp_path):
    """A saver stalled mid-write or between write and rename, here or in another PID
    namespace with the same hostname (a second container of one pod: its pids and /proc
    are not ours): a save from outside keeps its file, and the saver then finishes."""
    wrap = _unshare() if where == "another PID namespace" else ()
    path = tmp_path / "run.ckpt"
    live = _saver(path, stall, wrap)
    try:
        (live_tmp,) = _temps(tmp_path)
        size = os.path.getsize(tmp_path / live_tmp)
        _opt().save(path)                     # sweeps, writes, renames
        assert _temps(tmp_path) == [live_tmp], f"{where}: the live writer's file went"
        assert os.path.getsize(tmp_path / live_tmp) == size
        assert _finish(live) == ("saved", 0), f"{where}: the stalled save failed"
    finally:
        live.kill()
        live.wait(timeout=60)
    assert _temps(tmp_path) == []
    _opt().load(path)                         # the saver's complete checkpoint


def test_killed_savers_temp_is_removed_live_one_kept(tmp_path):
    path = tmp_path / "run.ckpt"
    dead = _saver(path)
    (dead_tmp,) = _temps(tmp_path)
    live = _saver(path)
    try:
        live_tmp = sorted(set(_temps(tmp_path)) - {dead_tmp})
        assert len(live_tmp) == 1
        dead.send_signal(signal.SIGKILL)
        dead.wait(timeout=60)
        opt = _opt()
        opt.save(path)                        # removes the dead writer's file only
        assert _temps(tmp_path) == live_tmp
        assert os.path.getsize(tmp_path / live_tmp[0]) >= 1_000_000
        opt.load(path)                        # and wrote a complete checkpoint
    finally:
        live.kill()
        live.wait(timeout=60)
        dead.kill()
    _opt().save(path)                         # the other writer is gone now too
    assert _temps(tmp_path) == []


@pytest.mark.parametrize("shared", [True, False])
def test_what_a_sweep_may_remove(shared, tmp_path, monkeypatch):
    """Unlocked files of this module's form go where a lock proves it (this kernel's
    tag anywhere; another kernel's only where locks are shared by every machine);
    earlier versions' names (no lock protocol), other paths' files and one this process
    writes stay."""
    monkeypatch.setattr(filelocks, "locks_shared", lambda folder: shared)
    me = filelocks.kernel_tag()
    other = "0" * 8 if me != "0" * 8 else "1" * 8
    keep = ["run.ckpt.tmp-k2v9x0a1",                        # the oldest form
            f"run.ckpt.tmp-{other}-999999-1-k2v9x0a1",      # the host-pid-start form
            f"other.ckpt.tmp-k{me}-abcdefgh"]               # another path's
    drop = [f"run.ckpt.tmp-k{me}-abcdefgh"]
    (drop if shared else keep).append(f"run.ckpt.tmp-k{other}-abcdefgh")
    for n in keep + drop:
        (tmp_path / n).write_bytes(b"x")
    gone = tempfiles.remove_abandoned(tmp_path / "run.ckpt")
    assert sorted(os.path.basename(p) for p in gone) == sorted(drop)
    assert _temps(tmp_path) == sorted(keep)
    with tempfiles.replacing(tmp_path / "run.ckpt") as f:   # our own, while we write it
        (mine,) = set(_temps(tmp_path)) - set(keep)
        assert tempfiles.remove_abandoned(tmp_path / "run.ckpt") == []
        f.write(b"new")
    assert (tmp_path / "run.ckpt").read_bytes() == b"new"
    assert _temps(tmp_path) == sorted(keep)


def test_a_file_swept_before_its_writer_locks_it_is_made_again(tmp_path, monkeypatch):
    """The window between creating a temporary file and locking it: a sweep that takes
    the lock first and removes the file makes the writer notice (its lock is on a
    removed file) and create another, so its rename still succeeds."""
    made, mkstemp = [], tempfile.mkstemp

    def mkstemp_then_sweep(**kw):
        fd, p = mkstemp(**kw)
        made.append(p)
        if len(made) == 1:
            assert tempfiles.remove_abandoned(tmp_path / "run.ckpt") == [p]
        return fd, p
    monkeypatch.setattr(filelocks.tempfile, "mkstemp", mkstemp_then_sweep)
    with tempfiles.replacing(tmp_path / "run.ckpt") as f:
        f.write(b"new")
    assert len(made) == 2 and (tmp_path / "run.ckpt").read_bytes() == b"new"
    assert _temps(tmp_path) == []


def test_a_failed_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "run.ckpt"
    path.write_bytes(b"old")
    with pytest.raises(OSError, match="disk full"):
        with tempfiles.replacing(path) as f:
            f.write(b"half")
            raise OSError("disk full")
    assert path.read_bytes() == b"old" and _temps(tmp_path) == []


@pytest.mark.parametrize("mount,shared", [
    (("ext4", "rw,discard"), True), (("tmpfs", "rw"), True), (("overlay", "rw"), True),
    (("nfs4", "rw,vers=4.2,local_lock=none,addr=10.0.0.1"), True),
    (("nfs", "rw,vers=3,nolock,local_lock=all"), False),
    (("nfs4", "rw,vers=4.1,local_lock=flock"), False),
    (("cifs", "rw"), False), (("fuse.sshfs", "rw"), False), (("lustre", "rw,flock"), False),
    (None, False)])
def test_where_a_lock_proves_a_writer_gone(mount, shared, monkeypatch):
    monkeypatch.setattr(filelocks, "_mount", lambda folder: mount)
    assert filelocks.locks_shared("/x") is shared


@pytest.mark.skipif(not os.path.exists("/proc/self/mountinfo"), reason="needs Linux /proc")
def test_the_mount_of_a_folder_is_found(tmp_path):
    kind, _ = filelocks._mount(str(tmp_path))
    assert kind and kind != "proc"

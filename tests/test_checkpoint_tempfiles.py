"""Issue 36: a save killed mid-write leaves ``<name>.tmp-*``; the next save to that path
removes the temporary files it can prove abandoned and keeps a live writer's."""
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import optgen
from optgen.runtime import tempfiles

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")

# a child that saves and stops mid-write (np.savez wrote 1 MB of the file, then waits)
SAVER = textwrap.dedent("""
    import sys, time, numpy as np, optgen
    w = [np.zeros(100_000, np.float32)]
    opt = optgen.create("adam", w)
    opt.step([np.ones_like(w[0])])
    def stuck(f, **arrays):
        f.write(b"x" * 1_000_000); f.flush()
        print("writing", flush=True)
        time.sleep(600)
    np.savez = stuck
    opt.save(sys.argv[1])
""")


def _saver(path):
    p = subprocess.Popen([sys.executable, "-c", SAVER, str(path)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "writing"
    return p


def _temps(folder):
    return sorted(n for n in os.listdir(folder) if ".tmp-" in n)


def _opt():
    w = [np.zeros(100_000, np.float32)]
    opt = optgen.create("adam", w)
    opt.step([np.ones_like(w[0])])
    return opt


def test_killed_savers_temp_is_removed_live_one_kept(tmp_path):
    path = tmp_path / "run.ckpt"
    dead, live = _saver(path), _saver(path)
    try:
        assert len(_temps(tmp_path)) == 2
        live_tmp = [n for n in _temps(tmp_path) if f"-{live.pid}-" in n]
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


def test_unprovable_temps_are_kept(tmp_path):
    path = tmp_path / "run.ckpt"
    host = tempfiles._host()
    me = os.getpid()
    keep = ["run.ckpt.tmp-k2v9x0a1",                          # an older version's name
            f"run.ckpt.tmp-{'0' * 8 if host != '0' * 8 else '1' * 8}-999999-1-abc",  # other host
            f"run.ckpt.tmp-{host}-{me}-{tempfiles.start_time(me)}-abc",  # a live writer
            "other.ckpt.tmp-" + f"{host}-999999-1-abc"]               # another file's
    drop = [f"run.ckpt.tmp-{host}-{me}-{tempfiles.start_time(me) + 1}-abc"]  # pid reused
    if not os.path.exists("/proc/999999"):
        drop.append(f"run.ckpt.tmp-{host}-999999-1-abc")      # no such process
    for n in keep + drop:
        (tmp_path / n).write_bytes(b"x")
    assert sorted(os.path.basename(p) for p in tempfiles.abandoned(str(path))) == \
        sorted(n for n in drop if f"-{me}-" not in n)
    subprocess.run([sys.executable, "-c",
                    f"from optgen.runtime import tempfiles; tempfiles.remove_abandoned({str(path)!r})"],
                   check=True, timeout=120)
    # a new process sees this test's pid alive at its start time: only the reused-pid
    # and the dead process's names go
    assert _temps(tmp_path) == sorted(keep)

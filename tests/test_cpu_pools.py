"""The CPU kernels' parallel loops on torch's OpenMP runtime or on TVM's pool.

Whichever pool runs them, the results are the same bits (elementwise updates do not
depend on the split; reductions sum a fixed chunk count); with torch loaded the default
pool is OpenMP (the trampoline counts its launches); a numpy-only process keeps TVM's.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import optgen
from optgen.runtime.backends import omp_pool

torch = pytest.importorskip("torch")   # loads the libgomp the OpenMP pool runs on

N = 200_003          # above the parallel threshold (32K), with a scalar tail


def _params(seed: int, n: int = N):
    r = np.random.default_rng(seed)
    return [r.standard_normal(n).astype(np.float32),
            r.standard_normal(n // 3 + 5).astype(np.float32)]


def _run(spec: str, pool: str, steps: int = 3, **kw) -> list[np.ndarray]:
    assert optgen.set_cpu_pool(pool) in ("openmp", "tvm")
    ps = _params(0)
    opt = optgen.create(spec, ps, **kw)
    r = np.random.default_rng(1)
    for _ in range(steps):
        opt.step([r.standard_normal(p.shape).astype(np.float32) for p in ps])
    return ps


@pytest.fixture
def openmp():
    got = optgen.set_cpu_pool("openmp")
    if got != "openmp":
        pytest.skip(f"no OpenMP pool here: {optgen.cpu_pool()['why']}")
    yield
    optgen.set_cpu_pool("auto")


# lamb: whole-tensor reductions (norms); adam q8: blocked states; sgd: one read, one write
CASES = [("adam", {}), ("lamb", {"weight_decay": 0.01}), ("sgd", {"momentum": 0.9}),
         ("adam", {"state_format": "q8"})]


@pytest.mark.parametrize("spec,kw", CASES, ids=[f"{s}{kw}" for s, kw in CASES])
def test_same_bits_whichever_pool(openmp, spec, kw):
    before = omp_pool.omp_launches()
    on_omp = _run(spec, "openmp", **kw)
    assert omp_pool.omp_launches() > before, "the OpenMP pool ran no parallel loop"
    on_tvm = _run(spec, "tvm", **kw)
    for a, b in zip(on_omp, on_tvm):
        assert a.tobytes() == b.tobytes()


def test_same_bits_with_another_thread_count(openmp):
    ref = _run("lamb", "openmp", weight_decay=0.01)
    optgen.set_num_threads(1)
    try:
        one = _run("lamb", "openmp", weight_decay=0.01)
    finally:
        optgen.set_num_threads(len(os.sched_getaffinity(0)))
    for a, b in zip(ref, one):
        assert a.tobytes() == b.tobytes()


def test_torch_loaded_means_openmp_by_default(openmp):
    optgen.set_cpu_pool("auto")
    assert optgen.cpu_pool()["pool"] == "openmp"   # (TVM's while oversubscribed: no count)
    p = torch.zeros(N)
    opt = optgen.create("adam", [p])
    opt.step([torch.ones(N)])
    assert torch.allclose(p, torch.full((N,), -1e-3), atol=1e-6)


def test_auto_counts_runnable_threads(openmp):
    """"auto" falls back to TVM's pool while /proc/loadavg shows more runnable threads
    than its limit (0: no check, as "openmp" sets; -1: always over it)."""
    shim = omp_pool._trampoline()
    try:
        for limit, on_omp in ((1_000_000, True), (0, True), (-1, False)):
            p = np.zeros(N, np.float32)
            opt = optgen.create("adam", [p])
            opt.step([np.ones_like(p)])             # (the first step loads, attaching)
            shim.optgen_set_mode(1, 2, omp_pool.TASKS_PER_THREAD, limit)
            before = omp_pool.omp_launches()
            opt.step([np.ones_like(p)])
            assert (omp_pool.omp_launches() > before) == on_omp, limit
            assert shim.optgen_busy() == (not on_omp)
    finally:
        optgen.set_cpu_pool("openmp")


def test_bad_pool_names():
    with pytest.raises(ValueError, match="pool must be one of auto, openmp, tvm, got 'gomp'"):
        optgen.set_cpu_pool("gomp")


NUMPY_ONLY = """
import sys, numpy as np, optgen
p = np.zeros(200_003, np.float32)
opt = optgen.create("adam", [p])
opt.step([np.ones_like(p)])
from optgen.runtime.backends import omp_pool
assert "torch" not in sys.modules
assert "libgomp" in optgen.cpu_pool()["why"]
print(optgen.cpu_pool()["pool"], omp_pool.omp_launches(), float(p[0]))
"""


def test_numpy_only_process_keeps_tvm_pool():
    env = {k: v for k, v in os.environ.items() if k != "OPTGEN_CPU_POOL"}
    out = subprocess.run([sys.executable, "-c", NUMPY_ONLY], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    pool, launches, p0 = out.stdout.split()
    assert (pool, launches) == ("tvm", "0") and abs(float(p0) + 1e-3) < 1e-6


def test_bad_environment_setting():
    code = ("import numpy as np, optgen; p = np.zeros(100_000, np.float32); "
            "optgen.create('adam', [p]).step([np.ones_like(p)])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, OPTGEN_CPU_POOL="fast"), timeout=300)
    assert out.returncode != 0 and "OPTGEN_CPU_POOL must be one of auto, openmp, tvm" in out.stderr


FORKED = """
import os, sys, numpy as np, torch, optgen
from optgen.runtime.backends import omp_pool
assert optgen.set_cpu_pool("openmp") == "openmp", optgen.cpu_pool()
p = np.zeros(200_003, np.float32)
opt = optgen.create("adam", [p])
opt.step([np.ones_like(p)])
assert omp_pool.omp_launches() > 0
pid = os.fork()
if pid == 0:                          # the child steps on TVM's pool, and does not hang
    n = omp_pool.omp_launches()
    opt.step([np.ones_like(p)])
    os._exit(0 if omp_pool.omp_launches() == n and abs(p[0] + 2e-3) < 1e-5 else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_forked_child_steps_on_tvm_pool(openmp):
    out = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "0"


LOADED_UNDER_TVM = """
import numpy as np, torch, optgen
from optgen.runtime.backends import omp_pool
assert optgen.set_cpu_pool("tvm") == "tvm"
p = np.zeros(200_003, np.float32)
opt = optgen.create("adam", [p])
opt.step([np.ones_like(p)])                  # loaded (and attached to nothing) under "tvm"
assert omp_pool.omp_launches() == 0
assert optgen.set_cpu_pool("openmp") == "openmp", optgen.cpu_pool()
opt.step([np.ones_like(p)])
print(omp_pool.omp_launches())
"""


def test_library_loaded_under_tvm_moves_to_openmp_when_asked(openmp):
    """set_cpu_pool("openmp") moves the loops of a library loaded under "tvm" too, as
    cpu_pool() then says."""
    env = {k: v for k, v in os.environ.items() if k != "OPTGEN_CPU_POOL"}
    out = subprocess.run([sys.executable, "-c", LOADED_UNDER_TVM], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) > 0, "the step after set_cpu_pool('openmp') ran on TVM"

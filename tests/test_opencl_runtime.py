"""Choosing the OpenCL device, and telling a broken OpenCL runtime from a broken kernel.

PoCL 3.0 (the PyPI build, LLVM 14) compiles no kernel at all on a CPU its LLVM does not
know (AMD Zen 5: "unknown target CPU 'generic'"). runtime/opencl.py asks a runtime to
compile a trivial kernel when a program fails to build: if that fails too, the runtime
is at fault (the device is passed over with a DeviceWarning, or, when the user named it,
an error saying so); if it builds, the kernel is at fault and the error says that.

A runtime broken for every kernel is made here on any CPU by giving PoCL a build option
it rejects (POCL_EXTRA_BUILD_FLAGS), in a subprocess, so the fallback path runs on every
machine, not only on a CPU that PoCL does not know.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from optgen.runtime.backends import opencl

cl = pytest.importorskip("pyopencl", reason="the OpenCL runtime tests need pyopencl")

ZEN5_LOG = """clBuildProgram failed: BUILD_PROGRAM_FAILURE - clBuildProgram failed: \
BUILD_PROGRAM_FAILURE - clBuildProgram failed: BUILD_PROGRAM_FAILURE

Build on <pyopencl.Device 'pthread-AMD EPYC 9B45' on 'Portable Computing Language'>:

error: unknown target CPU 'generic'
note: valid target CPU values are: nocona, core2, penryn, bonnell, atom, silvermont
"""
POCL_VERSION = "OpenCL 3.0 PoCL 3.0-rc2  Linux, Release, RELOC, LLVM 14.0.6, SLEEF, DISTRO"


def _device(runtime: str):
    found = [d for d in opencl.devices() if opencl.matches(runtime, d)]
    if not found:
        pytest.skip(f"no {runtime} OpenCL device here")
    return found[0]


def _working(runtime: str):
    d = _device(runtime)
    fault = opencl.runtime_fault(d)
    if fault:
        pytest.skip(f"{opencl.label(d)}: {fault}")
    return d


def test_unknown_cpu_is_named_as_the_runtime_fault():
    text = opencl.runtime_fault_text(POCL_VERSION, ZEN5_LOG)
    assert text.startswith("PoCL's LLVM 14.0.6 does not know this CPU (")
    assert opencl.host_cpu() in text and "'generic'" in text
    assert "PoCL 3.0-rc2 (LLVM 14.0.6) compiles no kernel here, not even a trivial one" in text


def test_other_runtime_faults_quote_the_build_log():
    text = opencl.runtime_fault_text(POCL_VERSION, "clBuildProgram failed: X\n\nerror: boom\n")
    assert text == "PoCL 3.0-rc2 (LLVM 14.0.6) cannot compile a trivial kernel: error: boom"
    assert opencl.runtime_fault_text("Oclgrind 21.10", "") == \
        "Oclgrind 21.10 cannot compile a trivial kernel: no build log"


@pytest.mark.parametrize("runtime", ["pocl", "oclgrind"])
def test_a_kernel_error_on_a_working_runtime_is_the_kernels(runtime, monkeypatch):
    """Bad source on a runtime that compiles the trivial kernel: the kernel's error, with
    the build log, and no runtime blamed, no other device tried."""
    d = _working(runtime)
    monkeypatch.setenv("OPTGEN_OPENCL_DEVICE", runtime)
    with pytest.raises(opencl.DeviceError, match=re.escape(f"did not build on {d.name}")) as e:
        opencl.build("__kernel void k(__global float *x) { x[0] = undeclared_name; }")
    assert "undeclared_name" in str(e.value) and "runtime, not the kernel" not in str(e.value)


def test_device_names_and_indices(monkeypatch):
    all_ = opencl.devices()
    if not all_:
        pytest.skip("no OpenCL device here")
    monkeypatch.setenv("OPTGEN_OPENCL_DEVICE", str(len(all_)))
    with pytest.raises(opencl.DeviceError, match=f"there are {len(all_)} OpenCL devices"):
        opencl.candidates()
    monkeypatch.setenv("OPTGEN_OPENCL_DEVICE", "no-such-device")
    with pytest.raises(opencl.DeviceError, match="matches no OpenCL device"):
        opencl.candidates()
    monkeypatch.setenv("OPTGEN_OPENCL_DEVICE", "0")
    assert opencl.candidates() == ([all_[0]], True)
    monkeypatch.delenv("OPTGEN_OPENCL_DEVICE")
    order, named = opencl.candidates()
    assert not named and sorted(map(opencl.label, order)) == sorted(map(opencl.label, all_))
    sims = [opencl.is_simulator(d) for d in order]
    assert sims == sorted(sims), "simulators come last"


BROKEN_POCL = r"""
import json, sys, warnings
import numpy as np
import optgen
from optgen.runtime.backends import opencl
warnings.simplefilter("always")
art = optgen.get_artifact("adam", "opencl")
w = np.linspace(-1, 1, 37).astype(np.float32)
w_ref = w.copy()
out = {}
try:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = optgen.create(art, [w], lr=0.1)
        ref = optgen.create(art, [w_ref], lr=0.1, backend="reference")
        for _ in range(3):
            g = np.cos(np.arange(37, dtype=np.float32))
            opt.step([g]); ref.step([g])
    out["warnings"] = [f"{type(c.message).__name__}: {c.message}" for c in caught]
    out["max_diff"] = float(np.abs(w - w_ref).max())
    out["moved"] = bool(np.abs(w - np.linspace(-1, 1, 37)).max() > 0)
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
out["untouched"] = bool(np.array_equal(w, np.linspace(-1, 1, 37).astype(np.float32)))
print(json.dumps(out))
"""


def _broken_pocl_run(device: str | None) -> dict:
    env = {**os.environ, "POCL_EXTRA_BUILD_FLAGS": "-optgen-no-such-option"}
    env.pop("OPTGEN_OPENCL_DEVICE", None)
    if device:
        env["OPTGEN_OPENCL_DEVICE"] = device
    p = subprocess.run([sys.executable, "-c", BROKEN_POCL], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_broken_runtime_is_passed_over_for_one_that_works():
    """PoCL made unable to compile anything: the default choice passes it over with a
    DeviceWarning naming the cause and runs the kernels on Oclgrind, equal to the
    reference interpreter."""
    _working("pocl")
    _working("oclgrind")
    out = _broken_pocl_run(None)
    assert "error" not in out, out
    passed = [w for w in out["warnings"] if w.startswith("DeviceWarning")]
    assert len(passed) == 1, out["warnings"]
    assert "OpenCL device passed over: Portable Computing Language" in passed[0]
    assert "cannot compile a trivial kernel" in passed[0] and "using Oclgrind" in passed[0]
    assert out["moved"] and out["max_diff"] <= 1e-6


def test_a_named_broken_runtime_is_the_runtimes_fault():
    """The user named PoCL and it cannot compile anything: an ArtifactError saying that
    the OpenCL runtime, not the kernel, is at fault; the parameter is untouched."""
    _working("pocl")
    out = _broken_pocl_run("pocl")
    assert out["error"].startswith("ArtifactError: "), out
    assert "the OpenCL runtime, not the kernel, is at fault" in out["error"]
    assert "PoCL 3.0" in out["error"] and "cannot compile a trivial kernel" in out["error"]
    assert out["untouched"]


def test_optgen_targets_names_the_runtime_fault():
    """`optgen targets`: opencl's run line names the device the runtime would use, and
    the runtime passed over with its cause."""
    _working("pocl")
    _working("oclgrind")
    env = {**os.environ, "POCL_EXTRA_BUILD_FLAGS": "-optgen-no-such-option"}
    env.pop("OPTGEN_OPENCL_DEVICE", None)
    p = subprocess.run([sys.executable, "-m", "optgen.cli", "targets"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    block = p.stdout.split("opencl:", 1)[1].split("\nmetal:", 1)[0]
    run = next(ln for ln in block.splitlines() if ln.strip().startswith("run:"))
    assert "yes (Oclgrind: Oclgrind Simulator (a simulator: exact, slow)" in run
    assert "passed over Portable Computing Language" in run
    assert "cannot compile a trivial kernel" in run


def test_trivial_kernel_runs_where_the_runtime_works():
    """The probe itself: a runtime reported as working really builds and runs the
    trivial kernel (doubles a vector)."""
    ran = 0
    for d in opencl.devices():
        if opencl.runtime_fault(d):
            continue
        ctx = cl.Context([d])
        prog = cl.Program(ctx, opencl.TRIVIAL_KERNEL).build()
        q = cl.CommandQueue(ctx)
        x = np.arange(5, dtype=np.float32)
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
        prog.optgen_probe(q, (5,), None, buf)
        cl.enqueue_copy(q, x, buf)
        q.finish()
        assert x.tolist() == [0, 2, 4, 6, 8], opencl.label(d)
        ran += 1
    if not ran:
        pytest.skip("no OpenCL runtime here compiles the trivial kernel: "
                    + "; ".join(f"{opencl.label(d)}: {opencl.runtime_fault(d)}"
                                for d in opencl.devices()))

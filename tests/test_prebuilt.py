"""Prebuilt artifacts on a machine without TVM's compiler (how a lent GPU machine runs the
GPU tests: bench/gpu_prebuild.py builds, bench/gpu_run.sh runs), and the reference
interpreter taking host arrays whatever target an artifact is for."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import optgen
from optgen.compiler import tvm_backend
from helpers import assert_close


def _tvm_without_compiler(tmp_path) -> str:
    """A folder holding a ``tvm`` package that is the installed one without its compiler
    library (links to every other file), and apache-tvm's metadata: what
    .gpu/site.tar.xz carries to a GPU machine."""
    import importlib.metadata
    import importlib.util
    real = os.path.dirname(importlib.util.find_spec("tvm").origin)
    site = tmp_path / "site"
    (site / "tvm" / "lib").mkdir(parents=True)
    for name in os.listdir(real):
        if name != "lib":
            os.symlink(os.path.join(real, name), site / "tvm" / name)
    for name in os.listdir(os.path.join(real, "lib")):
        if not name.startswith("libtvm_compiler."):
            os.symlink(os.path.join(real, "lib", name), site / "tvm" / "lib" / name)
    dist = importlib.metadata.distribution("apache-tvm")
    os.symlink(str(dist._path), site / os.path.basename(str(dist._path)))  # noqa: SLF001
    return str(site)


def test_a_tvm_without_its_compiler_is_a_build_error_naming_it(tmp_path):
    lib = tmp_path / "tvm" / "lib"
    lib.mkdir(parents=True)
    (lib / "libtvm_runtime.so").write_bytes(b"")
    with pytest.raises(optgen.BuildError, match="compiler library is not in .*runs prebuilt "
                                                "kernels only"):
        tvm_backend._check_compiler.__wrapped__(str(tmp_path / "tvm"))
    (lib / "libtvm_compiler.so").write_bytes(b"")
    tvm_backend._check_compiler.__wrapped__(str(tmp_path / "tvm"))     # whole: no error


def test_prebuilt_kernels_run_without_the_compiler(tmp_path):
    """Kernels built here step in a process whose TVM has no compiler library; a kernel
    not built there is a VariantNotBuilt naming the missing library (not a crash inside
    TVM)."""
    cache = tmp_path / "cache"
    env = dict(os.environ, OPTGEN_CACHE_DIR=str(cache))
    script = textwrap.dedent("""
        import sys, numpy as np, optgen
        w = np.linspace(-1, 1, 1009).astype(np.float32)
        opt = optgen.create("sgd", [w], lr=0.1, momentum=0.9)
        for _ in range(3):
            opt.step([np.cos(w)])
        print(repr(w[:4].tolist()))
        if sys.argv[1:] == ["miss"]:
            try:
                optgen.create("adam", [w], lr=0.1).step([w.copy()])
            except (optgen.BuildError, optgen.VariantNotBuilt) as e:
                print(type(e).__name__, e)
    """)
    here = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert here.returncode == 0, here.stderr[-2000:]
    env["PYTHONPATH"] = os.pathsep.join([_tvm_without_compiler(tmp_path),
                                         env.get("PYTHONPATH", "")])
    there = subprocess.run([sys.executable, "-c", script, "miss"], env=env,
                           capture_output=True, text=True, timeout=300)
    assert there.returncode == 0, there.stderr[-2000:]
    lines = there.stdout.splitlines()
    assert lines[0] == here.stdout.splitlines()[0]                  # the same steps
    assert lines[1].startswith("VariantNotBuilt") and "TVM's compiler library is not in" \
        in lines[1], lines


def test_the_reference_steps_host_arrays_of_a_cuda_artifact(rng):
    """The GPU tests' oracle: the reference interpreter from the cuda artifact on host
    copies equals it from the llvm artifact (it reads the spec alone; no nvcc needed)."""
    for fmt in (None, "q8", "bf16"):
        outs = []
        for target in ("cuda", "llvm"):
            w = np.linspace(-2, 2, 3001).astype(np.float32)
            art = optgen.get_artifact("adam", target, state_format=fmt)
            ref = optgen.create(art, [w], backend="reference", lr=0.1, state_format=fmt,
                                state_format_min_size=0)
            for k in range(3):
                ref.step([np.sin(w * k).astype(np.float32)])
            outs.append(w)
        assert_close(outs[0], outs[1], "float32", f"adam {fmt}")
    with pytest.raises(TypeError, match="built for cuda"):     # compiled: the device rule
        optgen.create(optgen.get_artifact("adam", "cuda"), [np.zeros(4, np.float32)])

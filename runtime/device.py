"""Launching an artifact's device kernels without TVM: CuPy (CUDA) and pyopencl (OpenCL).

A GPU artifact's manifest carries its device ABI (``device_kernels``, written by
optgen.compiler.abi): for every kernel pass, the device kernels in launch order, their
parameters in the order the generated code declares them, where each shape variable
comes from, and each kernel's grid. ``DeviceFunction`` turns that into a callable with
the same signature as a compiled CPU kernel, ``fn(*arrays, scalars)``, so the optimizer
drives every target the same way.

* CUDA: the arrays are CuPy arrays or torch CUDA tensors (zero copy); the module is the
  cubin built for the device's architecture, else the newest PTX not above it (the
  driver JIT-compiles PTX). Kernels run on the current CuPy stream, or on torch's
  current stream when the parameters are torch tensors.
* OpenCL: the arrays are host numpy arrays, copied to the device and the written ones
  back on every call — a way to execute and check the GPU schedules (PoCL runs them on
  the CPU), not a fast path.
"""
from __future__ import annotations

import math
import os
import threading
from typing import Any

import numpy as np

_DIM_TYPES = {"int64_t": np.int64, "long": np.int64, "int": np.int32, "int32_t": np.int32}


class DeviceError(RuntimeError):
    """The device kernels cannot be loaded or launched here."""


def blocks(grid: dict, dims: dict[str, int]) -> int:
    total = math.prod(dims[d] for d in grid["extent"])
    count = -(-total // grid["per_block"])
    return min(count, grid["max_blocks"]) if grid["max_blocks"] else count


def shape_values(spec: dict, arrays: dict[str, Any]) -> dict[str, int]:
    """Each shape variable's value, read off the arrays passed (see abi.shape_vars)."""
    return {name: int(arrays[buf].shape[axis]) for name, (buf, axis) in spec["dims"].items()}


def pick_binary(binaries: dict[str, dict[str, str]], cc: int) -> str:
    """The file to load on a GPU of compute capability ``cc`` (e.g. 90): the cubin built
    for exactly that architecture, else the PTX of the newest architecture below it
    (the driver compiles PTX forward, never backward)."""
    archs = {int(a[3:].rstrip("af")): files for a, files in binaries.items()
             if not a.endswith(("a", "f"))}  # sm_90a code runs on sm_90 only: exact match
    exact = [files for a, files in binaries.items() if int(a[3:].rstrip("af")) == cc]
    if exact:
        return exact[0]["cubin"]
    lower = [a for a in archs if a <= cc]
    if not lower:
        raise DeviceError(f"the artifact has code for {', '.join(sorted(binaries))} only; this "
                          f"GPU is sm_{cc}: rebuild with --arch sm_{cc}")
    return archs[max(lower)]["ptx"]


class _OpenCL:
    """pyopencl on the first OpenCL device (``OPTGEN_OPENCL_DEVICE=<index>`` picks another)."""
    name = "opencl"

    def __init__(self, source: str):
        try:
            import pyopencl as cl
        except ImportError:
            raise DeviceError("running OpenCL kernels needs pyopencl "
                              "(pip install 'pyopencl[pocl]' for a CPU device)") from None
        devices = [d for p in cl.get_platforms() for d in p.get_devices()]
        if not devices:
            raise DeviceError("no OpenCL device found (pip install 'pyopencl[pocl]' for one "
                              "that runs on the CPU)")
        device = devices[int(os.environ.get("OPTGEN_OPENCL_DEVICE", "0"))]
        self.cl = cl
        self.ctx = cl.Context([device])
        self.queue = cl.CommandQueue(self.ctx)
        try:
            self.program = cl.Program(self.ctx, source).build()
        except cl.RuntimeError as e:
            raise DeviceError(f"the OpenCL program did not build on {device.name}: {e}") from None

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
                    else _DIM_TYPES[p["type"]](dims[p["dim"]]) for p in entry["params"]]
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


class _CuPy:
    """CuPy's RawModule on the cubin for this device's architecture, else PTX."""
    name = "cuda"

    def __init__(self, folder: str, binaries: dict[str, dict[str, str]]):
        try:
            import cupy
        except ImportError:
            raise DeviceError("running CUDA kernels needs CuPy (pip install "
                              "'optgen[cuda]')") from None
        self.cp = cupy
        try:
            cc = int(cupy.cuda.Device().compute_capability)
        except Exception as e:  # no driver, no device
            raise DeviceError(f"no usable CUDA device: {e}") from None
        self.path = os.path.join(folder, pick_binary(binaries, cc))
        self.module = cupy.RawModule(path=self.path)

    def kernel(self, name: str) -> Any:
        return self.module.get_function(name)

    def run(self, spec: dict, arrays: dict[str, Any], scalars: np.ndarray,
            launches: list[tuple[Any, dict]]) -> None:
        cp = self.cp
        stream = None
        devarrays = {}
        for n, a in arrays.items():
            if type(a).__module__.startswith("torch"):
                import torch
                stream = stream or cp.cuda.ExternalStream(
                    torch.cuda.current_stream(a.device).cuda_stream)
                a = a.detach()
                if a.dtype == torch.bfloat16:  # CuPy has no bfloat16; the kernel needs the bits
                    a = a.view(torch.int16)
                a = cp.from_dlpack(a)
            devarrays[n] = a
        dims = shape_values(spec, devarrays)
        with (stream or cp.cuda.get_current_stream()):
            sdev = cp.asarray(scalars)
            for kern, entry in launches:
                nb = blocks(entry["grid"], dims)
                if nb == 0:
                    continue
                args = [devarrays[p["buffer"]] if "buffer" in p else sdev if "scalars" in p
                        else _DIM_TYPES[p["type"]](dims[p["dim"]]) for p in entry["params"]]
                kern((nb,), (entry["grid"]["threads"],), tuple(args))


class DeviceProgram:
    """The device kernels of one GPU artifact, loaded once (thread-safe)."""

    def __init__(self, folder: str, manifest: dict):
        self.folder = folder
        self.manifest = manifest
        self._backend = None
        self._lock = threading.Lock()
        self.target = manifest["target"]
        if self.target not in ("cuda", "opencl"):
            raise DeviceError(f"optgen's runtime cannot run {self.target} kernels; the "
                              f"artifact has their source only (see docs/targets.md)")

    def backend(self):
        with self._lock:
            if self._backend is None:
                if self.target == "opencl":
                    path = os.path.join(self.folder, self.manifest["sources"]["opencl"])
                    with open(path, encoding="utf-8") as f:
                        self._backend = _OpenCL(f.read())
                else:
                    self._backend = _CuPy(self.folder, self.manifest["binaries"])
            return self._backend

    def function(self, symbol: str) -> "DeviceFunction":
        try:
            spec = self.manifest["device_kernels"][symbol]
        except KeyError:
            raise DeviceError(f"{symbol}: not in the artifact's device ABI") from None
        be = self.backend()
        return DeviceFunction(be, spec, [(be.kernel(e["name"]), e) for e in spec["kernels"]])


class DeviceFunction:
    """``fn(*arrays, scalars)`` for one kernel pass: arrays in the pass's buffer order."""

    def __init__(self, backend, spec: dict, launches: list[tuple[Any, dict]]):
        self._backend = backend
        self._spec = spec
        self._launches = launches
        self._names = spec["buffers"]

    def __call__(self, *args: Any) -> None:
        *arrays, scalars = args
        if len(arrays) != len(self._names):
            raise TypeError(f"expected {len(self._names)} arrays ({', '.join(self._names)}) "
                            f"and the scalars, got {len(args)} arguments")
        self._backend.run(self._spec, dict(zip(self._names, arrays)), np.asarray(scalars),
                          self._launches)


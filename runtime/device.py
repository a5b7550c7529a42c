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
* OpenCL (runtime/opencl.py): the arrays are host numpy arrays, copied to the device and
  the written ones back on every call — a way to execute and check the GPU schedules
  (PoCL runs them on the CPU, Oclgrind in a simulator), not a fast path.

Imports: device_abi (errors, grids, binaries) and opencl; CuPy and torch inside functions.
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings
from typing import Any

import numpy as np

from .device_abi import DIM_TYPES, DeviceError, DeviceWarning, blocks, pick_binary, shape_values
from .opencl import OpenCLBackend

_NO_CONTEXT = contextlib.nullcontext()

__all__ = ["DeviceError", "DeviceWarning", "DeviceProgram", "DeviceFunction", "blocks",
           "pick_binary", "shape_values"]


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
        self._streams: dict[tuple[int, int], Any] = {}
        self._scalar_cache: dict[tuple, Any] = {}

    def kernel(self, name: str) -> Any:
        return self.module.get_function(name)

    def run(self, spec: dict, arrays: dict[str, Any], scalars: np.ndarray,
            launches: list[tuple[Any, dict]]) -> None:
        """One kernel pass. A torch CUDA tensor goes to the kernel as its data pointer (the
        kernel's parameter is a pointer: the same bits, without a CuPy view per call), on
        torch's current stream of its device; CuPy arrays as they are, on CuPy's stream."""
        cp = self.cp
        device, stream = None, None
        args_of = {}
        for n, a in arrays.items():
            if type(a).__module__.startswith("torch"):
                if device is None:
                    device = a.device.index or 0
                    stream = self._torch_stream(a.device)
                args_of[n] = np.uint64(a.data_ptr())
            else:
                args_of[n] = a
        dims = shape_values(spec, arrays)
        with cp.cuda.Device(device) if device is not None else _NO_CONTEXT:
            with stream or cp.cuda.get_current_stream():
                sdev = self._scalars(scalars)
                for kern, entry in launches:
                    nb = blocks(entry["grid"], dims)
                    if nb == 0:
                        continue
                    args = [args_of[p["buffer"]] if "buffer" in p else sdev if "scalars" in p
                            else DIM_TYPES[p["type"]](dims[p["dim"]]) for p in entry["params"]]
                    kern((nb,), (entry["grid"]["threads"],), tuple(args))

    def _torch_stream(self, device: Any) -> Any:
        """CuPy's handle on torch's current stream of ``device`` (one per stream, kept)."""
        import torch
        ts = torch.cuda.current_stream(device)
        key = (device.index or 0, ts.cuda_stream)
        stream = self._streams.get(key)
        if stream is None:
            with warnings.catch_warnings():   # (CuPy 14 prefers Stream.from_external)
                warnings.simplefilter("ignore", DeprecationWarning)
                stream = self.cp.cuda.ExternalStream(ts.cuda_stream, key[0])
            self._streams[key] = stream
        return stream

    def _scalars(self, scalars: np.ndarray) -> Any:
        """The pass's host scalars on the device. Every tensor of a group takes the same
        values in a step, so one copy per distinct value set and stream is kept (a small
        cache) instead of a host-to-device copy per kernel call; a copy from pageable
        memory waits for the stream, so fewer copies also mean fewer host stalls."""
        stream = self.cp.cuda.get_current_stream()
        key = (scalars.tobytes(), scalars.dtype.str, stream.ptr, self.cp.cuda.Device().id)
        sdev = self._scalar_cache.pop(key, None)
        if sdev is None:
            sdev = self.cp.asarray(scalars)
            if len(self._scalar_cache) >= 64:
                self._scalar_cache.pop(next(iter(self._scalar_cache)))
        self._scalar_cache[key] = sdev     # (most recent last)
        return sdev


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
                        self._backend = OpenCLBackend(f.read())
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


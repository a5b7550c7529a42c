"""Launching an artifact's device kernels without TVM: CuPy (CUDA) and pyopencl (OpenCL).

A GPU artifact's manifest carries its device ABI (``device_kernels``, written by
optgen.compiler.abi): for every kernel pass, the device kernels in launch order, their
parameters in the order the generated code declares them, where each shape variable
comes from, and each kernel's grid. ``DeviceFunction`` turns that into a callable with
the same signature as a compiled CPU kernel, ``fn(*arrays, scalars)``, so the optimizer
drives every target the same way.

The launcher of each target is its runtime backend's (runtime/backends/: cuda.py through
CuPy, opencl.py through pyopencl), which runs one pass's device kernels on its arrays.

Imports: device_abi (errors, grids, binaries) and the backend registry.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from . import backends
from .device_abi import DeviceError, DeviceWarning, blocks, pick_binary, shape_values

__all__ = ["DeviceError", "DeviceWarning", "DeviceProgram", "DeviceFunction", "blocks",
           "pick_binary", "shape_values"]


class DeviceProgram:
    """The device kernels of one GPU artifact, loaded once (thread-safe)."""

    def __init__(self, folder: str, manifest: dict):
        self.folder = folder
        self.manifest = manifest
        self._backend = None
        self._lock = threading.Lock()
        self.target = manifest["target"]
        self._launcher = backends.get(self.target).launcher
        if self._launcher is None:
            raise DeviceError(f"optgen's runtime cannot run {self.target} kernels; the "
                              f"artifact has their source only (see docs/targets.md)")

    def backend(self):
        with self._lock:
            if self._backend is None:
                self._backend = self._launcher(self.folder, self.manifest)
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
        if isinstance(scalars, (list, tuple, float, int, np.generic)):
            scalars = np.asarray(scalars)       # (a device array: a capturable row)
        self._backend.run(self._spec, dict(zip(self._names, arrays)), scalars,
                          self._launches)


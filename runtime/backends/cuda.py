"""The cuda target's runtime: the device kernels launched through CuPy.

The arrays are CuPy arrays or torch CUDA tensors (zero copy); the module is the cubin
built for the device's architecture, else the newest PTX not above it (the driver
JIT-compiles PTX). Kernels run on the current CuPy stream, or on torch's current stream
when the parameters are torch tensors. runtime/device.py drives the launches from the
manifest's device ABI. Imports: device_abi; CuPy and torch inside functions.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import warnings
from typing import Any

import numpy as np

from ..device_abi import DIM_TYPES, DeviceError, blocks, pick_binary, shape_values
from .base import Backend

_NO_CONTEXT = contextlib.nullcontext()


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

    def run(self, spec: dict, arrays: dict[str, Any], scalars: Any,
            launches: list[tuple[Any, dict]]) -> None:
        """One kernel pass. A torch CUDA tensor goes to the kernel as its data pointer (the
        kernel's parameter is a pointer: the same bits, without a CuPy view per call), on
        torch's current stream of its device; CuPy arrays as they are, on CuPy's stream.
        ``scalars``: numpy (copied to the device, cached), or already on the device (a
        capturable optimizer's row: runtime/capture.py)."""
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
                sdev = self._scalars(scalars) if isinstance(scalars, np.ndarray) else \
                    np.uint64(scalars.data_ptr()) if hasattr(scalars, "data_ptr") else scalars
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


def launcher(folder: str, manifest: dict) -> _CuPy:
    return _CuPy(folder, manifest["binaries"])


@functools.lru_cache(maxsize=1)
def _device() -> str | None:
    if importlib.util.find_spec("cupy") is None:
        return None
    try:
        import cupy
        n = cupy.cuda.runtime.getDeviceCount()
        return f"{n} CUDA device(s)" if n else None
    except Exception:  # CuPy installed without a driver or a GPU
        return None


def status() -> dict[str, str]:
    dev = _device()
    return {"run": f"yes (CuPy: {dev})" if dev else "no: needs CuPy and an NVIDIA GPU"}


BACKEND = Backend("cuda", launcher=launcher, status=status)

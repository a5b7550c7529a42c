"""Memory-bandwidth anchors: STREAM-style copy, triad and in-place axpy kernels for this
CPU, built with TVM once and kept in the artifact cache (``anchors-llvm-<key>/``).

``optgen bench`` times an optimizer step against them: an elementwise optimizer step is
memory-bound, so the bandwidth these plain loops reach is the limit it is measured by.

| anchor | computes | bytes per element (fp32) | STREAM counts |
|---|---|---|---|
| copy  | a = b          | 8  | read b, write a |
| triad | a = b + s*c    | 12 | read b, c, write a |
| axpy  | a = a + s*b    | 12 | read a, b, write a |

The copy's and triad's stores go to lines they did not read, so the CPU reads each line
first (write-allocate) and moves more bytes than STREAM counts; the axpy, like an
optimizer, stores only to lines it has just read. See bench/README.md.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Callable

import numpy as np

from ..core import cache
from ..core.tvm_runtime import load_tvm_runtime
from . import tvm_backend
from .templates import render

VECTOR_BYTES = 64
KERNELS = {           # name: (buffers, the statement, bytes STREAM counts per element)
    "copy": (("a", "b"), "A[i] = B[i]", 2),
    "triad": (("a", "b", "c"), "A[i] = B[i] + S[0] * C[i]", 3),
    "axpy": (("a", "b"), "A[i] = A[i] + S[0] * B[i]", 3),
}
DTYPES = {"float32": "f32", "float64": "f64"}


def scripts() -> dict[str, str]:
    """TVMScript of every anchor kernel, by symbol (``triad_f32``, ...)."""
    out = {}
    for dtype, suffix in DTYPES.items():
        itemsize = np.dtype(dtype).itemsize
        for name, (buffers, body, _) in KERNELS.items():
            out[f"{name}_{suffix}"] = render(
                "anchors_llvm.py.j2", kernel=name, suffix=suffix, buffers=buffers, body=body,
                dtype=dtype, align=itemsize, vec=VECTOR_BYTES // itemsize)
    return out


def library() -> str:
    """The path of the anchors' shared library for this CPU, built on first use."""
    from .pipeline import _locked, _publish, _temp_folder   # the artifacts' publishing protocol
    texts = scripts()
    key = hashlib.sha256(json.dumps({
        "scripts": texts, "tvm": cache.tvm_version(), "machine": cache.machine(),
        "format": cache.FORMAT}, sort_keys=True).encode()).hexdigest()
    dest = os.path.join(cache.cache_dir(), f"anchors-llvm-{key[:16]}")
    lib = os.path.join(dest, "anchors.so")
    if os.path.isfile(lib):
        return lib
    os.makedirs(cache.cache_dir(), exist_ok=True)
    with _locked(dest + ".lock"):
        if os.path.isfile(lib):
            return lib
        funcs = {sym: tvm_backend.parse_tvmscript(text, sym) for sym, text in texts.items()}
        tmp = _temp_folder("build", dest)
        try:
            tvm_backend.build_library(funcs, tvm_backend.target_for("llvm"),
                                      os.path.join(tmp, "anchors.so"))
            with open(os.path.join(tmp, "manifest.json"), "w", encoding="utf-8") as f:
                json.dump({"name": "bandwidth anchors (copy, triad, axpy)", "target": "llvm",
                           "key": key, "kernels": sorted(texts)}, f, indent=1)
            _publish(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return lib


def functions(dtype: str) -> dict[str, Callable]:
    """The anchors for ``dtype`` by name: ``fn(*arrays, s)``, the arrays named by
    ``KERNELS[name][0]`` (1-D, one length) and ``s`` a one-element array of the scalar."""
    load_tvm_runtime()
    import tvm_ffi
    module = tvm_ffi.load_module(library())
    return {name: module[f"{name}_{DTYPES[dtype]}"] for name in KERNELS}


def stream_bytes(name: str, dtype: str) -> int:
    """Bytes per element the anchor ``name`` is credited with (STREAM's convention)."""
    return KERNELS[name][2] * np.dtype(dtype).itemsize

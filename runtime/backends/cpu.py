"""CPU targets (llvm, c): the artifact's library opened with ``tvm_ffi``. The caller
(runtime/artifact.py) has loaded ``libtvm_runtime.so`` into the global symbol namespace
first (``needs_tvm``): it provides the thread pool and workspace hooks the kernels call
(tvm-notes §7), so ``import tvm`` (seconds) is never needed. Where torch's OpenMP
runtime is loaded, the kernels' parallel loops run on it instead (omp_pool.py)."""
from __future__ import annotations

import os
from typing import Any

from . import omp_pool
from .base import Backend


def load(folder: str, manifest: dict) -> Any:
    """The artifact's library; ``module[symbol]`` is a kernel."""
    import tvm_ffi
    path = os.path.join(folder, manifest["library"])
    module = tvm_ffi.load_module(path)
    omp_pool.attach(path)
    return module


BACKENDS = (Backend("llvm", load=load), Backend("c", load=load))

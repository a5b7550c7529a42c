"""TVM's runtime library, loaded without the TVM compiler, and torch kept out of the
imports of tvm_ffi and TVM: both the compiler (which imports TVM) and the runtime (which
loads kernels with tvm_ffi) need these.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import os
import sys

from .manifest import ArtifactError


@contextlib.contextmanager
def torch_hidden():
    """Imports inside make ``import torch`` and ``import ml_dtypes`` fail, each unless
    this process has imported it.

    tvm_ffi's ``__init__`` and TVM's relax package import torch whenever it is installed
    (1.5-2 s of a cold build or a first step here): tvm_ffi to dodge a symbol clash seen
    on Windows and to load a DLPack addon that torch >= 2.10 makes unnecessary
    (torch.Tensor has ``__dlpack_c_exchange_api__`` itself), relax for its PyTorch
    interop, which optgen does not use. A process that has imported torch gets both
    unchanged; one that has not gets them as if torch were absent, and tensors of a
    torch imported later still pass to kernels through DLPack
    (tests/test_torch_interop.py runs that order in a new process).

    tvm_ffi imports ml_dtypes (0.6 s here: it registers its dtypes' numpy casts) to map
    its numpy dtypes to TVM's; optgen never passes one to tvm_ffi (a numpy bfloat16
    array goes as its uint16 bits, re-typed by TVM's runtime: runtime/artifact/load.py),
    and imports ml_dtypes itself where a format needs it."""
    hide = [n for n in _HIDDEN if n not in sys.modules]
    for name in hide:
        sys.modules[name] = None   # makes `import name` raise ImportError
    try:
        yield
    finally:
        for name in hide:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


_HIDDEN = ("torch", "ml_dtypes")


@functools.lru_cache(maxsize=1)
def load_tvm_runtime() -> None:
    """Load libtvm_runtime.so once, with a sensible thread count (tvm-notes §0)."""
    os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    with torch_hidden():
        import tvm_ffi  # noqa: F401  — loads libtvm_ffi.so, which libtvm_runtime.so links
    spec = importlib.util.find_spec("tvm")
    if spec is None or spec.origin is None:
        raise ArtifactError("the apache-tvm package is not installed (pip install apache-tvm)")
    lib = os.path.join(os.path.dirname(spec.origin), "lib", "libtvm_runtime.so")
    ctypes.CDLL(lib, ctypes.RTLD_GLOBAL)

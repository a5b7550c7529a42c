"""The array libraries a trainer hands to optgen: numpy (CPU), torch (CPU, CUDA), CuPy.

Kernels receive every array zero-copy through DLPack, so the optimizer never converts
or copies a parameter, gradient or state. This module answers the few questions the
runtime asks about an array whatever its library: which library and device, which
dtype, whether it is contiguous, whether two arrays overlap, and how to allocate a
state next to a parameter. torch and CuPy are imported only when a trainer passes
their arrays.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from optgen.core.dtypes import LOW_PRECISION

ALIGN = 64


def compute_dtype(dtype: str) -> str:
    """The dtype kernels compute a parameter of ``dtype`` in (and keep its unformatted
    states in): float32 for float16/bfloat16 (with a master copy, or bfloat16 stepped
    without one), else its own."""
    return "float32" if dtype in LOW_PRECISION else dtype


def numpy_dtype(name: str) -> np.dtype:
    """``np.dtype`` for a dtype name, bfloat16 included (from ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def library(x: Any) -> str | None:
    """"numpy", "torch", "cupy", or None for anything else."""
    if isinstance(x, np.ndarray):
        return "numpy"
    mod = type(x).__module__
    if mod.startswith("torch") and "torch" in sys.modules:
        import torch
        if isinstance(x, torch.Tensor):
            return "torch"
    if mod.startswith("cupy") and "cupy" in sys.modules:
        import cupy
        if isinstance(x, cupy.ndarray):
            return "cupy"
    return None


def device(x: Any, lib: str) -> str:
    """"cpu", "cuda:0", ... ."""
    if lib == "numpy":
        return "cpu"
    if lib == "torch":
        return str(x.device) if x.device.type != "cuda" else f"cuda:{x.device.index or 0}"
    return f"cuda:{x.device.id}"


def dtype_name(x: Any, lib: str) -> str:
    if lib == "torch":
        return str(x.dtype).removeprefix("torch.")
    return x.dtype.name


def is_contiguous(x: Any, lib: str) -> bool:
    if lib == "torch":
        return x.is_contiguous()
    return bool(x.flags.c_contiguous)


def is_writeable(x: Any, lib: str) -> bool:
    return bool(x.flags.writeable) if lib == "numpy" else True


def address_range(x: Any, lib: str) -> tuple[int, int]:
    """[start, end) of the bytes a contiguous array covers."""
    if lib == "numpy":
        start, nbytes = x.ctypes.data, x.nbytes
    elif lib == "torch":
        start, nbytes = x.data_ptr(), x.numel() * x.element_size()
    else:
        start, nbytes = x.data.ptr, x.nbytes
    return start, start + nbytes


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[0] < a[1] and b[0] < b[1]


def kernel_arg(x: Any, lib: str) -> Any:
    """What a TVM kernel takes: the array itself (DLPack), detached from autograd."""
    return x.detach() if lib == "torch" else x


def matmul_into(a: Any, b: Any, out: Any) -> None:
    """``out = a @ b`` (2-D, any of them a transposed view) in the arrays' own library:
    numpy's BLAS, torch's (CPU BLAS or cuBLAS), CuPy's (cuBLAS). A matrix rule's products
    on a target with ``library_matmul`` (cuda) run here."""
    if isinstance(out, np.ndarray):
        np.matmul(a, b, out=out)
    elif type(out).__module__.startswith("torch"):
        import torch
        torch.matmul(a, b, out=out)
    else:
        import cupy
        cupy.matmul(a, b, out=out)


def aligned_full(shape: tuple, value: float, dtype, align: int = ALIGN) -> np.ndarray:
    """A C-contiguous numpy array whose data starts on an ``align``-byte boundary."""
    dtype = numpy_dtype(dtype) if isinstance(dtype, str) else np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(n * dtype.itemsize + align, dtype=np.uint8)
    start = (-raw.ctypes.data) % align
    arr = raw[start:start + n * dtype.itemsize].view(dtype).reshape(shape)
    arr.fill(value)
    return arr


def full_like(like: Any, lib: str, shape: tuple, value: float, dtype: str) -> Any:
    """A new array of ``shape`` filled with ``value``, on ``like``'s library and device."""
    if lib == "numpy":
        return aligned_full(shape, value, dtype)
    if lib == "torch":
        import torch
        return torch.full(shape, value, dtype=getattr(torch, dtype), device=like.device)
    import cupy
    with like.device:
        return cupy.full(shape, value, dtype=numpy_dtype(dtype))


def copy_to(like: Any, lib: str, host: np.ndarray) -> Any:
    """A copy of the numpy array ``host`` on ``like``'s library and device (a kernel's
    constant table, optgen/core/quant.py); numpy: ``host`` itself."""
    if lib == "numpy":
        return host
    if lib == "torch":
        import torch
        return torch.tensor(np.ascontiguousarray(host), device=like.device)
    import cupy
    with like.device:
        return cupy.asarray(np.ascontiguousarray(host))


def to_numpy(x: Any, lib: str) -> np.ndarray:
    """A numpy copy (host memory) of any array; bfloat16 stays bfloat16 (ml_dtypes)."""
    if lib == "numpy":
        return np.array(x, copy=True)
    if lib == "torch":
        import torch
        t = x.detach()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).cpu().numpy().view(numpy_dtype("bfloat16"))
        return t.cpu().numpy().copy()
    return x.get()


def numpy_view(x: Any, lib: str) -> np.ndarray:
    """A numpy array sharing ``x``'s (CPU) memory, for the reference interpreter."""
    if lib == "numpy":
        return x
    if lib == "torch":
        import torch
        t = x.detach()
        if t.device.type != "cpu":
            raise TypeError(f"the reference backend runs on the CPU; got a tensor on {t.device}")
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
        return t.numpy()
    raise TypeError("the reference backend runs on the CPU; got a CuPy array")


def copy_into(dst: Any, lib: str, src: np.ndarray) -> None:
    """Overwrite ``dst`` (any library) with the numpy array ``src`` (same shape)."""
    if lib == "numpy":
        dst[...] = src
    elif lib == "torch":
        import torch
        if dst.dtype == torch.bfloat16:
            host = torch.from_numpy(np.ascontiguousarray(src).view(np.int16)).view(torch.bfloat16)
        else:
            host = torch.from_numpy(np.ascontiguousarray(src))
        with torch.no_grad():
            dst.copy_(host.reshape(dst.shape))
    else:
        import cupy
        dst[...] = cupy.asarray(src)


def equal(a: Any, b: Any, lib: str) -> bool:
    """Whether two arrays of one library, shape and dtype hold the same values."""
    if lib == "torch":
        import torch
        return torch.equal(a.detach(), b.detach())
    if lib == "numpy":
        return bool(np.array_equal(a, b))
    return bool((a == b).all())


def copy_cast(dst: Any, src: Any, lib: str) -> None:
    """``dst[...] = src`` converted to ``dst``'s dtype (a master copy taken again)."""
    if lib == "torch":
        import torch
        with torch.no_grad():
            dst.copy_(src.detach())
    else:
        dst[...] = src


def adopt_written(master: Any, w: Any, lib: str) -> None:
    """``master[i] = w[i]`` wherever ``w[i]`` is not ``master[i]`` rounded to ``w``'s
    dtype (to nearest even, compared bit for bit, as the mixed kernels read their master:
    optgen/core/reference.py ``adopted``): a float32 master takes the weight's values
    written from outside and keeps its own digits elsewhere. No host synchronization."""
    if lib == "torch":
        import torch
        with torch.no_grad():
            w = w.detach()
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[w.element_size()]
            same = master.to(w.dtype).view(bits) == w.view(bits)
            torch.where(same, master, w, out=master)
    else:
        xp = np if lib == "numpy" else __import__("cupy")
        bits = f"uint{8 * w.dtype.itemsize}"
        xp.copyto(master, w, where=master.astype(w.dtype).view(bits) != w.view(bits))


def cast_copy(x: Any, lib: str, dtype: str) -> Any:
    """A new array of ``x`` converted to ``dtype`` (the float32 master copy)."""
    if lib == "numpy":
        out = aligned_full(x.shape, 0.0, dtype)
        out[...] = x
        return out
    if lib == "torch":
        import torch
        return x.detach().to(getattr(torch, dtype), copy=True).contiguous()
    return x.astype(numpy_dtype(dtype), copy=True)


CHUNK = 1 << 16


def sum_of_squares(x: Any, lib: str) -> float:
    """``sum(x**2)`` accumulated in float64 (one pass; no full-size float64 copy)."""
    if lib == "numpy":
        flat = x.reshape(-1)
        with np.errstate(over="ignore", invalid="ignore"):
            if flat.dtype == np.float64:
                return float(np.dot(flat, flat))
            total = 0.0
            for s in range(0, flat.size, CHUNK):
                c = flat[s:s + CHUNK].astype(np.float64)
                total += float(np.dot(c, c))
        return total
    if lib == "torch":
        import torch
        v = torch.linalg.vector_norm(x.detach().reshape(-1), dtype=torch.float64)
        return float(v) ** 2
    import cupy
    return float(cupy.sum(cupy.square(x.reshape(-1), dtype=cupy.float64)))


def all_finite(x: Any, lib: str) -> bool:
    if lib == "numpy":
        return bool(np.isfinite(x).all())
    if lib == "torch":
        import torch
        return bool(torch.isfinite(x.detach()).all())
    import cupy
    return bool(cupy.isfinite(x).all())


def centralize(x: Any, lib: str) -> Any:
    """``x - mean(x over every axis but the first)`` as a new array (gradient
    centralization of a convolution weight, MindSpore ``grad_centralization``)."""
    axes = tuple(range(1, x.ndim))
    if lib == "torch":
        x = x.detach()
        return (x - x.mean(dim=axes, keepdim=True)).contiguous()
    if lib == "numpy":
        out = aligned_full(x.shape, 0.0, x.dtype)
        np.subtract(x, x.mean(axis=axes, keepdims=True, dtype=np.float64).astype(x.dtype),
                    out=out)
        return out
    return x - x.mean(axis=axes, keepdims=True)

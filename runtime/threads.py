"""How many threads the CPU kernels use.

TVM's own default is half the cores (it assumes hyper-threading), which on a 2-core
machine is one thread. optgen starts TVM's pool with every core this process may run
on; ``TVM_NUM_THREADS`` in the environment, or ``set_num_threads`` before the first
step, chooses another count. After the pool has started it can shrink but not grow
beyond its starting size (TVM 0.27's ``runtime.config_threadpool``).
"""
from __future__ import annotations

import numbers
import os

from optgen.core.tvm_runtime import load_tvm_runtime

from .backends import omp_pool


def _started() -> bool:
    return load_tvm_runtime.cache_info().currsize > 0


def set_num_threads(n: int) -> None:
    """Use ``n`` threads for the CPU kernels of every optimizer in this process."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"set_num_threads: n must be an int >= 1, got {n!r}")
    if not _started():
        os.environ["TVM_NUM_THREADS"] = str(int(n))
        return
    import tvm_ffi
    limit = int(os.environ.get("TVM_NUM_THREADS", "0") or 0)
    if limit and n > limit:
        raise ValueError(f"set_num_threads: the kernel thread pool started with {limit} "
                         f"threads and cannot grow to {n}; set TVM_NUM_THREADS={n} or call "
                         "set_num_threads before the first step")
    tvm_ffi.get_global_func("runtime.config_threadpool")(0, int(n))
    omp_pool.threads_changed(int(n))


def get_num_threads() -> int:
    """The number of threads the CPU kernels use now."""
    load_tvm_runtime()
    import tvm_ffi
    return int(tvm_ffi.get_global_func("runtime.NumThreads")())


def set_cpu_pool(pool: str) -> str:
    """Which thread pool runs the CPU kernels' parallel loops: "auto" (the default, also
    ``OPTGEN_CPU_POOL``: the OpenMP runtime torch loaded where there is one, else TVM's),
    "openmp" or "tvm". Returns the pool now in use ("openmp" or "tvm"). Results are the
    same bits whichever runs them (runtime/backends/omp_pool.py)."""
    return omp_pool.set_pool(pool)


def cpu_pool() -> dict[str, str]:
    """{"setting", "pool" (the one in use), "why" (why not OpenMP, where it is not)}."""
    return omp_pool.pool()

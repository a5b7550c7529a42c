"""Stage 6c — native CUDA compilation: nvcc turns the generated CUDA C++ into PTX and a
cubin per architecture. No TVM here; a GPU is not needed (nvcc only compiles)."""
from __future__ import annotations

import functools
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

from ..errors import BuildError
from . import targets

# -diag-suppress 177: TVM declares let-bound index variables it then inlines ("unused")
FLAGS = ["-O3", "-std=c++17", "-diag-suppress", "177", "-diag-suppress", "550"]


@functools.lru_cache(maxsize=1)
def version() -> str:
    exe = targets.nvcc()
    if exe is None:
        return "none"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "unknown"


def compile_all(source: str, archs: tuple[str, ...], folder: str) -> dict[str, dict[str, str]]:
    """Write ``kernels.cu`` into ``folder`` and compile it to ``kernels.<arch>.ptx`` and
    ``kernels.<arch>.cubin`` for every arch (in parallel). Returns arch -> files."""
    exe = targets.nvcc()
    if exe is None:
        raise BuildError("target cuda needs nvcc to compile PTX and cubin: nvcc is not on "
                         "PATH (install the CUDA toolkit, or put its bin/ on PATH)")
    cu = os.path.join(folder, "kernels.cu")
    with open(cu, "w", encoding="utf-8") as f:
        f.write(source)
    jobs = [(arch, fmt) for arch in archs for fmt in ("ptx", "cubin")]

    def run(job):
        arch, fmt = job
        out = os.path.join(folder, f"kernels.{arch}.{fmt}")
        r = subprocess.run([exe, f"-{fmt}", f"-arch={arch}", *FLAGS, "-o", out, cu],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"nvcc failed for {arch} ({fmt}): "
                             f"{(r.stderr or r.stdout).strip()[-2000:]}")
        return job

    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        list(pool.map(run, jobs))
    return {arch: {fmt: f"kernels.{arch}.{fmt}" for fmt in ("ptx", "cubin")} for arch in archs}

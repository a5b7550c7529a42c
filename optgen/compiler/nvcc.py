"""Stage 6c — native CUDA compilation: nvcc turns the generated CUDA C++ into PTX and a
cubin per architecture. No TVM here; a GPU is not needed (nvcc only compiles)."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

from ..errors import BuildError

# -diag-suppress 177: TVM declares let-bound index variables it then inlines ("unused")
FLAGS = ["-O3", "-std=c++17", "-diag-suppress", "177", "-diag-suppress", "550"]


def exe() -> str | None:
    """nvcc on PATH, or None."""
    return shutil.which("nvcc")


@functools.lru_cache(maxsize=1)
def version() -> str:
    nv = exe()
    if nv is None:
        return "none"
    out = subprocess.run([nv, "--version"], capture_output=True, text=True).stdout
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "unknown"


def compile_all(cu: str, archs: tuple[str, ...], folder: str) -> dict[str, dict[str, str]]:
    """Compile the CUDA source ``cu`` (the artifact's ``kernels.cu``, written by the
    manifest stage) to ``kernels.<arch>.ptx`` (nvcc) and ``kernels.<arch>.cubin`` (ptxas
    on that PTX: half the time of a second nvcc run) in ``folder``, archs in parallel.
    Returns arch -> files."""
    nv = exe()
    if nv is None:
        raise BuildError("target cuda needs nvcc to compile PTX and cubin: nvcc is not on "
                         "PATH (install the CUDA toolkit, or put its bin/ on PATH)")
    ptxas = os.path.join(os.path.dirname(nv), "ptxas")
    if not os.path.exists(ptxas):
        ptxas = shutil.which("ptxas") or ptxas

    def run(cmd: list[str], what: str) -> None:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"{what} failed: {(r.stderr or r.stdout).strip()[-2000:]}")

    def arch_job(arch: str) -> None:  # nvcc's front end once, then ptxas on its PTX
        ptx = os.path.join(folder, f"kernels.{arch}.ptx")
        run([nv, "-ptx", f"-arch={arch}", *FLAGS, "-o", ptx, cu], f"nvcc -ptx for {arch}")
        run([ptxas, f"-arch={arch}", "-O3", "-o",
             os.path.join(folder, f"kernels.{arch}.cubin"), ptx], f"ptxas for {arch}")

    with ThreadPoolExecutor(max_workers=min(len(archs), os.cpu_count() or 1)) as pool:
        list(pool.map(arch_job, archs))
    return {arch: {fmt: f"kernels.{arch}.{fmt}" for fmt in ("ptx", "cubin")} for arch in archs}

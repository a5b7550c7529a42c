"""cuda: NVIDIA GPUs. TVM writes CUDA C++; nvcc and ptxas compile it to PTX and a cubin
per ``--arch`` (optgen.compiler.nvcc); the runtime launches them through CuPy."""
from __future__ import annotations

import os
import re

from .. import nvcc
from .base import Signature, Target, regex_signatures

_SIGNATURE = re.compile(
    r'extern "C" __global__ void (?:__launch_bounds__\((\d+)\) )?(\w+)\(([^)]*)\)')


class CUDA(Target):
    def tvm_target(self, arch: str | None, host: dict) -> dict:
        # the source does not depend on the arch; nvcc compiles it for every --arch
        return {"kind": "cuda", "arch": arch or "sm_80"}

    def parse_archs(self, arch: str | None) -> tuple[str, ...]:
        """``"sm_80,sm_90"`` -> ("sm_80", "sm_90"); each must look like sm_<digits>.
        None: the default architectures (optgen.core.targets)."""
        if arch is None:
            return self.facts.default_archs
        archs = tuple(a.strip() for a in arch.split(",") if a.strip())
        bad = [a for a in archs if not re.fullmatch(r"sm_[1-9][0-9]{1,2}[af]?", a)]
        if not archs or bad:
            raise ValueError(f"invalid --arch {arch!r}: expected a comma-separated list such "
                             "as sm_80,sm_90")
        return archs

    def status(self) -> dict[str, str]:
        """Build and compile; whether it runs here is the runtime backend's answer
        (optgen.runtime.backends.cuda: CuPy and a GPU), which ``optgen targets`` adds."""
        cc = nvcc.exe()
        return {"build": "yes (CUDA C++ source)",
                "compile": f"yes (nvcc: {cc})" if cc else "no: nvcc not on PATH (source only)"}

    def detail(self, archs: tuple[str, ...], host: dict) -> dict:
        return {**super().detail(archs, host), "archs": list(archs), "nvcc": nvcc.version()}

    def compile_native(self, sources: dict[str, str], archs: tuple[str, ...],
                       folder: str) -> dict[str, dict[str, str]]:
        # kernels.cu is in the folder already (write_artifact.write_sources)
        return nvcc.compile_all(os.path.join(folder, f"kernels.{self.source}"), archs, folder)

    def signatures(self, sources: dict[str, str], folder: str) -> dict[str, Signature]:
        return regex_signatures(_SIGNATURE, sources[self.source_key])


TARGET = CUDA("cuda", ("float32", "float64"), ("float16", "bfloat16"), True, "float64",
              "NVIDIA GPUs: CUDA C++, PTX and cubin per --arch (nvcc)",
              quant=True, matrix=True, library_matmul=True, multi_tensor=True)

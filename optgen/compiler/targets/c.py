"""c: portable C from TVM's C code generator, compiled with gcc (a CPU fallback)."""
from __future__ import annotations

import os
import shutil

from .base import Target

# gcc options: -fno-math-errno lets gcc vectorize sqrtf (tvm-notes §8); TVM's C code
# names float16 "half", which is C's _Float16 (IEEE binary16, gcc >= 12)
C_OPTIONS = ["-O3", "-fno-math-errno", "-Dhalf=_Float16"]


def gcc() -> str | None:
    return shutil.which(os.environ.get("CC", "gcc"))


class C(Target):
    def export_options(self) -> list[str]:
        return C_OPTIONS

    def status(self) -> dict[str, str]:
        cc = gcc()
        return {"build": "yes", "compile": f"yes ({cc})" if cc else "no: gcc not found",
                "run": "yes (tvm_ffi on this CPU)" if cc else "no: needs gcc"}

    def detail(self, archs: tuple[str, ...], host: dict) -> dict:
        return {"kind": "c", "cc": os.environ.get("CC", "gcc"), "options": C_OPTIONS}


# the C target gets scalar loops (vector=False): TVM's C codegen cannot print vector
# sqrt, and gcc vectorizes the scalar loops itself (tvm-notes §8)
TARGET = C("c", ("float32", "float64"), ("float16", "bfloat16"), True, "float64",
           "portable C compiled with gcc -O3 -fno-math-errno (a CPU fallback without LLVM)",
           quant=True, source_format="c", multi_tensor=True)

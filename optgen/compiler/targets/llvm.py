"""llvm: this machine's CPU through TVM's LLVM (vectorized, multi-threaded)."""
from __future__ import annotations

from .base import Target


class LLVM(Target):
    def tvm_target(self, arch: str | None, host: dict) -> dict:
        return host

    def status(self) -> dict[str, str]:
        return {"build": "yes (TVM's LLVM)", "compile": "yes (LLVM, in TVM)",
                "run": "yes (tvm_ffi on this CPU)"}

    def detail(self, archs: tuple[str, ...], host: dict) -> dict:
        from optgen.core import cache  # noqa: PLC0415 — the key's machine id
        return {**host, "machine": cache.machine()}


TARGET = LLVM("llvm", ("float32", "float64"), ("float16", "bfloat16"), True, "float64",
              "this machine's CPU through LLVM (vectorized, multi-threaded)",
              quant=True, matrix=True, vector=True, multi_tensor=True, source_format="ll")

"""webgpu: WGSL for WebGPU (validated by wgpu/naga where installed; not run)."""
from __future__ import annotations

import importlib.util
import re

from .base import Signature, Target, regex_signatures

_SIGNATURE = re.compile(r'fn ()(\w+)\(\n')


class WebGPU(Target):
    def math_name(self, fn: str, dtype: str) -> str:
        if fn in ("erf", "log1p", "expm1"):
            raise self.lacks(fn, "WGSL has no erf, log1p or expm1")
        return fn    # its built-ins are overloaded

    def status(self) -> dict[str, str]:
        ok = importlib.util.find_spec("wgpu") is not None
        return {"build": "yes (WGSL source)",
                "compile": "yes (validated by wgpu/naga when an adapter exists)" if ok else
                "no: pip install wgpu to validate the WGSL",
                "run": "no: optgen's runtime has no WebGPU launcher"}

    def signatures(self, sources: dict[str, str], folder: str) -> dict[str, Signature]:
        return regex_signatures(_SIGNATURE, sources[self.source_key])


TARGET = WebGPU("webgpu", ("float32",), (), False, "float32",
                "WebGPU: WGSL (no doubles, halves or 64-bit integers: float32 kernels, "
                "float32 reductions, no row-sparse kernels)", lazy=False)

"""metal: Apple GPUs, Metal Shading Language (source only here)."""
from __future__ import annotations

import re

from .base import Signature, Target, regex_signatures

_SIGNATURE = re.compile(r'kernel void ()(\w+)\(')


class Metal(Target):
    def math_name(self, fn: str, dtype: str) -> str:
        if fn in ("erf", "log1p", "expm1"):
            raise self.lacks(fn, "the Metal Shading Language has no erf, log1p or expm1")
        return fn    # its built-ins are overloaded

    def status(self) -> dict[str, str]:
        return {"build": "yes (Metal source)", "compile": "no: needs Apple's metal compiler",
                "run": "no: needs macOS"}

    def signatures(self, sources: dict[str, str], folder: str) -> dict[str, Signature]:
        return regex_signatures(_SIGNATURE, sources[self.source_key])


TARGET = Metal("metal", ("float32",), ("float16",), True, "float32",
               "Apple GPUs: Metal Shading Language (no doubles: float32 reductions)")

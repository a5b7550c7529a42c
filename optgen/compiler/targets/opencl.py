"""opencl: OpenCL C for any OpenCL device. The OpenCL runtime compiles it when the
program is loaded, so whether it compiles and runs here is the runtime backend's answer
(optgen.runtime.backends.opencl: the device it would choose, and why others were passed
over); ``optgen targets`` shows both."""
from __future__ import annotations

import re

from .base import Signature, Target, regex_signatures

_SIGNATURE = re.compile(r'__kernel void ()(\w+)\(([^)]*)\)')


class OpenCL(Target):
    def math_name(self, fn: str, dtype: str) -> str:
        return fn    # OpenCL C's built-ins are overloaded on float and double

    def status(self) -> dict[str, str]:
        return {"build": "yes (OpenCL C source)"}

    def signatures(self, sources: dict[str, str], folder: str) -> dict[str, Signature]:
        return regex_signatures(_SIGNATURE, sources[self.source_key])


TARGET = OpenCL("opencl", ("float32", "float64"), (), False, "float64",
                "OpenCL C (any OpenCL device; PoCL runs it on the CPU, Oclgrind in a "
                "simulator); float16 needs cl_khr_fp16, which PoCL lacks, so no half kernels",
                quant=True)

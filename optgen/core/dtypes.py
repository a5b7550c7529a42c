"""The parameter dtypes kept with a float32 master copy (mixed precision): the compiler
builds their kernels, the runtime picks them by a parameter's dtype."""
from __future__ import annotations

LOW_PRECISION = ("float16", "bfloat16")

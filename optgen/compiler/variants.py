"""Which kernels a target gets (stages 3-4 of the pipeline, per target): the kernel IRs
of every flag combination, plain and mixed precision (``kernel_irs``), the dtypes each
compiles in (``variants``), and the symbol each kernel is exported as (``symbol_for``).
The pipeline lowers these; the manifest (optgen.compiler.manifest) lists them.
"""
from __future__ import annotations

from ..errors import BuildError
from . import targets
from .kernel_ir import KernelIR
from .lower import DTYPE_TAG
from .specialize import MASTER_DTYPE, specialize

DTYPES = ("float32", "float64")   # plain kernels: parameter, states and compute in one dtype


def symbol_for(name: str, param_dtype: str, flags: dict[str, bool]) -> str:
    return "_".join([name, DTYPE_TAG[param_dtype], *(f for f, on in flags.items() if on)])


def variants(kirs: list[KernelIR], dtypes: tuple[str, ...] = DTYPES
             ) -> list[tuple[KernelIR, str, str]]:
    """(IR, compute dtype, parameter dtype) of every kernel: a plain IR compiles once per
    ``dtypes``, a mixed-precision IR once, in float32 (MASTER_DTYPE)."""
    return [(kir, dt, kir.param_dtype or dt) for kir in kirs
            for dt in ((MASTER_DTYPE,) if kir.param_dtype else dtypes)]


def kernel_irs(spec, traces, tg: targets.Target) -> list[KernelIR]:
    """The IRs a target gets: every flag combination, plain and in each mixed dtype the
    target has; without float16 on the target, no IR that stores float16; without
    64-bit integers, no row-sparse variant."""
    if tg.name != "llvm":
        matrix = next((tr for tr in traces if tr.matrix), None)
        if matrix is not None:
            raise BuildError(f"{spec.name} uses matrix products (flags {matrix.flags}), which "
                             f"optgen compiles for the llvm target only so far, not {tg.name}")
    kirs = [specialize(spec, tr, low, merge=tg.family == "cpu") for tr in traces
            for low in (None, *(() if tr.matrix else tg.mixed))]
    kirs = [k for k in kirs if tg.half_states or "float16" not in k.storage.values()]
    if not tg.lazy:
        for k in kirs:
            k.lazy = None
    return kirs

"""What every target is: the ``Target`` record and the hooks a target module overrides.

What both sides know of a target (its schedule family: ``cpu``, loops, SIMD vectors
and a thread pool, or ``gpu``, thread-bound blocks; its source file; the artifact key;
what the runtime reads) is the kernel core's (optgen.core.targets), read here by name.
A compiler target adds the kernel dtypes it gets, the wide type of reductions, how TVM
is asked to build it (the TVM target as a dict; TVM itself is imported by
optgen.compiler.tvm_backend only), the native step after TVM (nvcc, ld.lld) and how the
device ABI is read back from what was built (optgen.compiler.abi).
Nothing here imports TVM.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from optgen.core import targets as core_targets
from ...errors import BuildError
from optgen.core.targets import TargetFacts, fact

# One device kernel as a signature reader finds it: launch bounds (threads per block,
# None where the code does not say) and its parameters as (C type, name) in declaration
# order (None: the reader finds names only).
Signature = tuple["int | None", "list[tuple[str, str]] | None"]


@dataclass(frozen=True)
class Target:
    name: str                   # its facts are optgen.core.targets.get(name)
    dtypes: tuple[str, ...]     # plain kernels: parameter, states and compute dtype
    mixed: tuple[str, ...]      # mixed-precision parameter dtypes (float32 master)
    half_states: bool           # float16 state storage (half_when flags) is available
    acc_dtype: str              # reductions and pow: float64 where the target has doubles
    doc: str
    lazy: bool = True           # row-sparse kernels (they index with int64 row numbers)
    quant: bool = False         # q8/q4 state kernels (a GPU target: as tested on it)
    matrix: bool = False        # matrix rules (products of 2-D parameters)
    library_matmul: bool = False  # their products run in the runtime's BLAS (CuPy/torch:
    #                               cuBLAS; numpy), not as generated kernels
    vector: bool = False        # CPU schedule with explicit SIMD vectors (else scalar loops)
    multi_tensor: bool = False  # "_mt" variants: a list of tensors through a pointer table
    source_format: str = ""     # what TVM's inspect_source is asked for
    facts: TargetFacts = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "facts", core_targets.get(self.name))

    # -- the core's facts (optgen.core.targets.TargetFacts; the runtime reads the same) --
    family, source, source_key = fact("family"), fact("source"), fact("source_key")
    takes_arch, machine_bound = fact("takes_arch"), fact("machine_bound")
    device_abi, needs_tvm = fact("device_abi"), fact("needs_tvm")
    key, files = fact("key"), fact("files")     # (archs) -> artifact key; (manifest) -> names

    # -- building with TVM (optgen.compiler.tvm_backend) -------------------------------
    def tvm_target(self, arch: str | None, host: dict) -> dict:
        """The TVM target as a dict; ``host`` is this machine's CPU as a TVM target dict,
        which tvm_backend gives a GPU target as its host."""
        return {"kind": self.name}

    def export_options(self) -> list[str] | None:
        """Compiler options of TVM's export_library (None: TVM's)."""
        return None

    def tvm_callbacks(self, folder: str) -> dict[str, Callable]:
        """TVM global functions this target's build calls back (linkers, device library
        paths), by name; registered for the build into ``folder`` only."""
        return {}

    def intrinsic_gaps(self) -> dict[tuple[str, str], str]:
        """(TVM op, dtype) -> why this machine cannot compile it for the target; the build
        refuses them with that reason (an LLVM back end would abort the process)."""
        return {}

    def math_name(self, fn: str, dtype: str) -> str:
        """The name this target's compiler knows the C library's function ``fn``
        (optgen.ir.LIBM: atan, atan2, tanh, erf, log1p, expm1, sinh, cosh) by on
        ``dtype``: C99's (``atanf`` on float32, ``atan`` on float64) unless a target
        overrides it; a function the target lacks is a BuildError (``lacks``)."""
        return fn + "f" if dtype == "float32" else fn

    def lacks(self, fn: str, why: str) -> BuildError:
        """The BuildError for a function ``fn`` this target cannot compute."""
        return BuildError(f"{fn}() has no {self.name} implementation: {why}; use another "
                          "target or write the function with the DSL's other operations")

    # -- options and availability -------------------------------------------------------
    def parse_archs(self, arch: str | None) -> tuple[str, ...]:
        """The architectures ``--arch`` names (None: the default); called only for a
        target with ``takes_arch`` (optgen.compiler.targets.archs_for)."""
        return self.facts.default_archs

    def check_toolchain(self) -> None:
        """Raise BuildError naming what is missing when this machine cannot build."""

    def status(self) -> dict[str, str]:
        """What this machine can do: build / compile / run, each a short sentence
        starting with "yes" or "no" (``optgen targets``)."""
        raise NotImplementedError(self.name)

    # -- after TVM ---------------------------------------------------------------------
    def detail(self, archs: tuple[str, ...], host: dict) -> dict:
        """The manifest's target_detail (``host``: as for tvm_target)."""
        from ..schedule_gpu import THREADS  # noqa: PLC0415 — GPU targets only
        return {"kind": self.name, "threads_per_block": THREADS}

    def compile_native(self, sources: dict[str, str], archs: tuple[str, ...],
                       folder: str) -> dict[str, dict[str, str]]:
        """Native binaries from the generated source, written into ``folder``: arch ->
        format -> file name (the manifest's ``binaries``)."""
        return {}

    def signatures(self, sources: dict[str, str], folder: str) -> dict[str, Signature] | None:
        """Device kernel name -> its signature, read from what was built (None: this
        target has no reader, the ABI is the schedule's word)."""
        return None


def regex_signatures(pattern: re.Pattern, text: str) -> dict[str, Signature]:
    """Signatures by a regex with groups (launch bounds or empty, name, parameter list
    or none); parameters "T name" split on commas, a pointer's '*' kept with its type."""
    found: dict[str, Signature] = {}
    for m in pattern.finditer(text):
        plist = m.group(3) if m.lastindex and m.lastindex >= 3 else None
        params = None if plist is None else [
            (" ".join(raw.split()[:-1]), raw.split()[-1].lstrip("*"))
            for raw in (p.strip() for p in plist.split(",")) if raw]
        found.setdefault(m.group(2), (int(m.group(1)) if m.group(1) else None, params))
    return found

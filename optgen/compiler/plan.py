"""The build plan: stages 1-5 of the pipeline (load, verify, IR, lower, schedule), which
need no TVM, and what they decided, recorded once per kernel and per pass.

Every later stage reads the plan instead of deciding again: the build (TVM) compiles
``BuildPlan.scripts``, the device ABI (optgen.compiler.abi) reads each pass's grids,
shape variables and buffers, and the manifest (optgen.compiler.write_artifact) lists each
kernel with the symbols of its passes.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Collection

from ..declarations import Spec
from optgen.core import progress
from . import math_calls, schedule_gpu, schedule_llvm, targets
from .kernel_ir import KernelIR
from .loader import load_spec
from .lower import LoweredKernel, lower
from .schedule_llvm import RED_SCALAR_SIZE
from .variants import default_variants, kernel_irs, symbol_for, variant_name, variants
from .verify import verify


@dataclass
class PassPlan:
    """One function of the library: a launch of a kernel, its segmented twin (CPU) or
    its row-sparse pass."""
    lowered: LoweredKernel
    script: str                      # its TVMScript
    grids: list | None               # GPU: the grid of each device kernel it becomes
    dims: dict[str, list] | None     # GPU: shape variable -> [buffer, axis] it is read off
    compiled_as: str                 # the symbol that runs it: its own, or an earlier
    #                                  pass's whose function is the same text (CPU)

    @property
    def symbol(self) -> str:
        return self.lowered.symbol

    @property
    def function(self) -> str:
        """The TVMScript of the function that runs it, named ``compiled_as``."""
        if self.compiled_as == self.symbol:
            return self.script
        return self.script.replace(f"def {self.symbol}(", f"def {self.compiled_as}(").replace(
            f'"{self.symbol}"', f'"{self.compiled_as}"')

    @property
    def library(self) -> bool:
        """A matrix product the runtime's BLAS computes (Target.library_matmul): no
        function of the library, no device kernel."""
        return self.lowered.kind == "matmul" and not self.script


_SLOT = {"seg": "seg_symbol", "mt": "mt_symbol"}   # a launch's variants, by pass role


@dataclass
class KernelPlan:
    """One kernel of the manifest: a kernel IR in one (compute, parameter) dtype, in the
    library of its variant (optgen.compiler.variants.variant_name)."""
    kir: KernelIR
    dtype: str
    param_dtype: str
    symbol: str
    passes: list[PassPlan]
    variant: str

    def manifest_entry(self) -> dict:
        """The manifest's record of the kernel: its IR, and each launch (and lazy pass)
        with the symbol that runs it."""
        entry = {"symbol": self.symbol, "dtype": self.dtype, "param_dtype": self.param_dtype,
                 "variant": self.variant, **self.kir.to_json()}
        for p in self.passes:
            role, j = p.lowered.role, p.lowered.launch
            if role == "lazy":
                entry["lazy"]["symbol"] = p.compiled_as
            elif p.library:
                entry["launches"][j].update(symbol=None, library="matmul")
            else:
                entry["launches"][j][_SLOT.get(role, "symbol")] = p.compiled_as
        return entry


@dataclass
class BuildPlan:
    """What the front end decided for one (spec, target, base, state format)."""
    spec: Spec
    target: targets.Target
    base: str | None
    state_format: str | dict[str, str] | None   # the request (optgen.core.formats.request)
    kirs: list[KernelIR]
    kernels: list[KernelPlan]
    made: dict[str, tuple[str, dict]]   # every variant -> (parameter dtype, its flags)

    @property
    def passes(self) -> list[PassPlan]:
        return [p for k in self.kernels for p in k.passes]

    @property
    def defaults(self) -> list[str]:
        """The variants ``optgen build`` makes by default (variants.default_variants)."""
        return default_variants(self.spec, self.target, self.made)

    def scripts(self, variants: Collection[str] | None = None) -> dict[str, str]:
        """symbol -> TVMScript of every function a library of ``variants`` (or of all of
        them) exports, in plan order: each function once, under the name every launch
        of it uses (``compiled_as``: the first pass of that text in the plan, which may
        be another variant's)."""
        return {p.compiled_as: p.function for k in self.kernels
                if variants is None or k.variant in variants
                for p in k.passes if not p.library}


def _debug(stage: str, text: str) -> None:
    if os.environ.get("OPTGEN_DEBUG"):
        print(f"--- optgen: after {stage} ---\n{text}", file=sys.stderr)


def schedule(k: LoweredKernel, tg: targets.Target) -> tuple[str, list | None]:
    """Stage 5 for a target: TVMScript text, and the device kernels' grids (GPU)."""
    k = math_calls.resolve(k, tg)     # atan, erf, ...: the target's names (or BuildError)
    if tg.family == "gpu":
        return schedule_gpu.schedule(k, tg.acc_dtype)
    # a target without vector (C) gets scalar loops (targets/c.py says why), and so does
    # a pass calling the C library (math_calls says why)
    return schedule_llvm.schedule(k, vector=tg.vector and not math_calls.calls(k)), None


def make_plan(spec_path: str, tg: targets.Target, base: str | None = None,
              state_format: str | dict[str, str] | None = None) -> BuildPlan:
    """Stages 1-5 for ``tg``: the spec, its kernel IRs, and every kernel's passes with
    their TVMScript (and GPU grids and shape variables), each kernel in its variant."""
    progress.stage("trace")
    spec = load_spec(spec_path, base)                                # 1 load
    traces = verify(spec)                                            # 2 verify
    kirs = kernel_irs(spec, traces, tg, state_format)                # 3 IR
    _debug("specialize", "\n".join(json.dumps(k.to_json(), indent=1) for k in kirs))
    kernels, made = [], {}
    progress.stage("lower")
    for kir, dt, pdt in variants(kirs, tg.dtypes):                   # 4 lower
        variant = variant_name(pdt, kir.flags, spec.flags)
        made.setdefault(variant, (pdt, {f: kir.flags[f] for f in spec.flags}))
        symbol = symbol_for(spec.name, pdt, kir.flags, kir.state_format)
        passes = []
        cpu = tg.family == "cpu"
        for k in lower(kir, dt, symbol, tg.acc_dtype, RED_SCALAR_SIZE if cpu else None,
                       multi=tg.multi_tensor):
            if k.kind == "matmul" and tg.library_matmul:   # the runtime's BLAS computes it
                passes.append(PassPlan(k, "", [], {}, k.symbol))
                continue
            text, grids = schedule(k, tg)                            # 5 schedule
            dims = schedule_gpu.shape_vars(k) if tg.family == "gpu" else None
            passes.append(PassPlan(k, text, grids, dims, k.symbol))
        kernels.append(KernelPlan(kir, dt, pdt, symbol, passes, variant))
    plan = BuildPlan(spec, tg, base, state_format, kirs, kernels, made)
    if tg.family != "gpu":      # GPU passes keep their own symbols: each has device kernels
        _share_functions(plan.passes)
    _debug("schedule", "\n\n".join(p.script for p in plan.passes))
    return plan


def _share_functions(passes: list[PassPlan]) -> None:
    """Point each pass at the first one whose function is the same text but for its
    name. Flag combinations share many passes (every matmul of a matrix rule, a fallback
    rule under flags it ignores): each is compiled once and the launches name the first.
    A variant's library holds each function its launches name, under that name."""
    first: dict[str, str] = {}
    for p in passes:
        if p.library:
            continue
        canonical = p.script.replace(f"def {p.symbol}(", "def _(").replace(
            f'"{p.symbol}"', '"_"')
        p.compiled_as = first.setdefault(canonical, p.symbol)

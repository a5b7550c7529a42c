"""The runtime's backends, registered by target name: how the trainer-side runtime loads
and runs each target's artifacts (``cpu``: the library through tvm_ffi; ``cuda``: CuPy;
``opencl``: pyopencl). A target with no backend here (rocm, metal, webgpu) is built with
its source only and cannot be run. What the compiler knows of a target too (device kind,
host memory, artifact key, files) is the kernel core's (optgen.core.targets), which each
backend reads by name. The runtime asks these registries instead of comparing target
names; it never imports the compiler (TVM). Adding a backend: write its module and list
it below (docs/targets.md, "Adding a target").
"""
from __future__ import annotations

from optgen.core import targets as core_targets
from . import cpu, cuda, opencl
from .base import Backend, source_only

BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    """Add ``backend`` under its target's name (registered twice: a ValueError)."""
    return core_targets.add(BACKENDS, backend.target, backend, "runtime backend")


for _b in (*cpu.BACKENDS, cuda.BACKEND, opencl.BACKEND):
    register(_b)


def get(target: str) -> Backend:
    """The backend of ``target``; a source-only one for a target the runtime cannot run
    (ValueError for a name that is no target)."""
    return BACKENDS.get(target) or source_only(target)


def host_targets() -> list[str]:
    """Targets whose kernels step host arrays in place (CPU offload)."""
    return [n for n, b in BACKENDS.items() if b.host]


__all__ = ["BACKENDS", "Backend", "get", "host_targets", "register"]

"""The targets optgen builds for, one module each, registered by name.

A target module defines ``TARGET``, a ``base.Target`` (or a subclass overriding its
hooks): its TVM target, kernel dtypes, native compile step, device ABI reader and what
this machine can do with it (``optgen targets``). What the runtime knows of it too
(schedule family, source suffix, artifact key, ...) is the kernel core's, by name
(optgen.core.targets). Everything else asks these registries: nothing outside them (and
the runtime's backends) switches on a target's name. Adding a target: its facts in
optgen/core/targets.py, then write ``<name>.py`` here and list it in ``_MODULES``
(docs/targets.md, "Adding a target").
"""
from __future__ import annotations

from optgen.core import targets as core_targets
from . import c, cuda, llvm, metal, opencl, rocm, webgpu
from .base import Signature, Target
from .. import nvcc as _nvcc

_MODULES = (llvm, c, cuda, rocm, opencl, metal, webgpu)   # the order `optgen targets` shows
TARGETS: dict[str, Target] = {}
DEFAULT = "llvm"    # the target of `optgen build` and optgen.create without one


def register(target: Target) -> Target:
    """Add ``target`` under its name (a name registered twice is a ValueError)."""
    return core_targets.add(TARGETS, target.name, target, "target")


for _m in _MODULES:
    register(_m.TARGET)


def get(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; targets: {', '.join(TARGETS)}") from None


def names() -> tuple[str, ...]:
    return tuple(TARGETS)


def archs_for(target: Target, arch: str | None) -> tuple[str, ...]:
    """The architectures a build compiles for: ``--arch`` parsed by a target that takes
    one (its default without), () for the others; ``--arch`` given to one that does not
    take it is a ValueError naming those that do."""
    if target.takes_arch:
        return target.parse_archs(arch)
    if arch is not None:
        raise ValueError(f"--arch applies to the {', '.join(names_with_archs())} target "
                         f"only, not {target.name!r}")
    return ()


def names_with_archs() -> list[str]:
    return [n for n, t in TARGETS.items() if t.takes_arch]


def status(name: str) -> dict[str, str]:
    """What this machine can build and compile for a target (see Target.status)."""
    return get(name).status()


# the helpers tests and tools name by their old home (optgen/compiler/targets.py)
nvcc = _nvcc.exe
rocm_path = rocm.toolchain          # the ROCm build's toolchain (a linker), None without

__all__ = ["DEFAULT", "Signature", "TARGETS", "Target", "archs_for", "get", "names",
           "names_with_archs", "nvcc", "register", "rocm_path", "status"]

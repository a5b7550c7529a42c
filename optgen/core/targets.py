"""What both sides know of a target, registered by name: the facts that are neither how
TVM builds it nor how the runtime loads and launches it.

The compiler's targets (optgen/compiler/targets/: TVM target, dtypes, native compile
step) and the runtime's backends (runtime/backends/: load, launch) each read their
target's ``TargetFacts`` here by name and add only their own side; the artifact key
(cache.artifact_key) and the artifact checks (manifest.py) read them too. Nothing else
states these facts, and nothing outside the three registries compares a target's name
(tests/test_architecture_targets.py). Adding a target: its facts here (``register``),
its compiler module, and its runtime backend if optgen runs it.

Imports nothing of optgen.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TargetFacts:
    name: str
    # "cpu": loops in a shared library that TVM's runtime loads (tvm_ffi); "gpu":
    # thread-bound device kernels, launched from the manifest's device ABI
    family: str
    device: str             # the device kind of the arrays its kernels take
    source: str             # suffix of the generated source file (kernels.<source>)
    source_key: str = ""    # the source's key in the manifest's "sources" (default: name)
    host: bool = False      # its kernels step arrays in host memory in place (CPU offload)
    machine_bound: bool = False   # code for this machine's CPU: the artifact key names it
    # what `--arch` defaults to; a target with default archs takes `--arch`, and the
    # archs it was built for are part of its artifact key ("cuda:sm_80,sm_90")
    default_archs: tuple[str, ...] = ()
    loads_source: bool = False    # the runtime compiles its source when loading (OpenCL)

    def __post_init__(self) -> None:
        if self.family not in ("cpu", "gpu"):
            raise ValueError(f"target {self.name!r}: family {self.family!r} is not "
                             "'cpu' or 'gpu'")
        if not self.source_key:
            object.__setattr__(self, "source_key", self.name)

    @property
    def device_abi(self) -> bool:
        """Its manifest has a device ABI (``device_kernels``) its kernels launch from."""
        return self.family == "gpu"

    @property
    def needs_tvm(self) -> bool:
        """Its kernels load through TVM's runtime (a library, not a device ABI)."""
        return not self.device_abi

    @property
    def takes_arch(self) -> bool:
        """``--arch`` picks the architectures it compiles for."""
        return bool(self.default_archs)

    def key(self, archs: tuple[str, ...] = ()) -> str:
        """The target as the artifact key sees it: the name, with the architectures
        (``archs``, else the default ones) for a target that takes ``--arch``."""
        if not self.takes_arch:
            return self.name
        return f"{self.name}:{','.join(archs or self.default_archs)}"

    def files(self, manifest: dict) -> list[str]:
        """Files the runtime reads beyond the library and the binaries: the source of a
        target whose runtime compiles it at load."""
        return [manifest["sources"][self.source_key]] if self.loads_source else []


def fact(name: str) -> property:
    """A property reading ``self.facts.<name>``: how the compiler's Target and the
    runtime's Backend show the facts of their target as their own attributes."""
    return property(lambda self: getattr(self.facts, name),
                    doc=f"optgen.core.targets.TargetFacts.{name}")


def add(table: dict, name: str, entry, what: str):
    """``table[name] = entry`` for a target registry (the core's, the compiler's, the
    runtime's): ``entry`` back, or a ValueError if ``name`` is registered already."""
    if name in table:
        raise ValueError(f"{what} {name!r} is registered twice")
    table[name] = entry
    return entry


FACTS: dict[str, TargetFacts] = {}


def register(facts: TargetFacts) -> TargetFacts:
    """Add ``facts`` under its name (a name registered twice is a ValueError)."""
    return add(FACTS, facts.name, facts, "TargetFacts")


def get(name: str) -> TargetFacts:
    try:
        return FACTS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; targets: {', '.join(FACTS)}") from None


# the targets, in the order `optgen targets` shows them
register(TargetFacts("llvm", "cpu", "cpu", "ll", source_key="ll", host=True,
                     machine_bound=True))
register(TargetFacts("c", "cpu", "cpu", "c", host=True))
register(TargetFacts("cuda", "gpu", "cuda", "cu", default_archs=("sm_80", "sm_90")))
register(TargetFacts("rocm", "gpu", "rocm", "ll"))
# OpenCL kernels take host arrays, copied to the OpenCL device on every call
register(TargetFacts("opencl", "gpu", "cpu", "cl", loads_source=True))
register(TargetFacts("metal", "gpu", "metal", "metal"))
register(TargetFacts("webgpu", "gpu", "webgpu", "wgsl"))

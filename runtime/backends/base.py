"""What a runtime backend is: how the runtime loads and runs one target's artifacts.

What the compiler knows of the target too (the device kind of its arrays, whether its
kernels step host memory, whether the artifact key names this machine, device ABI or
library, the files it reads) is the kernel core's, by name (optgen.core.targets); a
backend adds only how kernels are loaded or launched and whether this machine runs them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from optgen.core import targets as core_targets
from optgen.core.targets import TargetFacts, fact


def _no_status() -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class Backend:
    """One target's runtime. A target with neither ``load`` nor ``launcher`` has its
    source only: the runtime cannot run it (``source_only``)."""
    target: str                  # its facts are optgen.core.targets.get(target)
    # the library through tvm_ffi (CPU): (folder, manifest) -> module, module[symbol]
    load: Callable[[str, dict], Any] | None = None
    # the device ABI's launcher: (folder, manifest) -> object with kernel(name) and
    # run(spec, arrays, scalars, launches) (runtime/device.py drives it)
    launcher: Callable[[str, dict], Any] | None = None
    status: Callable[[], dict[str, str]] = _no_status  # `optgen targets`: compile/run here
    facts: TargetFacts = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "facts", core_targets.get(self.target))

    # -- the core's facts (optgen.core.targets.TargetFacts; the compiler reads the same) --
    device, host, machine_bound = fact("device"), fact("host"), fact("machine_bound")
    device_abi, needs_tvm = fact("device_abi"), fact("needs_tvm")
    files = fact("files")        # (manifest) -> files it reads beyond the library

    def target_key(self, archs: tuple[str, ...] | None = None) -> str:
        """The target as the artifact key sees it (cuda: with its architectures)."""
        return self.facts.key(archs or ())


def source_only(target: str) -> Backend:
    """A target the runtime has no backend for (its source only); ValueError for a
    name that is no target."""
    return Backend(target)

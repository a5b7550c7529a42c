"""What a runtime backend is: how the runtime loads and runs one target's artifacts."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


def _no_files(manifest: dict) -> list[str]:
    return []


def _no_status() -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class Backend:
    """One target's runtime. A target with neither ``load`` nor ``launcher`` has its
    source only: the runtime cannot run it (``source_only``)."""
    target: str
    device: str                  # the device kind of the arrays its kernels take
    host: bool = False           # its kernels step arrays in host memory in place (offload)
    # the library through tvm_ffi (CPU): (folder, manifest) -> module, module[symbol]
    load: Callable[[str, dict], Any] | None = None
    # the device ABI's launcher: (folder, manifest) -> object with kernel(name) and
    # run(spec, arrays, scalars, launches) (runtime/device.py drives it)
    launcher: Callable[[str, dict], Any] | None = None
    machine_bound: bool = False  # code for this machine's CPU: the cache key names it
    files: Callable[[dict], list[str]] = _no_files   # files it reads beyond the library
    status: Callable[[], dict[str, str]] = _no_status  # `optgen targets`: compile/run here
    key: Callable[[tuple[str, ...]], str] | None = field(default=None)  # archs -> key

    @property
    def device_abi(self) -> bool:
        """Launched through the manifest's device ABI (``device_kernels``)."""
        return self.launcher is not None

    @property
    def needs_tvm(self) -> bool:
        """Its kernels load through TVM's runtime (all but the device-ABI launchers)."""
        return self.launcher is None

    def target_key(self, archs: tuple[str, ...] | None = None) -> str:
        """The target as the artifact key sees it (cuda: with its architectures)."""
        return self.key(archs or ()) if self.key is not None else self.target


def source_only(target: str) -> Backend:
    """A target the runtime has no backend for: its arrays live on a device of its name."""
    return Backend(target, target)

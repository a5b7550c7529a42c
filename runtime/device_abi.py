"""The device ABI shared by the GPU launchers (runtime/device.py, runtime/backends/): the
errors, how many blocks a grid needs, where shape variables come from, and which CUDA
binary fits a GPU. Imports nothing of optgen's."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

DIM_TYPES = {"int64_t": np.int64, "long": np.int64, "int": np.int32, "int32_t": np.int32}


class DeviceError(RuntimeError):
    """The device kernels cannot be loaded or launched here."""


class DeviceWarning(RuntimeWarning):
    """A device was passed over (its runtime cannot compile kernels here)."""


def blocks(grid: dict, dims: dict[str, int]) -> int:
    total = math.prod(dims[d] for d in grid["extent"])
    count = -(-total // grid["per_block"])
    return min(count, grid["max_blocks"]) if grid["max_blocks"] else count


def shape_values(spec: dict, arrays: dict[str, Any]) -> dict[str, int]:
    """Each shape variable's value, read off the arrays passed (see abi.shape_vars)."""
    return {name: int(arrays[buf].shape[axis]) for name, (buf, axis) in spec["dims"].items()}


def pick_binary(binaries: dict[str, dict[str, str]], cc: int) -> str:
    """The file to load on a GPU of compute capability ``cc`` (e.g. 90): the cubin built
    for exactly that architecture, else the PTX of the newest architecture below it
    (the driver compiles PTX forward, never backward)."""
    archs = {int(a[3:].rstrip("af")): files for a, files in binaries.items()
             if not a.endswith(("a", "f"))}  # sm_90a code runs on sm_90 only: exact match
    exact = [files for a, files in binaries.items() if int(a[3:].rstrip("af")) == cc]
    if exact:
        return exact[0]["cubin"]
    lower = [a for a in archs if a <= cc]
    if not lower:
        raise DeviceError(f"the artifact has code for {', '.join(sorted(binaries))} only; this "
                          f"GPU is sm_{cc}: rebuild with --arch sm_{cc}")
    return archs[max(lower)]["ptx"]

"""The multi-tensor launch: one call steps a list of loose tensors where they live.

A kernel whose rule is one elementwise pass has a ``_mt`` variant (``mt_symbol``,
templates/kernel_llvm_multi.py.j2) that reads a table of pointers instead of arrays:

    _tab     (nt, nbuf + 1) int64   per tensor: the address of each of the launch's
                                    buffers (parameter, master, states, gradient), then
                                    its element count
    _chunks  (nc + 1, 3) int64      row 0: the total element count (the kernel goes
                                    parallel above a threshold); rows 1..: the work
                                    items (tensor, first element, end), CHUNK at most

``find`` groups the parameters that no flat run steps by (group, kernel, multipliers,
library, device; the shape too where host scalars read it): one ``MultiTensor`` per group of two or more. The table is built
once, when the kernels are prepared (the slots keep every array it points into; on a
GPU it lives in device memory, and so does the chunk map); only the gradients' column
is rewritten (one copy to the device), when the gradients change (runtime/gradcache.py).
``run`` is a run's (strategies/base.py ``Fused``): a member without a dense gradient,
a step count or scalar state that differs, or gradients overlapping the table's other
arrays make it decline, and the members step alone, exactly as before. ``part`` makes
the list of some members, with a table of their own, for a step in parts (the torch
drop-ins' buckets of the step inside backward: runtime/strategies/base.py ``Launches``).

May import: numpy, base, gradcache, launch, slots, tensors; core: scalar_expr.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from optgen.core import scalar_expr

from .. import tensors
from ..gradcache import GradCache
from ..launch import Launcher
from ..slots import ParamSlot
from .base import Fused, StepInputs

CHUNK = 1 << 15          # elements of a CPU work item (whole vectors but the tensor's last)
GPU_CHUNK = 1 << 12      # elements of a GPU work item (one block of 256 threads)


def chunk_map(sizes: Sequence[int], chunk: int = CHUNK) -> np.ndarray:
    """The ``_chunks`` argument for tensors of ``sizes`` elements (see the module doc)."""
    rows = [(sum(sizes), 0, 0)]
    rows += [(t, lo, min(lo + chunk, n)) for t, n in enumerate(sizes)
             for lo in range(0, n, chunk)]
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


class MultiTensor(Fused):
    """Loose parameters with one kernel, group and multipliers: one call per step."""

    def __init__(self, launcher: Launcher, slots: Sequence[ParamSlot], cache: GradCache):
        k = slots[0].kernel
        ln = k.launches[0]
        self.lib = slots[0].lib
        names = list(ln["buffers"])
        self.gcol = names.index("grad")
        parts = [launcher.arrays(s.index, k, None, {}) for s in slots]
        self.host = np.zeros((len(slots), len(names) + 1), dtype=np.int64)
        ranges = []
        for r, (s, part) in enumerate(zip(slots, parts)):
            for c, n in enumerate(names):
                if n != "grad" and s.numel:
                    lo, hi = tensors.address_range(part[n], s.lib)
                    self.host[r, c] = lo
                    ranges.append((lo, hi))
            self.host[r, -1] = s.numel
        self.persistent = np.array(sorted(ranges), dtype=np.int64).reshape(-1, 2)
        like, cpu = slots[0].array, tensors.device(slots[0].array, self.lib) == "cpu"
        self.table = self.host       # (on a GPU: the table's device copy, rewritten in place)
        self.chunks = chunk_map([s.numel for s in slots], CHUNK if cpu else GPU_CHUNK)
        if not cpu:
            self.table = tensors.copy_to(like, self.lib, self.host)
            self.chunks = tensors.copy_to(like, self.lib, self.chunks)
        super().__init__(launcher, slots, [(launcher.artifact.function(ln["mt_symbol"]),
                                            [self.table, self.chunks])], cache)

    @staticmethod
    def fits(launcher: Launcher, slot: ParamSlot) -> bool:
        """Whether ``slot``'s arrays can sit in a table: contiguous, all of its size."""
        k = slot.kernel
        part = launcher.arrays(slot.index, k, None, {})
        return all(tensors.is_contiguous(part[n], slot.lib) and
                   int(np.prod(tuple(part[n].shape), dtype=np.int64)) == slot.numel
                   for n in k.launches[0]["buffers"] if n != "grad")

    def part(self, indices: Sequence[int]) -> MultiTensor:
        """The list of ``indices`` alone (a table of their own)."""
        some = set(indices)
        return MultiTensor(self.launcher, [s for s in self.slots if s.index in some],
                           self.cache)

    def bind(self, step: StepInputs) -> Any:
        """The table with the gradients' addresses (runtime/gradcache.py keeps them)
        written into its column; None when they overlap the table's other arrays."""
        ranges = np.array([self.cache.ranges[i] for i in self.indices],
                          dtype=np.int64).reshape(-1, 2)
        sizes = ranges[:, 1] - ranges[:, 0]
        spans = np.concatenate([self.persistent, ranges[sizes > 0]])
        spans = spans[np.argsort(spans[:, 0], kind="stable")]
        if len(spans) > 1 and np.any(spans[1:, 0] < np.maximum.accumulate(spans[:-1, 1])):
            return None
        self.host[:, self.gcol] = ranges[:, 0]
        if self.table is not self.host:    # (one copy, ordered on the launch's stream)
            tensors.copy_into(self.table, self.lib, self.host)
        return self.table


def _reads_shape(k: Any) -> bool:
    """Whether some host scalar of ``k`` reads the parameter's shape (then only tensors
    of one shape share a launch: they share its scalars)."""
    return any(scalar_expr.names(k.host_scalars[n]) & {"rows", "cols"}
               for n in k.param_scalars)


def find(launcher: Launcher, slots: Sequence[ParamSlot], taken: set[int],
         has_inputs: bool, cache: GradCache) -> dict[int, MultiTensor]:
    """First member -> its multi-tensor launch: the parameters not in ``taken`` (flat
    runs) whose prepared kernel has a multi-tensor variant reading a gradient (a rule
    without one, e.g. torch Muon's 1-D decay, steps per tensor), grouped by group, kernel,
    multipliers, library and device (two or more each). FSDP2 local shards join too: an
    elementwise pass sums nothing across ranks, so a shard's step is its local slice's
    (unless a host scalar reads the shape, which is the whole parameter's)."""
    if has_inputs or launcher.hooks:     # extra inputs: per-tensor arrays, not tabled;
        return {}                        # hooks (offload): its buckets copy per tensor
    groups: dict[tuple, list[ParamSlot]] = {}
    for s in slots:
        k = s.kernel
        if s.index in taken or k is None or k.stochastic or \
                "mt_symbol" not in k.launches[0] or "grad" not in k.launches[0]["buffers"] or \
                not MultiTensor.fits(launcher, s) or \
                (s.split is not None and _reads_shape(k)):
            continue
        key = (s.group, k.symbol, s.lr_mult, s.wd_mult, s.lib, tensors.device(s.array, s.lib),
               s.dims if _reads_shape(k) else None)
        groups.setdefault(key, []).append(s)
    return {members[0].index: MultiTensor(launcher, members, cache)
            for members in groups.values() if len(members) > 1}

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
is rewritten (one copy to the device), when the gradient arrays change (checked per
object, by address for torch). A member without a gradient (or with a row-sparse one),
a step count or scalar state that differs, or gradients overlapping the table's other
arrays make ``run`` decline: the members then step alone, exactly as before.

May import: numpy, base, launch, slots, sparse, tensors; core: scalar_expr.
"""
from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np

from optgen.core import scalar_expr

from .. import tensors
from ..launch import Launcher
from ..slots import ParamSlot
from ..sparse import RowSparse
from .base import StepInputs

CHUNK = 1 << 15          # elements of a CPU work item (whole vectors but the tensor's last)
GPU_CHUNK = 1 << 12      # elements of a GPU work item (one block of 256 threads)


def chunk_map(sizes: Sequence[int], chunk: int = CHUNK) -> np.ndarray:
    """The ``_chunks`` argument for tensors of ``sizes`` elements (see the module doc)."""
    rows = [(sum(sizes), 0, 0)]
    rows += [(t, lo, min(lo + chunk, n)) for t, n in enumerate(sizes)
             for lo in range(0, n, chunk)]
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


class MultiTensor:
    """Loose parameters with one kernel, group and multipliers: one call per step."""

    def __init__(self, launcher: Launcher, slots: Sequence[ParamSlot]):
        k = slots[0].kernel
        ln = k.launches[0]
        self.launcher, self.slots = launcher, list(slots)
        self.indices = [s.index for s in slots]
        self.lib = slots[0].lib
        self.fn = launcher.artifact.function(ln["mt_symbol"])
        names = list(ln["buffers"])
        self.gcol = names.index("grad")
        parts = [launcher.arrays(s.index, k, None, {}) for s in slots]
        self.table = np.zeros((len(slots), len(names) + 1), dtype=np.int64)
        ranges = []
        for r, (s, part) in enumerate(zip(slots, parts)):
            for c, n in enumerate(names):
                if n != "grad" and s.numel:
                    lo, hi = tensors.address_range(part[n], s.lib)
                    self.table[r, c] = lo
                    ranges.append((lo, hi))
            self.table[r, -1] = s.numel
        self.persistent = np.array(sorted(ranges), dtype=np.int64).reshape(-1, 2)
        like, cpu = slots[0].array, tensors.device(slots[0].array, self.lib) == "cpu"
        self.host = self.table       # (on a GPU: the table's device copy, rewritten in place)
        self.chunks = chunk_map([s.numel for s in slots], CHUNK if cpu else GPU_CHUNK)
        if not cpu:
            self.table = tensors.copy_to(like, self.lib, self.host)
            self.chunks = tensors.copy_to(like, self.lib, self.chunks)
        self.seen: tuple | None = None      # the gradients the table's column holds

    @staticmethod
    def fits(launcher: Launcher, slot: ParamSlot) -> bool:
        """Whether ``slot``'s arrays can sit in a table: contiguous, all of its size."""
        k = slot.kernel
        part = launcher.arrays(slot.index, k, None, {})
        return all(tensors.is_contiguous(part[n], slot.lib) and
                   int(np.prod(tuple(part[n].shape), dtype=np.int64)) == slot.numel
                   for n in k.launches[0]["buffers"] if n != "grad")

    def _gradients(self, gs: list[Any]) -> bool:
        """Write the gradients' addresses into the table (when they changed); False
        when they overlap the table's other arrays (then the members step alone)."""
        lib = self.lib
        where = [tensors.address_range(g, lib)[0] if lib != "numpy" else None for g in gs]
        if self.seen is not None and all(r() is g for r, g in zip(self.seen[0], gs)) \
                and self.seen[1] == where:
            return True
        self.seen = None
        ranges = np.array([tensors.address_range(g, lib) for g in gs],
                          dtype=np.int64).reshape(-1, 2)
        sizes = ranges[:, 1] - ranges[:, 0]
        spans = np.concatenate([self.persistent, ranges[sizes > 0]])
        spans = spans[np.argsort(spans[:, 0], kind="stable")]
        if len(spans) > 1 and np.any(spans[1:, 0] < np.maximum.accumulate(spans[:-1, 1])):
            return False
        self.host[:, self.gcol] = ranges[:, 0]
        if self.table is not self.host:    # (one copy, ordered on the launch's stream)
            tensors.copy_into(self.table, self.lib, self.host)
        try:
            self.seen = (tuple(weakref.ref(g) for g in gs), where)
        except TypeError:         # an array type without weak references: no caching
            pass
        return True

    def run(self, step: StepInputs) -> bool:
        first, rest = self.slots[0], self.slots[1:]
        k, names = first.kernel, first.kernel.scalar_state_updates
        gs = [step.grads[i] for i in self.indices]
        steps = first.steps
        if any(g is None or type(g) is RowSparse for g in gs) or \
                any(s.steps != steps for s in rest) or \
                (names and not all(s.state[n] == first.state[n] for s in rest for n in names)):
            return False
        if not self._gradients(gs):
            return False
        for s in rest:
            s.steps = steps + 1
        packed = step.place(self.indices, k, step.advance(first, k), first)
        if names:                        # the members had the same values
            for s in rest:
                s.state.update((n, first.state[n]) for n in names)
        self.launcher.run_fused(self.indices, [(self.fn, [self.table, self.chunks])], None,
                                packed)
        return True


def _reads_shape(k: Any) -> bool:
    """Whether some host scalar of ``k`` reads the parameter's shape (then only tensors
    of one shape share a launch: they share its scalars)."""
    return any(scalar_expr.names(k.host_scalars[n]) & {"rows", "cols"}
               for n in k.param_scalars)


def find(launcher: Launcher, slots: Sequence[ParamSlot], taken: set[int],
         has_inputs: bool) -> dict[int, MultiTensor]:
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
    return {members[0].index: MultiTensor(launcher, members)
            for members in groups.values() if len(members) > 1}

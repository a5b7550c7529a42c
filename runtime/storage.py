"""Where each parameter's data lives, what the runtime keeps that depends on it, and the
one rule for when that is stale.

What follows from a parameter's storage, made once and kept in its record
(runtime/slots.py):

    karg         its kernel argument, a detached view of its data   (launch.py)
    plan         its launches, with views of karg and its states     (launch.py)
    runs         multi-tensor tables of raw addresses, flat spans    (strategies/)
    chain        its flat chain: neighbours whose data it adjoins    (flat.py)
    gradients    the check's verdict on its gradient, beside its data (gradcache.py)
    master       mixed precision: its float32 copy, the values the kernels step

A torch parameter's data can move while the object stays: ``p.data = new``
(torch.optim reads ``p`` at every step and simply follows). So each record keeps its
parameter's ``where`` (data address, shape, strides, dtype) from when those were made,
and ``Storage.follow`` compares it before every step (and before a checkpoint is
written or read); when it changed, the new data is checked whole, and then the record
follows it: a new kernel argument, its plan and every run found again, chains found
again (a parameter moved out of a flat buffer steps alone; its neighbours still fuse),
and the master copy takes the new values where they are not its rounding
(``p.data = p.data.clone()`` loses nothing). Where following is impossible, before
anything changes: another shape (its states have the old one: ValueError), dtype or
device (TypeError), non-contiguous data or data overlapping another parameter or a
state (ValueError), or a capturable optimizer staging a captured step (CaptureError:
the graph writes the old memory). numpy and CuPy arrays cannot be re-pointed (their
data is fixed for the object's life), so only torch parameters are watched: one
tuple per parameter per step, less than the gradient check no longer pays for the
parameter's layout (runtime/gradcache.py: storage has the cache forget a moved
parameter's gradient). The torch layer hands over a new object where its runtime array
is a stand-in (FSDP2's local shard, SparseAdam's numpy view): ``repoint``.

Values written from outside, in place or not (``p.copy_``, ``load_state_dict``,
``p.data.mul_(mask)``, a compiled step's write-back), are told by content, not by
torch's version counter (which misses ``p.data`` writes and counts a compiled step's own
write-back), in the kernels: a mixed-precision kernel reads its float32 master as the
weight wherever the weight is not the master rounded (optgen/compiler/lower_bits.py
``adopted``), a split master's kernel decodes a correction that cannot belong to its
weight as the weight (optgen/core/formats/split.py); the reference interpreter alike.
``adopt`` does the first on the host, for a checkpoint written before the next step.
Data moved to new memory starts a split master's correction at zero (unless it holds
the old values).

May import: numpy, optgen.core.formats, capture, flat, checks (labels), state, tensors.
"""
from __future__ import annotations

from typing import Any, Sequence

from optgen.core import formats

from . import flat, state, tensors
from .capture import CaptureError
from .checks import label


def where(x: Any, lib: str) -> tuple:
    """What a parameter's kept views and addresses depend on: data address, shape,
    strides, dtype (the device follows the address: one address space under CUDA UVA)."""
    if lib == "torch":
        return x.data_ptr(), x.shape, x.stride(), x.dtype
    if lib == "numpy":
        return x.ctypes.data, x.shape, x.strides, x.dtype
    return x.data.ptr, x.shape, x.strides, x.dtype


class Storage:
    """The parameters' storage as one optimizer's kept views and tables saw it."""

    def __init__(self, owner: str, slots: Sequence[Any], launcher: Any, multi_precision: bool,
                 grads: Any):
        self.owner, self.slots, self.launcher, self.grads = owner, slots, launcher, grads
        for s in slots:
            s.mixed = multi_precision and \
                tensors.dtype_name(s.array, s.lib) in tensors.LOW_PRECISION
            s.where = where(s.array, s.lib)
            launcher.bind(s)
            if s.mixed:   # the float32 master copy the kernels update
                s.state[state.MASTER] = state.master_copy(s.array, s.lib)
        self.watched = [s for s in slots if s.lib == "torch"]
        self.handed: set[int] = set()       # re-pointed by ``repoint``, checked next
        self.chains = self._chain()

    def _chain(self) -> list[tuple[int, int]]:
        """Flat chains of the parameters as they lie now (runtime/flat.py); parameters
        split across ranks or with a master copy step alone."""
        chains = flat.chains([s.array for s in self.slots], [s.lib for s in self.slots],
                             [not s.mixed and s.split is None for s in self.slots])
        for s in self.slots:
            s.chain = None
        for a, b in chains:
            for s in self.slots[a:b]:
                s.chain = (a, b)
        return chains

    def repoint(self, i: int, array: Any) -> None:
        """Parameter ``i`` is ``array`` from now on (checked and followed next time)."""
        self.slots[i].array = array
        self.handed.add(i)

    def follow(self, staging: bool = False, masters: bool = False) -> bool:
        """Follow every parameter whose data moved since its views were made (see the
        module doc); False when none did (the usual step: nothing changes). ``masters``:
        then ``adopt`` (before a checkpoint is written)."""
        moved = [s for s in self.watched if (s.array.data_ptr(), s.array.shape,
                                             s.array.stride(), s.array.dtype) != s.where]
        if self.handed:
            moved += [self.slots[i] for i in sorted(self.handed)
                      if self.slots[i] not in moved]
        if not moved:
            if masters:
                self.adopt()
            return False
        self.check(moved, staging)
        if masters:
            self.adopt()
        for s in moved:
            if formats.CORRECTION in s.state and not tensors.equal(s.array, s.karg, s.lib):
                s.state[formats.CORRECTION][...] = 0   # (the old correction was the old data's)
            s.where = where(s.array, s.lib)
            self.launcher.bind(s)
            s.forget_kernel()
        self.grads.forget([s.index for s in moved])   # (a GradCache)
        self.handed.clear()
        self.chains = self._chain()
        return True

    def adopt(self) -> None:
        """Each float32 master takes its weight's value wherever the weight is not the
        master rounded to the weight's dtype (written from outside: the module doc), as
        the next step's kernels would read it; before a checkpoint is written."""
        for s in self.slots:
            if s.mixed:
                tensors.adopt_written(s.state[state.MASTER], s.array, s.lib)

    def check(self, moved: Sequence[Any], staging: bool) -> None:
        """The new data of each ``moved`` record can take its place (else the typed
        error, before anything changes)."""
        names = [s.name for s in self.slots]
        taken = [(tensors.address_range(a, o.lib), o, a is o.array) for o in self.slots
                 for a in [o.array, *state.arrays(o.state)] if tensors.library(a) == o.lib]
        for s in moved:
            x, lib, what = s.array, s.lib, f"{self.owner}: {label(s.index, names)}"
            old_dtype, new_dtype = tensors.dtype_name(s.karg, lib), tensors.dtype_name(x, lib)
            if staging:
                raise CaptureError(f"{what}: its data moved since the step was captured (the "
                                   "graph writes the old memory); capture again after "
                                   "replacing .data")
            if tensors.library(x) != lib:
                raise TypeError(f"{what} was a {lib} array and is now a "
                                f"{type(x).__name__}")
            if new_dtype != old_dtype:
                raise TypeError(f"{what}: its data was replaced by {new_dtype} data; the "
                                f"optimizer's kernels and states are for {old_dtype}: assign "
                                f"{old_dtype} data (p.data = new.to(p.dtype)), or make a new "
                                "optimizer")
            if tensors.device(x, lib) != tensors.device(s.karg, lib):
                raise TypeError(f"{what}: its data was replaced by data on "
                                f"{tensors.device(x, lib)}; its states are on "
                                f"{tensors.device(s.karg, lib)}: make the optimizer after "
                                "moving the model")
            if tuple(x.shape) != tuple(s.karg.shape):
                raise ValueError(f"{what}: its data was replaced by data of shape "
                                 f"{tuple(x.shape)}; its states have shape "
                                 f"{tuple(s.karg.shape)}: assign data of that shape, or make "
                                 "a new optimizer for the new shape")
            if not tensors.is_contiguous(x, lib):
                raise ValueError(f"{what}: its new data is not C-contiguous "
                                 "(p.data = new.contiguous())")
            r = tensors.address_range(x, lib)
            for q, o, is_param in taken:
                if not (o is s and is_param) and tensors.overlaps(r, q):
                    whose = "its own states" if o is s else label(o.index, names) + (
                        "" if is_param else "'s states")
                    raise ValueError(f"{what}: its new data shares memory with {whose}; "
                                     "give each parameter its own memory")


__all__ = ["Storage", "where"]

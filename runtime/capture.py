"""Capturable steps (issue 31): the scalars that change every step (lr, bias corrections,
step counts) reach the kernels through fixed device buffers, so a CUDA graph can
capture the launches of a step and replay them.

With ``capturable=True`` every launch (one per parameter, flat run or multi-tensor
list) owns a *row*: a pinned host buffer and a device buffer of its kernel's scalars,
made on its first step and kept. A step writes the host row and copies it to the
device row (one asynchronous copy on the launch's stream, which a graph captures as a
memcpy node), and the kernel reads the device row. ``Optimizer.stage()`` runs a step's
host half only: it counts the step and writes the rows, launching nothing; a replay of
the captured graph then copies and launches:

    opt = optgen.create(art, params, capturable=True)       # CUDA tensors
    opt.step(grads)                                          # eager steps make the rows
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        opt.step(grads)          # host half of this step now, its device half recorded
    g.replay()                   # ... which runs here
    for _ in range(n):
        ...                      # new gradients into the same tensors
        opt.stage(grads)         # the next step's scalars into the pinned rows
        g.replay()

A row never moves once made (the graph holds its addresses): a launch that needs a new
row during ``stage`` is an error, and so are gradients that moved since the last step
(the graph holds those addresses too). On the CPU the rows are the numpy arrays
themselves (no copy): the same bookkeeping, testable without a GPU.

May import: numpy, tensors.
"""
from __future__ import annotations

from typing import Any, Hashable, Sequence

import numpy as np

from . import tensors


class CaptureError(RuntimeError):
    """A capturable optimizer cannot replay this step with the captured addresses."""


class ScalarRows:
    """The rows of one optimizer's launches, by launch key."""

    def __init__(self, owner: str):
        self.owner = owner
        self.rows: dict[Hashable, tuple[np.ndarray, Any, Any]] = {}   # host, device, host
        self.staging = False          # (torch: the pinned tensor the copy reads)
        self.grads: list[int] | None = None

    def place(self, key: Hashable, packed: np.ndarray, like: Any, lib: str) -> Any:
        """Launch ``key``'s scalars ``packed`` in its row: the device row the kernel
        reads (written and copied now unless staging: then the graph copies it)."""
        row = self.rows.get(key)
        if row is None or row[0].shape != packed.shape or row[0].dtype != packed.dtype:
            if self.staging:
                raise CaptureError(f"{self.owner}: a launch of parameters {key[0]} needs new "
                                   "scalar buffers, which the captured graph does not hold; "
                                   "run eager steps (and capture again) after changing flags, "
                                   "groups or multipliers")
            row = self.rows[key] = _alloc(like, lib, packed)
        host, dev, pinned = row
        host[...] = packed
        if not self.staging and dev is not host:
            _copy(dev, pinned, lib)
        return dev

    def check_grads(self, grads: Sequence[Any], libs: Sequence[str]) -> None:
        """Staging: the gradients must lie where the captured step read them; eager
        steps: remember where they lie."""
        where = [0 if g is None else tensors.address_range(g, lib)[0]
                 for g, lib in zip(grads, libs)]
        if self.staging and self.grads is not None and where != self.grads:
            moved = next(i for i, (a, b) in enumerate(zip(where, self.grads)) if a != b)
            raise CaptureError(f"{self.owner}: gradient {moved} is not where the captured "
                               "step read it (or is None now); write new gradients into "
                               "the same tensors before stage()")
        self.grads = where

    def wait(self, like: Any, lib: str) -> None:
        """Before a stage writes the pinned rows: the previous replay's copies have read
        them (the stream is idle)."""
        if lib == "torch" and like.device.type == "cuda":
            import torch
            torch.cuda.current_stream(like.device).synchronize()
        elif lib == "cupy":
            import cupy
            cupy.cuda.get_current_stream().synchronize()


def rows(owner: str, capturable: bool, shards: Any, host_reads: Any) -> ScalarRows | None:
    """An optimizer's rows where ``capturable``; refused where a step reads device
    values on the host (the global-norm clip, non-finite checks) or drives collectives
    (FSDP2 shards)."""
    if capturable and (shards is not None or host_reads):
        raise ValueError(f"{owner}: capturable=True cannot be combined with shards, "
                         "clip_global_norm or nonfinite (they read gradients on the host "
                         "or call collectives during a step, which a graph cannot replay)")
    return ScalarRows(owner) if capturable else None


def stage_ready(owner: str, rows: ScalarRows | None, slots: Sequence[Any],
                centralized: Sequence[Any]) -> None:
    """Checks before ``Optimizer.stage``, and the wait for the previous replay."""
    if rows is None:
        raise ValueError(f"{owner}: stage() is for optimizers made with capturable=True")
    if centralized:
        raise ValueError(f"{owner}: stage() cannot run gradient centralization outside "
                         "the graph; centralize inside the captured region instead")
    if slots:
        rows.wait(slots[0].array, slots[0].lib)


def _alloc(like: Any, lib: str, packed: np.ndarray) -> tuple[np.ndarray, Any, Any]:
    """(host row as numpy, device row, what the copy reads) for ``like``'s device."""
    where = tensors.device(like, lib)
    if where == "cpu":
        host = packed.copy()
        return host, host, host
    if lib == "torch":
        import torch
        pinned = torch.from_numpy(packed.copy()).pin_memory()
        return pinned.numpy(), torch.empty_like(pinned, device=like.device), pinned
    import cupy
    import cupyx
    with like.device:
        host = cupyx.empty_pinned(packed.shape, packed.dtype)
        return host, cupy.empty(packed.shape, packed.dtype), host


def _copy(dev: Any, pinned: Any, lib: str) -> None:
    """One asynchronous host-to-device copy on the current stream (graph-capturable)."""
    if lib == "torch":
        dev.copy_(pinned, non_blocking=True)
    else:
        import cupy
        dev.set(pinned, stream=cupy.cuda.get_current_stream())


__all__ = ["CaptureError", "ScalarRows", "rows", "stage_ready"]

"""Capturable steps: the scalars that change every step (lr, bias corrections, step
counts) reach the kernels through fixed device buffers, so a CUDA graph can capture
the launches of a step and replay them.

With ``capturable=True`` every launch (one per parameter, flat run or multi-tensor
list) owns a *buffer* of its kernel's scalars: one device buffer the kernel reads, fixed
for the optimizer's life (a graph holds its address), fed from pinned host buffers
by asynchronous copies on the launch's stream. ``Optimizer.stage()`` runs a step's
host half only: it counts the step and writes the buffers, launching nothing; a replay of
the captured graph then copies and launches:

    opt = optgen.create(art, params, capturable=True)       # CUDA tensors
    opt.step(grads)                                          # eager steps make the buffers
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        opt.step(grads)          # host half of this step now, its device half recorded
    g.replay()                   # ... which runs here
    for _ in range(n):
        ...                      # new gradients into the same tensors
        opt.stage(grads)         # the next step's scalars into the captured pinned buffers
        g.replay()

When may the host overwrite a pinned buffer? Only once the copy that reads it has run,
and the host runs ahead of the GPU: an eager step k queues "copy buffer to device,
kernel" and returns, and step k+1 must not write the buffer copy k has yet to read
(the kernel of step k would see step k+1's lr). So each launch has a ring of ``RING``
pinned buffers, each with an event recorded after its copy; a step writes the next
buffer of the ring, waiting first for that buffer's event if its copy has not run
(with three buffers that happens only when the host is two steps ahead). The device
buffer needs no ring: copies and kernels are ordered on the launch's stream (steps run on
one stream), so copy k+1 lands after kernel k has read the buffer.

A captured graph copies from one fixed pinned buffer, the one its capture wrote:
that buffer leaves the ring (eager steps after a capture never touch it), a new one
takes its place at the next step or stage outside a capture (a capture allocates no
pinned memory), and ``stage()`` writes it. Every capture keeps its buffer for the
optimizer's life, so graphs captured one after another (one per input shape, or a
capture made again) all replay the staged scalars: ``stage()`` writes each of them.
Before writing, stage waits for the device to finish what it
was given (the previous replay's copy among it): an event recorded inside a graph
fires at each replay only as an external event node, which not every library and
version records, so a device synchronize is the one wait that holds wherever the
replay ran; it costs the overlap of the host's staging with that replay. While a graph
is being captured no event is queried or waited on (a capture forbids it); a capture
starts after the device is synchronized (``torch.cuda.graph`` does it; with CuPy,
synchronize before ``begin_capture``), so the buffer it writes is free.

A buffer never moves once made: a launch that needs a new buffer during ``stage`` is an
error, and so are gradients that moved since the last step (the graph holds those
addresses too). On the CPU the buffers are the numpy arrays themselves: the kernels
run when called, so there is nothing to wait for and no copy; the same bookkeeping,
testable without a GPU. The ordering above is tested on the CPU with a device that
runs its copies late (``transfers``: tests/test_capture_buffers.py).

May import: numpy, tensors.
"""
from __future__ import annotations

from typing import Any, Hashable, Sequence

import numpy as np

from . import tensors

RING = 3    # pinned buffers per launch for eager steps


class CaptureError(RuntimeError):
    """A capturable optimizer cannot replay this step with the captured addresses."""


class ScalarBuffer:
    """One launch's scalars: the device buffer, the pinned ring that feeds it in eager
    steps, and the pinned buffers captured graphs copy from (one per capture)."""

    def __init__(self, transfers: Any, packed: np.ndarray):
        self.transfers = transfers
        self.dev = transfers.device_row(packed)
        self.ring: list[list] = []        # [host, pinned, event] free for eager steps
        self.refill(packed)
        self.next = 0                     # the ring's buffer the next eager step writes
        self.graphs: list[list] = []      # [host, pinned, None] that captured graphs read

    def fits(self, packed: np.ndarray) -> bool:
        host = (self.ring or self.graphs)[0][0]
        return host.shape == packed.shape and host.dtype == packed.dtype

    def refill(self, packed: np.ndarray) -> None:
        """New pinned buffers for those captures took (never during a capture: it may
        not allocate pinned memory)."""
        while len(self.ring) < RING:
            self.ring.append([*self.transfers.alloc(packed), None])

    def write(self, packed: np.ndarray, staging: bool, owner: str) -> None:
        """This step's scalars into a pinned buffer free to write, and (eager) its copy;
        staging: into every captured buffer (stage_ready waited for the replays' copies)."""
        t = self.transfers
        capturing = not staging and t.capturing()
        if not capturing:
            self.refill(packed)
        if staging:
            for host, _, _ in self.graphs:
                host[...] = packed
            return
        if not self.ring:
            raise CaptureError(f"{owner}: {len(self.graphs)} captures in a row took every "
                               "pinned buffer of a launch; run an eager step or stage() "
                               "between captures")
        j = self.next % len(self.ring)
        host, pinned, event = self.ring[j]
        if event is not None and not capturing and not t.done(event):
            t.wait(event)             # (its copy has not run: the host is ahead)
        host[...] = packed
        t.copy(self.dev, pinned)
        if capturing:                 # the graph reads this buffer from now on
            self.graphs.append(self.ring.pop(j))
            self.next = j
        else:
            self.ring[j][2] = t.record(event)
            self.next = j + 1


class ScalarBuffers:
    """The buffers of one optimizer's launches, by launch key. ``transfers``: how buffers
    reach the device (default: by the parameter's library and device; None on the CPU)."""

    def __init__(self, owner: str, transfers: Any = None):
        self.owner, self.transfers = owner, transfers
        self.buffers: dict[Hashable, ScalarBuffer | np.ndarray] = {}
        self.staging = False
        self.grads: list[int] | None = None

    def place(self, key: Hashable, packed: np.ndarray, like: Any, lib: str) -> Any:
        """Launch ``key``'s scalars ``packed`` in its buffer: the device buffer the kernel
        reads (written, and copied now unless staging: then the graph copies it)."""
        buffer = self.buffers.get(key)
        fits = buffer is not None and (buffer.fits(packed) if isinstance(buffer, ScalarBuffer) else
                                    buffer.shape == packed.shape and buffer.dtype == packed.dtype)
        if not fits:
            if self.staging:
                raise CaptureError(f"{self.owner}: a launch of parameters {key[0]} needs new "
                                   "scalar buffers, which the captured graph does not hold; "
                                   "run eager steps (and capture again) after changing flags, "
                                   "groups or multipliers")
            t = self.transfers or transfers_for(like, lib)
            buffer = self.buffers[key] = packed.copy() if t is None else ScalarBuffer(t, packed)
        if not isinstance(buffer, ScalarBuffer):  # (CPU: the kernel reads the host buffer itself)
            buffer[...] = packed
            return buffer
        if self.staging and not buffer.graphs:
            raise CaptureError(f"{self.owner}: stage() writes the scalars a captured step "
                               f"copies, and no captured step launches parameters {key[0]}; "
                               "capture opt.step() in a graph first")
        buffer.write(packed, self.staging, self.owner)
        return buffer.dev

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

    def wait(self) -> None:
        """Before a stage writes the captured buffers: the device has run what it was
        given, the previous replay's copies among it (see the module doc)."""
        for t in {id(r.transfers): r.transfers for r in self.buffers.values()
                  if isinstance(r, ScalarBuffer)}.values():
            t.idle()


def transfers_for(like: Any, lib: str) -> Any:
    """How buffers reach ``like``'s device: None on the CPU (the kernels read the host buffers)."""
    if tensors.device(like, lib) == "cpu":
        return None
    return TorchCuda(like.device) if lib == "torch" else CupyCuda(like.device)


class TorchCuda:
    """Buffers of torch CUDA tensors: pinned host tensors, copies and events on the current
    stream."""

    def __init__(self, device: Any):
        self.device = device

    def alloc(self, packed: np.ndarray) -> tuple[np.ndarray, Any]:
        import torch
        pinned = torch.from_numpy(packed.copy()).pin_memory()
        return pinned.numpy(), pinned

    def device_row(self, packed: np.ndarray) -> Any:
        import torch
        return torch.from_numpy(packed.copy()).to(self.device)

    def copy(self, dev: Any, pinned: Any) -> None:
        dev.copy_(pinned, non_blocking=True)

    def record(self, event: Any) -> Any:
        import torch
        event = event or torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def done(self, event: Any) -> bool:
        return event.query()

    def wait(self, event: Any) -> None:
        event.synchronize()

    def capturing(self) -> bool:
        import torch
        return torch.cuda.is_current_stream_capturing()

    def idle(self) -> None:
        import torch
        torch.cuda.synchronize(self.device)


class CupyCuda(TorchCuda):
    """Buffers of CuPy arrays: pinned host arrays, copies and events on the current stream."""

    def alloc(self, packed: np.ndarray) -> tuple[np.ndarray, Any]:
        import cupyx
        with self.device:
            host = cupyx.empty_pinned(packed.shape, packed.dtype)
        host[...] = packed
        return host, host

    def device_row(self, packed: np.ndarray) -> Any:
        import cupy
        with self.device:
            return cupy.asarray(packed)

    def copy(self, dev: Any, pinned: Any) -> None:
        import cupy
        dev.set(pinned, stream=cupy.cuda.get_current_stream())

    def record(self, event: Any) -> Any:
        import cupy
        event = event or cupy.cuda.Event(disable_timing=True)
        event.record(cupy.cuda.get_current_stream())
        return event

    def done(self, event: Any) -> bool:
        return event.done

    def capturing(self) -> bool:
        import cupy
        return cupy.cuda.get_current_stream().is_capturing()

    def idle(self) -> None:
        self.device.synchronize()


def scalar_buffers(owner: str, capturable: bool, shards: Any, host_reads: Any) -> ScalarBuffers | None:
    """An optimizer's buffers where ``capturable``; refused where a step reads device
    values on the host (the global-norm clip, non-finite checks) or drives collectives
    (FSDP2 shards)."""
    if capturable and (shards is not None or host_reads):
        raise ValueError(f"{owner}: capturable=True cannot be combined with shards, "
                         "clip_global_norm or nonfinite (they read gradients on the host "
                         "or call collectives during a step, which a graph cannot replay)")
    return ScalarBuffers(owner) if capturable else None


def stage_ready(owner: str, buffers: ScalarBuffers | None, slots: Sequence[Any],
                centralized: Sequence[Any]) -> None:
    """Checks before ``Optimizer.stage``, and the wait for the previous replay."""
    if buffers is None:
        raise ValueError(f"{owner}: stage() is for optimizers made with capturable=True")
    if centralized:
        raise ValueError(f"{owner}: stage() cannot run gradient centralization outside "
                         "the graph; centralize inside the captured region instead")
    buffers.wait()


__all__ = ["CaptureError", "RING", "ScalarBuffer", "ScalarBuffers", "scalar_buffers", "stage_ready",
           "transfers_for"]

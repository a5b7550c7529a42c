"""Offloaded optimizer states for the torch drop-ins: ``offload="cpu"``.

    opt = optgen.torch.AdamW(model.parameters(), lr=1e-3, offload="cpu")
    opt = optgen.torch.AdamOffload(model.parameters(), learning_rate=1e-3)   # the seeds' name

The parameters stay where the model has them (a GPU); the optimizer keeps, in host
memory, a float32 (or float64) copy of each parameter, the master copy, and every state.
A step copies the gradients to the host, steps the host copies with the CPU kernels
(target llvm: at the memory-bandwidth limit), and copies the parameters back, rounded to
their dtype (a bfloat16 model gets round-to-nearest-even of the float32 master, as
``multi_precision`` does). States never move: per step the copies are one gradient to the
host and one parameter to the device per stepped parameter, and ``copies`` counts them.

On CUDA the host buffers are pinned and the copies asynchronous on the current stream,
in buckets of about ``BUCKET_BYTES`` of gradients: every gradient copy is issued at once,
an event marks the end of each bucket, and the runtime's launch hooks
(``Launcher.watch``) make the CPU kernels of a parameter wait for its bucket's event
only, and issue a bucket's parameter copies back as soon as its last parameter is
stepped. So the CPU steps bucket k while bucket k+1's gradients are still on the way
and bucket k-1's parameters already go back. A global-norm clip or a non-finite check
reads every gradient before any kernel runs: then the step waits for all copies first.
With CPU tensors as the "device" (what CI runs) the same code runs, with synchronous
copies between separate buffers; ``log`` records the order of a step's bucket events.

The host copy is the master, but values written to a device parameter from outside win,
as they do for torch.optim: data replaced (``p.data = new``, same shape, dtype and
device) or written in place (``p.copy_``, ``model.load_state_dict``: torch's version
counter tells), or through ``p.data`` (``p.data.mul_(mask)``, which the counter misses:
a fingerprint tells, the sum of the parameter's bit patterns taken on its device after
each copy back). Before the step the host copy takes the parameter's values wherever
they are not the host copy rounded to the parameter's dtype (``follow``). A write through
``p.data`` that keeps that sum (a permutation of the values) is not seen.
"""
from __future__ import annotations

from typing import Any

import torch

from optgen.runtime import backends, tensors

PLACES = ("cpu",)
WIDE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
BUCKET_BYTES = 32 << 20    # gradient bytes per bucket of copies


def check(owner: str, offload: Any, target: str, flat: bool, master_format: Any = None
          ) -> None:
    """The offload option's value and target (ValueError naming the rule); offload
    against the other options (``flat``, ``master_format``): the composition table
    (runtime/composition.py, read by optgen/torch/contract.py)."""
    if offload is None:
        return
    if offload not in PLACES:
        raise ValueError(f"{owner}: offload must be None or one of {', '.join(PLACES)}, "
                         f"got {offload!r}")
    if not backends.get(target).host:
        raise ValueError(f"{owner}: offload={offload!r} steps the states on the host, which "
                         f"needs a host target ({', '.join(backends.host_targets())}), "
                         f"got target={target!r}")


class HostCopies:
    """The host side of offloaded parameters: master copies and gradient buffers, keyed
    by the device parameter, and the count of copies made."""

    def __init__(self, owner: str):
        self.owner = owner
        self._master: dict[int, torch.Tensor] = {}
        self._where: dict[int, tuple] = {}     # each device parameter's data, as copied
        self._seen: dict[int, tuple] = {}      # its version and fingerprint, as copied
        self._grad: dict[int, torch.Tensor] = {}
        self.copies = {"grads_to_host": 0, "params_to_device": 0}
        self._params: list = []
        self._bucket: dict[int, int] = {}
        self._events: list = []
        self._members: list[list[int]] = []   # per bucket: its parameters
        self._left: list[int] = []             # per bucket: how many are not stepped yet
        self.log: list[tuple[str, int]] = []

    def master(self, p: torch.Tensor) -> torch.Tensor:
        """The host copy of device parameter ``p`` (made on first use from its value)."""
        key = id(p)
        if key not in self._master:
            if p.is_sparse or not p.is_floating_point():
                raise TypeError(f"{self.owner}: offload needs dense floating-point "
                                f"parameters, got {p.dtype}{' (sparse)' if p.is_sparse else ''}")
            pin = p.is_cuda and torch.cuda.is_available()
            host = torch.empty(p.shape, dtype=WIDE.get(p.dtype, p.dtype), device="cpu",
                               pin_memory=pin)
            with torch.no_grad():
                host.copy_(p.detach())
            self._master[key] = host
            self._grad[key] = torch.empty_like(host, pin_memory=pin)
            self._where[key] = _where(p)
            self._seen[key] = _seen(p)
        return self._master[key]

    @torch.no_grad()
    def follow(self, params: list) -> None:
        """Device parameters whose data moved (``p.data = new``; checked: the parameter's
        shape, dtype and device, else the error before anything changes) or was written
        since their host copy was taken: the host copy takes the parameter's values
        wherever they are not what it rounds to (nothing lost elsewhere). Without this
        the step would send the old copy's update over the new values."""
        moved = [(i, p) for i, p in enumerate(params) if _where(p) != self._where[id(p)]]
        for i, p in moved:
            old = self._where[id(p)]
            what = f"{self.owner}: parameter {i}'s data was replaced by"
            if p.dtype != old[3] or p.device != old[4]:
                raise TypeError(f"{what} {p.dtype} data on {p.device}; its host copy is for "
                                f"{old[3]} on {old[4]}: assign data of that dtype and "
                                "device, or make a new optimizer")
            if p.shape != old[1]:
                raise ValueError(f"{what} data of shape {tuple(p.shape)}; its host copy and "
                                 f"states have shape {tuple(old[1])}: assign data of that "
                                 "shape, or make a new optimizer for the new shape")
        keys = [id(p) for p in params]
        now = [_seen(p) for p in params]
        changed = _differ([self._seen[k] for k in keys], now)
        for p, key, seen, diff in zip(params, keys, now, changed):
            if diff or _where(p) != self._where[key]:
                tensors.adopt_written(self._master[key], p.detach().cpu(), "torch")
                self._where[key], self._seen[key] = _where(p), seen

    def grads_to_host(self, params: list, grads: list, wait_all: bool = False) -> list:
        """Each device gradient copied into its host buffer (None stays None), in
        buckets; with ``wait_all`` (the step reads every gradient first) it waits for
        all of them here, otherwise ``ready`` waits per bucket. A gradient of another
        shape is left to the runtime's checks: it is passed on as it is, and they reject
        it."""
        out, cuda, size = [], False, 0
        # per step: parameter index -> bucket; per bucket: its end event, its parameters
        # and how many are not stepped yet
        self._params, self._bucket, self._events = params, {}, []
        self._members, self._left, self.log = [[]], [0], []
        for i, (p, g) in enumerate(zip(params, grads)):
            if g is None or not isinstance(g, torch.Tensor) or g.is_sparse or \
                    tuple(g.shape) != tuple(p.shape):
                out.append(g)
                continue
            buf = self._grad[id(p)]
            buf.copy_(g.detach(), non_blocking=True)
            cuda = cuda or g.is_cuda
            out.append(buf)
            self.copies["grads_to_host"] += 1
            self._bucket[i] = len(self._left) - 1
            self._left[-1] += 1
            self._members[-1].append(i)
            size += buf.numel() * buf.element_size()
            if size >= BUCKET_BYTES:
                self._close_bucket(cuda)
                size = 0
        if self._left[-1]:
            self._close_bucket(cuda)
        if wait_all and cuda:
            torch.cuda.current_stream().synchronize()
            self._events = [None] * len(self._events)
        return out

    def _close_bucket(self, cuda: bool) -> None:
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
        self._events.append(event)
        self.log.append(("grads", len(self._left) - 1))
        self._left.append(0)
        self._members.append([])

    def ready(self, i: int) -> None:
        """Launch hook: before parameter ``i``'s kernels, its bucket's gradients are in."""
        b = self._bucket.get(i)
        if b is not None and self._events[b] is not False:
            if self._events[b] is not None:
                self._events[b].synchronize()
            self._events[b] = False          # (waited for)
            self.log.append(("ready", b))

    @torch.no_grad()
    def done(self, i: int) -> None:
        """Launch hook: after parameter ``i``'s kernels; the bucket's last one sends the
        bucket's parameters back (rounded to their dtype)."""
        b = self._bucket.pop(i, None)
        if b is None:
            return
        self._left[b] -= 1
        if not self._left[b]:
            for j in self._members[b]:
                p = self._params[j]
                p.copy_(self._master[id(p)], non_blocking=True)
                self._seen[id(p)] = _seen(p)
                self.copies["params_to_device"] += 1
            self.log.append(("params", b))

    def finish(self) -> None:
        """After a step the runtime applied: parameters it did not launch (no elements)
        go back too, so every stepped parameter has its copy."""
        for i in list(self._bucket):
            self.done(i)
    @torch.no_grad()
    def refresh(self, params: list) -> None:
        """Take every master copy again from its device parameter (after a checkpoint load:
        a trainer loads the model's weights, then the optimizer's state)."""
        for p in params:
            self.master(p).copy_(p.detach())
            self._where[id(p)], self._seen[id(p)] = _where(p), _seen(p)


def _where(p: torch.Tensor) -> tuple:
    """A device parameter's data: address, shape, strides, dtype, device."""
    return p.data_ptr(), p.shape, p.stride(), p.dtype, p.device


_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _seen(p: torch.Tensor) -> tuple:
    """A device parameter's version counter and fingerprint: the sum of its bits as
    64-bit words (wrapping), or of its elements' bit patterns where its bytes are not
    whole aligned words; a device scalar (no synchronization here)."""
    x = p.detach().reshape(-1)
    whole = (x.numel() % 8 == 0) and x.storage_offset() * x.element_size() % 8 == 0
    words = x.view(torch.int64) if whole else x.view(_BITS[x.element_size()])
    return p._version, torch.sum(words, dtype=torch.int64)


def _differ(old: list, new: list) -> list[bool]:
    """Per parameter: written since ``old`` (its version or its fingerprint changed);
    the fingerprints compared on their device, read back at once."""
    if not new:
        return []
    eq = [a[1] == b[1] for a, b in zip(old, new)]
    same = torch.stack(eq).tolist() if len({e.device for e in eq}) == 1 else \
        [bool(e) for e in eq]
    return [a[0] != b[0] or not s for a, b, s in zip(old, new, same)]


def seed_class(adam: type) -> type:
    """The seeds' ``AdamOffload`` (TinyMS/MindSpore) over the drop-in Adam ``adam``: its
    signature and defaults, ``offload="cpu"``. ``use_locking`` (a graph-mode lock in
    MindSpore) is checked and has nothing to do here: a step updates each state once."""

    class AdamOffload(adam):
        offload = "cpu"

        def __init__(self, params, learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                     use_locking=False, use_nesterov=False, weight_decay=0.0,
                     loss_scale=1.0, **kwargs: Any):
            if not isinstance(use_locking, bool):
                raise TypeError(f"adam: use_locking must be a bool, got {use_locking!r}")
            super().__init__(params, lr=learning_rate, betas=(beta1, beta2), eps=eps,
                             use_nesterov=use_nesterov, weight_decay=weight_decay,
                             loss_scale=loss_scale, **kwargs)

    AdamOffload.__module__ = adam.__module__
    AdamOffload.__doc__ = "The seeds' AdamOffload: optgen's adam with offload='cpu'."
    return AdamOffload

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

On CUDA the host buffers are pinned and the copies are asynchronous on the current stream
(one synchronization before the CPU kernels read the gradients; the parameter copies go
back without waiting). With CPU tensors as the "device" (what CI runs) the same code
runs, with synchronous copies between separate buffers. Not built yet: overlapping the
copies of one bucket with the CPU step of another (the runtime steps all parameters of
a step in one call).
"""
from __future__ import annotations

from typing import Any

import torch

PLACES = ("cpu",)
HOST_TARGETS = ("llvm", "c")   # targets whose kernels run on the host CPU
WIDE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def check(owner: str, offload: Any, target: str, flat: bool) -> None:
    """The offload option against the others (ValueError naming the rule)."""
    if offload is None:
        return
    if offload not in PLACES:
        raise ValueError(f"{owner}: offload must be None or one of {', '.join(PLACES)}, "
                         f"got {offload!r}")
    if target not in HOST_TARGETS:
        raise ValueError(f"{owner}: offload={offload!r} steps the states on the host, which "
                         f"needs a host target ({', '.join(HOST_TARGETS)}), got target={target!r}")
    if flat:
        raise ValueError(f"{owner}: flat=True and offload={offload!r} together are not built "
                         "(flat groups adopt the device parameters into one buffer)")


class HostCopies:
    """The host side of offloaded parameters: master copies and gradient buffers, keyed
    by the device parameter, and the count of copies made."""

    def __init__(self, owner: str):
        self.owner = owner
        self._master: dict[int, torch.Tensor] = {}
        self._grad: dict[int, torch.Tensor] = {}
        self.copies = {"grads_to_host": 0, "params_to_device": 0}

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
        return self._master[key]

    def grads_to_host(self, params: list, grads: list) -> list:
        """Each device gradient copied into its host buffer (None stays None); waits for
        the copies before the CPU kernels read them. A gradient of another shape is left
        to the runtime's checks: it is passed on as it is, and they reject it."""
        out, waits = [], False
        for p, g in zip(params, grads):
            if g is None or not isinstance(g, torch.Tensor) or g.is_sparse or \
                    tuple(g.shape) != tuple(p.shape):
                out.append(g)
                continue
            buf = self._grad[id(p)]
            buf.copy_(g.detach(), non_blocking=True)
            waits = waits or g.is_cuda
            out.append(buf)
            self.copies["grads_to_host"] += 1
        if waits:
            torch.cuda.current_stream().synchronize()
        return out

    @torch.no_grad()
    def params_to_device(self, params: list, grads: list) -> None:
        """Each stepped parameter takes its host copy's new value (rounded to its dtype)."""
        for p, g in zip(params, grads):
            if g is not None:
                p.copy_(self._master[id(p)], non_blocking=True)
                self.copies["params_to_device"] += 1

    @torch.no_grad()
    def refresh(self, params: list) -> None:
        """Take every master copy again from its device parameter (after a checkpoint load:
        a trainer loads the model's weights, then the optimizer's state)."""
        for p in params:
            self.master(p).copy_(p.detach())


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

"""The buckets of the step inside backward (optgen/torch/in_backward.py): parameters
whose gradients complete close together are stepped together, in one multi-tensor
launch, when the last of them completes.

A launch costs tens of microseconds of host time (checks, scalars, the call, the
thread pool's start) whatever the tensor's size; stepping each parameter alone made a
model of many small layers pay it per tensor. So the parameters are grouped as
DistributedDataParallel groups its all-reduce buckets: in reverse registration order
(the order gradients roughly arrive in: the last layer's first), a bucket filled until
its gradients would pass ``BUCKET_BYTES``. A parameter whose gradient is
``ALONE_BYTES`` or more is a bucket of its own (its launch is small beside its work,
and the memory the step inside backward saves is mostly in such tensors) and ends the
bucket before it: a bucket is a run of neighbours, whose gradients complete close
together. The gradients of a bucket wait in ``.grad`` until its last completes: at most
about ``BUCKET_BYTES`` of small gradients a bucket are alive beyond what stepping each
alone keeps, and only while its neighbours complete.

FSDP2 (``fully_shard``): the parameters one ``fully_shard``-ed module reduce-scatters
together (``together``) are one bucket, whatever its size: FSDP2 calls their hooks back
to back after that reduce-scatter, their gradients views of its one output buffer, which
lives until the last of them is released; a bucket across two modules would keep the
first module's buffer alive until the second's reduce-scatter.

The buckets hold the parameters this optimizer's hooks step (not a newer optimizer's,
not an attached DDP model's: made again when those change). A bucket is complete
(``Bucket.arrive``) when every member counted this backward has its gradient: counted
at the bucket's first gradient of a backward, the members that require a gradient, but
those held for the end of the backward (reached by a reentrant checkpoint's nested
backward). A counted member that gets no gradient (unused in this forward) keeps its
bucket waiting; the end of the backward steps whatever still holds a gradient.
The runtime launches a bucket's members of one kernel, group and multipliers together
(runtime/strategies/base.py ``Launches``, a part of a multi-tensor list).

Imports: torch only.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import torch

BUCKET_BYTES = 1 << 20   # a bucket's gradients at most (one parameter's may pass it)
ALONE_BYTES = 1 << 18    # a gradient this large is stepped alone
REQUIRES_GRAD = operator.attrgetter("requires_grad")


def grad_bytes(p: torch.Tensor) -> int:
    """The bytes of ``p``'s gradient (its own dtype)."""
    return p.numel() * p.element_size()


class Bucket:
    """Parameters stepped together; their arrivals in the current backward."""

    __slots__ = ("members", "task", "expected", "arrived")

    def __init__(self, members: list[torch.Tensor]):
        self.members = members   # (registration order: the runtime's)
        self.task: Any = None    # the backward the counts below are of
        self.expected = 0
        self.arrived: set[int] = set()

    def arrive(self, p: torch.Tensor, task: int, held: set[int]) -> list[torch.Tensor] | None:
        """``p``'s gradient completed in backward ``task``: the members that arrived, when
        ``p`` is the last counted one to (then the bucket starts over); else None.
        Counted: the members requiring a gradient, but those whose id is in ``held``
        (reached by a reentrant checkpoint's nested backward)."""
        if self.task != task:
            self.task, self.arrived = task, set()
            self.expected = sum(map(REQUIRES_GRAD, self.members))
            if held:
                self.expected -= sum(1 for q in self.members if q.requires_grad and id(q) in held)
        self.arrived.add(id(p))
        if len(self.arrived) < self.expected:
            return None
        arrived = self.arrived
        self.task, self.arrived = None, set()
        return [q for q in self.members if id(q) in arrived]


class Buckets:
    """The buckets of the parameters an optimizer's hooks step (``params``: its list,
    in registration order; ``keep``: which of them; ``version``: what ``keep`` read,
    made again when it or the list changes: ``current``)."""

    def __init__(self, params: list[torch.Tensor], keep: Callable[[torch.Tensor], bool],
                 version: Any, together: list[list[torch.Tensor]] = ()):
        self.params, self.version = params, version
        self.of: dict[int, Bucket] = {}
        for group in together:   # (FSDP2: in registration order, a bucket each)
            if kept := [p for p in group if keep(p)]:
                self._add(kept[::-1])
        members: list[torch.Tensor] = []
        size = 0
        for p in reversed([p for p in params if keep(p) and id(p) not in self.of]):
            n = grad_bytes(p)
            if members and (n >= ALONE_BYTES or size + n > BUCKET_BYTES):
                self._add(members)
                members, size = [], 0
            if n >= ALONE_BYTES:
                self._add([p])
                continue
            members.append(p)
            size += n
        if members:
            self._add(members)

    def _add(self, members: list[torch.Tensor]) -> None:
        bucket = Bucket(members[::-1])
        self.of.update((id(p), bucket) for p in members)

    def sizes(self) -> list[int]:
        """The number of parameters in each bucket, in stepping order (for tests)."""
        seen: dict[int, int] = {}
        for b in self.of.values():
            seen.setdefault(id(b), len(b.members))
        return list(seen.values())


def current(buckets: Buckets | None, params: list[torch.Tensor],
            keep: Callable[[torch.Tensor], bool], version: Any,
            together: Callable[[], list[list[torch.Tensor]]] = list) -> Buckets:
    """``buckets`` if made of ``params`` (the same list object) at ``version``, else new
    ones (their arrivals so far forgotten: the end of the backward steps them), with
    ``together()``'s groups of parameters a bucket each."""
    if buckets is not None and buckets.params is params and buckets.version == version:
        return buckets
    return Buckets(params, keep, version, together())

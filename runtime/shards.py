"""Parameters split across processes (FSDP2 shards): whole-tensor reductions made exact.

A rule with a reduction (LAMB's and LARS's norms, Adafactor's RMS and row/column means)
runs as passes (optgen.compiler.specialize): reduction passes fill small float64
buffers (``_red<k>``), later passes read them. On a shard, a reduction pass sees only
its rows, so between the pass that fills a buffer and the first pass that reads it the
buffers of every shard are summed across the ranks that hold the parameter. ``run``
does that for all split parameters of a step together: each parameter's launches run
until one would read a buffer not yet summed; then one all-reduce sums every such
buffer of every parameter (a bucket of float64 values), and the launches go on. A rule
whose reductions nest (a mean of a mean) takes one round per level; a rule with none
takes no collective at all.

What is summed: a whole-tensor reduction's value (one float64 per reduction and
parameter, 8 bytes), or a row/column reduction's buffer when the split axis is the one
reduced (Adafactor's column means of a row-split matrix: C values). A reduction over
axes the split does not cut (row means of a row-split matrix) is complete on every
rank and is not sent. A mean is sent as a sum (the kernel's mean times its own count)
and divided by the whole count after the sum.

The collective itself comes from the caller (``Collective``: optgen/torch/fsdp.py
passes torch.distributed's all-reduce over the parameter's mesh); this module imports
no communication library.

Matrix rules' whole-matrix stretches go to one owner rank each (runtime/exchange.py);
``run`` drives them with the sums.

May import: numpy, views, formats, exchange, owned.
"""
from __future__ import annotations

import contextlib
import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol, Sequence

import numpy as np

from . import exchange, owned
from optgen.core import views
from optgen.core.formats import FLAT_VIEWS


@dataclass(frozen=True)
class Split:
    """How a parameter is cut across ranks: along ``axis`` ("b", "r" or "c") of its
    ``[B, R, C]`` view; ``whole`` is the whole parameter's shape."""
    axis: str
    whole: tuple[int, ...]
    owner: int | None = None      # the rank that keeps its whole-matrix states (owned.py)
    held: tuple[str, ...] = ()    # those states, sorted (empty: none)
    mine: bool = field(default=False, repr=False, compare=False)   # this rank owns it

    @property
    def dims(self) -> tuple[int, int, int]:
        return views.dims(self.whole)


def axis_of_dim0(ndim: int) -> str:
    """The axis of the ``[B, R, C]`` view that a split of a tensor's first dimension
    cuts: C below two dimensions, R for matrices, B above."""
    return "c" if ndim < 2 else "r" if ndim == 2 else "b"


class Collective(Protocol):
    """Sums arrays in place across the ranks that hold the split parameters (``size``
    of them; this one is ``rank``), and exchanges rows between them (matrix rules,
    runtime/exchange.py): ``sends[r]`` go to rank ``r``, which fills what it listed in
    ``recvs`` for this rank (the same sizes, in order)."""
    rank: int
    size: int

    def all_reduce(self, arrays: list[Any]) -> None: ...

    def all_to_all(self, sends: list[list[Any]], recvs: list[list[Any]]) -> None: ...


@dataclass
class Shards:
    """The split parameters of one optimizer (by index; None: whole on this rank) and
    the collective over their ranks. ``talks``: whether steps communicate (a
    reduction, a global norm): then each step's checks agree first (``agreed``).
    ``rounds`` and ``values`` count what was summed; ``moved`` the bytes this rank
    sent to others per all-to-all (matrix rules), in order."""
    splits: list[Split | None]
    collective: Collective
    talks: bool = True
    rounds: int = 0
    values: int = 0
    log: list[int] = field(default_factory=list)   # values per all-reduce, in order
    moved: list[int] = field(default_factory=list)

    def split(self, i: int) -> Split | None:
        return self.splits[i] if i < len(self.splits) else None

    def any(self) -> bool:
        return any(s is not None for s in self.splits)

    def all_reduce(self, arrays: list[Any]) -> None:
        self.collective.all_reduce(arrays)
        n = sum(math.prod(tuple(a.shape)) for a in arrays)
        self.rounds += 1
        self.values += n
        self.log.append(n)


    def exchange(self, sends: list[list[Any]], recvs: list[list[Any]]) -> None:
        self.collective.all_to_all(sends, recvs)
        self.moved.append(exchange.nbytes([a for r, out in enumerate(sends) for a in out
                                           if r != self.collective.rank]))


@dataclass(frozen=True)
class Pending:
    """A reduction buffer (the part of it to send) that must be summed across ranks
    before a launch reads it; ``local`` and ``whole`` are the counts a mean divides by
    on this rank and for the whole parameter (None for sums)."""
    array: Any
    local: int | None
    whole: int | None


def split(shards: Shards | None, i: int) -> Split | None:
    """Parameter ``i``'s split (None: whole on this rank, or no shards)."""
    return None if shards is None else shards.split(i)


def reduced(launch: dict, workspaces: dict[str, str]) -> str:
    """The ``[B, R, C]`` axes (lower case) a reduction launch reduces over; a matrix
    kernel's reduction: its space's axes that its buffer does not keep."""
    if launch["view"] in FLAT_VIEWS:
        return views.AXES
    if "reduced" in launch:
        return launch["reduced"]
    kept = workspaces.get(launch["red"], "")
    return "".join(a.lower() for a in launch["space"] if a not in kept)


def needs_sum(launch: dict, split: Split | None, workspaces: dict[str, str]) -> bool:
    """Whether a reduction launch reduces over the axis ``split`` cuts."""
    return split is not None and launch["kind"] == "reduce" and \
        split.axis in reduced(launch, workspaces)


def pending(launch: dict, buffers: dict[str, Any], workspaces: dict[str, str],
            local: tuple[int, int, int], split: Split) -> list[tuple[str, Pending]]:
    """The buffers a reduction launch fills that must be summed, by name."""
    reduced_ = reduced(launch, workspaces)
    out = []
    for red, op in [(launch["red"], launch["op"])] + [(a["red"], a["op"])
                                                        for a in launch.get("also", [])]:
        arr = buffers[red]
        part = arr[0:1] if not workspaces[red] else arr   # R[0]: the value of a whole one
        counts = (math.prod(views.extents(local, reduced_)),
                  math.prod(views.extents(split.dims, reduced_))) if op == "mean" \
            else (None, None)
        out.append((red, Pending(part, *counts)))
    return out


def run(shards: Shards, items: Sequence[Iterator[list[Pending]]]) -> None:
    """Drive the launches of the split parameters of one step (``items``: one generator
    per parameter, from ``Launcher.passes``, each yielding the buffers it needs summed
    before its next launch): one all-reduce per round for all of them."""
    live = list(items)
    while live:
        wanted, still = [], []
        for it in live:
            got = next(it, None)
            if got is not None:
                wanted.extend(got)
                still.append(it)
        sums = [w for w in wanted if isinstance(w, Pending)]
        if sums:
            _sum(shards, sums)
        if len(sums) < len(wanted):    # matrix rules' whole-matrix stretches
            exchange.run(shards, [w for w in wanted if not isinstance(w, Pending)])
        live = still


def _sum(shards: Shards, wanted: list[Pending]) -> None:
    """Sum across ranks: means as sums of this rank's values, then divided."""
    for p in wanted:
        if p.local is not None:
            if p.local:
                p.array[...] = p.array * p.local
            else:            # an empty shard: its kernel's mean is 0/0
                p.array[...] = 0.0
    shards.all_reduce([p.array for p in wanted])
    for p in wanted:
        if p.whole:
            p.array[...] = p.array / p.whole


def check(owner: str, backend: str, shards: Shards | None, artifact: Any,
          global_norm: bool) -> Shards | None:
    """The shards an optimizer was given (None when no parameter is split)."""
    if shards is None or not shards.any():
        return None
    shards.talks = bool(global_norm) or any(k.matrix or ln["kind"] == "reduce"
                                            for k in artifact.kernels for ln in k.launches)
    summed = next((k for k in artifact.kernels if k.global_sums), None)
    if summed is not None:
        raise ValueError(f"{owner}: its rule sums over all parameters (global_sum, kernel "
                         f"{summed.symbol}); parameters split across ranks (FSDP2) are not "
                         "supported for such rules: use DDP or ZeRO-1")
    if backend != "compiled":
        raise ValueError(f"{owner}: parameters split across ranks are stepped by the compiled "
                         "kernels only (the reference interpreter runs a rule in one piece)")
    shards.splits = owned.assign(shards.splits, artifact, shards.collective.size,
                                 shards.collective.rank)
    return shards


def whole_shapes(params: Sequence[Any], shards: Shards | None) -> list[tuple[int, ...]]:
    """Each parameter's whole shape (what its shape flags read)."""
    return [tuple(p.shape) if split(shards, i) is None else shards.splits[i].whole
            for i, p in enumerate(params)]


def fingerprint(shards: Shards, grads: Any) -> float:
    """What this rank is about to step, as a number below 2**20 (exact in float64, and
    so its square): its split parameters and which have gradients."""
    pattern = tuple(g is not None for g in grads) if isinstance(grads, (list, tuple)) else ()
    return float(zlib.crc32(repr((shards.splits, pattern)).encode()) % (1 << 20))


@contextlib.contextmanager
def agreed(shards: Shards | None, owner: str, grads: Any) -> Iterator[None]:
    """Run a step's checks so that every rank goes on or none does: one 32-byte
    all-reduce counts the ranks whose checks failed and compares what each rank is about
    to step (its split parameters and which have gradients: a fingerprint f, sent as
    1, f and f**2; equal everywhere iff W * sum(f**2) == sum(f)**2). A rank that failed
    raises its own error; the others raise a RuntimeError, with nothing changed,
    instead of waiting in the step's next collective for a rank that left; different
    steps are a ValueError on every rank."""
    if shards is None or not shards.talks:
        yield
        return
    f = fingerprint(shards, grads)
    sent = np.array([0.0, 1.0, f, f * f])
    try:
        yield
    except BaseException:
        sent[0] = 1.0
        shards.all_reduce([sent])
        raise
    shards.all_reduce([sent])
    failed, world, total, squares = sent
    if failed:
        raise RuntimeError(f"{owner}: the step's checks failed on {int(failed)} other "
                           "rank(s) (their error names the cause); nothing was changed here")
    if world * squares != total * total:
        raise ValueError(f"{owner}: the ranks would step different parameters (another "
                         "rank's optimizer has other parameters, shapes or splits, or "
                         "gradients where this one has none); nothing was changed")


def sum_of_squares(shards: Shards, split: float, whole: float, bad: bool
                   ) -> tuple[float, bool]:
    """A global sum of squares: the split parameters' parts summed across ranks, plus
    those every rank holds whole (counted once); and whether any rank found a
    non-finite gradient (``bad`` here). One 16-byte all-reduce."""
    total = np.array([split, float(bad)])
    shards.all_reduce([total])
    return float(total[0]) + whole, bool(total[1])

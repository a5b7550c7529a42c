"""Matrix passes of parameters split across ranks: each matrix whole on one owner rank.

A matrix rule (Muon's Newton-Schulz iterations, any spec with ``matmul``) runs passes
that multiply whole matrices; on a row shard they would be wrong. ``region`` finds, in
a matrix kernel's launches, the contiguous stretch that needs the whole matrix (its
matmuls, loops and R x R / C x C temporaries) and the parameter-shaped buffers that
enter it (Muon: the normalized momentum) and leave it (the orthogonalized update).
The launches before and after it are elementwise or reductions and stay on the shards
(their reductions summed across ranks as any split rule's, runtime/shards.py).

Per step, ``run`` moves every such matrix of the step at once: one all-to-all sends
each rank's rows of each entering buffer to the matrix's owner, the owner runs the
stretch with the compiled kernels on the whole matrices, and one all-to-all sends each
rank its rows of the leaving buffers ("unshard and distribute", as Dion does). Owners
are chosen per step, alike on every rank, by a greedy balance of the stretch's flops
(R * C * min(R, C) for a Newton-Schulz iteration); a rank owns whole matrices only while
it steps them.

May import: numpy, views. Imports no other runtime module.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from optgen.core import views


@dataclass(frozen=True)
class Region:
    """Launches ``[start, stop)`` need whole matrices; ``inputs`` enter, ``outputs``
    leave (parameter-shaped buffers, in a fixed order)."""
    start: int
    stop: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


class Unsupported(ValueError):
    """A matrix kernel whose whole-matrix stretch cannot be cut from its shards."""


def _whole_launch(ln: dict, axes: dict[str, str], param: str,
                 held: frozenset[str] = frozenset()) -> bool:
    return ln["kind"] in ("matmul", "repeat") or \
        any(axes[b] not in (param, "") or b in held for b in ln["buffers"])


def region(launches: Sequence[dict], axes: dict[str, str], workspaces: Sequence[str],
           step_arrays: Sequence[str] = ("grad",), held: frozenset[str] = frozenset()
           ) -> Region | None:
    """The stretch of ``launches`` that needs whole matrices (None: none does).
    ``axes``: each buffer's axes; ``workspaces``: the kernel's temporaries (the other
    buffers are the parameter, its states and the step's arrays). Unsupported (a
    ValueError) when a buffer that is not parameter-shaped would have to cross the
    stretch's edges: a whole-matrix state (THOR's R x R inverse) or a value computed
    inside it and read after. ``held``: states the owner rank keeps whole
    (runtime/owned.py: Shampoo's statistics and roots), read and written in place there;
    every launch that uses one is in the stretch."""
    param = axes["w"]
    whole = [j for j, ln in enumerate(launches) if _whole_launch(ln, axes, param, held)]
    if not whole:
        return None
    start, stop = whole[0], 0
    for j in whole:
        ln = launches[j]
        stop = max(stop, j + 1 + (ln["length"] if ln["kind"] == "repeat" else 0))
    before = {b for ln in launches[:start] for b in (*ln.get("outputs", ()), ln.get("red"))}
    after = {b for ln in launches[stop:] for b in ln["buffers"]}
    used = [b for ln in launches[start:stop] for b in ln["buffers"]]
    written = {b for ln in launches[start:stop] for b in (*ln.get("outputs", ()), ln.get("red"))}
    inputs, outputs = [], []
    for b in dict.fromkeys(used):
        kept = b not in workspaces          # the parameter, a state, the gradient
        if b in held:          # (every launch using it is in the stretch: the owner's)
            continue
        if axes[b] == "":
            if b in written and b in after:
                raise Unsupported(f"its whole-tensor value {b} is computed with the "
                                  "whole matrix and read by the elementwise passes")
            continue                        # summed before the stretch: alike everywhere
        if axes[b] != param:
            if kept or b in before or b in after:
                raise Unsupported(f"it keeps or passes on {b} of shape {axes[b]} (a whole-"
                                  "matrix state), which row shards cannot hold")
            continue                        # a temporary of the stretch: the owner's
        if kept or b in before:
            inputs.append(b)
        if b in written and ((kept and b not in step_arrays) or b in after):
            outputs.append(b)
    return Region(start, stop, tuple(inputs), tuple(outputs))


def rows_of(n: int, world: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s rows of ``n`` split on ``world`` ranks (torch.chunk, DTensor's
    Shard(0))."""
    size = -(-n // world)
    start = min(rank * size, n)
    return start, min(start + size, n)


@dataclass
class Matrix:
    """One split matrix's stretch this step: its whole shape, this rank's arrays of the
    entering and leaving buffers (its rows), and ``run(whole)``, which runs the stretch
    on whole arrays (name -> array; the owner's) and ``whole(name)`` which gives them."""
    shape: tuple[int, int]
    mine: dict[str, Any]
    region: Region
    run: Callable[[dict[str, Any]], None]
    whole: Callable[[str], Any]
    owner: int | None = None     # fixed (its whole-matrix states live there); None: chosen

    @property
    def flops(self) -> int:
        r, c = self.shape
        return r * c * min(r, c)


def owners(matrices: Sequence[Matrix], world: int) -> list[int]:
    """Each matrix's owner: the largest first, each to the least loaded rank (ties:
    the lowest rank); alike on every rank, which sees the same matrices. A matrix with
    a fixed ``owner`` (whole-matrix states held there) keeps it and counts first."""
    load = [0] * world
    out = [0] * len(matrices)
    free = []
    for j, m in enumerate(matrices):
        if getattr(m, "owner", None) is None:
            free.append(j)
        else:
            out[j] = m.owner
            load[m.owner] += m.flops
    for j in sorted(free, key=lambda j: -matrices[j].flops):
        o = min(range(world), key=lambda r: (load[r], r))
        out[j] = o
        load[o] += matrices[j].flops
    return out


def run(shards: Any, matrices: Sequence[Matrix]) -> None:
    """One round trip for ``matrices``: their entering rows to the owners, the stretch
    run there, their leaving rows back (two all-to-alls through ``shards``)."""
    coll = shards.collective
    world, me = coll.size, coll.rank
    who = owners(matrices, world)
    sends = [[] for _ in range(world)]
    recvs = [[] for _ in range(world)]
    held: dict[int, dict[str, Any]] = {}
    for j, m in enumerate(matrices):
        for b in m.region.inputs:
            sends[who[j]].append(m.mine[b])
        if who[j] == me:
            held[j] = {b: m.whole(b) for b in (*m.region.inputs, *m.region.outputs)}
            for r in range(world):
                a, z = rows_of(m.shape[0], world, r)
                recvs[r].extend(held[j][b][a:z] for b in m.region.inputs)
    shards.exchange(sends, recvs)
    for j, m in enumerate(matrices):
        if who[j] == me:
            m.run(held[j])
    sends = [[] for _ in range(world)]
    recvs = [[] for _ in range(world)]
    for j, m in enumerate(matrices):
        recvs[who[j]].extend(m.mine[b] for b in m.region.outputs)
        if who[j] == me:
            for r in range(world):
                a, z = rows_of(m.shape[0], world, r)
                sends[r].extend(held[j][b][a:z] for b in m.region.outputs)
    shards.exchange(sends, recvs)


def whole_arrays(full_like: Callable[[tuple, str], Any], axes: dict[str, str],
                 dtypes: dict[str, str], names: Sequence[str],
                 d: tuple[int, int, int]) -> dict[str, Any]:
    """Whole-sized arrays for ``names`` (the owner's copies), by the buffers' axes."""
    return {b: full_like(views.extents(d, axes[b]) if axes[b] else (1,), dtypes[b])
            for b in names}


def nbytes(arrays: Sequence[Any]) -> int:
    return sum(math.prod(tuple(a.shape)) * a.element_size() if hasattr(a, "element_size")
               else a.nbytes for a in arrays)

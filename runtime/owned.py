"""Whole-matrix states of parameters split across ranks: each matrix's states on one
owner rank.

Shampoo keeps R x R and C x C statistics and their inverse roots, SOAP its statistics,
their eigenbases and its moments in that basis: states whose rows are not the
parameter's rows, which row shards cannot hold. On FSDP2 shards each such matrix gets
one **owner rank**, chosen once (at construction) for all split matrices of the
optimizer, alike on every rank, by the same greedy balance of flops as the exchange of
matrix passes (runtime/exchange.py: largest matrix first, to the least loaded rank).
The owner keeps these states whole; the other ranks keep no entry for them (their
states, ``opt.state`` and state_dict name only what the rank holds), so a checkpoint
sees each held state once, whole, under the parameter's name. Every step the owner
runs the whole-matrix stretch of the kernel on them (the rows of the buffers that
enter it reach the owner by the exchange's all-to-all, the rows that leave it go
back), and the refresh rule (roots, eigenbases) runs on the owner alone, on the host,
as in one process.

Which states are held: every state of such a matrix, those of shape R x R or C x C
and the parameter-shaped ones. SOAP's m and v are kept in the eigenbasis (their rows
are not the parameter's rows) and its refresh rotates them whole; Shampoo's m and v
are read and written by the passes between its matmuls, so split they would cross the
network twice each per step (8 parameter-sized transfers instead of 3: the gradient
and the weight to the owner, the weight back). The owners are balanced by flops, so
each rank keeps the states of about 1/W of the matrices' work.

May import: numpy, exchange, views.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from . import exchange
from optgen.core import views

WHOLE_MATRIX = ("rr", "cc")


def _refresh_reads(k: Any) -> set[str]:
    """The names kernel ``k``'s refresh rule reads (its IR's named nodes)."""
    return {n["name"] for n in k.refresh["ir"]["nodes"] if "name" in n}


def held(artifact: Any) -> frozenset[str]:
    """The states an owner rank keeps whole for a split matrix (empty: none; Muon):
    every state of a rule with whole-matrix states."""
    states = {s.name: s.shape for s in artifact.states}
    if not any(kind in WHOLE_MATRIX for kind in states.values()):
        return frozenset()
    return frozenset(n for n, kind in states.items() if kind in (*WHOLE_MATRIX, "param"))


def kernel_refused(k: Any, artifact: Any) -> str | None:
    """Why kernel ``k`` cannot keep its whole-matrix states on owner ranks (None: it
    can): its refresh reads what the owner does not hold whole (the step's gradient,
    the parameter, statistics the trainer passes on each rank)."""
    keep = held(artifact)
    if not keep or k.refresh is None:
        return None
    if k.refresh.get("reads"):
        return (f"refreshes from statistics the trainer passes "
                f"({', '.join(k.refresh['reads'])}), which are not summed across ranks")
    other = sorted(n for n in _refresh_reads(k) - keep
                   if n in ("w", "grad") or n in {s.name for s in artifact.states})
    if other or k.refresh.get("grad"):
        return (f"refreshes from {', '.join(other) or 'the step gradient'}, which its "
                "owner rank does not hold whole")
    return None


def refused(artifact: Any) -> str | None:
    """Why a rule cannot step split matrices with owner-held states under any of its
    flags (None: some kernel can; the others are refused when selected)."""
    why = [kernel_refused(k, artifact) for k in artifact.kernels if k.refresh is not None]
    return why[0] if why and all(why) else None


def check_kernel(owner: str, i: int, k: Any, artifact: Any, split: Any) -> None:
    """A split parameter's kernel, when selected (before anything changes)."""
    why = None if split is None or not split.held else kernel_refused(k, artifact)
    if why is not None:
        raise ValueError(f"{owner}: parameter {i} is split across ranks and its rule under "
                         f"these flags {why} (use DDP or ZeRO-1, or other flags)")


@dataclasses.dataclass
class _Cost:
    flops: int


def assign(splits: list, artifact: Any, world: int, rank: int) -> list:
    """``splits`` with an owner for every split matrix (row-split, 2-D) when the rule
    has whole-matrix states: the exchange's greedy choice over all of them (the same on
    every rank, which sees the same splits); the others as they are."""
    keep = held(artifact)
    at = [i for i, s in enumerate(splits) if s is not None and s.axis == "r"]
    if not keep or not at:
        return splits
    cost = [_Cost(splits[i].dims[1] * splits[i].dims[2] * min(splits[i].dims[1:]))
            for i in at]
    out = list(splits)
    for i, o in zip(at, exchange.owners(cost, world)):
        out[i] = dataclasses.replace(splits[i], owner=o, held=tuple(sorted(keep)),
                                     mine=o == rank)
    return out


def state_shape(split: Any, name: str, kind: str) -> tuple[int, ...] | None:
    """The whole shape of state ``name`` (``kind`` its shape) of a split parameter
    whose owner holds it; None when it is not held (it is split as the parameter)."""
    if split is None or name not in split.held:
        return None
    return views.state_shape(split.whole, kind)


def absent(split: Any, name: str) -> bool:
    """Whether this rank keeps no state ``name`` of a split parameter (another rank
    owns it and holds it whole): it has no entry here, in its states, ``opt.state``
    and its state_dict, so checkpoints see each held state once, whole."""
    return split is not None and name in split.held and not split.mine


def refreshes_here(split: Any) -> bool:
    """Whether this rank runs a split parameter's refresh rule (its owner; any rank of
    a parameter whose rule holds nothing whole)."""
    return split is None or not split.held or split.mine


def whole_dims(slot: Any) -> tuple[int, int, int]:
    """A parameter's ``[B, R, C]`` dims as its whole-matrix work sees them."""
    return slot.dims if slot.split is None else slot.split.dims


def unheld(names: Sequence[str], split: Any) -> list[str]:
    """``names`` less those the owner holds whole (a shard's plan leaves them out)."""
    return [n for n in names if split is None or n not in split.held]

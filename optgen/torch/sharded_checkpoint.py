"""optgen's sharded checkpoints without torch.distributed.checkpoint: ``opt.save(folder)``
and ``opt.load(folder)`` with DTensor parameters (FSDP2).

A folder holds one runtime checkpoint file per rank (runtime/checkpoint.py's format: the
optimizer's state_dict with, for each parameter split on its first dimension, the rows
this rank holds) and ``index.json``: the world size, the files of the last complete save
and the rows each holds. Both calls are collective: every rank calls them.

Saving: every rank writes its file under a name new to this save (``rank-<r>-<id>.npz``),
then the ranks agree on success (one all_gather of each rank's error or rows) before
anything else: if any rank failed, every rank raises the same ShardedCheckpointError,
naming each failing rank and what it raised, at once (no rank waits in a barrier for a
rank that left), and removes its new file; the folder's previous checkpoint stays whole
and is what ``load`` reads. Only when every file is written does rank 0 replace
``index.json`` (atomically); the ranks agree on that too, then rank 0 removes the files
no index names (earlier saves').

Loading (a folder, or one file that ``save`` wrote without DTensor parameters): each
rank reads ``index.json`` and only the files it needs (those holding rows
it holds now; with equal world sizes its own rank's file) and checks what it would
load (a process with plain parameters, without a process group or under DDP or
ZeRO-1, holds every row: it reads every file that holds rows); the ranks agree, and every rank loads or none does (a ShardedCheckpointError on
every rank naming the failing ranks' errors; nothing changes).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import warnings
from typing import Any, Callable

import numpy as np

from optgen.core import formats, views
from optgen.runtime import checkpoint, owned, shards as runtime_shards, tempfiles
from .fsdp import local, rows, sharded

FORMAT = 2
INDEX = "index.json"
_FILE = re.compile(r"rank-\d+(?:-[0-9a-f]{8})?\.npz")


class ShardedCheckpointError(RuntimeError):
    """A sharded ``opt.save``/``opt.load`` failed on some rank: raised alike on every
    rank. ``failures``: rank -> what it raised (``"TypeName: message"``)."""

    def __init__(self, message: str, failures: dict[int, str]):
        super().__init__(message)
        self.failures = failures


def _dist():
    import torch.distributed as dist
    return dist


def _rank() -> int:
    dist = _dist()
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _agree(what: str, error: BaseException | None, extra: Any = None) -> list:
    """Every rank's ``extra`` (one all_gather with each rank's error); a
    ShardedCheckpointError on every rank where any rank had an error. Without a process
    group: this process's alone."""
    dist = _dist()
    if not (dist.is_available() and dist.is_initialized()):
        if error is not None:
            raise ShardedCheckpointError(f"{what} failed: {type(error).__name__}: {error}",
                                         {0: f"{type(error).__name__}: {error}"}) from error
        return [extra]
    got: list = [None] * dist.get_world_size()
    dist.all_gather_object(got, (None if error is None else
                                 f"{type(error).__name__}: {error}", extra))
    failures = {r: e for r, (e, _) in enumerate(got) if e is not None}
    if failures:
        raise ShardedCheckpointError(
            f"{what} failed on {len(failures)} of {len(got)} rank(s): " +
            "; ".join(f"rank {r}: {e}" for r, e in failures.items()), failures) from error
    return [x for _, x in got]


def _check_splits(core: Any, params: list, verb: str) -> None:
    for i, p in enumerate(params):   # (alike on every rank: before any file or collective)
        if sharded(p) and rows(p) is None:
            raise ValueError(f"{core.name}: parameter {i} is split "
                             f"({', '.join(map(str, p.placements))}); opt.{verb} handles "
                             "splits of the first dimension only (use DCP for others)")


def save(core: Any, params: list, kinds: dict[str, str], folder: str,
         prepare: Callable[[], None] = lambda: None) -> None:
    """Run ``prepare`` (the drop-in's pending hyperparameter changes), write this
    rank's file, agree, then rank 0 writes ``index.json`` (see the module's docstring)."""
    dist = _dist()
    _check_splits(core, params, "save")
    rank, world = dist.get_rank(), dist.get_world_size()
    what = f"{core.name}: opt.save({folder!r})"
    token = [secrets.token_hex(4) if rank == 0 else None]
    dist.broadcast_object_list(token, src=0)
    names = [f"rank-{r}-{token[0]}.npz" for r in range(world)]
    mine = [rows(p) for p in params]
    error = None
    try:
        prepare()
        os.makedirs(folder, exist_ok=True)
        sd = core.state_dict()
        sd["rows"] = mine
        checkpoint.save(os.path.join(folder, names[rank]), sd)
    except Exception as e:     # noqa: BLE001 (told to every rank, raised on every rank)
        error = e
    try:
        held = _agree(what, error, mine)
        error = None
        if rank == 0:
            try:
                with tempfiles.replacing(os.path.join(folder, INDEX)) as f:
                    f.write(json.dumps({"format": FORMAT, "world": world, "files": names,
                                        "rows": held}).encode())
            except Exception as e:     # noqa: BLE001
                error = e
        _agree(f"{what} writing {INDEX}", error)
    except ShardedCheckpointError:
        with contextlib.suppress(OSError):
            os.remove(os.path.join(folder, names[rank]))
        raise
    if rank == 0:                       # the index names the new files: earlier saves' go
        with contextlib.suppress(OSError):   # (the save itself is complete everywhere)
            _remove_stale(folder, names)


def _remove_stale(folder: str, names: list[str]) -> None:
    """The rank files ``names`` (the committed save) do not list, and the temporary
    files no writer holds of such names."""
    for n in os.listdir(folder):
        if _FILE.fullmatch(n) and n not in names:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, n))
        elif ".npz.tmp-" in n and _FILE.fullmatch(n.split(".tmp-")[0]):
            # what a killed save of a file of another name left (no save to that name
            # comes again to sweep it): only if no writer holds it
            tempfiles.remove_abandoned(os.path.join(folder, n.split(".tmp-")[0]))


def load(core: Any, params: list, kinds: dict[str, str], folder: str,
         collective: bool = True) -> None:
    """Read the files this rank needs, check, agree, load (see the module's docstring).
    ``collective=False`` (no DTensor parameters): this process alone, its own error."""
    error = sd = None
    try:
        sd = _read(core, params, kinds, folder, _rank())
        with warnings.catch_warnings():   # (the load below warns of conversions once)
            warnings.simplefilter("ignore")
            checkpoint.check(core, sd)
    except Exception as e:     # noqa: BLE001
        if not collective:
            raise
        error = e
    if collective:
        _agree(f"{core.name}: opt.load({folder!r})", error)
    core.load_state_dict(sd)


def _index(core: Any, folder: str) -> tuple[list[str], list | None]:
    """The files of the last complete save, and the rows each holds (None: an index of
    format 1, whose files hold their rows)."""
    try:
        with open(os.path.join(folder, INDEX), encoding="utf-8") as f:
            index = json.load(f)
        world = int(index["world"])
        if index.get("format", 1) < 2:
            return [f"rank-{r}.npz" for r in range(world)], None
        files, held = [str(n) for n in index["files"]], list(index["rows"])
        if len(files) != world or len(held) != world or \
                not all(_FILE.fullmatch(n) for n in files):
            raise ValueError(f"{INDEX} names {len(files)} files for {world} ranks")
        return files, held
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{core.name}: {folder} is not a sharded optgen checkpoint "
                         f"({type(e).__name__}: {e})") from None


def _read(core: Any, params: list, kinds: dict[str, str], folder: str, rank: int
          ) -> dict[str, Any]:
    """The state_dict this rank loads: for every split state the rows it holds now, from
    the files that hold them; every other value from one file (its own rank's where
    there is one: every file holds them)."""
    _check_splits(core, params, "load")
    if os.path.isfile(folder):            # one file (``save`` without DTensor parameters)
        return checkpoint.load(folder)
    files, held = _index(core, folder)
    opened: dict[int, dict] = {}

    def part(r: int) -> dict:
        if r not in opened:
            opened[r] = checkpoint.load(os.path.join(folder, files[r]))
        return opened[r]
    if held is None:
        held = [part(r).get("rows", ()) for r in range(len(files))]
    if any(not isinstance(h, list) or len(h) != len(params) for h in held):
        raise ValueError(f"{core.name}: {folder} holds {len(held[0])} parameters' rows, "
                         f"this optimizer has {len(params)}")
    spans = [_spans(p, i, held) for i, p in enumerate(params)]
    need = sorted({r for s in spans for r, _ in s})
    # the file for the values every file holds: one opened anyway, its own rank's first
    base = rank if rank in need or (not need and rank < len(files)) else \
        (need[0] if need else 0)
    first = part(base)
    sd = dict(first, state=[dict(st) for st in first["state"]],
              params=[dict(e) for e in first["params"]])
    for i, p in enumerate(params):
        whole = _held(core, sd, i, p, kinds, part, len(files))
        if p.ndim == 0 or (rows(p) is None and held[base][i] is None):
            continue        # whole here and in the checkpoint: every file has it
        # (a plain tensor, in a process without DTensors: every row is its own)
        mine = rows(p) or (0, p.shape[0])
        # the files holding these rows (a parameter saved whole: the first file)
        here = [(part(r), span) for r, span in spans[i]] if any(
            h[i] is not None for h in held) else [(first, (0, p.shape[0]))]
        sd["params"][i]["shape"] = list(local(p).shape)
        blocked = _blocked_rows(sd, i, p, here, mine)
        for n, v in sd["state"][i].items():
            if n in blocked or n.endswith(formats.ABSMAX) or n in whole:
                continue     # (per-shard blocks: taken by _blocked_rows; held: _held)
            if isinstance(v, np.ndarray) and _split_state(p, kinds.get(n, "param")):
                sd["state"][i][n] = np.concatenate(
                    [part_["state"][i][n][max(mine[0], a) - a:min(mine[1], b) - a]
                     for part_, (a, b) in here if min(mine[1], b) > max(mine[0], a)]
                    or [v[:0]])
    return sd


def _held(core: Any, sd: dict, i: int, p: Any, kinds: dict[str, str],
          part: Callable[[int], dict], files: int) -> set[str]:
    """Parameter ``i``'s states that one owner rank holds whole on shards
    (runtime/owned.py), set in ``sd`` for this rank: whole from the file that holds them
    whole (its owner's when saved on shards, any file when saved whole) where this
    rank holds them now (its owner, or the parameter is whole here); no entry
    elsewhere. Returns their names."""
    names = owned.held(core.artifact) if p.ndim == 2 else frozenset()
    split = core.records[i].split
    st = sd["state"][i]
    for n in names:
        st.pop(n, None)
    if split is not None and not split.mine:
        return set(names)
    for n in names:
        want = views.state_shape(tuple(p.shape), kinds[n])
        found = (part(r)["state"][i].get(n) for r in range(files))
        v = next((v for v in found if v is not None and np.shape(v) == want), None)
        if v is not None:    # (else the load's check names the missing state)
            st[n] = v
    return set(names)


def _spans(p: Any, i: int, held: list) -> list[tuple[int, tuple[int, int]]]:
    """(rank, rows) of the files holding rows of parameter ``i`` that this rank holds
    now (or exactly its rows: an empty shard's per-shard blocks)."""
    if p.ndim == 0:
        return []
    mine = rows(p) or (0, p.shape[0])   # (held whole: a DTensor or a plain tensor)
    out = []
    for r, h in enumerate(held):
        if h[i] is None:
            continue
        a, b = (int(x) for x in h[i])
        if min(mine[1], b) > max(mine[0], a) or (a, b) == tuple(mine):
            out.append((r, (a, b)))
    return out


def _split_state(p: Any, kind: str) -> bool:
    """Whether a state of ``kind`` is split like its parameter (see shards.shown)."""
    return kind not in ("row", "col") or \
        runtime_shards.axis_of_dim0(p.ndim) in ("br" if kind == "row" else "bc")


def _blocked_rows(sd: dict, i: int, p: Any, held: list, mine: tuple[int, int]) -> set[str]:
    """Parameter ``i``'s q8/q4 states (per-shard blocks) for rows ``mine``: the codes
    and block scales as saved when one file held exactly these rows; otherwise each
    file's rows dequantized with its own blocks, and the float32 rows given to the
    runtime's load, which quantizes them in this rank's blocks (and warns that it
    converted them)."""
    st = sd["state"][i]
    blocked = {n for n in st if n + formats.ABSMAX in st}
    for n in blocked:
        same = [part for part, rows_ in held if tuple(rows_) == tuple(mine)]
        if same:
            st[n], st[n + formats.ABSMAX] = (same[0]["state"][i][n],
                                             same[0]["state"][i][n + formats.ABSMAX])
            continue
        parts = []
        for part, (a, b) in held:
            if min(mine[1], b) <= max(mine[0], a):
                continue
            fmt = formats.from_stored(part["stored"][i][n])
            rows_ = fmt.dequantize((part["state"][i][n], part["state"][i][n + formats.ABSMAX]),
                                   (b - a, *p.shape[1:]))
            parts.append(rows_[max(mine[0], a) - a:min(mine[1], b) - a])
        st[n] = np.concatenate(parts) if parts else \
            np.zeros((0, *p.shape[1:]), np.float32)
        del st[n + formats.ABSMAX]
        sd["stored"][i].pop(n, None)
    return blocked

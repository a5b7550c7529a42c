"""Optimizer checkpoints: validation of a state_dict, and a safe file format.

The file is one ``.npz`` (numpy's zip of ``.npy`` arrays) holding every state array
plus ``meta.json``: the rest of the state_dict as JSON. Nothing is pickled, so loading
a checkpoint never runs code. bfloat16 arrays travel as their uint16 bits. Writes are
atomic: a temporary file in the same folder, fsynced, then ``os.replace`` (a crash
mid-save leaves the previous checkpoint intact, plus at most a ``<name>.tmp-*`` file,
locked by its writer while it lives; the next save to that path removes it once no
writer holds it: runtime/tempfiles.py).

``state_dict`` and ``check`` read an optimizer through its public interface: its
records (``opt.records``: each parameter's array, library, states, step count,
multipliers, last refresh), ``opt.groups``, ``opt.hyper`` and ``opt.t``;
``Optimizer.load_state_dict`` sets what ``check`` returns (``restore_states`` writes the
states in place).

May import: numpy, formats, hyper, state, tempfiles, tensors.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import numbers
import os
import warnings
import zipfile
from typing import Any, Mapping

import numpy as np

from optgen.core import hyper as hyper_rules
from . import state, tempfiles, tensors
from optgen.core import formats
from optgen.core.formats import ABSMAX

FORMAT = 1
META = "meta.json"


@functools.lru_cache(maxsize=None)
def _hash_file(path: str, name: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(name.encode() + b"\0" + f.read()).hexdigest()[:16]


def spec_hash(artifact) -> str:
    """A hash of the spec's source (and name, which carries a wrapper's base): the
    same on every target, different for any edit of the spec."""
    return _hash_file(os.path.join(artifact.path, "spec.py"), artifact.name)


def state_dict(opt) -> dict[str, Any]:
    """``opt``'s state_dict: plain Python values and numpy copies (Optimizer.state_dict
    says what it holds)."""
    return {
        "format": FORMAT, "optimizer": opt.name,
        "spec_hash": spec_hash(opt.artifact), "key": opt.artifact.key,
        "t": opt.t, "param_steps": [s.steps for s in opt.records],
        "skipped_steps": opt.skipped_steps, "hyper": opt.hyper,
        "groups": [{"hyper": dict(g.hyper), "lr_schedule": g.lr is not None,
                    "params": _members(opt, gi)} for gi, g in enumerate(opt.groups)],
        "params": [{"name": s.name, "shape": list(s.array.shape),
                    "dtype": tensors.dtype_name(s.array, s.lib)} for s in opt.records],
        "lr_mult": [s.lr_mult for s in opt.records],
        "wd_mult": [s.wd_mult for s in opt.records],
        "refreshed": [s.refreshed for s in opt.records],
        "state": [{n: (float(v) if isinstance(v, np.floating) else
                       tensors.to_numpy(v, s.lib)) for n, v in s.state.items()}
                  for s in opt.records],
        # how formatted states are stored (optgen/core/formats.py): "bfloat16",
        # "q8:<map>[:<block>]", "q4:<map>[:<block>]"
        "stored": [{n: opt.artifact.stored[n] for n in s.state if n in opt.artifact.stored}
                   if s.formatted else {} for s in opt.records]}


def _members(opt, gi: int) -> list[int]:
    """The indices of group ``gi``'s parameters."""
    return [s.index for s in opt.records if s.group == gi]


def restore_states(slots: Any, saved: list) -> None:
    """Overwrite every state of the parameters (``slots``: their records) in place with
    its saved value (checked by ``check``)."""
    for s, theirs in zip(slots, saved):
        mine = s.state
        if formats.PARAM in theirs:     # a master converted into this one's weight too
            tensors.copy_into(s.array, s.lib, np.asarray(theirs[formats.PARAM]))
        for n in list(mine):
            if isinstance(mine[n], np.floating):
                mine[n] = np.float64(theirs[n])
            else:
                tensors.copy_into(mine[n], s.lib, np.asarray(theirs[n]))


# dtype pairs a state may change between a checkpoint and the optimizer loading it: a
# state format's dtype and the full-precision float32 (optgen/core/formats.py)
REFORMAT = [{"float32", "bfloat16"}]


def _fail(opt, message: str):
    raise ValueError(f"{opt.name}: {message}")


def _int(opt, value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        _fail(opt, f"state_dict {what} must be an int >= 0, got {value!r}")
    return int(value)


def check(opt, sd: Any) -> dict[str, Any]:
    """Validate ``sd`` against optimizer ``opt`` (same spec, parameters, groups and
    state layout) and return the hyperparameters to restore; raises ValueError or
    TypeError naming the first mismatch, changing nothing. The plan holds the
    ``defaults`` and each group's hyperparameters (``groups``), and the counters and
    multipliers as they are to be set (``t``, ``steps``, ``skipped_steps``, ``lr_mult``,
    ``wd_mult``, ``refreshed``)."""
    if not isinstance(sd, Mapping):
        raise TypeError(f"{opt.name}: state_dict must be a dict, got {type(sd).__name__}")
    if sd.get("optimizer") != opt.name:
        _fail(opt, f"state_dict is for optimizer {sd.get('optimizer')!r}")
    if sd.get("format") != FORMAT:
        _fail(opt, f"state_dict format {sd.get('format')!r}; this optgen reads format {FORMAT}")
    mine = spec_hash(opt.artifact)
    if sd.get("spec_hash") != mine:
        _fail(opt, f"state_dict comes from another version of the spec {opt.name} "
                   f"(spec hash {sd.get('spec_hash')!r}, this one is {mine!r})")
    n = len(opt.params)
    states = sd.get("state")
    if not isinstance(states, list) or len(states) != n:
        _fail(opt, f"state_dict has state for {len(states) if isinstance(states, list) else '?'} "
                   f"parameters, this optimizer has {n}")
    _int(opt, sd.get("t"), "step t")
    steps = sd.get("param_steps")
    if not isinstance(steps, list) or len(steps) != n:
        _fail(opt, f"state_dict param_steps must list {n} step counts")
    for s in steps:
        _int(opt, s, "param_steps entry")
    _int(opt, sd.get("skipped_steps", 0), "skipped_steps")
    for what in ("lr_mult", "wd_mult"):
        values = sd.get(what)
        if not isinstance(values, list) or len(values) != n or not all(
                isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
                and v >= 0 for v in values):
            _fail(opt, f"state_dict {what} must list {n} finite floats >= 0")
    params = sd.get("params")
    if not isinstance(params, list) or len(params) != n:
        _fail(opt, f"state_dict describes {len(params) if isinstance(params, list) else '?'} "
                   f"parameters, this optimizer has {n}")
    for i, (s, rec) in enumerate(zip(opt.records, params)):
        want = (list(s.array.shape), tensors.dtype_name(s.array, s.lib))
        got = (list(rec.get("shape", [])), rec.get("dtype"))
        if got != want:
            _fail(opt, f"state_dict parameter {i} is {got[1]}{got[0]}, this optimizer's "
                       f"parameter {i} is {want[1]}{want[0]}")
    layout = [_members(opt, gi) for gi in range(len(opt.groups))]
    groups = sd.get("groups")
    theirs = [g.get("params") for g in groups] if isinstance(groups, list) else None
    if theirs != layout:
        _fail(opt, f"state_dict has the group layout {theirs}, this optimizer has {layout} "
                   "(parameter indices per group)")
    defaults = hyper_rules.resolve(opt.name, opt.artifact.hypers, opt.artifact.requirements,
                                   opt.hyper, sd.get("hyper", {}))
    restored = []
    for g, rec in zip(opt.groups, groups):
        h = dict(rec.get("hyper", {}))
        if g.lr is not None or rec.get("lr_schedule"):
            h.pop("lr", None)      # schedules are code: each side keeps its own lr
        restored.append(hyper_rules.resolve(opt.name, opt.artifact.hypers,
                                            opt.artifact.requirements, g.hyper, h))
    converted: set[str] = set()
    stored = sd.get("stored") or [{}] * n
    restored_states = []
    for i, (st, rec) in enumerate(zip(opt.state, states)):
        if isinstance(rec, Mapping):
            rec = _reformat(opt, i, rec, stored[i] if i < len(stored) else {}, converted)
        restored_states.append(rec)
        if not isinstance(rec, Mapping) or set(st) != set(rec) - {formats.PARAM}:
            _fail(opt, f"state_dict state {i} has "
                       f"{sorted(rec) if isinstance(rec, Mapping) else rec!r}, "
                       f"expected {sorted(st)}")
        for name, v in st.items():
            if isinstance(v, np.floating):
                x = rec[name]
                if isinstance(x, bool) or not isinstance(x, numbers.Real):
                    _fail(opt, f"state_dict state {i}.{name} must be a float, got {x!r}")
                continue
            src = np.asarray(rec[name])
            want = (tensors.dtype_name(v, opt.records[i].lib), list(v.shape))
            if (src.dtype.name, list(src.shape)) != want:
                _fail(opt, f"state_dict state {i}.{name} is {src.dtype.name}{list(src.shape)}, "
                           f"expected {want[0]}{want[1]}")
    if converted:   # another state format (optgen/core/formats.py): rounded or widened
        warnings.warn(f"{opt.name}: state_dict states converted to this optimizer's state "
                      f"format ({', '.join(sorted(converted))})", stacklevel=3)
    return {"defaults": defaults, "groups": restored, "t": int(sd["t"]),
            "steps": [int(s) for s in sd["param_steps"]],
            "skipped_steps": int(sd.get("skipped_steps", 0)),
            "lr_mult": [float(x) for x in sd["lr_mult"]],
            "wd_mult": [float(x) for x in sd["wd_mult"]],
            "refreshed": [None if r is None else int(r)
                          for r in sd.get("refreshed", [None] * n)],
            "states": restored_states}


def _reformat(opt, i: int, rec: Mapping, stored: Any, converted: set[str]) -> dict:
    """Parameter ``i``'s saved states in this optimizer's layout: a state this optimizer
    keeps as q8/q4 but saved in full precision is quantized; one saved as q8/q4 (codes and
    absmax; ``stored`` names its map) that this optimizer keeps in full precision is
    dequantized (then cast to its dtype); codes of another block size, map or format
    (q8 <-> q4) are dequantized and quantized again; a float32 state kept as bfloat16 is rounded, and the reverse
    widened. Anything else is left to the checks."""
    st, out, shape = opt.state[i], _remaster(opt, i, rec, converted), tuple(opt.params[i].shape)
    for n in [n for n in st if not n.endswith(ABSMAX) and n in rec
              and not isinstance(st[n], np.floating)]:
        mine, theirs = n + ABSMAX in st, n + ABSMAX in rec
        src = np.asarray(rec[n])
        want = tensors.dtype_name(st[n], opt.records[i].lib)
        if not mine and not theirs and src.dtype.name != want and \
                list(src.shape) == list(st[n].shape) and {src.dtype.name, want} in REFORMAT:
            out[n] = src.astype(tensors.numpy_dtype(want))
            converted.add(f"{src.dtype.name} -> {want}")
            continue
        ours = formats.from_stored(opt.artifact.stored.get(n))
        theirs_fmt = formats.from_stored(stored.get(n)) if isinstance(stored, Mapping) else None
        if mine and not theirs and (src.dtype.kind == "f" or src.dtype.name == "bfloat16"):
            out[n], out[n + ABSMAX] = ours.quantize(src.astype(np.float32))
            converted.add(f"{src.dtype.name} -> {ours.name}")
        elif theirs and not mine:
            if theirs_fmt is None:
                _fail(opt, f"state_dict state {i}.{n} is q8/q4 codes without their map "
                           "(no 'stored' entry): it cannot be dequantized")
            out[n] = theirs_fmt.dequantize((src, np.asarray(rec[n + ABSMAX])), shape) \
                .astype(tensors.numpy_dtype(want))
            del out[n + ABSMAX]
            converted.add(f"{theirs_fmt.name} -> {want}")
        elif mine and theirs and theirs_fmt is not None and \
                stored[n] != opt.artifact.stored[n]:      # another block size, map or bits
            values = theirs_fmt.dequantize((src, np.asarray(rec[n + ABSMAX])), shape)
            out[n], out[n + ABSMAX] = ours.quantize(values)
            converted.add(f"{stored[n]} -> {opt.artifact.stored[n]}")
    return out


def _remaster(opt, i: int, rec: Mapping, converted: set[str]) -> dict:
    """Parameter ``i``'s saved record with its master in this optimizer's form
    (``state.remaster``)."""
    slot = opt.records[i]
    out, label = state.remaster(rec, opt.state[i], lambda: tensors.to_numpy(slot.array, slot.lib),
                                opt.artifact.state_format)
    if label:
        converted.add(label)
    return out


# -- the file format -----------------------------------------------------------------
def save(path: str | os.PathLike, sd: Mapping[str, Any]) -> None:
    """Write a state_dict to ``path`` atomically (npz + json, no pickle)."""
    path = os.fspath(path)
    arrays: dict[str, np.ndarray] = {}
    meta = {k: v for k, v in sd.items() if k != "state"}
    meta["state"] = []
    for i, st in enumerate(sd["state"]):
        rec = {}
        for name, v in st.items():
            if isinstance(v, np.ndarray):
                key = f"state.{i}.{name}"
                rec[name] = {"array": key, "dtype": v.dtype.name}
                arrays[key] = v.view(np.uint16) if v.dtype.name == "bfloat16" else v
            else:
                rec[name] = float(v)
        meta["state"].append(rec)
    blob = json.dumps(meta).encode()
    with tempfiles.replacing(path) as f:   # (and removes what killed saves left)
        np.savez(f, **arrays, **{META: np.frombuffer(blob, np.uint8)})


def load(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint written by ``save`` (never unpickles)."""
    path = os.fspath(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            files = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise ValueError(f"{path}: not an optgen checkpoint ({e})") from None
    if META not in files:
        raise ValueError(f"{path}: not an optgen checkpoint (no {META})")
    try:
        sd = json.loads(files[META].tobytes().decode())
    except ValueError as e:
        raise ValueError(f"{path}: unreadable {META}: {e}") from None
    if not isinstance(sd, dict) or not isinstance(sd.get("state"), list):
        raise ValueError(f"{path}: {META} has no state list")
    for rec in sd["state"]:
        if not isinstance(rec, dict):
            raise ValueError(f"{path}: a state entry is not a dict")
        for name, v in rec.items():
            if isinstance(v, dict):
                arr = files.get(v.get("array"))
                if arr is None:
                    raise ValueError(f"{path}: array {v.get('array')!r} is missing")
                if v.get("dtype") == "bfloat16":
                    arr = arr.view(tensors.numpy_dtype("bfloat16"))
                rec[name] = arr
    return sd

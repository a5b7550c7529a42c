"""Loading a drop-in's ``state_dict``: every saved state checked against the
optimizer's layout before anything changes, then copied into the runtime's states.

Used by ``OptgenOptimizer.load_state_dict`` (drop_in.py): ``plan`` raises a ValueError
naming the parameter and the state on another group layout, a missing or extra state or
another shape, and changes nothing; ``copy_in`` then copies from the saved tensors (not
torch's dtype-cast copies), so float64 scalar states and every stored dtype round-trip.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from . import fsdp
from optgen.core import formats
from optgen.runtime import state, tensors

STORED = "stored"   # an optgen-format state_dict's entry: state -> the form of its codes


def plan(name: str, state_dict: dict[str, Any], param_groups: list[dict[str, Any]],
         params: list, states: list[dict[str, Any]], fmt: dict[str, str] | None = None,
         stored: dict[str, str] | None = None) -> list[tuple[int, dict[str, Any]]]:
    """(parameter index, saved record) of every parameter ``state_dict`` holds a state
    for, each checked against ``states`` (the runtime's); a saved master of another
    form (float32, split: ``fmt`` is the artifact's format dict) and saved states of
    another state format (``stored``: the artifact's; the state_dict's own ``"stored"``
    where it names the form of its codes, ``reformat``) converted first, with one
    warning line."""
    saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
    if len(saved_groups) != len(param_groups) or any(
            len(a["params"]) != len(b["params"])
            for a, b in zip(saved_groups, param_groups)):
        raise ValueError(f"{name}: state_dict has another group layout "
                         "(number of groups or parameters per group)")
    index = {id(p): i for i, p in enumerate(params)}
    out, converted = [], set()
    for sg, g in zip(saved_groups, param_groups):
        for pid, p in zip(sg["params"], g["params"]):
            if pid not in saved_state:
                continue
            i, rec = index[id(p)], saved_state[pid]
            rec = _remaster(rec, states[i], p, fmt or {}, converted)
            rec = reformat(name, i, rec, states[i], stored or {}, converted,
                           state_dict.get(STORED))
            want = set(states[i]) | {"step"}
            if set(rec) - {formats.PARAM} != want:
                raise ValueError(f"{name}: state_dict state of parameter "
                                 f"{i} has {sorted(rec)}, expected {sorted(want)}")
            for n, v in states[i].items():   # (a DTensor state: its local shard)
                got = None if isinstance(v, np.floating) else fsdp.local(rec[n])
                if got is not None and tuple(got.shape) != tuple(v.shape):
                    raise ValueError(f"{name}: state_dict state {i}.{n} has "
                                     f"shape {tuple(got.shape)}, expected {tuple(v.shape)}")
            out.append((i, rec))
    if converted:
        warnings.warn(f"{name}: state_dict states converted to this optimizer's state "
                      f"format ({', '.join(sorted(converted))})", stacklevel=3)
    return out


def named(sd: dict[str, Any], stored: dict[str, str]) -> dict[str, Any]:
    """An optgen-format state_dict with the form of its codes (``STORED``), so that an
    optimizer whose format codes a state otherwise converts it on load."""
    if stored:
        sd[STORED] = dict(stored)
    return sd


def reformat(name: str, i: int, rec: dict[str, Any], mine: dict[str, Any],
             stored: dict[str, str], converted: set[str],
             saved: dict[str, str] | None = None) -> dict[str, Any]:
    """Parameter ``i``'s saved record with each tensor state in this optimizer's format
    (``mine``: its states; ``stored``: the artifact's formats of its block-quantized ones):
    values (float32, bfloat16: torch's format, another optimizer's) of a state kept as
    codes are coded in this optimizer's blocks, with the saved block scales where the
    record holds them and they give the values back exactly (the codes they came from),
    else with their own (a conversion); values of a state kept as values are cast to its
    dtype (a conversion where it differs), their block scales dropped. Codes of a state
    kept as codes in another form (``saved``, the state_dict's ``"stored"``: q8's
    earlier "q8:unsigned" for "q8:usqrt", another block size) are decoded and coded
    again; without ``saved`` codes are taken as this optimizer's form. Codes of a state
    kept as values are refused: an optgen-format record without ``saved`` does not say
    its format."""
    out = dict(rec)
    for n, v in mine.items():
        got = out.get(n)
        if n.endswith(formats.ABSMAX) or not isinstance(v, torch.Tensor) or \
                not isinstance(got, torch.Tensor):
            continue
        here = fsdp.local(got).detach()
        theirs = (saved or {}).get(n)
        if n + formats.ABSMAX in mine and not here.is_floating_point() and \
                theirs is not None and theirs != stored.get(n) and \
                formats.from_stored(theirs) is not None:
            src = formats.from_stored(theirs)
            values = src.dequantize((here.cpu().numpy(),
                                     fsdp.local(out[n + formats.ABSMAX]).detach().cpu().numpy()),
                                    tuple(here.shape))
            codes = formats.from_stored(stored[n]).quantize(np.asarray(values, np.float32))
            out[n], out[n + formats.ABSMAX] = (torch.from_numpy(c) for c in codes)
            converted.add(f"{theirs} -> {stored[n]}")
        elif n + formats.ABSMAX in mine and here.is_floating_point():
            out[n], out[n + formats.ABSMAX] = _coded(here, out.get(n + formats.ABSMAX),
                                                     mine[n + formats.ABSMAX],
                                                     formats.from_stored(stored[n]), converted)
        elif n + formats.ABSMAX not in mine and not here.is_floating_point() and \
                v.is_floating_point():
            raise ValueError(f"{name}: state_dict state {i}.{n} holds block-quantized codes "
                             f"({here.dtype}), which an optgen-format state_dict keeps "
                             f"without their format; this optimizer keeps {n} as {v.dtype}: "
                             "load it into an optimizer of the same state_format, or carry "
                             "it as values (a torch form's state_dict(), opt.save(path))")
        elif n + formats.ABSMAX not in mine:
            out.pop(n + formats.ABSMAX, None)   # (values with their codes' block scales)
            if here.is_floating_point() and here.dtype != v.dtype:
                out[n] = here.to(v.dtype)
                converted.add(f"{_dtype(here)} -> {_dtype(v)}")
    return out


def _coded(values: torch.Tensor, scales: Any, like: torch.Tensor, fmt: Any,
           converted: set[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, block scales) of ``values`` in ``fmt``: with the saved ``scales`` when
    they code the values back exactly, else with the values' own (a conversion)."""
    x = values.float().cpu().numpy()
    if isinstance(scales, torch.Tensor) and tuple(fsdp.local(scales).shape) == tuple(like.shape):
        codes = fmt.quantize(x, fsdp.local(scales).detach().float().cpu().numpy())
        back = np.asarray(fmt.dequantize(codes, x.shape), np.float32)
        if np.array_equal(back.view(np.uint32), x.view(np.uint32)):
            return torch.from_numpy(codes[0]), torch.from_numpy(codes[1])
    codes = fmt.quantize(x)
    converted.add(f"{_dtype(values)} -> {fmt.name}")
    return torch.from_numpy(codes[0]), torch.from_numpy(codes[1])


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _remaster(rec: dict[str, Any], mine: dict[str, Any], p: Any, fmt: dict[str, str],
              converted: set[str]) -> dict[str, Any]:
    """``rec`` with its master in the form of ``mine`` (runtime/state.py ``remaster``)."""
    keys = (formats.CORRECTION, state.MASTER)
    host = {n: fsdp.local(rec[n]).detach().cpu().numpy() for n in keys if n in rec}
    new, label = state.remaster(host, mine, lambda: tensors.to_numpy(fsdp.local(p), "torch"),
                                fmt)
    if label is None:
        return rec
    converted.add(label)
    out = {n: v for n, v in rec.items() if n not in keys}
    out.update((n, v if n == formats.PARAM else torch.from_numpy(v)) for n, v in new.items())
    return out


def copy_in(states: list[dict[str, Any]], plan: list[tuple[int, dict[str, Any]]],
            params: list | None = None) -> None:
    """The saved records of ``plan`` into the runtime's ``states``, in place (and a
    converted master's weight into its parameter of ``params``)."""
    for i, rec in plan:   # copied from the saved tensors (not torch's dtype-cast copies)
        if formats.PARAM in rec and params is not None:
            tensors.copy_into(fsdp.local(params[i]).data, "torch", rec[formats.PARAM])
        for n, v in states[i].items():
            if isinstance(v, np.floating):
                states[i][n] = np.float64(float(rec[n]))
            elif isinstance(v, np.ndarray):   # (SparseAdam steps numpy views)
                np.copyto(v, torch.as_tensor(rec[n]).detach().cpu().numpy())
            else:
                v.copy_(fsdp.local(rec[n]))


def written(opt_state: Any, params: list, states: list[dict[str, Any]]) -> bool:
    """Whether a state dict of ``opt.state`` holds tensors that are not the runtime's
    (``states``): assigned from outside, as ``ZeroRedundancyOptimizer.load_state_dict``
    does (``optim.state[param] = {...}``, bypassing ``load_state_dict``)."""
    for p, core in zip(params, states):
        st = opt_state.get(p, {})
        for n, v in core.items():
            x = st.get(n)
            if isinstance(x, torch.Tensor) and x is not v and fsdp.local(x) is not v:
                return True
    return False

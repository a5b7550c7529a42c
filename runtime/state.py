"""Optimizer states: which states a parameter has, their initial values, dtypes and
shapes, where they are allocated, and their storage dtype when a kernel changes it.

A parameter's states are a dict name -> array (kernel states, in the compute dtype or
float16 where the spec's ``half_when`` says so), ``np.float64`` (scalar states, kept on
the host) and, under mixed precision, ``"master"``: the float32 copy the kernels update.
An elementwise state new to every parameter of a flat chain (runtime/flat.py), with one
init and dtype, is one buffer for the chain, so states are back to back wherever
parameters are. Storage formats and placement (sharded, offloaded, low-bit states)
belong here.

May import: numpy, warnings, flat, formats, owned, scalar_expr, tensors, views.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import flat, owned, tensors
from optgen.core import formats, scalar_expr, views

MASTER = "master"   # the float32 master copy of a mixed-precision parameter
FROM_W = "w"        # the init of a state that starts as a copy of the parameter


def init_value(s: Any, st: Mapping[str, Any], flags: Mapping[str, bool],
               env: Callable[[], Mapping[str, Any]], compute_dtype: str,
               stored: Mapping[str, str]) -> tuple[float, str] | None:
    """(init value, dtype) of state ``s`` new to a parameter with states ``st`` and
    ``flags``; None if it has it or its flags leave it out. An init expression reads
    the group's environment ``env()``; ``stored`` maps the parameter's formatted states
    to their dtype (the spec's float16 states keep theirs)."""
    if s.name in st or not s.exists(flags):
        return None
    init = s.init if s.init == FROM_W else \
        scalar_expr.evaluate(s.init, env()) if isinstance(s.init, str) else s.init
    half = s.half_when is not None and scalar_expr.evaluate(s.half_when, flags)
    return init, "float16" if half else stored.get(s.name, compute_dtype)


def formatted(owner: str, artifact: Any, req: Any, shapes: Sequence[tuple[int, ...]],
              min_size: int) -> list[bool]:
    """Which parameters store their states in the requested format (optgen/core/formats.py):
    those with at least ``min_size`` elements (the whole parameter's: a parameter split
    across ranks is formatted alike on every rank). The artifact must hold the request's
    kernels (``optgen.create(..., state_format=...)`` builds them)."""
    formats.check_min_size(owner, min_size)
    if req is None:
        return [False] * len(shapes)
    want = formats.expand(owner, req, artifact.states)
    if artifact.state_format != want:
        have = formats.key(artifact.state_format) if artifact.state_format else "none"
        raise ValueError(f"{owner}: state_format {formats.key(req)!r} needs an artifact built "
                         f"with it; {artifact.path} has state formats: {have} (optgen.create"
                         f"(..., state_format=...) or `optgen build --state-format` builds it)")
    if not formats.states_of(want):     # (stochastic_rounding alone: no state is formatted)
        return [False] * len(shapes)
    out = [int(np.prod(shape, dtype=np.int64)) >= min_size for shape in shapes]
    _warn_rows(owner, artifact.stored, shapes, out)
    return out


def _warn_rows(owner: str, stored: Mapping[str, str], shapes: Sequence[tuple[int, ...]],
               out: Sequence[bool]) -> None:
    """Where q8 is still not safe (docs/state-formats.md): states in blocks that span
    rows of a weight, which may differ in gradient scale by decades; a warning at
    construction naming the first such parameter and what avoids it."""
    parsed = {n: formats.from_stored(t) for n, t in stored.items()}
    q8 = {n for n, f in parsed.items() if f is not None and f.blocked}
    signed = [n for n in q8 if parsed[n].map == "signed"]
    if not signed:
        return
    block = parsed[signed[0]].block
    cut = [i for i, (shape, f) in enumerate(zip(shapes, out))
           if f and len(shape) >= 2 and shape[-1] % block]
    if not cut:
        return
    cols = shapes[cut[0]][-1]
    fits = [b for b in (128, 64, 32) if b < block and cols % b == 0]
    fix = f"state_format='q8@{fits[0]}' (a block that divides the row) or " if fits else ""
    mixed = {n: "q8" if n in signed else "bf16" for n in sorted(q8)}
    warnings.warn(f"{owner}: q8 states of {len(cut)} parameter(s) (first: #{cut[0]}, shape "
                  f"{tuple(shapes[cut[0]])}) put parts of several rows in one {block}-element "
                  "block; where those rows differ in gradient scale by decades, the small "
                  "ones' states are coded with a few values per decade and keep their codes "
                  "as their gradients change, so those weights can move further than with "
                  f"float32 states (docs/state-formats.md, q8); {fix}the second moments in "
                  f"bf16 (state_format={mixed}) come closer", stacklevel=4)


def allocate(specs: Sequence[Any], slot: Any, chain: Sequence[Any],
             new: Callable[[Any, Any], tuple[float, str] | None]) -> None:
    """Allocate the states a parameter (``slot``: its record) has under its current
    flags (a state that appears when a flag is switched on starts at its init value);
    ``new(x, s)`` is ``init_value`` of state ``s`` for the parameter of record ``x``,
    and ``chain`` the records of its flat chain (itself alone when it has none)."""
    p, st, lib = slot.array, slot.state, slot.lib
    for s in specs:
        found = new(slot, s)
        if found is None:
            continue
        init, dtype = found
        if init == FROM_W:      # (its own copy: never one buffer of a flat chain)
            _allocate_copy(s.name, slot, dtype)
            continue
        if s.shape == "scalar":
            st[s.name] = np.float64(init)
            continue
        coded = formats.from_stored(dtype)
        if coded is not None:         # codes of the init and their companions
            st.update(coded.allocate(s.name, init, tuple(p.shape),
                                     lambda shape, v, dt: tensors.full_like(p, lib, shape, v, dt)))
            continue
        if s.shape == "param" and len(chain) > 1 and all(new(x, s) == found for x in chain):
            for x, v in zip(chain, flat.split_full(
                    [x.array for x in chain], lib, [tuple(x.array.shape) for x in chain],
                    init, dtype)):
                x.state[s.name] = v
            continue
        if owned.absent(slot.split, s.name):   # (held whole by another rank)
            continue
        shape = owned.state_shape(slot.split, s.name, s.shape) or \
            views.state_shape(tuple(p.shape), s.shape)
        st[s.name] = tensors.full_like(p, lib, shape, init, dtype)


def _allocate_copy(name: str, slot: Any, dtype: str) -> None:
    """State ``name`` as a copy of the parameter (of its master under mixed precision)."""
    p, st, lib = slot.array, slot.state, slot.lib
    if formats.from_stored(dtype) is not None:
        raise ValueError(f"state {name} starts as a copy of the parameter (init w), which "
                         f"a state format ({dtype}) cannot hold; leave {name} out of "
                         "state_format")
    if owned.absent(slot.split, name):   # (held whole by another rank)
        return
    copy = tensors.full_like(p, lib, tuple(p.shape), 0.0, dtype)
    src = st.get(MASTER, p)
    copy[...] = src.detach() if hasattr(src, "detach") else src   # (no autograd history)
    st[name] = copy


def allocate_correction(slot: Any, chain: Sequence[Any], fmt: Mapping[str, str]) -> None:
    """A bfloat16 parameter stepped through a split master (``fmt``: the artifact's
    format dict has one, optgen/core/formats/split.py) keeps the master's low bits as
    the state ``w__corr``: zero at first (the master is the weight); one buffer for a
    flat chain (``chain``: its records) whose parameters all take one."""
    split, name = formats.master(fmt), formats.CORRECTION

    def takes(x: Any) -> bool:
        return not x.mixed and name not in x.state and \
            tensors.dtype_name(x.array, x.lib) == split.dtype

    if split is None or not takes(slot):
        return
    dtype = split.family.corr_dtypes[split.name]
    if len(chain) > 1 and all(takes(x) for x in chain):
        for x, v in zip(chain, flat.split_full([x.array for x in chain], slot.lib,
                                               [tuple(x.array.shape) for x in chain], 0, dtype)):
            x.state[name] = v
        return
    slot.state[name] = tensors.full_like(slot.array, slot.lib, tuple(slot.array.shape), 0,
                                         dtype)


def remaster(rec: Mapping[str, Any], mine: Mapping[str, Any], weight: Callable[[], Any],
             fmt: Mapping[str, str]) -> tuple[dict[str, Any], str | None]:
    """A saved record of a parameter's states with its master in the form of the states
    ``mine`` (``fmt``: the artifact's format dict), and the conversion made ("float32
    master -> split8"; None: none): a float32 master (``MASTER``) or a split one
    (``w__corr``, decoded with the parameter's bfloat16 weight, ``weight()`` as numpy)
    becomes the other, or the other split format. A split master encoded anew also gives
    the weight, under ``formats.PARAM`` (the caller writes it into the parameter)."""
    out, corr, ours = dict(rec), formats.CORRECTION, formats.master(fmt)
    saved = np.asarray(out[corr]) if corr in out else None
    theirs = None if saved is None else formats.split.SPLIT.by_corr(saved.dtype.name)
    if saved is not None and (theirs is None or (corr in mine and theirs == ours)):
        return out, None
    if saved is not None and (corr in mine or MASTER in mine):
        theta = theirs.family.decode(theirs, weight(), out.pop(corr))
    elif saved is None and corr in mine and MASTER in out and MASTER not in mine:
        theta = np.asarray(out.pop(MASTER), np.float32)
    else:
        return out, None
    if corr in mine:
        out[formats.PARAM], out[corr] = ours.family.encode(ours, theta)
    else:
        out[MASTER] = theta
    return out, (f"{theirs.name if theirs else 'float32 master'} -> "
                 f"{ours.name if corr in mine else 'float32 master'}")


def master_copy(p: Any, lib: str) -> Any:
    """The float32 master copy of a low-precision parameter (mixed precision)."""
    return tensors.cast_copy(p, lib, "float32")


def convert(st: dict[str, Any], lib: str, k: Any) -> None:
    """Store each of kernel ``k``'s buffers in the dtype ``k`` wants (a storage flag
    changed: the state is converted, rounding once)."""
    for n in k.buffers:
        if n in k.formats or n in k.companions:   # (codes: never cast)
            continue
        want = k.storage.get(n, k.dtype)
        v = st.get(n)
        if v is not None and not isinstance(v, np.floating) and \
                tensors.dtype_name(v, lib) != want:
            st[n] = tensors.cast_copy(v, lib, want)


def arrays(st: Mapping[str, Any]) -> list[Any]:
    """The state arrays of a parameter (its scalar states left out)."""
    return [s for s in st.values() if not isinstance(s, np.floating)]


def scalar_states(st: Mapping[str, Any]) -> dict[str, Any]:
    """The scalar states of a parameter (host float64 values)."""
    return {n: v for n, v in st.items() if isinstance(v, np.floating)}

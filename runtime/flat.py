"""Flat parameter groups: many tensors in one contiguous buffer, one kernel call.

An elementwise rule does not care where one tensor ends and the next begins. When the
parameters of a group lie back to back in one buffer (``optgen.flatten`` puts them
there), and so do their gradients and states, the optimizer updates a whole run of them
with one kernel call over the span instead of one call per tensor. Nothing about the
arithmetic changes: the span is the same elements in the same order.

The optimizer finds runs by looking at memory, not by trusting a mode:

- *chains* (at construction): consecutive parameters of one library, device and dtype
  whose data lie back to back. Each elementwise state of a chain is allocated as one
  buffer with a view per parameter, so states are back to back wherever parameters are.
- *runs* (when kernels are prepared): stretches of a chain whose parameters use the
  same single-launch elementwise kernel with the same scalars (group, multipliers),
  and whose every persistent array (parameter, states) is back to back.
- at each step, a run is fused when its gradients are back to back too (checked by
  address when they change: runtime/gradcache.py) and every parameter in it takes
  this step; otherwise its parameters are stepped one by one, exactly as before.

This module owns that memory logic (chains, runs, spans); the run strategies
(runtime/strategies/runs.py) keep the runs it finds, and runtime/launch.py makes the
calls. May import: numpy, tensors.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import tensors

GRAD = object()   # a run's argument slot for the gradient span, filled in per step


def flatten(arrays: Sequence[Any], dtype: Any = None) -> list[Any]:
    """Copies of ``arrays`` as views into one new contiguous buffer (64-byte aligned
    for numpy; torch tensors keep their device), in order. Use the returned views in
    place of the originals: parameters built this way (and gradients written into a
    second ``flatten``) let a group's update run as one kernel call."""
    arrays = list(arrays)
    if not arrays:
        return []
    lib = tensors.library(arrays[0])
    if lib is None or any(tensors.library(a) != lib for a in arrays):
        raise TypeError("flatten: expected a list of arrays of one library (numpy, torch "
                        "or cupy), got " + ", ".join(sorted({type(a).__name__ for a in arrays})))
    sizes = [int(np.prod(tuple(a.shape), dtype=np.int64)) for a in arrays]
    if lib == "numpy":
        dt = np.result_type(*arrays) if dtype is None else np.dtype(dtype)
        buf = tensors.aligned_full((sum(sizes),), 0, dt)
    elif lib == "torch":
        import torch
        dt = arrays[0].dtype if dtype is None else dtype
        if any(a.dtype != dt for a in arrays) or any(a.device != arrays[0].device
                                                     for a in arrays):
            raise TypeError("flatten: torch tensors must share one dtype and device")
        buf = torch.empty(sum(sizes), dtype=dt, device=arrays[0].device)
    else:
        import cupy
        dt = arrays[0].dtype if dtype is None else cupy.dtype(dtype)
        with arrays[0].device:
            buf = cupy.empty(sum(sizes), dtype=dt)
    views, start = [], 0
    for a, n in zip(arrays, sizes):
        v = buf[start:start + n].reshape(tuple(a.shape))
        if lib == "torch":
            v.copy_(a.detach())
        else:
            v[...] = a
        views.append(v)
        start += n
    return views


def _numel(a: Any) -> int:
    return int(np.prod(tuple(a.shape), dtype=np.int64))


def adjacent(arrays: Sequence[Any], lib: str) -> bool:
    """Whether the C-contiguous ``arrays`` lie back to back in memory, in order, within
    one allocation (torch: one storage). Empty arrays hold no memory and are skipped."""
    arrays = [a for a in arrays if _numel(a)]
    if not arrays:
        return False
    if lib == "torch":
        storage = arrays[0].untyped_storage().data_ptr()
        if any(a.untyped_storage().data_ptr() != storage for a in arrays[1:]):
            return False
    ranges = [tensors.address_range(a, lib) for a in arrays]
    return all(r[1] == s[0] for r, s in zip(ranges, ranges[1:]))


def span(arrays: Sequence[Any], lib: str) -> Any:
    """One flat view covering the adjacent ``arrays`` (checked by ``adjacent``)."""
    n = sum(_numel(a) for a in arrays)
    first = next(a for a in arrays if _numel(a))
    if lib == "numpy":
        return np.lib.stride_tricks.as_strided(first, shape=(n,), strides=(first.itemsize,))
    if lib == "torch":
        return first.detach().as_strided((n,), (1,), first.storage_offset())
    import cupy
    return cupy.lib.stride_tricks.as_strided(first, shape=(n,), strides=(first.itemsize,))


def split_full(like: Sequence[Any], lib: str, shapes: Sequence[tuple], value: float,
               dtype: str) -> list[Any]:
    """One buffer of ``value`` holding arrays of ``shapes`` back to back; the views."""
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    buf = tensors.full_like(like[0], lib, (sum(sizes),), value, dtype)
    out, start = [], 0
    for s, n in zip(shapes, sizes):
        out.append(buf[start:start + n].reshape(s))
        start += n
    return out


def chains(params: Sequence[Any], libs: Sequence[str], eligible: Sequence[bool]
           ) -> list[tuple[int, int]]:
    """Maximal [start, end) stretches (two or more) of consecutive eligible parameters
    of one library and dtype that lie back to back in memory (empty ones in between
    belong to the stretch: they hold no memory)."""
    out, i, n = [], 0, len(params)
    while i < n:
        j = i + 1
        if eligible[i] and _numel(params[i]):
            last = i                                 # the last non-empty one so far
            while j < n and eligible[j] and libs[j] == libs[i] and \
                    params[j].dtype == params[i].dtype and \
                    (not _numel(params[j]) or adjacent([params[last], params[j]], libs[i])):
                if _numel(params[j]):
                    last = j
                j += 1
            if j - i > 1:
                out.append((i, j))
        i = j
    return out


# -- runs: stretches of a chain that one call per pass updates ----------------------------
def fusable(k: Any, has_inputs: bool, flat_axes: str) -> bool:
    """Whether kernel ``k`` is one elementwise launch over the flat view, or passes that
    each have a segmented variant (whole-tensor reductions: LAMB, LARS), so a parameter
    may share a call per pass with its neighbours (scalar states, such as SGD's
    buffer_started, are checked equal per step). Specs with extra inputs never fuse, nor
    stochastically rounded states (their random numbers are keyed per parameter:
    optgen/core/rounding.py)."""
    if has_inputs or k.stochastic:
        return False
    if all("seg_symbol" in ln for ln in k.launches):
        return not k.param_scalars
    return (len(k.launches) == 1 and k.launches[0]["view"] == "flat" and not k.workspaces
            and all(k.buffer_axes[b] == flat_axes for b in k.launches[0]["buffers"]))


def find_runs(chains: Sequence[tuple[int, int]], same: Callable[[int], tuple | None],
              calls: Callable[[int, int], list | None]
              ) -> dict[int, tuple[int, list[tuple[Callable, list]], list]]:
    """start -> (end, [(kernel, arguments), ...], every argument): the stretches of each
    chain whose parameters have one ``same(i)`` key (group, kernel, multipliers; None:
    not fusable) and whose ``calls(i, j)`` exist (every persistent array back to back;
    the gradient's span, ``GRAD``, is filled in per step)."""
    runs = {}
    for a, b in chains:
        i = a
        while i < b:
            j = i + 1
            key = same(i)
            if key is not None:
                while j < b and same(j) == key:
                    j += 1
            if j - i > 1:
                found = calls(i, j)
                if found is not None:
                    runs[i] = (j, found, [x for _, args in found for x in args])
            i = j
    return runs


def run_calls(artifact: Any, k: Any, lib: str, like: Any, parts: Sequence[Mapping[str, Any]],
              sizes: Sequence[int], *, segmented: bool) -> list[tuple[Callable, list]] | None:
    """The calls that update a run's parameters together (``parts``: each one's kernel
    arguments by buffer name, ``sizes`` their element counts): the kernel's one launch
    over the span, or (``segmented``) each pass's segmented variant with the run's
    offsets (``_seg``) and reduction buffers (one per tensor, kept with the run); None
    when some persistent array is not back to back."""
    spans: dict[str, Any] = {"grad": GRAD}
    if segmented:
        size = artifact.reduction_buffer_size * len(parts)
        spans.update((n, tensors.full_like(like, lib, (size,), 0.0, artifact.reduction_dtype))
                     for n in k.workspaces)
        offsets = np.cumsum([0] + list(sizes), dtype=np.int64)
        spans["_seg"] = tensors.full_like(like, lib, (len(parts) + 1,), 0, "int64")
        tensors.copy_into(spans["_seg"], lib, offsets)
    calls = []
    for ln in k.launches:
        args = []
        for name in ln["buffers"]:
            if name not in spans:
                arrays = [p[name] for p in parts]
                if not adjacent(arrays, lib):
                    return None
                spans[name] = span(arrays, lib)
            args.append(spans[name])
        if segmented:
            args.append(spans["_seg"])
        calls.append((artifact.function(ln["seg_symbol" if segmented else "symbol"]), args))
    return calls


def grad_span(gs: Sequence[Any], lib: str, args: Sequence[Any]) -> Any:
    """The span of a run's dense gradients ``gs`` if they lie back to back, apart from
    the run's arguments ``args`` (parameters and states); else None. (Whether every
    member takes this step, and how long the verdict holds: runtime/gradcache.py.)"""
    if not adjacent(gs, lib):
        return None
    full = [g for g in gs if _numel(g)]
    where = (tensors.address_range(full[0], lib)[0], tensors.address_range(full[-1], lib)[1])
    if any(a is not GRAD and tensors.overlaps(where, tensors.address_range(a, lib))
           for a in args):
        return None
    return span(gs, lib)


__all__ = ["flatten"]

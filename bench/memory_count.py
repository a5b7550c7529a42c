"""Bytes per parameter at the peak of a training step, counted from the storages alive on
the torch side (bench/memory_bench.py prints the table; tests/test_memory_bench.py checks
the counter on a case with a known answer).

What is counted
---------------
A storage is a block of memory behind one or more tensors or numpy arrays: a torch
tensor's untyped storage (its data pointer and size), a numpy array's outermost owning
array (its ``.base`` chain followed to the end). Views, tied weights and arrays sharing a
tensor's memory are counted once: every storage is an interval of addresses, and
overlapping intervals are merged before they are summed. A tensor subclass without its
own storage (torchao's 8-bit and 4-bit state tensors) is counted through the inner
tensors its ``__tensor_flatten__`` names.

At each instant that matters the census sorts the live storages into five kinds, each
storage counted once, under the first kind that claims it:

  weights  the model's parameters (``p.data``)
  grads    the parameters' ``.grad`` at that instant
  master   storages the optimizer holds under a name that says master copy or
           correction (``master``, ``corr``, ``split``: MASTER_NAMES)
  states   every other tensor or array reachable from the optimizer object: its
           ``state`` and ``param_groups``, and the attributes of the objects it holds
           (followed into objects of the optimizer libraries only: WALK_INTO, not into
           torch modules, functions or compiled kernels)
  other    storages alive across the step that appeared after the optimizer was built
           and that no walk reached: found with ``gc.get_objects()`` (tensors, and numpy
           arrays held by any tracked container), minus the storages alive before the
           optimizer existed (kept alive by the census, so no address is reused)

Activations and the input batch are excluded by construction: they are neither
parameters, gradients, nor reachable from the optimizer, and "other" is swept only at
the quiet instant after ``opt.step()`` (the loss, logits and batch dropped), when no
activation is alive.

The instants of the step: a post-accumulate-grad hook on every parameter, registered
before the optimizer is built, so it runs before any hook the optimizer registers (the
gradient of that parameter is complete and alive); a second hook registered after the
optimizer (what its hook left); just before ``opt.step()``; just after it; after
``opt.zero_grad()`` (what lives between steps: "steady"). The peak is
the instant with the largest total (weights + master + grads + states), plus the "other"
of the sweep (memory outside the walk that lives through the step).
The step measured is the last of a few (``warmup`` before it), so states that optimizers
allocate at their first step exist. Memory no Python object exposes (a kernel's
scratch inside one call, TVM's or a C++ allocator's own buffers) is not seen.
"""
from __future__ import annotations

import gc
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch

KINDS = ("weights", "master", "grads", "states", "other")
MASTER_NAMES = re.compile(r"master|corr|split")
# objects whose attributes the optimizer walk follows, by the top of their module's name
WALK_INTO = ("optgen", "torchao", "bitsandbytes", "torch.optim")
MAX_DEPTH = 16
CONTAINERS = (dict, list, tuple, set, frozenset)


# -- storages ----------------------------------------------------------------------------
def tensor_extents(t: torch.Tensor) -> Iterator[tuple[int, int]]:
    """(address, bytes) of the storage(s) behind ``t``."""
    if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter and \
            hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        for n in names:   # (torch.Tensor only: some subclasses also name a DeviceMesh)
            inner = getattr(t, n)
            if isinstance(inner, torch.Tensor):
                yield from tensor_extents(inner)
        return
    try:   # (fake and functional tensors of torch.compile have no memory)
        s = t.untyped_storage()
        if s.device.type == "meta":   # (a FakeTensor's storage)
            return
        start, size = s.data_ptr(), s.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return
    if size:
        yield start, size


def array_extent(a: np.ndarray) -> tuple[int, int] | None:
    """(address, bytes) of the memory ``a`` lies in: its outermost array's."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    if a.dtype.hasobject or a.nbytes == 0:
        return None
    return a.__array_interface__["data"][0], a.nbytes


def extents(x: Any) -> list[tuple[int, int]]:
    if isinstance(x, torch.Tensor):
        return list(tensor_extents(x))
    if isinstance(x, np.ndarray):
        e = array_extent(x)
        return [e] if e else []
    return []


class Intervals:
    """A union of address intervals; ``add`` returns the bytes it newly covers."""

    def __init__(self) -> None:
        self.spans: list[tuple[int, int]] = []

    def add(self, start: int, size: int) -> int:
        end, new, merged = start + size, size, []
        for a, b in self.spans:
            if b <= start or a >= end:
                merged.append((a, b))
                continue
            new -= min(b, end) - max(a, start)   # (spans are disjoint)
            start, end = min(a, start), max(b, end)
        merged.append((start, end))
        self.spans = merged
        return max(new, 0)

    def covers(self, start: int, size: int) -> bool:
        return any(a <= start and start + size <= b for a, b in self.spans)


# -- what the optimizer holds ------------------------------------------------------------
def walk(root: Any) -> Iterator[tuple[str, Any]]:
    """(name, tensor or array) for everything reachable from ``root``; the name is the
    innermost string key or attribute on the way to it."""
    seen: set[int] = set()
    stack: list[tuple[Any, str, int]] = [(root, "", 0)]
    while stack:
        obj, name, depth = stack.pop()
        if id(obj) in seen or depth > MAX_DEPTH:
            continue
        seen.add(id(obj))
        if isinstance(obj, (torch.Tensor, np.ndarray)):
            yield name, obj
            continue
        if isinstance(obj, dict):
            for k, v in obj.items():
                stack.append((v, k if isinstance(k, str) else name, depth + 1))
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend((v, name, depth + 1) for v in obj)
        elif obj is root or _walks_into(obj):
            for k, v in _attributes(obj):
                stack.append((v, k, depth + 1))


def _walks_into(obj: Any) -> bool:
    if isinstance(obj, type):
        return False
    mod = getattr(type(obj), "__module__", "") or ""
    return any(mod == m or mod.startswith(m + ".") for m in WALK_INTO)


def _attributes(obj: Any) -> Iterable[tuple[str, Any]]:
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        yield from d.items()
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            if isinstance(slot, str) and hasattr(obj, slot):
                yield slot, getattr(obj, slot)


def sweep() -> dict[tuple[int, int], Any]:
    """Every storage a Python object exposes: tensors (gc tracks them) and numpy arrays
    held by any container, tracked or not (arrays are not tracked, and CPython stops
    tracking a dict or tuple that holds only untracked objects, so those are followed
    from the tracked objects that hold them). Values are the objects, so a caller
    holding the dict keeps those addresses in use."""
    found: dict[tuple[int, int], Any] = {}
    with warnings.catch_warnings():   # (isinstance on deprecated lazy module attributes)
        warnings.simplefilter("ignore")
        objs = gc.get_objects()
        for o in objs:
            try:
                tensor = isinstance(o, torch.Tensor)
            except ReferenceError:     # (a weakref proxy whose object is gone)
                continue
            if tensor:
                _add(found, o)
        seen: set[int] = set()
        while objs:
            refs = gc.get_referents(*objs)
            for r in refs:
                if type(r) is np.ndarray:
                    _add(found, r)
            objs = [r for r in refs if type(r) in CONTAINERS and not gc.is_tracked(r)
                    and id(r) not in seen]
            seen.update(id(r) for r in objs)
    return found


def _add(found: dict, x: Any) -> None:
    for e in extents(x):
        found.setdefault(e, x)


# -- one census, one step ------------------------------------------------------------------
@dataclass
class Census:
    """Bytes of each kind at one instant."""
    where: str
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    names: dict[str, int] = field(default_factory=dict)   # optimizer bytes by state name

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


def census(where: str, params: list, opt: Any, extra: dict | None = None) -> Census:
    c, seen = Census(where), Intervals()

    def count(kind: str, x: Any, name: str | None = None) -> None:
        for start, size in extents(x):
            b = seen.add(start, size)
            c.bytes[kind] += b
            if name is not None and b:
                c.names[name] = c.names.get(name, 0) + b
    for p in params:
        count("weights", p.data)
    for p in params:
        if p.grad is not None:
            count("grads", p.grad)
    held = list(walk(opt)) if opt is not None else []
    for name, x in held:
        if MASTER_NAMES.search(name):
            count("master", x, name)
    for name, x in held:
        count("states", x, name or "?")
    for (start, size), _ in (extra or {}).items():
        c.bytes["other"] += seen.add(start, size)
    return c


@dataclass
class Peak:
    """The largest census of the measured step, over the number of parameters."""
    n_params: int
    peak: Census
    steady: Census          # between steps: after opt.zero_grad()
    other: dict             # (address, bytes) -> object, for inspection
    instants: list[Census]

    def per_param(self, census_: Census | None = None) -> dict[str, float]:
        c = census_ or self.peak
        out = {k: c.bytes[k] / self.n_params for k in KINDS}
        out["total"] = c.total / self.n_params
        return out


def measure(model: torch.nn.Module, make_opt: Callable[[list], Any],
            train_step: Callable[[torch.nn.Module], torch.Tensor],
            warmup: int = 2, set_to_none: bool = True) -> Peak:
    """Run ``warmup + 1`` training steps of ``model`` (``train_step(model)`` returns the
    loss of a new batch), with ``make_opt(params)``'s optimizer, and count the last."""
    params = list(dict.fromkeys(model.parameters()))
    pre = sweep()                  # the world before the optimizer (kept alive: see sweep)
    instants: list[Census] = []
    box: dict[str, Any] = {"on": False, "opt": None}

    def hook(where: str):
        def run(p: torch.Tensor) -> None:
            if box["on"]:
                instants.append(census(where, params, box["opt"]))
        return run
    handles = [p.register_post_accumulate_grad_hook(hook("grad ready")) for p in params]
    opt = box["opt"] = make_opt(params)
    handles += [p.register_post_accumulate_grad_hook(hook("after hooks")) for p in params]
    other: dict = {}
    try:
        for i in range(warmup + 1):
            box["on"] = i == warmup
            loss = train_step(model)
            loss.backward()
            del loss
            if box["on"]:
                instants.append(census("before step", params, opt))
            opt.step()
            if box["on"]:
                other.update(_unreached(pre, params, opt))
                instants.append(census("after step", params, opt))
            opt.zero_grad(set_to_none=set_to_none)
            if box["on"]:
                instants.append(census("after zero_grad", params, opt))
    finally:
        for h in handles:
            h.remove()
    for c in instants:   # memory outside the walk, alive through the step
        c.bytes["other"] = census(c.where, params, opt, other).bytes["other"]
    peak = max(reversed(instants), key=lambda c: c.total)   # (ties: the latest)
    steady = [c for c in instants if c.where == "after zero_grad"][-1]
    return Peak(sum(p.numel() for p in params), peak, steady, other, instants)


def _unreached(pre: dict, params: list, opt: Any) -> dict:
    """Storages alive now that were not alive before the optimizer and that the census's
    walks do not reach."""
    gc.collect()
    known = Intervals()
    for x in [p.data for p in params] + [p.grad for p in params if p.grad is not None] + \
            [x for _, x in walk(opt)]:
        for e in extents(x):
            known.add(*e)
    before = Intervals()
    for e in pre:
        before.add(*e)
    return {e: x for e, x in sweep().items()
            if not before.covers(*e) and not known.covers(*e)}

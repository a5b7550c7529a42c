"""Kernel launches: the only place that calls a kernel (or, with backend="reference",
the reference interpreter in its place).

A ``Launcher`` keeps what the calls of an optimizer's parameters need between steps:

- kernel selection: the artifact's kernel for a dtype and flags, cached;
- plans: a parameter's launches with its persistent arguments (parameter, states,
  workspaces) viewed once; per-step arrays (the gradient, extra inputs) are named by a
  ``(name, axes, view)`` placeholder filled in per call;
- workspaces: reduction buffers and a matrix rule's temporaries, kept per parameter;
- the calls: one parameter's (``run``, ``run_lazy``, ``passes``) and a flat run's
  (``run_fused``); which of them steps a parameter is its launch strategy's choice
  (runtime/strategies/).

It reads and fills the optimizer's records (runtime/slots.py, the same objects): a
parameter ``i`` is ``slots[i]``; its plan and workspaces are kept in its slot.

May import: numpy, artifact, exchange, flat (its GRAD slot), formats, interpret, owned,
products, shards, slots, sparse, tensors, views. A parameter's kernel argument (``bind``) is made
when runtime/storage.py says its data is where it is now.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from . import exchange, interpret, owned, products, shards, tensors
from optgen.core import formats, views
from .artifact import KernelInfo, bfloat16_tensor
from .flat import GRAD
from optgen.core.reference import LOW_COPY
from .slots import ParamSlot
from .sparse import RowSparse

REPEAT = object()  # a plan entry: the next entries run a hyperparameter's number of times
# target -> the artifact of specs/_sum_of_squares.py (set by optgen.runtime, which builds)
SUM_OF_SQUARES: Callable[[Any, str, bool], tuple | None] | None = None


class Launcher:
    """The launches of one optimizer's parameters."""

    def __init__(self, owner: str, artifact: Any, backend: str, slots: Sequence[ParamSlot]):
        self.owner, self.artifact, self.slots = owner, artifact, slots
        self.compiled = backend == "compiled"
        self.kernels: dict[tuple, KernelInfo] = {}
        self.hooks: tuple[Callable[[int], None], Callable[[int], None]] | None = None
        self.tables: dict[tuple[str, str, str], Any] = {}   # (q8 table, library, device)
        self.dry = False        # capturable stage(): host half only, no kernel calls
        self.regions: dict[str, exchange.Region | None] = {}  # (matrix kernels on shards)
        self.norms: dict[str, tuple] = {}   # gradient dtype -> sum-of-squares function

    def bind(self, s: ParamSlot) -> None:
        """Parameter ``s``'s kernel argument, made from its data as it lies now (kept
        until its data moves: runtime/storage.py) and no plan (made when prepared)."""
        s.karg = tensors.kernel_arg(s.array, s.lib)
        s.numel = int(np.prod(tuple(s.array.shape), dtype=np.int64))
        s.bf16_numpy = s.lib == "numpy" and s.array.dtype.name == "bfloat16"
        s.plan = None

    def watch(self, ready: Callable[[int], None], done: Callable[[int], None]) -> None:
        """Call ``ready(i)`` before parameter ``i``'s kernels and ``done(i)`` after them
        (offloaded states wait for their gradients' copies and send their parameters
        back per bucket: optgen/torch/offload.py)."""
        self.hooks = ready, done

    # -- kernels and plans ---------------------------------------------------------------
    def select(self, i: int, flags: dict[str, bool], load: bool = True) -> KernelInfo:
        """The artifact's kernel for parameter ``i`` under ``flags``: by its dtype, with
        state formats where its slot is ``formatted`` (cached; ``load=False``: checked
        only, its library neither built nor loaded)."""
        s = self.slots[i]
        dtype, fmt = tensors.dtype_name(s.array, s.lib), s.formatted
        master = s.mixed or dtype not in tensors.LOW_PRECISION   # (else: no master)
        key = (dtype, tuple(sorted(flags.items())), fmt, master)
        k = self.kernels.get(key)
        if k is None:
            k = self.artifact.kernel_for(dtype, flags, fmt, master)
            if k is None:
                raise TypeError(f"{self.owner}: no kernel for dtype {dtype} with flags {flags}"
                                + (" and state formats" if fmt else ""))
            owned.check_kernel(self.owner, i, k, self.artifact, s.split)
            if not load:
                return k
            if self.compiled:       # its library built and loaded before anything changes
                self.artifact.ready(k)
            self.kernels[key] = k
        return k

    def prepare(self, i: int, k: KernelInfo) -> None:
        """Parameter ``i`` launches ``k`` from now on (its states are ready for it)."""
        self.slots[i].plan = self._plan(i, k) if self.compiled else None

    def arrays(self, i: int, k: KernelInfo, g, extra: Mapping[str, Any]) -> dict[str, Any]:
        """Kernel arguments by buffer name (without the gradient when ``g`` is None)."""
        s = self.slots[i]
        st, lib = s.state, s.lib
        arrays = {**({} if g is None else {"grad": tensors.kernel_arg(g, lib)}),
                  **{n: tensors.kernel_arg(a, lib) for n, a in extra.items()},
                  **{n: st[n] for n in k.buffers if n in st}}
        arrays.update((b, self.table(i, b)) for b in k.tables)   # (block-quantized states)
        if s.mixed:
            arrays["w"], arrays[LOW_COPY] = st["master"], s.karg
        else:
            arrays["w"] = s.karg
        return arrays

    def table(self, i: int, name: str) -> Any:
        """A kernel's table argument ``name`` (optgen/core/formats) for parameter ``i``:
        the numpy array, or for compiled kernels on a GPU (torch CUDA tensors, CuPy
        arrays) its copy on the parameter's device, made once per device and kept."""
        host = formats.table(name)
        p, lib = self.slots[i].array, self.slots[i].lib
        where = tensors.device(p, lib)
        if not self.compiled or where == "cpu":
            return host
        key = (name, lib, where)
        if key not in self.tables:
            self.tables[key] = tensors.copy_to(p, lib, host)
        return self.tables[key]

    def workspace(self, i: int, k: KernelInfo, d: tuple[int, int, int]) -> dict[str, Any]:
        """Parameter ``i``'s workspaces for kernel ``k``, kept: float64 reduction buffers,
        a matrix rule's temporaries in the kernel dtype."""
        s = self.slots[i]
        ws = s.work.get(k.symbol)
        if ws is None:
            ws = s.work[k.symbol] = {
                n: tensors.full_like(s.array, s.lib,
                                     (self.artifact.reduction_buffer_size,) if not axes
                                     else views.extents(d, axes), 0.0,
                                     self.artifact.reduction_dtype if n.startswith("_red")
                                     else k.dtype)
                for n, axes in k.workspaces.items()}
        return ws

    def _plan(self, i: int, k: KernelInfo) -> list[tuple[Callable, list]]:
        d, split = self.slots[i].dims, self.slots[i].split
        persistent = {**self.arrays(i, k, None, {}), **self.workspace(i, k, d)}
        for b in set(persistent) - set(owned.unheld(list(persistent), split)):
            del persistent[b]   # (held whole by an owner rank: its stretch's arrays)
        return self._entries(k, k.launches, persistent, d)

    def _entries(self, k: KernelInfo, launches: Sequence[dict], arrays: Mapping[str, Any],
                 d: tuple[int, int, int]) -> list[tuple[Callable, list]]:
        """Plan entries of ``launches`` over ``arrays`` viewed for dims ``d``; a buffer
        not in ``arrays`` is a ``(name, axes, view)`` placeholder filled per call."""
        plan, copies = [], products.Copies(launches)
        for ln in launches:
            if ln["kind"] == "repeat":   # the next ln["length"] entries, count times
                count = ln["count"]   # a hyperparameter's slot in the scalars, or a number
                plan.append((REPEAT, ((k.scalars.index(count), None) if isinstance(count, str)
                                      else (None, count), ln["length"])))
                continue
            args = [bfloat16_tensor(views.as_kernel(arrays[b], k.buffer_axes[b], d,
                                                    ln["view"]))
                    if b in arrays else (b, k.buffer_axes[b], ln["view"])
                    for b in ln["buffers"]]
            fn = products.library_product(ln, k.scalars, args, ln.get("library") == "matmul",
                                          copies) if ln["kind"] == "matmul" else None
            fn = fn or copies.writing(ln, self.artifact.function(ln["symbol"]))
            plan.append((fn, args))
        return plan

    # -- calls ---------------------------------------------------------------------------
    def run_fused(self, members: Sequence[int], calls: list[tuple[Callable, list]], gspan: Any,
                  scalars: np.ndarray) -> None:
        """A flat run's ``calls``, one per pass, for all its ``members`` at once; the
        gradient span ``gspan`` fills the ``GRAD`` slot (runtime/flat.py)."""
        if self.dry:
            return
        for i in members if self.hooks else ():
            self.hooks[0](i)
        gspan = bfloat16_tensor(gspan)     # (numpy bfloat16 gradients: a tvm_ffi view)
        for fn, args in calls:
            fn(*[gspan if a is GRAD else a for a in args], scalars)
        for i in members if self.hooks else ():
            self.hooks[1](i)

    def run(self, i: int, k: KernelInfo, g, scalars: np.ndarray,
            extra: Mapping[str, Any]) -> None:
        """Parameter ``i``'s update with dense gradient ``g``, in place."""
        if self.dry:
            return
        if self.hooks:
            self.hooks[0](i)
        if not self.compiled:       # (backend="reference": the interpreter steps it)
            interpret.step(k, self.arrays(i, k, g, extra), self.slots[i], scalars)
        elif k.matrix:                   # its plan may hold loops
            run_loops(self.slots[i].plan, self._caller(i, g, scalars, extra), scalars)
        else:
            call = self._caller(i, g, scalars, extra)
            for fn, args in self.slots[i].plan:
                call(fn, args)
        if self.hooks:
            self.hooks[1](i)

    def gather(self, i: int, k: KernelInfo, g, scalars: np.ndarray,
               extra: Mapping[str, Any]) -> dict[str, float]:
        """Parameter ``i``'s parts of the sums over all parameters (``k.global_sums``):
        its launches up to ``k.gathers``; ``finish`` runs the rest with the totals."""
        s = self.slots[i]
        if self.dry or not s.numel:
            return dict.fromkeys(k.global_sums, 0.0)
        if not self.compiled:
            return interpret.partial_sums(k, self.arrays(i, k, g, extra), s.lib, s.dims,
                                          scalars)
        if self.hooks:
            self.hooks[0](i)
        call = self._caller(i, g, scalars, extra)
        for fn, args in s.plan[:k.gathers]:
            call(fn, args)
        work = s.work[k.symbol]
        return {n: float(work[n][0]) for n in k.global_sums}

    def finish(self, i: int, k: KernelInfo, g, scalars: np.ndarray,
               extra: Mapping[str, Any], totals: Mapping[str, float]) -> None:
        """Parameter ``i``'s launches after ``gather``, reading the sums' ``totals``."""
        s = self.slots[i]
        if self.dry or not s.numel:
            return
        if not self.compiled:
            interpret.step(k, self.arrays(i, k, g, extra), s, scalars, totals)
        else:
            work = s.work[k.symbol]
            for n, v in totals.items():
                work[n][...] = v
            call = self._caller(i, g, scalars, extra)
            for fn, args in s.plan[k.gathers:]:
                call(fn, args)
        if self.hooks:
            self.hooks[1](i)

    def squares(self, i: int, g: Any, scale: float) -> float | None:
        """``sum((scale * g)**2)`` (summed in float64) of parameter ``i``'s dense gradient
        by the pass of specs/_sum_of_squares.py (backend="reference": the interpreter's);
        None where launches wait for copies (offload hooks), ``g`` is on another device
        or a prebuilt artifact ships no such pass (then the array library's)."""
        s = self.slots[i]
        if SUM_OF_SQUARES is None or self.hooks or \
                tensors.device(g, s.lib) != tensors.device(s.array, s.lib):
            return None
        dtype = tensors.dtype_name(g, s.lib)
        if dtype not in self.norms:
            self.norms[dtype] = SUM_OF_SQUARES(self.artifact, dtype, self.compiled)
        if self.norms[dtype] is None:     # (a prebuilt artifact that ships none)
            return None
        art, k, fn = self.norms[dtype]
        if not s.numel:
            return 0.0
        if not self.compiled:
            return interpret.partial_sums(k, {"grad": g, "w": s.array}, s.lib, s.dims,
                                          np.array([scale]))[k.global_sums[0]]
        work = s.work.get("_sum_of_squares")
        if work is None:
            work = s.work["_sum_of_squares"] = tensors.full_like(
                s.array, s.lib, (art.reduction_buffer_size,), 0.0, art.reduction_dtype)
        flat = views.as_kernel(tensors.kernel_arg(g, s.lib), "brc", s.dims, "flat")
        fn(bfloat16_tensor(flat) if s.bf16_numpy else flat, work, np.array([scale], k.dtype))
        return float(work[0])

    def _caller(self, i: int, g, scalars: np.ndarray, extra: Mapping[str, Any]) -> Callable:
        """Calls one plan entry of parameter ``i`` with this step's arrays."""
        s = self.slots[i]
        d, lib = s.dims, s.lib
        step = {"grad": tensors.kernel_arg(g, lib),
                **{n: tensors.kernel_arg(a, lib) for n, a in extra.items()}}
        wrap = bfloat16_tensor if s.bf16_numpy else (lambda x: x)

        def call(fn, args):
            fn(*[a if type(a) is not tuple else
                 wrap(views.as_kernel(step[a[0]], a[1], d, a[2])) for a in args], scalars)
        return call

    def passes(self, i: int, k: KernelInfo, g, scalars: np.ndarray,
               extra: Mapping[str, Any], split: shards.Split) -> Iterator[list]:
        """Parameter ``i``'s launches when its rows are split across ranks
        (runtime/shards.py): before a launch that reads reduction buffers this rank
        filled alone, yields them (``shards.Pending``) to be summed across ranks; at a
        matrix rule's whole-matrix stretch, yields it (``exchange.Matrix``) to be run
        on its owner rank (runtime/exchange.py). An empty shard runs no kernel and
        yields zeros, so every rank yields alike."""
        if not self.compiled:
            raise ValueError(f"{self.owner}: parameter {i} is split across ranks; its "
                             "reductions are summed between compiled passes only")
        s = self.slots[i]
        call = self._caller(i, g, scalars, extra) if s.numel else None
        work = self.workspace(i, k, s.dims)
        reg = self.region(k, split)
        unsummed: dict[str, shards.Pending] = {}
        for j, ((fn, args), ln) in enumerate(zip(s.plan, k.launches)):
            if reg is not None and reg.start <= j < reg.stop:
                if j == reg.start:
                    read = dict.fromkeys(b for x in k.launches[reg.start:reg.stop]
                                         for b in x["buffers"])
                    wanted = [unsummed.pop(b) for b in read if b in unsummed]
                    if wanted:
                        yield wanted
                    yield [self._matrix(i, k, reg, g, extra, scalars, split)]
                continue
            wanted = [unsummed.pop(b) for b in ln["buffers"] if b in unsummed]
            if wanted:
                yield wanted
            fills = shards.needs_sum(ln, split, k.workspaces) and shards.pending(
                ln, work, k.workspaces, s.dims, split)
            if call is not None:
                call(fn, args)
            elif ln["kind"] == "reduce":
                for red in [ln["red"]] + [a["red"] for a in ln.get("also", [])]:
                    work[red][...] = 0.0
            unsummed.update(fills or ())

    def region(self, k: KernelInfo, split: shards.Split | None = None
               ) -> exchange.Region | None:
        """A matrix kernel's whole-matrix stretch (runtime/exchange.py; cached); any
        kernel's that reads states an owner rank holds whole (runtime/owned.py)."""
        if not k.matrix and not (split is not None and split.held):
            return None
        if k.symbol not in self.regions:
            self.regions[k.symbol] = exchange.region(k.launches, k.buffer_axes,
                                                     tuple(k.workspaces),
                                                     held=owned.held(self.artifact))
        return self.regions[k.symbol]

    def _matrix(self, i: int, k: KernelInfo, reg: exchange.Region, g, extra: Mapping[str, Any],
                scalars: np.ndarray, split: shards.Split) -> exchange.Matrix:
        """Parameter ``i``'s whole-matrix stretch this step: its rows of the buffers that
        cross it, and how its owner runs it on whole arrays (kept in its slot)."""
        s = self.slots[i]
        work = self.workspace(i, k, s.dims)
        local = {**self.arrays(i, k, g, extra), **work}
        mine = {b: views.as_kernel(local[b], k.buffer_axes[b], s.dims, "matrix")
                for b in (*reg.inputs, *reg.outputs)}
        d = split.dims
        kept = s.work.setdefault(k.symbol + "@whole", {})

        def whole(b: str) -> Any:
            if b not in kept:
                dtype = k.dtype if b in k.workspaces else tensors.dtype_name(local[b], s.lib)
                kept[b] = tensors.full_like(s.array, s.lib, views.extents(d, k.buffer_axes[b]),
                                            0.0, dtype)
            return kept[b]

        def run(held: dict[str, Any]) -> None:
            launches = k.launches[reg.start:reg.stop]
            names = dict.fromkeys(b for ln in launches for b in ln["buffers"])
            # (whole-tensor values: this rank's, summed before the stretch; states the
            # owner holds whole: its own, runtime/owned.py)
            arrays = {b: work[b] if not k.buffer_axes[b] else
                      local[b] if b in split.held else whole(b) for b in names}
            run_loops(self._entries(k, launches, arrays, d),
                      lambda fn, args: fn(*args, scalars), scalars)

        return exchange.Matrix((d[1], d[2]), mine, reg, run, whole, split.owner)

    def run_lazy(self, i: int, k: KernelInfo, g: RowSparse, scalars: np.ndarray) -> None:
        """The rule on the rows ``g`` names only (indices unique and in range)."""
        if self.dry:
            return
        rows = g.rows.reshape(len(g.indices), -1)
        full = self.arrays(i, k, rows, {})
        full.pop("grad")
        if self.compiled:
            arrays = {"grad": rows, "_indices": g.indices,
                      **{n: a.reshape(-1) for n, a in full.items()}}
            self.artifact.function(k.lazy["symbol"])(
                *(bfloat16_tensor(arrays[b]) for b in k.lazy["buffers"]), scalars)
            return
        interpret.lazy(k, full, rows, g.indices, self.slots[i].array.shape[0], scalars)


def run_loops(plan: list, call: Callable, scalars: np.ndarray) -> None:
    """A matrix rule's plan: ``(REPEAT, ((slot, times), length))`` runs the next ``length``
    entries ``times`` times (or scalar ``slot``'s value); other entries are calls."""
    j = 0
    while j < len(plan):
        fn, args = plan[j]
        if fn is not REPEAT:
            call(fn, args)
            j += 1
            continue
        (slot, times), length = args
        if slot is not None:
            times = round(float(scalars[slot]))
        for _ in range(times):
            for body in plan[j + 1:j + 1 + length]:
                call(*body)
        j += 1 + length

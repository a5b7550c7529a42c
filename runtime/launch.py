"""Kernel launches: the only place that calls a kernel (or, with backend="reference",
the reference interpreter in its place).

A ``Launcher`` keeps what the calls of an optimizer's parameters need between steps:

- kernel selection: the artifact's kernel for a dtype and flags, cached;
- plans: a parameter's launches with its persistent arguments (parameter, states,
  workspaces) viewed once; per-step arrays (the gradient, extra inputs) are named by a
  ``(name, axes, view)`` placeholder filled in per call;
- workspaces: reduction buffers and a matrix rule's temporaries, kept per parameter;
- flat runs: stretches of parameters one call per pass updates (found by
  runtime/flat.py), and their gradient spans.

It shares the optimizer's lists of parameters and states (the same list objects), and
is told the rest (kernels prepared, groups, multipliers, step counts) when it needs it.

May import: numpy, artifact, flat, formats, reference, rounding, shards, sparse,
tensors, views.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from . import flat, shards, tensors
from optgen.core import formats, reference, rounding, views
from .artifact import KernelInfo, bfloat16_tensor
from .flat import GRAD
from optgen.core.reference import LOW_COPY
from .sparse import RowSparse

REPEAT = object()  # a plan entry: the next entries run a hyperparameter's number of times
Run = tuple[int, list[tuple[Callable, list]], list]   # (end, [(kernel, args)], every arg)


class Launcher:
    """The launches of one optimizer's parameters."""

    def __init__(self, owner: str, artifact: Any, backend: str, params: list, libs: list,
                 state: list[dict[str, Any]], mixed: list[bool],
                 dims: list[tuple[int, int, int]], formatted: list[bool]):
        self.owner, self.artifact, self.formatted = owner, artifact, formatted
        self.compiled = backend == "compiled"
        self.params, self.libs, self.state, self.mixed, self.dims = \
            params, libs, state, mixed, dims
        self.kargs = [tensors.kernel_arg(p, lib) for p, lib in zip(params, libs)]
        self.numel = [int(np.prod(tuple(p.shape), dtype=np.int64)) for p in params]
        self.bf16_numpy = [lib == "numpy" and p.dtype.name == "bfloat16"
                           for p, lib in zip(params, libs)]
        self.kernels: dict[tuple, KernelInfo] = {}
        self.plans: list[list | None] = [None] * len(params)
        self.work: list[dict[str, dict[str, Any]]] = [{} for _ in params]
        self.runs: dict[int, Run] = {}
        self.runs_for: list | None = None   # the prepared kernels the runs were found for
        self.grad_spans: dict[int, tuple[tuple, Any, list[int]]] = {}   # start ->
        # (weak references to the gradients, their span, their addresses)
        self.hooks: tuple[Callable[[int], None], Callable[[int], None]] | None = None
        self.tables: dict[tuple[str, str, str], Any] = {}   # (q8 table, library, device)

    def watch(self, ready: Callable[[int], None], done: Callable[[int], None]) -> None:
        """Call ``ready(i)`` before parameter ``i``'s kernels and ``done(i)`` after them
        (offloaded states wait for their gradients' copies and send their parameters
        back per bucket: optgen/torch/offload.py)."""
        self.hooks = ready, done

    # -- kernels and plans ---------------------------------------------------------------
    def select(self, i: int, flags: dict[str, bool]) -> KernelInfo:
        """The artifact's kernel for parameter ``i`` under ``flags``: by its dtype, with
        state formats where ``formatted[i]`` (cached)."""
        dtype, fmt = tensors.dtype_name(self.params[i], self.libs[i]), self.formatted[i]
        master = self.mixed[i] or dtype not in tensors.LOW_PRECISION   # (else: no master)
        key = (dtype, tuple(sorted(flags.items())), fmt, master)
        k = self.kernels.get(key)
        if k is None:
            k = self.artifact.kernel_for(dtype, flags, fmt, master)
            if k is None:
                raise TypeError(f"{self.owner}: no kernel for dtype {dtype} with flags {flags}"
                                + (" and state formats" if fmt else ""))
            self.kernels[key] = k
        return k

    def prepare(self, i: int, k: KernelInfo) -> None:
        """Parameter ``i`` launches ``k`` from now on (its states are ready for it)."""
        self.plans[i] = self._plan(i, k) if self.compiled else None

    def arrays(self, i: int, k: KernelInfo, g, extra: Mapping[str, Any]) -> dict[str, Any]:
        """Kernel arguments by buffer name (without the gradient when ``g`` is None)."""
        st, lib = self.state[i], self.libs[i]
        arrays = {**({} if g is None else {"grad": tensors.kernel_arg(g, lib)}),
                  **{n: tensors.kernel_arg(a, lib) for n, a in extra.items()},
                  **{n: st[n] for n in k.buffers if n in st}}
        arrays.update((b, self.table(i, b)) for b in k.tables)   # (block-quantized states)
        if self.mixed[i]:
            arrays["w"], arrays[LOW_COPY] = st["master"], self.kargs[i]
        else:
            arrays["w"] = self.kargs[i]
        return arrays

    def table(self, i: int, name: str) -> Any:
        """A kernel's table argument ``name`` (optgen/core/formats) for parameter ``i``:
        the numpy array, or for compiled kernels on a GPU (torch CUDA tensors, CuPy
        arrays) its copy on the parameter's device, made once per device and kept."""
        host = formats.table(name)
        lib = self.libs[i]
        where = tensors.device(self.params[i], lib)
        if not self.compiled or where == "cpu":
            return host
        key = (name, lib, where)
        if key not in self.tables:
            self.tables[key] = tensors.copy_to(self.params[i], lib, host)
        return self.tables[key]

    def workspace(self, i: int, k: KernelInfo, d: tuple[int, int, int]) -> dict[str, Any]:
        """Parameter ``i``'s workspaces for kernel ``k``, kept between steps: float64
        reduction buffers, and a matrix rule's temporaries in the kernel dtype."""
        ws = self.work[i].get(k.symbol)
        if ws is None:
            ws = self.work[i][k.symbol] = {
                n: tensors.full_like(self.params[i], self.libs[i],
                                     (self.artifact.reduction_buffer_size,) if not axes
                                     else views.extents(d, axes), 0.0,
                                     self.artifact.reduction_dtype if n.startswith("_red")
                                     else k.dtype)
                for n, axes in k.workspaces.items()}
        return ws

    def _plan(self, i: int, k: KernelInfo) -> list[tuple[Callable, list]]:
        d = self.dims[i]
        persistent = {**self.arrays(i, k, None, {}), **self.workspace(i, k, d)}
        plan = []
        for ln in k.launches:
            if ln["kind"] == "repeat":   # the next ln["length"] entries, count times
                count = ln["count"]   # a hyperparameter's slot in the scalars, or a number
                plan.append((REPEAT, ((k.scalars.index(count), None) if isinstance(count, str)
                                      else (None, count), ln["length"])))
                continue
            args = [bfloat16_tensor(views.as_kernel(persistent[b], k.buffer_axes[b], d,
                                                    ln["view"]))
                    if b in persistent else (b, k.buffer_axes[b], ln["view"])
                    for b in ln["buffers"]]
            plan.append((self.artifact.function(ln["symbol"]), args))
        return plan

    # -- flat runs (runtime/flat.py) ----------------------------------------------------
    def find_runs(self, prepared: Sequence[KernelInfo], chains: Sequence[tuple[int, int]],
                  group_of: Sequence[int], lr_mult: Sequence[float],
                  wd_mult: Sequence[float]) -> dict[int, Run]:
        """The runs under the kernels ``prepared`` (every parameter's): stretches of a
        chain with one group, one kernel and equal multipliers whose persistent arrays
        are back to back."""
        has_inputs, libs = bool(self.artifact.inputs), self.libs

        def same(i: int) -> tuple | None:
            k = prepared[i]
            if not flat.fusable(k, has_inputs, views.AXES):
                return None
            return group_of[i], k.symbol, lr_mult[i], wd_mult[i]

        def calls(i: int, j: int) -> list | None:
            k = prepared[i]
            return flat.run_calls(self.artifact, k, libs[i], self.params[i],
                                  [self.arrays(x, k, None, {}) for x in range(i, j)],
                                  self.numel[i:j])

        runs = flat.find_runs(chains, same, calls)
        # numpy bfloat16 spans (state formats) pass as tvm_ffi views; the run's list of
        # every argument keeps the arrays (gradient overlap checks read their addresses)
        self.runs = {i: (end, [(fn, [a if a is GRAD else bfloat16_tensor(a) for a in args])
                               for fn, args in found], every)
                     for i, (end, found, every) in runs.items()}
        self.runs_for = prepared
        self.grad_spans.clear()
        return self.runs

    def forget_runs(self) -> None:
        """Find the runs again before the next step (a multiplier changed)."""
        self.runs_for = None

    def fused(self, i: int, run: Run, k: KernelInfo, grads: Sequence[Any],
              steps: Sequence[int]) -> Any:
        """The gradient span that steps ``run`` (from parameter ``i``, kernel ``k``) with
        one call per pass this step, or None: its scalar states differ, or its gradients
        are not back to back or do not all take this step."""
        end, state = run[0], self.state
        names = k.scalar_state_updates
        if names and not all(state[x][n] == state[i][n] for x in range(i + 1, end)
                             for n in names):
            return None
        return flat.grad_span(self.grad_spans, i, grads[i:end], self.libs[i], steps, run[2])

    # -- calls ---------------------------------------------------------------------------
    def run_fused(self, run: Run, gspan: Any, scalars: np.ndarray, first: int) -> None:
        """One call per pass for every parameter of ``run`` (``first`` .. its end)."""
        for i in range(first, run[0]) if self.hooks else ():
            self.hooks[0](i)
        for fn, args in run[1]:
            fn(*[gspan if a is GRAD else a for a in args], scalars)
        for i in range(first, run[0]) if self.hooks else ():
            self.hooks[1](i)

    def run(self, i: int, k: KernelInfo, g, scalars: np.ndarray,
            extra: Mapping[str, Any]) -> None:
        """Parameter ``i``'s update with dense gradient ``g``, in place."""
        if self.hooks:
            self.hooks[0](i)
        self._run(i, k, g, scalars, extra)
        if self.hooks:
            self.hooks[1](i)

    def _run(self, i: int, k: KernelInfo, g, scalars: np.ndarray,
             extra: Mapping[str, Any]) -> None:
        d = self.dims[i]
        if self.compiled:
            call = self._caller(i, g, scalars, extra)
            if k.matrix:                 # its plan may hold loops
                run_loops(self.plans[i], call, scalars)
            else:
                for fn, args in self.plans[i]:
                    call(fn, args)
            return
        arrays = self.arrays(i, k, g, extra)
        lib = self.libs[i]
        host = {n: tensors.numpy_view(a, lib) for n, a in arrays.items()}
        values = {**host, **{n: f.dequantize((host[n], *(host[c] for c in f.companions(n, 0))),
                                             host["w"].shape)
                             for n, f in k.formats.items()}}
        at = dict(zip(k.scalars, scalars))
        new = reference.evaluate(k.ir, k.dtype, values, k.buffer_axes, at, d, k.stochastic)
        for name, value in new.items():
            if name in k.formats:        # block-quantized: the codes of the new values
                fmt = k.formats[name]
                for arr, new in zip([host[name], *(host[c] for c in fmt.companions(name, 0))],
                                    fmt.quantize(value)):
                    arr[...] = new
            elif name in k.stochastic:   # bf16sr: rounded stochastically (then exact)
                hi, lo = (int(at[n]) for n in rounding.KEY_SCALARS)
                host[name][...] = rounding.to_bfloat16(value, hi << 16 | lo, k.stochastic[name])
            else:
                host[name][...] = value

    def _caller(self, i: int, g, scalars: np.ndarray, extra: Mapping[str, Any]) -> Callable:
        """Calls one plan entry of parameter ``i`` with this step's arrays."""
        d, lib = self.dims[i], self.libs[i]
        step = {"grad": tensors.kernel_arg(g, lib),
                **{n: tensors.kernel_arg(a, lib) for n, a in extra.items()}}
        wrap = bfloat16_tensor if self.bf16_numpy[i] else _same

        def call(fn, args):
            fn(*[a if type(a) is not tuple else
                 wrap(views.as_kernel(step[a[0]], a[1], d, a[2])) for a in args], scalars)
        return call

    def passes(self, i: int, k: KernelInfo, g, scalars: np.ndarray,
               extra: Mapping[str, Any], split: shards.Split) -> Iterator[list]:
        """Parameter ``i``'s launches when its rows are split across ranks
        (runtime/shards.py): before a launch that reads reduction buffers this rank
        filled alone, yields them (``shards.Pending``) to be summed across ranks. An
        empty shard runs no kernel and yields zeros, so every rank yields alike."""
        if not self.compiled or k.matrix:
            raise ValueError(f"{self.owner}: parameter {i} is split across ranks; its "
                             "reductions are summed between compiled passes only")
        call = self._caller(i, g, scalars, extra) if self.numel[i] else None
        work = self.workspace(i, k, self.dims[i])
        unsummed: dict[str, shards.Pending] = {}
        for (fn, args), ln in zip(self.plans[i], k.launches):
            wanted = [unsummed.pop(b) for b in ln["buffers"] if b in unsummed]
            if wanted:
                yield wanted
            fills = shards.needs_sum(ln, split) and shards.pending(
                ln, work, k.workspaces, self.dims[i], split)
            if call is not None:
                call(fn, args)
            elif ln["kind"] == "reduce":
                for red in [ln["red"]] + [a["red"] for a in ln.get("also", [])]:
                    work[red][...] = 0.0
            unsummed.update(fills or ())

    def run_lazy(self, i: int, k: KernelInfo, g: RowSparse, scalars: np.ndarray) -> None:
        """The rule on the rows ``g`` names only (indices unique and in range)."""
        p = self.params[i]
        rows = g.rows.reshape(len(g.indices), -1)
        full = self.arrays(i, k, rows, {})
        full.pop("grad")
        if self.compiled:
            arrays = {"grad": rows, "_indices": g.indices,
                      **{n: a.reshape(-1) for n, a in full.items()}}
            self.artifact.function(k.lazy["symbol"])(
                *(bfloat16_tensor(arrays[b]) for b in k.lazy["buffers"]), scalars)
            return
        sub = {"grad": rows.reshape(-1),
               **{n: a.reshape(p.shape[0], -1)[g.indices].reshape(-1) for n, a in full.items()}}
        new = reference.evaluate(k.ir, k.dtype, sub, k.buffer_axes,
                                 dict(zip(k.scalars, scalars)), (1, 1, rows.size))
        for name, value in new.items():
            full[name].reshape(p.shape[0], -1)[g.indices] = value.reshape(len(g.indices), -1)


def run_loops(plan: list, call: Callable, scalars: np.ndarray) -> None:
    """A matrix rule's plan: ``(REPEAT, ((slot, times), length))`` runs the next
    ``length`` entries ``times`` times (or the value of scalar ``slot``: Newton-Schulz
    iterations); other entries are calls."""
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


def _same(x: Any) -> Any:
    return x

"""Stage 5 — schedule for GPU-style targets (CUDA, ROCm, OpenCL, Metal, WebGPU).

Each lowered pass becomes thread-bound loop nests over a one-dimensional grid of
``THREADS``-thread blocks; TVM splits every nest into one device kernel:

* an update (flat, 3-D or lazy rows): one element per thread, ``ceil(N / THREADS)``
  blocks, a bounds check for the last block;
* a whole-tensor reduction: two kernels. Up to ``PARTIAL_BLOCKS`` blocks each run a
  grid-stride loop into a per-thread accumulator and a block all-reduce
  (``tvm_thread_allreduce``: warp shuffles plus shared memory on CUDA, a local-memory
  tree elsewhere) into ``red[1 + block]``; one block then reduces the partials into
  ``red[0]``. The partition does not depend on the device, so the result is
  deterministic;
* a reduction along the innermost axis (Adafactor's row means): one block per output,
  threads striding over the reduced elements, a block all-reduce;
* a reduction along an outer axis (column means): one thread per output, a serial loop
  over the reduced axis; neighbouring threads read neighbouring columns (coalesced).
* a matrix rule's elementwise pass over an M x N matrix (its space: "RC", "RR", ...):
  one element per thread, i = e // N, j = e % N; its whole-matrix reduction as a
  whole-tensor one. Its products are no pass here: a target with ``library_matmul``
  leaves them to the runtime's BLAS (cuBLAS through CuPy or torch);
* a multi-tensor update (a list of tensors through a pointer table): one block per
  work item of the chunk map, its threads striding over the item's elements;
* a q8 update (states as block-wise 8-bit codes, optgen/core/quant.py): one block per
  quant block, ``min(quant_block, THREADS)`` threads each owning consecutive elements,
  a block all-reduce (max) per q8 state for its new absmax, then the codes
  (templates/kernel_gpu_q8.py.j2).

The all-reduce is written directly as TVM's ``tvm_thread_allreduce`` intrinsic inside
the thread-bound loops, with its accumulators allocated there: this avoids the three
ways the schedule-primitive route silently produces racy CUDA (tvm-notes §2d).

Besides the TVMScript, each pass gets its launch geometry: per device kernel, the block
size and the number of blocks as ``min(max_blocks, ceil(prod(extent) / per_block))``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from optgen.core import quant
from .lower import LoweredKernel, nibble_midpoints
from .scratch import folded
from .templates import render

THREADS = 256          # threads per block
PARTIAL_BLOCKS = 1024  # blocks of a whole-tensor reduction's first kernel (<= red size - 1)
DIMS = {"b": "B", "r": "R", "c": "C"}


@dataclass
class Grid:
    """Blocks of one device kernel: min(max_blocks, ceil(prod(extent) / per_block))."""
    extent: list[str]            # shape variables (n, B, R, C, nrows, L)
    per_block: int
    max_blocks: int | None = None
    threads: int = THREADS       # threads per block

    def to_json(self) -> dict:
        return {"extent": self.extent, "per_block": self.per_block,
                "max_blocks": self.max_blocks, "threads": self.threads}

    def tvm(self) -> str:
        total = " * ".join(self.extent) if self.extent else "T.int64(1)"
        blocks = total if self.per_block == 1 else \
            f"({total} + T.int64({self.per_block - 1})) // T.int64({self.per_block})"
        return f"T.min(T.int64({self.max_blocks}), {blocks})" if self.max_blocks else blocks


def shape_vars(k: LoweredKernel) -> dict[str, list]:
    """Shape variable -> [buffer, axis] that defines it, as the templates declare them
    (the device ABI names each kernel parameter that is one of these)."""
    out: dict[str, list] = {}
    companions = {c for s, f in k.formats.items() for c in f.companions(s, 0)}
    for b in k.buffers:
        if k.view == "multi":   # the pointer table's and the chunk map's rows
            names = {"_tab": ("nt",), "_chunks": ("nc1",)}[b.name]
        elif k.view == "lazy":
            names = {"_indices": ("nrows",), "grad": ("nrows", "L")}.get(b.name, ("n",))
        elif k.blocked:   # flat (n,) arrays, (nb,) absmax; the tables: fixed sizes
            names = ("nb",) if b.name in companions else \
                ("n",) if b.axes and b.name not in k.quant else ()
        elif not b.axes:
            names = (f"m_{b.name}",)
        elif k.view == "matrix":   # (R, C), (R, R), ... by the buffer's shape code
            names = tuple(b.axes)
        elif k.view == "flat":
            names = ("n",)
        else:
            names = tuple(DIMS[a] for a in b.axes)
        for axis, name in enumerate(names):
            out.setdefault(name, [b.name, axis])
    return out


def _product(axes: str) -> str:
    return " * ".join(DIMS[a] for a in axes) if axes else "T.int64(1)"


def _decompose(idx: str, axes: str) -> list[str]:
    """Let-bindings of the axis indices from a flat index over ``axes`` (row-major)."""
    lines, stride = [], ""
    for k, ax in enumerate(reversed(axes)):
        quotient = f"({idx} // ({stride}))" if stride else idx
        lines.append(f"{ax}: T.let = {quotient}" if k == len(axes) - 1
                     else f"{ax}: T.let = {quotient} % {DIMS[ax]}")
        stride = f"{stride} * {DIMS[ax]}" if stride else DIMS[ax]
    return list(reversed(lines))


def schedule(k: LoweredKernel, acc_dtype: str) -> tuple[str, list[Grid]]:
    """TVMScript of pass ``k`` and the grid of each device kernel it becomes."""
    if not (k.kind == "update" and k.view != "multi" and not k.blocked):
        k = folded(k)    # (only kernel_gpu_update.py.j2 allocates scratch buffers)
    ctx = dict(k=k, acc=acc_dtype, threads=THREADS, align=np.dtype(k.dtype).itemsize)
    if k.blocked:   # one block per quant block (a power of two >= 32); 4-bit
        mids = nibble_midpoints(k)                  # states: a thread packs its pairs
        threads = min(k.quant_block // (2 if mids else 1), THREADS)
        grid = Grid(["n"], k.quant_block, threads=threads)
        return render("kernel_gpu_q8.py.j2", **{**ctx, "threads": threads}, grid=grid,
                      bs=k.quant_block, per=k.quant_block // threads, mids=mids,
                      key_bits=quant.KEY_BITS, key_base=quant.KEY_BASE,
                      buckets=quant.BUCKETS), [grid]
    if k.view == "multi":   # a block per work item of the chunk map (one idles)
        grid = Grid(["nc1"], 1)
        return render("kernel_gpu_multi.py.j2", grid=grid, **ctx), [grid]
    if k.view == "lazy":
        grid = Grid(["nrows", "L"], THREADS)
        return render("kernel_gpu_update.py.j2", total="nrows * L", grid=grid,
                      index=["ri: T.let = e // L", "j: T.let = e % L",
                             "pi: T.let = B__indices[ri] * L + j"], **ctx), [grid]
    if k.view == "matrix":
        return _matrix(k, ctx)
    if k.kind == "update":
        axes = "" if k.view == "flat" else k.space
        total = "n" if k.view == "flat" else _product(axes)
        grid = Grid(["n"] if k.view == "flat" else [DIMS[a] for a in axes], THREADS)
        index = ["i: T.let = e"] if k.view == "flat" else _decompose("e", axes)
        return render("kernel_gpu_update.py.j2", total=total, grid=grid, index=index,
                      **ctx), [grid]
    out_axes = k.red.axes
    reduced = k.reduced if k.view == "3d" else ""
    space = "" if k.view == "flat" else k.space
    if not out_axes:  # whole tensor: partial sums per block, then one block
        first = Grid(["n"] if k.view == "flat" else [DIMS[a] for a in space], THREADS,
                     PARTIAL_BLOCKS)
        total = "n" if k.view == "flat" else _product(space)
        index = ["i: T.let = e"] if k.view == "flat" else _decompose("e", space)
        return render("kernel_gpu_reduce_whole.py.j2", total=total, grid=first, index=index,
                      partials=PARTIAL_BLOCKS, **ctx), [first, Grid([], 1)]
    if k.heads:   # over groups of rows: one thread per row, a loop over its head's rows
        grid = Grid(["B", "R"], THREADS)
        return render("kernel_gpu_reduce_cols.py.j2", grid=grid, outer_total="B * R",
                      outer=["b: T.let = o // R", "ro: T.let = o % R",
                             f'grp: T.let = R // T.Cast("int64", {k.heads})'],
                      inner=["r: T.let = (ro // grp) * grp + e"], inner_total="grp",
                      out=f"{k.red.var}[b, ro]", divisor="grp", **ctx), [grid]
    out_index = f"{k.red.var}[{', '.join(out_axes)}]"
    divisor = _product(reduced)
    if space.endswith("c") and "c" in reduced:  # innermost axis reduced: block per output
        grid = Grid([DIMS[a] for a in out_axes], 1)
        return render("kernel_gpu_reduce_rows.py.j2", grid=grid, outer=_decompose("o", out_axes),
                      inner=_decompose("e", reduced), inner_total=divisor, out=out_index,
                      divisor=divisor, **ctx), [grid]
    grid = Grid([DIMS[a] for a in out_axes], THREADS)
    return render("kernel_gpu_reduce_cols.py.j2", grid=grid, outer_total=_product(out_axes),
                  outer=_decompose("o", out_axes), inner=_decompose("e", reduced),
                  inner_total=divisor, out=out_index, divisor=divisor, **ctx), [grid]


def _matrix(k: LoweredKernel, ctx: dict) -> tuple[str, list[Grid]]:
    """A matrix rule's elementwise pass or whole-matrix reduction over its space M x N."""
    m, n = k.space
    index = [f"i: T.let = e // {n}", f"j: T.let = e % {n}"]
    total = f"{m} * {n}"
    if k.kind == "update":
        grid = Grid([m, n], THREADS)
        return render("kernel_gpu_update.py.j2", total=total, grid=grid, index=index,
                      **ctx), [grid]
    first = Grid([m, n], THREADS, PARTIAL_BLOCKS)
    return render("kernel_gpu_reduce_whole.py.j2", total=total, grid=first, index=index,
                  partials=PARTIAL_BLOCKS, **ctx), [first, Grid([], 1)]

"""Stage 5 — schedule for llvm (CPU): loops, vectors and threads around the lowered body.

One pass over the arrays: a parallel loop over full SIMD vectors (one 64-byte vector of
the element type per iteration), a scalar tail for the last ``n % vec`` elements, and a
serial vector loop for small tensors so they skip the thread pool's launch cost. Buffers
declare the element size as their alignment: numpy guarantees only 16 bytes, and a
64-byte alignment claim makes LLVM emit aligned loads that fault (tvm-notes §3).
"""
from __future__ import annotations

import numpy as np

from optgen.core import quant
from .lower import LoweredKernel, nibble_midpoints
from .matmul import MatmulPass, schedule_matmul
from .templates import render

VECTOR_BYTES = 64                 # one AVX-512 register; also fine on AVX2 (two registers)
PARALLEL_MIN_ELEMENTS = 1 << 15   # below this a thread-pool launch costs more than it saves
Q8_BLOCKS_PER_TASK = 16           # q8 blocks a parallel task steps (one set of block buffers)


REDUCE_CHUNKS = 64               # fixed chunk count of whole-tensor reductions (deterministic)
REDUCE_LANES = 16                # float64 partial sums per chunk, at most (float32: 16 lanes)
REDUCE_CHAINS = 4                # independent accumulators per chunk (additions overlap)
RED_SCALAR_SIZE = 1 + REDUCE_CHUNKS * REDUCE_LANES   # size of a per-parameter reduction buffer


def schedule(k: LoweredKernel, vector: bool = True) -> str:
    """``vector=False`` gives one-element "vectors" (the C target: scalar loops)."""
    itemsize = np.dtype(k.dtype).itemsize
    vec = VECTOR_BYTES // itemsize if vector else 1
    if k.kind == "matmul":
        m = k.matmul
        return schedule_matmul(MatmulPass(
            k.symbol, k.dtype, [(b.name, b.axes) for b in k.buffers], m["a"], m["b"],
            m["out"], m["trans_a"], m["trans_b"], n_scalars=None))
    if k.view == "matrix":
        return render("kernel_llvm_matrix.py.j2", k=k, vec=vec, align=itemsize,
                      parallel_min=PARALLEL_MIN_ELEMENTS)
    if k.blocked:
        return render("kernel_llvm_q8.py.j2", k=k, align=itemsize, bs=k.quant_block, vec=vec,
                      key_bits=quant.KEY_BITS, key_base=quant.KEY_BASE, buckets=quant.BUCKETS,
                      per_task=Q8_BLOCKS_PER_TASK, mids=nibble_midpoints(k),
                      fast={f.map: _fast(f.map) for f in k.formats.values() if f.fast},
                      parallel_min=PARALLEL_MIN_ELEMENTS)
    if k.view == "multi":
        name = "kernel_llvm_multi.py.j2"
    elif k.view == "seg":
        name = "kernel_llvm_reduce.py.j2" if k.kind == "reduce" else "kernel_llvm_seg.py.j2"
    elif k.view == "lazy":
        name = "kernel_llvm_lazy.py.j2"
    elif k.view == "3d":
        name = "kernel_llvm_3d.py.j2"
    elif k.kind == "reduce":
        name = "kernel_llvm_reduce.py.j2"
    else:
        name = "kernel_llvm.py.j2"
    return render(name, k=k, vec=vec, align=itemsize, chunks=REDUCE_CHUNKS, chains=REDUCE_CHAINS,
                  parallel_min_vectors=max(1, PARALLEL_MIN_ELEMENTS // vec),
                  parallel_min=PARALLEL_MIN_ELEMENTS, stride=RED_SCALAR_SIZE)


def _fast(kind: str) -> dict:
    """An 8-bit map's table-free codes (optgen/core/quant.py fast_codes) as the template
    writes them: the slope and offset of |x|'s decade as a balanced tree of selects by
    the bounds between regions (depth 3, not a chain of 7), float32 constants by their
    exact repr."""
    c = quant.fast_constants(kind)

    def f32(v) -> str:
        return f"T.float32({float(v)!r})"

    def pick(values, lo: int, hi: int) -> str:   # values[d] for decades lo .. hi
        if lo == hi:
            return f32(values[lo])
        mid = (lo + hi + 1) // 2                 # decade mid starts above bounds[mid - 1]
        return (f"T.Select({f32(c['bounds'][mid - 1])} < a, {pick(values, mid, hi)}, "
                f"{pick(values, lo, mid - 1)})")
    last = len(c["slope"]) - 1
    return {"slope": pick(c["slope"], 0, last), "offset": pick(c["offset"], 0, last),
            "cap": repr(float(c["cap"])), "zero": c["zero"], "signed": kind == "signed",
            "eps": repr(quant.FAST_EPS), "eps1": repr(1 - quant.FAST_EPS)}

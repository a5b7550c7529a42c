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
from .scratch import folded
from .templates import render
from .tvm_backend import host_has

VECTOR_BYTES = 64                 # one AVX-512 register; also fine on AVX2 (two registers)
PARALLEL_MIN_ELEMENTS = 1 << 15   # below this a thread-pool launch costs more than it saves
Q8_BLOCKS_PER_TASK = 16           # q8 blocks a parallel task steps (one set of block buffers)


REDUCE_CHUNKS = 64               # fixed chunk count of whole-tensor reductions (deterministic)
REDUCE_LANES = 16                # float64 partial sums per chunk, at most (float32: 16 lanes)
REDUCE_CHAINS = 4                # independent accumulators per chunk (additions overlap)
RED_SCALAR_SIZE = 1 + REDUCE_CHUNKS * REDUCE_LANES   # size of a per-parameter reduction buffer
SCRATCH_VIEWS = ("flat", "lazy", "multi")   # update templates with scratch buffers


def schedule(k: LoweredKernel, vector: bool = True) -> str:
    """``vector=False`` gives one-element "vectors" (the C target: scalar loops)."""
    itemsize = np.dtype(k.dtype).itemsize
    vec = VECTOR_BYTES // itemsize if vector else 1
    if not (k.kind == "update" and k.view in SCRATCH_VIEWS and not k.blocked):
        k = folded(k)    # (its template allocates no scratch buffers)
    if k.kind == "matmul":
        m = k.matmul
        slot = {n: j for j, n in enumerate(k.scalars)}   # (alpha, beta: hyperparameters)
        return schedule_matmul(MatmulPass(
            k.symbol, k.dtype, [(b.name, b.axes) for b in k.buffers], m["a"], m["b"],
            m["out"], m["trans_a"], m["trans_b"], n_scalars=None,
            alpha=slot.get(m.get("alpha")), beta=slot.get(m.get("beta")),
            addend=m.get("addend"), round=m.get("round")))
    if k.view == "matrix":
        return render("kernel_llvm_matrix.py.j2", k=k, vec=vec, align=itemsize,
                      parallel_min=PARALLEL_MIN_ELEMENTS, chunks=REDUCE_CHUNKS,
                      chains=REDUCE_CHAINS, lanes=min(vec, REDUCE_LANES))
    if k.blocked:
        permute = vec == PERMUTE_LANES and host_has(PERMUTE_FEATURE)
        return render("kernel_llvm_q8.py.j2", k=k, align=itemsize, bs=k.quant_block, vec=vec,
                      key_bits=quant.KEY_BITS, key_base=quant.KEY_BASE, buckets=quant.BUCKETS,
                      per_task=Q8_BLOCKS_PER_TASK, mids=nibble_midpoints(k),
                      vector_body=_permuted_body(k) if permute else None,
                      fast={f.map: _fast(f.map, permute) for f in k.formats.values()
                            if f.fast},
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


def _fast(kind: str, permute: bool = False) -> dict:
    """An 8-bit map's table-free codes (optgen/core/quant.py fast_codes) as the template
    writes them: the slope and offset of |x|'s decade as a balanced tree of selects by
    the bounds between regions (depth 3, not a chain of 7), float32 constants by their
    exact repr; ``permute``: by permutes of a table by |x|'s octave (``_octaves``)."""
    c = quant.fast_constants(kind)
    if permute:     # (``scaled``: x times the block's 1 / absmax, quant.SCALED_MAPS)
        scaled = kind in quant.SCALED_MAPS
        eps = quant.FAST_EPS_SCALED if scaled else quant.FAST_EPS
        return {**_octaves(kind, c), "cap": repr(float(c["cap"])), "zero": c["zero"],
                "signed": kind == "signed", "eps": repr(eps), "eps1": repr(1 - eps),
                "nonzero": bool(c["nonzero"]), "scaled": scaled,
                "near": repr(quant.BOUND_NEAR)}

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
            "eps": repr(quant.FAST_EPS), "eps1": repr(1 - quant.FAST_EPS),
            "nonzero": bool(c["nonzero"]), "scaled": False}


# A map lookup of 16 lanes without a gather (TVM splits a vector gather into 16 scalar
# loads): AVX-512's two-table permute picks each lane's entry of a 32-entry piece of
# the map by the code's low 5 bits, and selects by the code's higher bits pick the
# piece (a 16-entry map: one single-table permute). The same map entries as the
# gather, so the same values; used where LLVM targets this CPU with AVX-512F.
PERMUTE_FEATURE = "avx512f"
PERMUTE_LANES = 16
PERMUTE2 = "llvm.x86.avx512.vpermi2var.ps.512"   # (table lo, index, table hi)
PERMUTE1 = "llvm.x86.avx512.permvar.sf.512"      # (table, index)


def _permuted(table: str, code: str, size: int) -> str:
    """TVMScript of ``table[code]`` (float32, ``size`` entries, a power of two of at
    least 16) for the 16 lanes of a vectorized loop over ``jj``, by permutes."""
    def piece(at: int) -> str:
        return f"{table}[T.int64({at}) + jj]"
    if size == PERMUTE_LANES:
        return f'T.call_llvm_pure_intrin("float32", "{PERMUTE1}", {piece(0)}, {code})'
    level = [f'T.call_llvm_pure_intrin("float32", "{PERMUTE2}", {piece(at)}, {code}, '
             f"{piece(at + PERMUTE_LANES)})" for at in range(0, size, 2 * PERMUTE_LANES)]
    bit = 2 * PERMUTE_LANES
    while len(level) > 1:
        level = [f"T.Select(T.bitwise_and({code}, T.int32({bit})) != T.int32(0), "
                 f"{hi}, {lo})" for lo, hi in zip(level[0::2], level[1::2])]
        bit *= 2
    return level[0]


def _permuted_body(k: LoweredKernel) -> list[str] | None:
    """The element body of a full block with its map lookups by permutes (None where
    no state looks up a map)."""
    loads = {}
    for s, f in k.formats.items():
        found = f.lookup(s, "i")
        if found is not None:
            loads[f.load(s, "i")] = f.scaled(s, _permuted(*found))
    if not loads:
        return None
    body = []
    for line in k.body:
        for old, new in loads.items():
            line = line.replace(old, new)
        body.append(line)
    return body


# The decade of |x| for the codes (``_fast``) by permutes: |x|'s float32 exponent, clamped
# to 96 .. 127 (2**-31 .. 1: every bound lies in there, none below 2**-31, and what is
# not below 2 is above every bound), picks one of 32 octaves by its low 5 bits; an
# octave holds at most one bound, so the decade is the octave's first one, or the next
# above its bound (the tree's compare "bound < a" on the same bound). Rows of the
# table E_<map>: the bound (or the largest float32: none), the slope below and above
# it, the offset below and above it.
OCTAVE_LOW, OCTAVES = 96, 32
OCTAVE_ROWS = ("bound", "slope", "slope above", "offset", "offset above")


def _octaves(kind: str, c: dict) -> dict:
    """The octave table of a map (``table``: float32 literals) and the template's
    ``octave``, ``slope`` and ``offset`` expressions of ``a`` (|x|) reading it."""
    bounds = c["bounds"]
    rows = {r: [] for r in OCTAVE_ROWS}
    for e in range(OCTAVE_LOW, OCTAVE_LOW + OCTAVES):
        low, high = np.float32(2.0 ** (e - 127)), np.float32(2.0 ** (e - 126))
        inside = [b for b in bounds if low <= b < high]
        assert len(inside) <= 1, (kind, e)
        first = int(np.sum(bounds < low))
        above = first + len(inside)
        rows["bound"].append(inside[0] if inside else np.finfo(np.float32).max)
        rows["slope"].append(c["slope"][first])
        rows["slope above"].append(c["slope"][above])
        rows["offset"].append(c["offset"][first])
        rows["offset above"].append(c["offset"][above])

    def row(name: str) -> str:
        at = OCTAVE_ROWS.index(name) * OCTAVES
        return (f'T.call_llvm_pure_intrin("float32", "{PERMUTE2}", E_{kind}[T.int64({at}) '
                f"+ jj], oc, E_{kind}[T.int64({at + PERMUTE_LANES}) + jj])")
    above = "bnd < a"
    return {"table": [f"T.float32({float(v)!r})" for r in OCTAVE_ROWS for v in rows[r]],
            "octave": f'T.min(T.max(T.shift_right(T.reinterpret("int32", a), T.int32(23)), '
                      f"T.int32({OCTAVE_LOW})), T.int32({OCTAVE_LOW + OCTAVES - 1}))",
            "bound": row("bound"),
            "slope": f"T.Select({above}, {row('slope above')}, {row('slope')})",
            "offset": f"T.Select({above}, {row('offset above')}, {row('offset')})"}

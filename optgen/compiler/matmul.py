"""CPU matrix products for matrix optimizers (THOR, Muon): TVMScript text of one kernel
``out = alpha * op(a) @ op(b) + beta * addend``.

The schedule is GotoBLAS/BLIS-shaped, written as explicit loops (like schedule_llvm):

* the columns are cut into ``NC``-wide blocks and the depth into ``KC``-deep slices;
  for each (block, slice) the slice of ``op(b)`` is packed into ``Bp``, one ``KC x NR``
  micro-panel after another, so that the micro-kernel reads it with unit stride whatever
  the layout of ``b`` (a transposed ``b`` is read along its rows);
* ``op(a)`` is taken ``MR`` rows (a strip) at a time. A transposed ``a`` is read in
  place: a strip's ``MR`` values at one ``k`` are adjacent. Otherwise the strip's rows
  are copied into ``Ap``, ``KC`` plus one cache line apart: rows of ``a`` itself are ``K``
  elements apart, and when that is a multiple of 4 KiB (K = 1024, 3072 in float32) every
  row maps to the same L1 set and they evict each other;
* the micro-kernel keeps an ``MR x NR`` tile of accumulators in registers (a row is two
  64-byte vectors) and does ``MR`` broadcast-FMAs per ``k``;
* rows past ``M`` repeat row ``M - 1`` and columns past ``N`` repeat column ``N - 1``
  (clamped indices), so one unmasked micro-kernel serves every size; what the repeats
  compute is never stored. A tile that sticks out of ``out`` is written element-wise;
* strips, and the packing of ``Bp``, run on the thread pool when the product is big
  enough to pay for its launches; smaller products run the same loops serially.

The accumulators are ``MR`` separate ``(NR,)`` buffers of scope "global": a constant
"global" allocation under 1024 bytes stays on the stack (tvm-notes §0), and LLVM keeps
it in registers because every access is a whole vector at a constant offset. The tile
therefore leaves through ``tile`` (workspace, like ``Ap`` and ``Bp``), which the
epilogue indexes freely.

The first depth slice writes ``out`` (with the addend), later slices add to it, so
``out`` must differ from ``a``, ``b`` and ``addend``; those may be one buffer. With
``round="bfloat16"`` the last slice stores the sum rounded to the nearest bfloat16:
torch's ``addmm`` on bfloat16 tensors, whose operands are bfloat16 values (their
products are exact in float32), summed and scaled in float32 and rounded once.
Buffers declare their element size as alignment: numpy guarantees only 16 bytes
(tvm-notes §3).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .lower_bits import nearest_bf16


@dataclass(frozen=True)
class Tiling:
    """Blocking for one dtype, tuned on Zen 4 (AVX-512, 32 KiB L1, 1 MiB L2 per core),
    where one core matches OpenBLAS (about 100 GFLOP/s float32, 50 float64). ``MR`` rows of ``NR`` accumulators take 16
    of the 32 vector registers: enough independent FMAs to hide their latency, and
    ``MR = 8`` wastes no rows on the power-of-two sizes of weights. The ``MR x KC`` strip
    of ``a`` stays in L1 while the 512 KiB ``Bp`` (``KC x NC``) streams from L2."""
    mr: int
    nr: int
    kc: int
    nc: int


TILINGS = {
    "float32": Tiling(mr=8, nr=32, kc=256, nc=512),
    "float64": Tiling(mr=8, nr=16, kc=256, nc=256),
}
# below this many multiply-adds (M*N*K) the thread pool's launch (a few microseconds,
# twice per depth slice) costs more than a second thread saves
PARALLEL_MIN_MACS = 1 << 18


@dataclass
class MatmulPass:
    symbol: str                     # the PrimFunc's name and global_symbol
    dtype: str                      # "float32" or "float64" (accumulates in this dtype)
    buffers: list[tuple[str, str]]  # distinct (name, shape code) in argument order; the
                                    # code is two of "R", "C": "RC" = (R, C), "RR", ...
    a: str                          # a may equal b (X @ X.T); out differs from a, b, addend
    b: str
    out: str
    trans_a: bool = False           # use a.T
    trans_b: bool = False           # use b.T
    n_scalars: int | None = 1       # length of the scalar array S (the last argument);
                                    # None: any length (one kernel serves every flag
                                    # combination of a spec, whatever its scalar count)
    alpha: int | None = None        # out = S[alpha] * (op(a) @ op(b))   (None: factor 1)
    beta: int | None = None         #       + S[beta] * addend           (None: factor 1)
    addend: str | None = None       # a buffer of out's shape; may equal a or b, never out
    round: str | None = None        # "bfloat16": the result rounded to it (kept in dtype)


def schedule_matmul(p: MatmulPass) -> str:
    """TVMScript text of one ``@T.prim_func def <symbol>(h_<name>, ..., h_scalars)``."""
    m, k, n = _check(p)
    t = TILINGS[p.dtype]
    itemsize = np.dtype(p.dtype).itemsize
    code = dict(p.buffers)
    lines = [
        "@T.prim_func",
        f"def {p.symbol}({''.join(f'h_{b}: T.handle, ' for b, _ in p.buffers)}h_scalars: T.handle):",
        f'    T.func_attr({{"global_symbol": "{p.symbol}", "tirx.noalias": True}})',
    ]
    lines += [f"    {d} = T.int64()" for d in "RC" if any(d in c for c in code.values())]
    lines += [f'    B_{b} = T.match_buffer(h_{b}, ({c[0]}, {c[1]}), "{p.dtype}", align={itemsize})'
              for b, c in p.buffers]
    if p.n_scalars is None:
        lines.append("    n_scalars = T.int64()")
    length = "n_scalars" if p.n_scalars is None else p.n_scalars
    lines.append(f'    S = T.match_buffer(h_scalars, ({length},), "{p.dtype}", align={itemsize})')
    lines.append(f'    Bp = T.alloc_buffer(({t.kc * t.nc},), "{p.dtype}", scope="global")')
    lines.append(f"    if {m} * {n} * {k} >= T.int64({PARALLEL_MIN_MACS}):")
    lines += _nest(p, t, m, k, n, parallel=True, indent=2)
    lines.append("    else:")
    lines += _nest(p, t, m, k, n, parallel=False, indent=2)
    return "\n".join(lines) + "\n"


def _check(p: MatmulPass) -> tuple[str, str, str]:
    """The shape letters (M, K, N) of ``op(a) [M, K] @ op(b) [K, N]``, after checking
    that the buffers agree with each other and with ``out`` and ``addend``."""
    if p.dtype not in TILINGS:
        raise ValueError(f"{p.symbol}: dtype {p.dtype!r} is not one of {sorted(TILINGS)}")
    names = [b for b, _ in p.buffers]
    if len(set(names)) != len(names):
        raise ValueError(f"{p.symbol}: buffer names repeat: {names}")
    code = dict(p.buffers)
    for b, c in p.buffers:
        if len(c) != 2 or set(c) - {"R", "C"}:
            raise ValueError(f"{p.symbol}: buffer {b!r} has shape code {c!r}, not two of 'R', 'C'")
    for role, b in (("a", p.a), ("b", p.b), ("out", p.out), ("addend", p.addend)):
        if b is not None and b not in code:
            raise ValueError(f"{p.symbol}: {role} {b!r} is not among the buffers {names}")
    if p.out in (p.a, p.b, p.addend):
        raise ValueError(f"{p.symbol}: out {p.out!r} must differ from a, b and addend")
    for role, i in (("alpha", p.alpha), ("beta", p.beta)):
        if i is not None and p.n_scalars is not None and not 0 <= i < p.n_scalars:
            raise ValueError(f"{p.symbol}: {role} index {i} is outside the {p.n_scalars} scalars")
    if p.round not in (None, "bfloat16"):
        raise ValueError(f"{p.symbol}: round {p.round!r} is not None or 'bfloat16'")
    if p.beta is not None and p.addend is None:
        raise ValueError(f"{p.symbol}: beta is given but there is no addend")
    m, k = code[p.a][::-1] if p.trans_a else code[p.a]
    kb, n = code[p.b][::-1] if p.trans_b else code[p.b]
    if k != kb:
        raise ValueError(f"{p.symbol}: op(a) is [{m}, {k}] but op(b) is [{kb}, {n}]")
    for role, b in (("out", p.out), ("addend", p.addend)):
        if b is not None and code[b] != m + n:
            raise ValueError(f"{p.symbol}: {role} {b!r} is [{code[b][0]}, {code[b][1]}], "
                             f"the product is [{m}, {n}]")
    return m, k, n


def _nest(p: MatmulPass, t: Tiling, m: str, k: str, n: str, parallel: bool,
          indent: int) -> list[str]:
    """The loops over column blocks, depth slices, strips and micro-panels."""
    loop = "T.parallel" if parallel else "range"
    dt, mr, nr, kc, nc = p.dtype, t.mr, t.nr, t.kc, t.nc

    def i64(v: int) -> str:
        return f"T.int64({v})"

    def a_at(i: str, kk: str) -> str:
        return f"B_{p.a}[{kk}, {i}]" if p.trans_a else f"B_{p.a}[{i}, {kk}]"

    def b_at(kk: str, j: str) -> str:
        return f"B_{p.b}[{j}, {kk}]" if p.trans_b else f"B_{p.b}[{kk}, {j}]"

    def first(acc: str) -> str:
        value = f"S[{p.alpha}] * {acc}" if p.alpha is not None else acc
        if p.addend is not None:
            d = f"B_{p.addend}[i0 + r, j0 + v]"
            value += f" + S[{p.beta}] * {d}" if p.beta is not None else f" + {d}"
        return value

    def more(acc: str) -> str:
        o = f"B_{p.out}[i0 + r, j0 + v]"
        return f"{o} + S[{p.alpha}] * {acc}" if p.alpha is not None else f"{o} + {acc}"

    def rounded(value: str) -> str:
        if p.round is None:
            return value
        return nearest_bf16(value, dt)

    def store(rows: str, cols: str, vector: bool) -> list[str]:
        inner = f"T.vectorized({cols})" if vector else f"range({cols})"
        acc = f"tile[r * {i64(nr)} + v]"
        o = f"B_{p.out}[i0 + r, j0 + v]"
        if p.round is None:
            return [f"for r in range({rows}):",
                    f"    for v in {inner}:",
                    "        if pc == 0:",
                    f"            {o} = {first(acc)}",
                    "        else:",
                    f"            {o} = {more(acc)}"]
        last = f"({k} + {i64(kc - 1)}) // {i64(kc)} - {i64(1)}"
        return [f"for r in range({rows}):",
                f"    for v in {inner}:",
                "        if pc == 0:",
                f"            if pc == {last}:",
                f"                {o} = {rounded(first(acc))}",
                "            else:",
                f"                {o} = {first(acc)}",
                f"        elif pc == {last}:",
                f"            {o} = {rounded(more(acc))}",
                "        else:",
                f"            {o} = {more(acc)}"]

    bp = f"Bp[(jr * {i64(kc)} + kk) * {i64(nr)} + v]"
    s = [
        f"for jc in range(({n} + {i64(nc - 1)}) // {i64(nc)}):",
        f"    njr: T.let = (T.min({i64(nc)}, {n} - jc * {i64(nc)}) + {i64(nr - 1)}) // {i64(nr)}",
        f"    for pc in range(({k} + {i64(kc - 1)}) // {i64(kc)}):",
        f"        k0: T.let = pc * {i64(kc)}",
        f"        kc: T.let = T.min({i64(kc)}, {k} - k0)",
        # pack op(b)[k0:k0+kc, this block] as KC x NR micro-panels
        f"        for jr in {loop}(njr):",
        f"            j0: T.let = jc * {i64(nc)} + jr * {i64(nr)}",
        f"            if j0 + {i64(nr)} <= {n}:",
    ]
    if p.trans_b:      # b is [N, K]: read along its rows (k), write with stride NR
        s += [f"                for v in range({i64(nr)}):",
              "                    for kk in range(kc):",
              f"                        {bp} = {b_at('k0 + kk', 'j0 + v')}"]
    else:
        s += ["                for kk in range(kc):",
              f"                    for v in T.vectorized({i64(nr)}):",
              f"                        {bp} = {b_at('k0 + kk', 'j0 + v')}"]
    s += ["            else:",       # the last panel: columns past n repeat column n - 1
          f"                for v in range({i64(nr)}):",
          "                    for kk in range(kc):",
          f"                        {bp} = {b_at('k0 + kk', f'T.min(j0 + v, {n} - {i64(1)})')}",
          # one MR-row strip of op(a) per iteration; rows past m repeat row m - 1
          f"        for ir in {loop}(({m} + {i64(mr - 1)}) // {i64(mr)}):",
          f"            i0: T.let = ir * {i64(mr)}",
          f'            tile = T.alloc_buffer(({mr * nr},), "{dt}", scope="global")']
    if p.trans_a:      # a is [K, M]: the strip's MR values at one k are adjacent; read in place
        s += [f"            row{r}: T.let = T.min(i0 + {i64(r)}, {m} - {i64(1)})" for r in range(mr)]
        a_strip = [a_at(f"row{r}", "k0 + kk") for r in range(mr)]
    else:              # a is [M, K]: copy the strip's rows, KC + one cache line apart
        lda = kc + 64 // np.dtype(dt).itemsize
        s += [f'            Ap = T.alloc_buffer(({mr * lda},), "{dt}", scope="global")',
              f"            for r in range({i64(mr)}):",
              "                for kk in range(kc):",
              f"                    Ap[r * {i64(lda)} + kk] = {a_at(f'T.min(i0 + r, {m} - {i64(1)})', 'k0 + kk')}"]
        a_strip = [f"Ap[{i64(r * lda)} + kk]" for r in range(mr)]
    s += ["            for jr in range(njr):",
          f"                j0: T.let = jc * {i64(nc)} + jr * {i64(nr)}"]
    s += [f'                acc{r} = T.alloc_buffer(({nr},), "{dt}", scope="global")'
          for r in range(mr)]
    s.append(f"                for v in T.vectorized({i64(nr)}):")
    s += [f"                    acc{r}[v] = T.{dt}(0)" for r in range(mr)]
    s += ["                for kk in range(kc):",
          f"                    for v in T.vectorized({i64(nr)}):",
          f"                        bv: T.let = {bp}"]
    s += [f"                        acc{r}[v] = acc{r}[v] + {a_strip[r]} * bv" for r in range(mr)]
    s.append(f"                for v in T.vectorized({i64(nr)}):")
    s += [f"                    tile[{i64(r * nr)} + v] = acc{r}[v]" for r in range(mr)]
    s.append(f"                if i0 + {i64(mr)} <= {m} and j0 + {i64(nr)} <= {n}:")
    s += ["                    " + line for line in store(i64(mr), i64(nr), vector=True)]
    s.append("                else:")        # a tile that sticks out of out
    s += ["                    " + line for line in
          store(f"T.min({i64(mr)}, {m} - i0)", f"T.min({i64(nr)}, {n} - j0)", vector=False)]
    pad = " " * (4 * indent)
    return [pad + line for line in s]

"""Stage 4 — lower: a ``KernelIR`` becomes TVMScript statements for one element ``i``.

Lowering says *what* is computed, never how it is looped: the schedule stage wraps the
statements in loops, vectors and threads for a target. All reads of an element happen
(as ``T.let`` bindings) before any write of that element, and every store reads only
let-bound values, so updating ``w`` and the states in place is safe whatever order the
stores come in (see tvm-notes §1b on in-place aliasing).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Expr, walk
from optgen.core import formats, rounding
from optgen.core.reference import LOW_COPY
from .kernel_ir import KernelIR
from .lower_bits import adopted, lerp, narrow, nearest_bf16, stochastic, widen
from . import math_calls, scratch as _scratch
from .specialize import MASTER_DTYPE

TVM_DTYPE = {"float32": "float32", "float64": "float64"}
# symbol tags by parameter dtype; float16 and bfloat16 kernels are mixed precision
DTYPE_TAG = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}

_BIN = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">",
        "ge": ">=", "eq": "==", "ne": "!="}
_CALL = {"sqrt": "T.sqrt", "exp": "T.exp", "log": "T.log",
         "min": "T.min", "max": "T.max", "abs": "T.fabs", "pow": "T.pow",
         "and": "T.And", "or": "T.Or", "not": "T.Not", "where": "T.Select"}


@dataclass
class LoweredBuffer:
    name: str        # ABI name ("w", "w_low", "grad", a state, "_red<k>")
    var: str         # TVMScript buffer variable
    axes: str        # "brc", "br", "bc", "b" or "" (one value per parameter)
    dtype: str       # the kernel dtype, float64 (reductions), float16 (compressed states),
                     # float16/bfloat16 (w_low and gradients of mixed-precision kernels)

    @property
    def align(self) -> int:
        """The element size: numpy guarantees no more (tvm-notes §3)."""
        return {"int8": 1, "uint8": 1, "int16": 2, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
                "int64": 8}[self.dtype]


@dataclass
class LoweredKernel(formats.FormattedKernel):
    """One pass (see specialize.Launch), as TVMScript statements for one element.

    ``body`` holds ``T.let`` bindings and stores indexed by ``i`` (flat view) or
    ``b, r, c`` (3d view). A reduce pass's body ends in the value to accumulate,
    named by ``acc``; its buffer is ``red``."""
    symbol: str
    dtype: str
    kind: str                        # "reduce" | "update"
    view: str                        # "flat" | "3d"
    space: str                       # the loop space
    buffers: list[LoweredBuffer]
    scalars: list[str]               # names of the entries of the scalar array, in order
    body: list[str]
    acc: str | None = None
    red: LoweredBuffer | None = None
    op: str | None = None            # "sum" | "mean"
    also: list[tuple[str, LoweredBuffer, str]] = field(default_factory=list)  # more
                                     # (acc, red, op) of the same pass (plan(merge=True))
    reduced: str = ""                # the reduced axes
    heads: str | None = None         # over groups of rows: the number of heads (a scalar)
    writes: list[str] | None = None  # buffers the pass stores into
    matmul: dict | None = None       # kind "matmul": a, b, out, trans_a, trans_b
    quant: dict[str, str] = field(default_factory=dict)   # blocked view: state -> its map
    quant_block: int = formats.NO_BLOCK                   # blocked view: elements per absmax
    tabled: list[LoweredBuffer] = field(default_factory=list)  # "multi": table columns
    role: str = "launch"        # which manifest slot runs it: "launch" (launches[launch]
    launch: int | None = None   # ["symbol"]), "seg"/"mt" (its "seg/mt_symbol"), "lazy"
    scratch: list[str] = field(default_factory=list)  # values bound through memory
                                # (optgen.compiler.scratch), in the compute dtype

    @property
    def blocked(self) -> bool:
        """A pass over block-quantized states (optgen/core/formats/blocked.py)."""
        return self.view == formats.BLOCKED_VIEW


def nibble_midpoints(k: LoweredKernel) -> dict[str, list[str]]:
    """The 4-bit maps of a blocked pass -> their 15 midpoints as float32 literals: the
    kernels (CPU and GPU) count those below x / absmax for a code, without tables."""
    return {f.map: f.midpoints() for f in k.formats.values() if f.midpoints() is not None}


def buffer_var(name: str) -> str:
    return "B_" + name


SCALARS = "S"
MULTI_ARGS = ("_tab", "_chunks")   # a multi-tensor pass's arrays: pointer table, chunk map
ACC_DTYPE = "float64"   # reductions accumulate in float64 whatever the kernel dtype


def index(axes: str, view: str, transposed: bool = False) -> str:
    if not axes:
        return "0"
    if view == "matrix":   # the pass loops i over its space's rows, j over its columns
        return "j, i" if transposed else "i, j"
    if view in formats.FLAT_VIEWS:
        assert axes == "brc", axes
        return "i"
    return ", ".join(axes)


def lower(kir: KernelIR, dtype: str, symbol: str, acc_dtype: str = ACC_DTYPE,
          red_stride: int | None = None, multi: bool = False) -> list[LoweredKernel]:
    """Every pass of one kernel IR (reductions level by level, then the updates).

    A single pass keeps the plain symbol; several are suffixed ``_p0``, ``_p1``, ...
    in launch order. ``acc_dtype`` is the wide type of reductions and ``pow``: float64,
    or float32 on targets without doubles (Metal, WebGPU). ``red_stride`` (CPU targets:
    the reduction buffer size) also lowers each pass of a segmentable IR in the
    segmented view, suffixed ``_seg``: many tensors back to back, bounded by an offsets
    array ``_seg``, with segment ``s``'s reduction results at ``s * red_stride``.
    ``multi`` also lowers a single elementwise pass (``KernelIR.multi_tensor``) as ``_mt``:
    the same body over a list of tensors, its buffers declared over a pointer table."""
    assert kir.param_dtype is None or dtype == MASTER_DTYPE, (kir.param_dtype, dtype)
    several = len(kir.launches) > 1
    names = [f"{symbol}_p{k}" if several else symbol for k in range(len(kir.launches))]
    out = [_tagged(_lower_launch(kir, ln, dtype, name, acc_dtype), "launch", j)
           for j, (ln, name) in enumerate(zip(kir.launches, names)) if ln.kind != "repeat"]
    if kir.lazy is not None:
        out.append(_tagged(_lower_launch(kir, kir.lazy, dtype, f"{symbol}_lazy", acc_dtype),
                           "lazy", None))
    if red_stride is not None and kir.segmentable:
        out += [_tagged(_lower_launch(kir, ln, dtype, f"{name}_seg", acc_dtype, red_stride),
                        "seg", j) for j, (ln, name) in enumerate(zip(kir.launches, names))]
    if multi and kir.multi_tensor:
        k = _lower_launch(kir, kir.launches[0], dtype, f"{symbol}_mt", acc_dtype)
        k.view = "multi"       # (the same body: element i of one table entry's tensor)
        k.tabled, k.buffers = k.buffers, [LoweredBuffer(n, buffer_var(n), "k", "int64")
                                          for n in MULTI_ARGS]
        out.append(_tagged(k, "mt", 0))
    return out


def _tagged(k: LoweredKernel, role: str, launch: int | None) -> LoweredKernel:
    k.role, k.launch = role, launch
    return k


def _branch_only_powers(order: list[Expr], roots: list[Expr], stop) -> set[int]:
    """The general ``pow`` nodes (a float64 libm call per element) used only as a branch
    of ``where`` nodes whose condition is one value for all elements: those are rendered
    inside a ``T.if_then_else``, which evaluates the chosen branch only."""
    users: dict[int, list[Expr]] = {}
    for e in order:
        if id(e) in stop:
            continue
        for a in e.args:
            users.setdefault(id(a), []).append(e)
    root_ids = {id(r) for r in roots}
    return {id(e) for e in order
            if e.op == "pow" and not (e.args[1].op == "const" and e.args[1].value in
                                      (1.0, 2.0, 0.5))
            and id(e) not in root_ids and id(e) not in stop and users.get(id(e))
            and all(u.op == "where" and u.args[0].kind == "scalar"
                    and u.args[0] is not e for u in users[id(e)])}


def _lower_launch(kir: KernelIR, ln, dtype: str, symbol: str, wide: str,
                  red_stride: int | None = None) -> LoweredKernel:
    """Scalars (hyperparameters, host scalars) are read inline as ``S[j]`` from one
    array argument. As scalar parameters or let-bound values, TVM 0.27's simplifier
    crashes on shapes such as ``lr * min(max(g, -c), c)`` (it tries to bound a float
    variable with an integer constant); a buffer load is opaque to it."""
    ty = TVM_DTYPE[dtype]
    slot = {name: j for j, name in enumerate(kir.scalars)}
    red_of = {id(e): name for name, e in kir.reductions.items()}
    # a pass after the one that stores kir.early reads those states' new values back
    early_of = {} if ln.kind == "reduce" and ln.outputs else \
        {id(e): name for name, e in kir.early.items()}
    stop = {**red_of, **early_of}
    names: dict[int, str] = {}
    body: list[str] = []
    view = ln.view if red_stride is None else "seg"
    fmts = formats.kernel_formats(kir.quant, kir.quant_block)
    companions = {c for n, f in fmts.items() for c in f.companions(n, 0)}
    tables = {t for f in fmts.values() for t in f.tables()}
    split = formats.master(kir.state_format)    # w: a bfloat16 weight and its correction
    corr = formats.CORRECTION

    def const(v: float) -> str:
        return f"T.{ty}({float(v)!r})"

    bits, magnitude, inf = {"float32": ("int32", 0x7FFFFFFF, 0x7F800000),
                            "float64": ("int64", 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000)}[ty]

    def isnan(x: str) -> str:
        """NaN: the bits without the sign exceed those of inf."""
        return (f'(T.bitwise_and(T.reinterpret("{bits}", {x}), T.{bits}({magnitude})) '
                f'> T.{bits}({inf}))')

    def slot_of(name: str, transposed: bool = False) -> str:
        if view == "lazy":  # gradient rows are packed; parameter rows are looked up
            return f"{buffer_var(name)}[{'ri, j' if name == 'grad' else 'pi'}]"
        if view == "seg":   # element i of the span; segment s's reduction results
            axes = kir.buffer_axes[name]
            return f"{buffer_var(name)}[{'i' if axes else f's * T.int64({red_stride})'}]"
        return f"{buffer_var(name)}[{index(kir.buffer_axes[name], view, transposed)}]"

    def load(name: str, transposed: bool = False) -> str:
        if name == "w" and LOW_COPY in kir.buffers:   # mixed: the weight where it was
            return adopted(slot_of("w"), slot_of(LOW_COPY), kir.storage[LOW_COPY], ty)
        if split and name == "w":
            return split.family.load_param(split, slot_of("w"), slot_of(corr))
        if name in fmts:         # block-quantized: the format's load
            return fmts[name].load(name, "i")
        if name in kir.storage:  # float16 state, low-precision gradient: computed in ty
            return widen(slot_of(name), kir.storage[name], ty)
        if name in kir.reductions:   # a matrix rule's reduction, read by name
            return f'T.Cast("{ty}", {slot_of(name)})'
        return slot_of(name, transposed)

    def store(name: str, value: str) -> str:
        if split and name == "w":     # let lines and the correction's store, then w's
            *lines, last = split.family.store_param(split, "sw", value, slot_of("w"),
                                                    slot_of(corr))
            body.extend(lines)
            return last
        if name in fmts:         # block-quantized: the format's store
            return fmts[name].store(name, value)
        if name in kir.stochastic:   # bf16sr: the value rounded stochastically first
            value = stochastic(body, name, value, kir.stochastic[name],
                               [f"{SCALARS}[{slot[n]}]" for n in rounding.KEY_SCALARS])
        if name in kir.storage:
            value = narrow(value, kir.storage[name])
        return f"{slot_of(name)} = {value}"

    def ref(e: Expr) -> str:
        if e.op == "const":
            return const(e.value) if e.dtype == "float" else repr(bool(e.value))
        if e.op == "hyper":
            return f"{SCALARS}[{slot[e.name]}]"
        if id(e) in red_of and id(e) not in names:
            return f'T.Cast("{ty}", {load(red_of[id(e)])})'
        return names[id(e)]

    def render(e: Expr) -> str:
        a = [ref(x) for x in e.args]
        if e.op in ("param", "grad", "state"):
            return load(e.name)
        if e.op == "buf":    # a matrix rule's buffer (optgen.compiler.plan_matrix)
            return load(e.name, e.value == "T")
        if e.op in _BIN:
            return f"({a[0]} {_BIN[e.op]} {a[1]})"
        if e.op == "neg":
            return f"({const(0.0)} - {a[0]})"
        if e.op == "pow" and e.args[1].op == "const" and e.args[1].value in (1.0, 2.0, 0.5):
            return {1.0: a[0], 2.0: f"({a[0]} * {a[0]})", 0.5: f"T.sqrt({a[0]})"}[e.args[1].value]
        if e.op == "pow":
            # evaluated in float64 and rounded once, as the reference does: FTRL's
            # accum**p - accum_old**p cancels, and float32 powf implementations differ
            return (f'T.Cast("{ty}", T.pow(T.Cast("{wide}", {a[0]}), '
                    f'T.Cast("{wide}", {a[1]})))')
        if e.op == "rsqrt":
            # T.rsqrt of a let-bound value fails TVM 0.27's MakePackedAPI ("variables ...
            # are used, but are not passed in as API arguments"); 1/sqrt is what the
            # reference interpreter computes anyway.
            return f"({const(1.0)} / T.sqrt({a[0]}))"
        # NaN propagates as in the reference interpreter (numpy): sign(NaN), min and max
        # with a NaN operand are NaN (T.max alone returns the other operand). The NaN
        # test reads the bits: TVM's simplifier folds x != x to false and, in a Select's
        # else branch, rewrites x >= y to true after !(x < y), which is wrong for NaN.
        if e.op == "sign":
            x = a[0]
            return (f"T.Select({x} > {const(0)}, {const(1)}, "
                    f"T.Select({x} < {const(0)}, {const(-1)}, "
                    f"T.Select({isnan(x)}, {x}, {const(0)})))")
        if e.op == "round_bf16":
            return nearest_bf16(a[0], ty)
        if e.op == "lerp":
            return lerp(*a, ty, const)
        if e.op in math_calls.OPS:    # atan, ..., copysign
            return math_calls.render(e.op, ty, a)
        if e.op in ("min", "max"):   # (constants are finite: the verifier checks)
            out = f"{_CALL[e.op]}({a[0]}, {a[1]})"
            for arg, x in reversed(list(zip(e.args, a))):
                if arg.op != "const":
                    out = f"T.Select({isnan(x)}, {x}, {out})"
            return out
        return f"{_CALL[e.op]}({', '.join(a)})"

    size: dict[int, int] = {}    # unfolded tree size of each value since the last load
    scratch: list[str] = []

    def unfolded(e: Expr) -> int:
        if e.op in ("const", "hyper") or id(e) in red_of or id(e) in early_of:
            return 1
        exponent = e.args[1].value if e.op == "pow" and e.args[1].op == "const" else None
        return 1 + _scratch.uses(e.op, exponent) * sum(size.get(id(a), 1) for a in e.args)

    def emit(roots: list[Expr]) -> None:
        order = list(walk(roots, stop=stop))
        lazy = _branch_only_powers(order, roots, stop)
        for k, e in enumerate(order):
            if e.op in ("const", "hyper") or id(e) in names:
                continue
            size[id(e)] = 1 if e.op in ("param", "grad", "state", "buf") else unfolded(e)
            if id(e) in lazy:     # rendered inside its where's branch (see below)
                names[id(e)] = render(e)
                continue
            if e.op == "where" and (id(e.args[1]) in lazy or id(e.args[2]) in lazy):
                # a condition that is the same for every element picks one branch, and
                # only that branch runs: FTRL's where(lr_power == -0.5, sqrt(x), x ** p)
                # computes no float64 pow (scalar libm calls) unless p is used
                names[id(e)] = f"v{k}"
                body.append(f"v{k}: T.let = T.if_then_else({', '.join(ref(a) for a in e.args)})")
                continue
            if id(e) in early_of:
                names[id(e)] = f"e{k}"
                body.append(f"e{k}: T.let = {load(early_of[id(e)])}")
                continue
            if e.op == "buf" and not e.axes:   # one value per parameter: inline
                names[id(e)] = render(e)
                continue
            if id(e) in red_of:
                names[id(e)] = f"r{k}"
                body.append(f'r{k}: T.let = T.Cast("{ty}", {load(red_of[id(e)])})')
                continue
            if e.dtype == "bool":
                # Conditions stay inline in their Select: a let-bound comparison of a
                # vector with a scalar trips TVM 0.27's analyzer after vectorization
                # ("float32 vs float32x16" in IntSetAnalyzer).
                names[id(e)] = render(e)
                continue
            names[id(e)] = f"v{k}"
            if size[id(e)] > _scratch.LIMIT:    # a leaf to TVM's analyzer from here on
                scratch.append(f"{_scratch.PREFIX}{k}")
                body.extend(_scratch.barrier(scratch[-1], f"v{k}", render(e)))
                size[id(e)] = 1
                continue
            body.append(f"v{k}: T.let = {render(e)}")

    def lbuf(name: str) -> LoweredBuffer:
        if name in ("_indices", "_seg"):
            return LoweredBuffer(name, buffer_var(name), "k", "int64")
        if name in fmts:
            return LoweredBuffer(name, buffer_var(name), kir.buffer_axes[name],
                                 fmts[name].dtype)
        if name in companions:   # (one float32 scale per block)
            return LoweredBuffer(name, buffer_var(name), "", "float32")
        if name in tables:
            return LoweredBuffer(name, buffer_var(name), "", formats.table(name).dtype.name)
        return LoweredBuffer(name, buffer_var(name), kir.buffer_axes[name],
                             wide if name in kir.reductions else kir.storage.get(name, dtype))

    buffers = [*ln.buffers, "_seg"] if view == "seg" else ln.buffers
    if ln.kind == "matmul":
        return LoweredKernel(symbol, dtype, "matmul", view, ln.space,
                             [lbuf(b) for b in ln.buffers], list(kir.scalars), [],
                             writes=list(ln.outputs), matmul=dict(ln.matmul))
    if ln.kind == "reduce":
        pairs = ln.reduced_pairs
        stored = ln.values or {}     # (a matrix rule's values other passes read too)
        emit([node.args[0] for node, _ in pairs] + list(stored.values()))
        for out in ln.outputs:       # states stored early (plan(merge=True))
            body.append(store(out, ref(stored[out] if out in stored else kir.early[out])))
        accs = [(ref(node.args[0]), lbuf(red), node.value) for node, red in pairs]
        return LoweredKernel(symbol, dtype, "reduce", view, ln.space,
                             [lbuf(b) for b in buffers], list(kir.scalars), body,
                             acc=accs[0][0], red=accs[0][1], op=accs[0][2],
                             reduced=ln.node.name, also=accs[1:],
                             heads=ref(ln.node.args[1]) if len(ln.node.args) == 2 else None,
                             writes=[*ln.outputs, *(r for _, r in pairs)], scratch=scratch)
    # a state returned unchanged (rmsprop's mean_grad when not centered) is not stored
    outs = ln.values if ln.values is not None else \
        {n: e for n, e in ((n, kir.tensor_updates[n]) for n in ln.outputs)
         if not (e.op == "state" and e.name == n)}
    emit(list(outs.values()))
    for out, e in outs.items():  # a value with fewer axes is broadcast
        body.append(store(out, ref(e)))
    return LoweredKernel(symbol, dtype, "update", view, ln.space,
                         [lbuf(b) for b in buffers], list(kir.scalars), body,
                         writes=list(outs) + ([corr] if split and "w" in outs else []),
                         quant=dict(kir.quant), quant_block=kir.quant_block, scratch=scratch)


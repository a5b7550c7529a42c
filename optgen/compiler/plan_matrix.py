"""Stage 3b — plan a matrix update (2-D parameters): the passes of one traced rule that
uses matrix products, transposes or ``repeat`` (THOR, Muon).

An elementwise rule is one pass per space (optgen.compiler.specialize.plan). A matrix rule
is a sequence of passes over whole matrices, each a compiled kernel the runtime calls in
order with the same arguments every step:

* ``matmul``: ``out = op(a) @ op(b)`` into a temporary (``op``: the operand or its
  transpose, read in place: a transpose is an index order, never a copy). A product
  rounded to bfloat16, ``bf16([alpha *] a @ b [+ [beta *] addend])`` with ``alpha`` and
  ``beta`` hyperparameters, is one pass: torch's ``addmm`` on bfloat16 tensors (products
  of bfloat16 values summed in float32, the sum scaled, added and rounded once), which
  the runtime hands to torch itself for torch tensors (runtime/launch.py);
* ``update``: an elementwise expression over one matrix shape ("RC", "RR", "CC", "CR")
  written into temporaries or, last, into the parameter and states;
* ``reduce``: a whole-matrix sum or mean into a float64 ``_red<k>`` buffer; a value
  computed for it that another pass reads too (Muon's bfloat16 momentum, summed for its
  norm and then divided by it) is stored by the same pass into a temporary, which the
  other passes read instead of computing it again from its operands;
* ``repeat``: the next ``length`` passes run ``count`` times (a hyperparameter read per
  step), on a loop buffer ``_loop<k>`` that the body's last pass rewrites.

A value is *materialized* (given a buffer) where a product, a reduction or a loop needs it
whole; everything else is fused into the elementwise pass that reads it. Every pass reads
the old parameter and states, which only the final passes write (as in the elementwise
plan), and no pass reads a buffer transposed while writing it.
"""
from __future__ import annotations

from ..errors import SpecError
from ..ir import Expr, matrix_shape, walk
from .kernel_ir import KernelIR, Launch

LEAF_BUFFERS = ("param", "grad", "state")
# nodes a reduction's pass never stores: read from buffers or computed by other passes
NOT_STORED = (*LEAF_BUFFERS, "buf", "const", "hyper", "matmul", "loop", "loopvar", "reduce",
              "transpose")


def _buf(name: str, mat: str | None, transposed: bool = False) -> Expr:
    """A pass-local read of buffer ``name`` (transposed: at [j, i])."""
    return Expr("buf", name=name, value="T" if transposed else None, kind="tensor",
                axes="brc" if mat else "", mat=mat)


def _reads(e: Expr) -> list[Expr]:
    return [n for n in walk([e]) if n.op in ("buf", *LEAF_BUFFERS)]


class _Planner:
    def __init__(self, kir: KernelIR):
        self.kir = kir
        self.launches: list[Launch] = []
        self.local_of: dict[int, Expr] = {}      # node -> its pass-local expression
        self.operand_of: dict[int, Expr] = {}    # node -> a buffer read holding it
        self.counts = {"_tmp": 0, "_red": 0, "_loop": 0}
        self.rounded: set[int] = set()           # loop variables that hold bfloat16 values
        self.stored_by = _shared_reduced(list(kir.tensor_updates.values()))

    # -- buffers and passes --------------------------------------------------------------
    def buffer(self, prefix: str, axes: str) -> str:
        name = f"{prefix}{self.counts[prefix]}"
        self.counts[prefix] += 1
        self.kir.buffers.append(name)
        self.kir.buffer_axes[name] = axes
        return name

    def names_read(self, exprs) -> list[str]:
        return list(dict.fromkeys(n.name for e in exprs for n in _reads(e)))

    def update(self, space: str, values: dict[str, Expr]) -> None:
        reads = self.names_read(values.values())
        bufs = [b for b in self.kir.buffers if b in reads or b in values]
        self.launches.append(Launch("update", space, "matrix", bufs, outputs=list(values),
                                    values=dict(values)))

    # -- rewriting ------------------------------------------------------------------------
    def local(self, e: Expr) -> Expr:
        """``e`` as an expression of one elementwise pass: products, loops and reductions
        inside it are planned first and read from their buffers."""
        hit = self.local_of.get(id(e))
        if hit is not None:
            return hit
        if id(e) in self.stored_by:    # stored by its reduction's pass: that pass first
            self.local(self.stored_by[id(e)][1])
            return self.local_of[id(e)]
        if e.op == "loopvar":
            raise SpecError("a value computed inside repeat()'s body is used outside it",
                            e.loc, hint="use the value repeat() returns")
        if not e.args:
            out = e
        elif e.op in ("matmul", "loop"):
            out = self.operand(e)
        elif e.op == "round_bf16" and self.addmm(e.args[0]) is not None:
            out = self.operand(e)
        elif e.op == "transpose":
            inner = self.operand(e.args[0])
            out = _buf(inner.name, e.mat, inner.value != "T")
        elif e.op == "reduce":
            out = self.reduce(e)
        else:
            args = tuple(self.local(a) for a in e.args)
            out = Expr(e.op, args, value=e.value, name=e.name, dtype=e.dtype, kind=e.kind,
                       axes=e.axes, loc=e.loc, mat=e.mat)
        self.local_of[id(e)] = out
        return out

    def operand(self, e: Expr) -> Expr:
        """A buffer read (``buf`` or a leaf) holding the matrix ``e``, computing it into a
        temporary when it is an expression."""
        hit = self.operand_of.get(id(e))
        if hit is not None:
            return hit
        if e.op in LEAF_BUFFERS and e.name not in self.kir.storage:  # (else: widened)
            out = _buf(e.name, matrix_shape(e))
        elif e.op == "matmul":
            out = self.matmul(e)
        elif e.op == "round_bf16" and self.addmm(e.args[0]) is not None:
            out = self.matmul(e.args[0], self.addmm(e.args[0]))
        elif e.op == "loop":
            out = self.loop(e)
        else:
            value = self.local(e)
            if value.op == "buf":
                out = value
            else:
                tmp = self.buffer("_tmp", matrix_shape(e))
                self.update(matrix_shape(e), {tmp: value})
                out = _buf(tmp, matrix_shape(e))
        self.operand_of[id(e)] = out
        return out

    def matmul(self, e: Expr, addmm: tuple | None = None) -> Expr:
        """``e``'s product into a new temporary; ``addmm`` (from ``_addmm``): the
        rounded ``bf16(alpha * product + beta * addend)`` of which ``e`` is the sum."""
        alpha, prod, beta, addend = addmm if addmm else (None, e, None, None)
        a, b = self.operand(prod.args[0]), self.operand(prod.args[1])
        extra = {}
        if addmm:
            c = self.operand(addend) if addend is not None else None
            if c is not None and c.value == "T":     # (a transposed addend: a copy first)
                tmp = self.buffer("_tmp", matrix_shape(addend))
                self.update(matrix_shape(addend), {tmp: c})
                c = _buf(tmp, matrix_shape(addend))
            extra = {"alpha": alpha, "beta": beta, "addend": c.name if c is not None else None,
                     "round": "bfloat16"}
        out = self.buffer("_tmp", prod.mat)
        bufs = list(dict.fromkeys([a.name, b.name, *([extra["addend"]] if extra.get("addend")
                                                       else []), out]))
        self.launches.append(Launch("matmul", prod.mat, "matrix", bufs, outputs=[out],
                                    matmul={"a": a.name, "b": b.name, "out": out,
                                            "trans_a": a.value == "T",
                                            "trans_b": b.value == "T", **extra}))
        return _buf(out, prod.mat)

    def reduce(self, e: Expr) -> Expr:
        x = e.args[0]
        space = matrix_shape(x)
        if e.axes or not space:
            raise SpecError(f"{e.value}() over axes {e.name!r} in a matrix rule; matrix rules "
                            "reduce whole matrices", e.loc, hint=f"{e.value}(x) without axes")
        shared = [n for n, r in list(self.stored_by.values()) if r is e]
        for n in shared:          # (computed here, inline, before they are stored)
            del self.stored_by[id(n)]
        value = self.local(x)
        red = self.buffer("_red", "")
        node = Expr("reduce", (value,), value=e.value, name=e.name, kind="tensor", axes="",
                    loc=e.loc)
        stored = {}
        for n in shared:
            tmp = self.buffer("_tmp", space)
            stored[tmp] = self.local(n)
            self.local_of[id(n)] = self.operand_of[id(n)] = _buf(tmp, space)
        bufs = [b for b in self.kir.buffers
                if b in self.names_read([value]) or b == red or b in stored]
        self.launches.append(Launch("reduce", space, "matrix", bufs, node=node, red=red,
                                    outputs=list(stored), values=stored or None))
        self.kir.reductions[red] = e
        return _buf(red, None)

    def loop(self, e: Expr) -> Expr:
        init, result, var = e.args
        buf = self.buffer("_loop", e.mat)
        if self.bf16_valued(init) and self.bf16_valued(result):
            self.rounded.add(id(var))
        self.update(e.mat, {buf: self.local(init)})
        self.local_of[id(var)] = self.operand_of[id(var)] = _buf(buf, e.mat)
        inside = {id(var)}
        for n in walk([result]):
            if any(id(a) in inside for a in n.args):
                inside.add(id(n))
        for n in walk([result]):   # loop-invariant products: once, before the loop
            if id(n) not in inside and n.op in ("matmul", "loop", "reduce"):
                self.local(n)
        marker = Launch("repeat", "", "matrix", [], count=e.value)
        self.launches.append(marker)
        start = len(self.launches)
        value = self.local(result)
        if not (value.op == "buf" and value.name == buf and value.value is None):
            if any(r.name == buf and r.value == "T" for r in _reads(value)):
                tmp = self.buffer("_tmp", e.mat)   # reads the loop buffer transposed
                self.update(e.mat, {tmp: value})
                value = _buf(tmp, e.mat)
            self.update(e.mat, {buf: value})
            if value.op == "buf" and value.value is None:   # (a copy: runtime/products.py)
                self.launches[-1].copy = value.name
        marker.length = len(self.launches) - start
        return _buf(buf, e.mat)

    # -- the final passes ----------------------------------------------------------------
    def outputs(self) -> None:
        kir = self.kir
        values = {n: self.local(e) for n, e in kir.tensor_updates.items()
                  if not (e.op == "state" and e.name == n)}   # unchanged: not stored
        space = {n: kir.buffer_axes[n] for n in values}
        for n, v in list(values.items()):
            others = {m for m in values if space[m] != space[n]}
            hazard = any(r.name in values and (r.value == "T" or r.name in others)
                         for r in _reads(v))
            if hazard:   # read transposed while written, or written by another final pass
                tmp = self.buffer("_tmp", space[n])
                self.update(space[n], {tmp: v})
                values[n] = _buf(tmp, space[n])
        for s in dict.fromkeys(space.values()):
            self.update(s, {n: v for n, v in values.items() if space[n] == s})

    def bf16_valued(self, e: Expr) -> bool:
        """Whether every element of ``e`` is a bfloat16 value (rounded by ``bf16``)."""
        if e.op == "transpose":
            return self.bf16_valued(e.args[0])
        if e.op == "loop":
            return self.bf16_valued(e.args[0]) and self.bf16_valued(e.args[1])
        return e.op == "round_bf16" or e.op == "loopvar" and id(e) in self.rounded

    def addmm(self, e: Expr) -> tuple | None:
        """``_addmm(e)`` where its product's operands and its addend are bfloat16 values,
        so that the one pass computes what the rule says; None otherwise (the product,
        then the rounding in an elementwise pass)."""
        parts = _addmm(e)
        if parts is None:
            return None
        _, prod, _, addend = parts
        if not all(self.bf16_valued(x) for x in (*prod.args, *([addend] if addend is not None
                                                              else []))):
            return None
        return parts


def _shared_reduced(roots: list[Expr]) -> dict[int, tuple[Expr, Expr]]:
    """id(n) -> (n, the reduction whose pass stores it): the outermost values of a
    reduction's operand, of its matrix shape, that another pass reads too, other than
    the final passes (those read the parameter and the states anyway: there a stored
    value would cost a write and a read and save little). Where two reductions reduce
    the same value, the first stores it; a reduction in a repeat() body stores nothing
    (it runs every round, and its value may be read outside the loop)."""
    nodes = list(walk(roots))                      # (operands before their users)
    users: dict[int, list[Expr]] = {}
    looped: set[int] = set()                       # values that change in a loop
    for u in nodes:
        for a in {id(a): a for a in u.args}.values():
            users.setdefault(id(a), []).append(u)
        if u.op == "loopvar" or any(id(a) in looped for a in u.args):
            looped.add(id(u))
    boundary = {id(n) for n in nodes if n.op in NOT_STORED}
    final = {id(n) for n in walk(roots, stop=boundary)}   # computed in the final passes
    stored: dict[int, tuple[Expr, Expr]] = {}
    for r in nodes:
        if r.op != "reduce" or not r.args or r.axes or id(r) in looped:
            continue
        root, space = r.args[0], matrix_shape(r.args[0])
        inside = {id(n) for n in walk([root], stop=boundary)}
        todo, seen = [root], set()
        while todo:
            n = todo.pop()
            if id(n) in seen or n.op in NOT_STORED or matrix_shape(n) != space:
                continue
            seen.add(id(n))
            if any(id(u) not in inside and id(u) not in final and u is not r
                   for u in users.get(id(n), ())):
                stored.setdefault(id(n), (n, r))
                continue
            todo.extend(n.args)
    return stored


def _term(e: Expr) -> tuple[str | None, Expr]:
    """``hyper * x`` or ``x * hyper`` -> (the hyperparameter's name, x); else (None, e)."""
    if e.op == "mul":
        for f, x in (e.args, e.args[::-1]):
            if f.op == "hyper" and matrix_shape(x):
                return f.name, x
    return None, e


def _addmm(e: Expr) -> tuple | None:
    """``e`` as ``(alpha, product, beta, addend)`` when it is ``[alpha *] a @ b`` plus at
    most one ``[beta *] addend`` of the product's shape (alpha, beta: hyperparameter names
    or None for 1); None otherwise."""
    terms = [_term(x) for x in (e.args if e.op == "add" else (e,))]
    products = [t for t in terms if t[1].op == "matmul"]
    if not products or len(terms) > 2:
        return None
    alpha, prod = products[0]
    rest = [t for t in terms if t[1] is not prod]
    if rest and matrix_shape(rest[0][1]) != prod.mat:
        return None
    beta, addend = rest[0] if rest else (None, None)
    return alpha, prod, beta, addend


def plan_matrix(kir: KernelIR) -> None:
    """Fill ``kir.launches`` (and its temporaries) for a matrix rule; see the module doc."""
    planner = _Planner(kir)
    planner.outputs()
    kir.launches = planner.launches
    kir.lazy = None

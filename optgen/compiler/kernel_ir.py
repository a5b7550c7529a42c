"""The kernel IR that stage 3 produces and every later stage reads: ``KernelIR`` (one flag
combination's update, split for the host and the kernel passes) and its ``Launch``
passes, planned by optgen.compiler.specialize (elementwise rules) and
optgen.compiler.plan_matrix (matrix rules).

``KernelIR.to_json`` (with ``serialize``) is what the manifest stores; the reference
interpreter and the runtime read that form, so neither needs the compiler.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Expr, is_global, walk
from optgen.core import formats


@dataclass
class Launch:
    """One pass over the data: a reduction into ``_red<k>`` or the final update of the
    outputs of one space ("brc": parameter and per-element states, "br" row states,
    "bc" column states). ``view`` is "flat" when every value is per element or per
    parameter (one loop over n elements), "3d" when rows or columns appear."""
    kind: str                      # "reduce" | "update"; matrix rules also "matmul", "repeat"
    space: str                     # the loop space (axes; a matrix shape for view "matrix")
    view: str                      # "flat" | "3d" | "matrix" (optgen.compiler.plan_matrix)
    buffers: list[str]             # array arguments in order
    outputs: list[str] = field(default_factory=list)   # update: names written
    node: Expr | None = None       # reduce: the reduce node
    red: str | None = None         # reduce: its buffer name
    values: dict[str, Expr] | None = None   # matrix update: pass-local value per output
    matmul: dict | None = None     # matmul: a, b, out, trans_a, trans_b
    count: str | int | None = None  # repeat: the hyperparameter (or number) of repetitions
    length: int = 0                # repeat: how many of the following launches repeat
    also: list[tuple[Expr, str]] = field(default_factory=list)  # reduce: more (node, buffer)
                                   # pairs accumulated in the same pass (CPU, plan(merge=True))
    copy: str | None = None        # matrix update: it copies this buffer into its output

    @property
    def reduced_pairs(self) -> list[tuple[Expr, str]]:
        """reduce: every (node, buffer) the pass accumulates, its own first."""
        return [(self.node, self.red), *self.also]

    def to_json(self, index: dict[int, int]) -> dict:
        d = {"kind": self.kind, "space": self.space, "view": self.view, "buffers": self.buffers}
        if self.view == "matrix":
            d.update(outputs=self.outputs, **({"matmul": self.matmul} if self.matmul else {}),
                     **({"copy": self.copy} if self.copy else {}),
                     **({"count": self.count, "length": self.length}
                        if self.kind == "repeat" else {}),
                     **({"red": self.red, "op": self.node.value} if self.kind == "reduce"
                        else {}))
        elif self.kind == "update":
            d["outputs"] = self.outputs
        else:
            d.update(node=index[id(self.node)], red=self.red, op=self.node.value,
                     reduced=self.node.name, out_axes=self.node.axes)
            if len(self.node.args) == 2:   # over groups of rows: the number of heads
                heads = self.node.args[1]
                d["heads"] = heads.name if heads.op == "hyper" else int(heads.value)
            if self.also:
                d["also"] = [{"node": index[id(e)], "red": r, "op": e.value} for e, r in self.also]
            if self.outputs:
                d["outputs"] = self.outputs
        return d


@dataclass
class KernelIR:
    """One flag combination's update, split for the host and the kernel passes.

    ``storage`` names the buffers stored in a dtype other than the kernel's (loads cast
    up, stores round): float16 states (compression) and, in a mixed-precision IR
    (``param_dtype`` set), ``w_low``, ``grad`` and the extra inputs in ``param_dtype``."""
    flags: dict[str, bool]
    buffers: list[str]                  # array arguments: "w", ["w_low"], "grad", inputs,
                                        # states, then "_red<k>"
    hypers: list[str]                   # numeric hyperparameters, passed as scalars
    host_scalars: dict[str, str]        # name -> Python expression, evaluated per step
    scalar_state_updates: dict[str, str]
    tensor_updates: dict[str, Expr]     # "w", ["w_low"], per-element/row/column states -> value
    scalar_states: list[str] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    reductions: dict[str, Expr] = field(default_factory=dict)   # "_red<k>" -> reduce node
    buffer_axes: dict[str, str] = field(default_factory=dict)   # buffer -> axes
    lazy: Launch | None = None          # the row-sparse variant, where the rule allows one
    storage: dict[str, str] = field(default_factory=dict)  # buffer -> stored dtype
    param_dtype: str | None = None      # mixed precision: float16 or bfloat16
    refresh: dict | None = None         # the refresh rule (host, numpy): every, ir, reads
    early: dict[str, Expr] = field(default_factory=dict)   # state -> new value, stored by
                                        # the first (reduce) pass; later passes read it back
    state_format: dict[str, str] = field(default_factory=dict)  # state -> format
                                        # (optgen.core.formats); its dtype is in storage
    quant: dict[str, str] = field(default_factory=dict)  # block-quantized state -> its map
    quant_block: int = formats.NO_BLOCK  # block-quantized states: elements per absmax
    stochastic: dict[str, int] = field(default_factory=dict)  # state rounded to bfloat16
                                        # stochastically -> its salt (optgen/core/rounding.py)

    @property
    def scalars(self) -> list[str]:
        return self.hypers + list(self.host_scalars)

    @property
    def global_sums(self) -> list[str]:
        """The buffers of sums over all parameters (``global_sum``): the runtime adds
        every parameter's part before the passes that read them."""
        return [r for r, e in self.reductions.items() if is_global(e)]

    @property
    def segmentable(self) -> bool:
        """Whether every pass is over the flat view with whole-tensor reductions only,
        so that a run of parameters in one buffer can take each pass as one call with an
        offsets array (the ``_seg`` variants: runtime/flat.py). Single-pass elementwise
        rules need none: their body does not care where a tensor ends."""
        return len(self.launches) > 1 and not self.global_sums and all(
            ln.kind in ("reduce", "update") and ln.view == "flat" and ln.space == "brc"
            and (ln.kind == "update" or not ln.node.axes) for ln in self.launches)

    @property
    def multi_tensor(self) -> bool:
        """Whether the rule is one elementwise pass over the flat view (no reductions, no
        workspaces, no block-quantized or stochastically rounded states), so one call can
        step a list of tensors where they live through a table of their pointers (the
        ``_mt`` variant: runtime/strategies/multi.py)."""
        return (len(self.launches) == 1 and self.launches[0].kind == "update"
                and self.launches[0].view == "flat" and self.launches[0].space == "brc"
                and all(self.buffer_axes[b] == "brc" for b in self.launches[0].buffers)
                and not self.quant and not self.stochastic)

    def to_json(self) -> dict:
        ir, index = serialize(self.tensor_updates, self.reductions)
        return {"flags": self.flags, "buffers": self.buffers, "scalars": self.scalars,
                "host_scalars": self.host_scalars,
                "scalar_state_updates": self.scalar_state_updates,
                "buffer_axes": self.buffer_axes, "storage": self.storage,
                "launches": [ln.to_json(index) for ln in self.launches],
                "lazy": self.lazy.to_json(index) if self.lazy else None, "ir": ir,
                "refresh": self.refresh, "state_format": self.state_format,
                "quant": self.quant, "quant_block": self.quant_block,
                "stochastic": self.stochastic}


def serialize(outputs: dict[str, Expr], reductions: dict[str, Expr] | None = None
              ) -> tuple[dict, dict[int, int]]:
    """A topologically ordered node list plus the node index of each output and reduction."""
    nodes: list[dict] = []
    index: dict[int, int] = {}
    for n in walk([*outputs.values(), *(reductions or {}).values()]):
        rec: dict = {"op": n.op, "dtype": n.dtype, "kind": n.kind, "axes": n.axes}
        if n.args:
            rec["args"] = [index[id(a)] for a in n.args]
        if n.op in ("const", "reduce", "loop"):
            rec["value"] = n.value
        if n.mat is not None:
            rec["mat"] = n.mat
        if n.name is not None:
            rec["name"] = n.name
        index[id(n)] = len(nodes)
        nodes.append(rec)
    ir = {"nodes": nodes, "outputs": {k: index[id(v)] for k, v in outputs.items()},
          "reductions": {k: index[id(v)] for k, v in (reductions or {}).items()}}
    return ir, index

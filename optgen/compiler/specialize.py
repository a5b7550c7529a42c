"""Stage 3 — IR: one traced update becomes a ``KernelIR``.

The pass splits the update into what runs where:

* host scalars: maximal compound scalar sub-expressions, such as the bias correction
  ``lr * sqrt(1 - beta2**t) / (1 - beta1**t)`` or ``1 - beta1``. The runtime evaluates
  them once per step in float64 and passes them as kernel arguments (rounded once to
  the kernel dtype), so they cost nothing per element and never trigger a rebuild;
* scalar-state updates: evaluated on the host after the kernel, like host scalars;
* tensor updates (the parameter and per-element states): the kernel body.

``KernelIR.to_json`` is what the manifest stores; the reference interpreter and the
runtime read that form, so neither needs the compiler.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..dsl import Spec, Trace
from ..ir import Expr, apply, to_python, walk


@dataclass
class KernelIR:
    flags: dict[str, bool]
    buffers: list[str]                  # array arguments: "w", "grad", then per-element states
    hypers: list[str]                   # numeric hyperparameters, passed as scalars
    host_scalars: dict[str, str]        # name -> Python expression, evaluated per step
    scalar_state_updates: dict[str, str]
    tensor_updates: dict[str, Expr]     # "w" and per-element states -> kernel expression
    scalar_states: list[str] = field(default_factory=list)

    @property
    def scalars(self) -> list[str]:
        return self.hypers + list(self.host_scalars)

    def to_json(self) -> dict:
        return {"flags": self.flags, "buffers": self.buffers, "scalars": self.scalars,
                "host_scalars": self.host_scalars,
                "scalar_state_updates": self.scalar_state_updates,
                "ir": serialize(self.tensor_updates)}


def _needs_host(e: Expr) -> bool:
    """Every compound scalar goes to the host. Scalars reading ``t`` or a scalar state
    must; the others (``1 - beta2``) should, because the host computes in float64 and
    rounds once, where a float32 kernel would round ``beta2`` first and then subtract
    (a 1.3e-5 relative error in Adam's ``v``, found by the oracle tests)."""
    return e.kind == "scalar" and bool(e.args)


def specialize(spec: Spec, trace: Trace) -> KernelIR:
    host: dict[str, str] = {}            # python text -> host scalar name
    memo: dict[int, Expr] = {}

    def host_leaf(e: Expr) -> Expr:
        if e.dtype == "bool":  # pass conditions as 1.0 / 0.0 and compare in the kernel
            text = to_python(apply("where", e, 1.0, 0.0))
        else:
            text = to_python(e)
        name = host.setdefault(text, f"_host{len(host)}")
        leaf = Expr("hyper", name=name, kind="scalar", loc=e.loc)
        return apply("ne", leaf, 0.0) if e.dtype == "bool" else leaf

    def rewrite(e: Expr) -> Expr:
        if id(e) in memo:
            return memo[id(e)]
        if _needs_host(e):
            out = host_leaf(e)
        elif not e.args:
            out = e
        else:
            args = tuple(rewrite(a) for a in e.args)
            out = e if all(a is b for a, b in zip(args, e.args)) else \
                Expr(e.op, args, value=e.value, name=e.name, dtype=e.dtype, kind=e.kind, loc=e.loc)
        memo[id(e)] = out
        return out

    tensor_states = [n for n, s in spec.states.items() if s.shape == "param"]
    scalar_states = [n for n, s in spec.states.items() if s.shape == "scalar"]
    tensor_updates = {name: rewrite(trace.updates[name]) for name in ["w", *tensor_states]}
    scalar_updates = {name: to_python(trace.updates[name]) for name in scalar_states}
    return KernelIR(
        flags=dict(trace.flags),
        buffers=["w", "grad", *tensor_states],
        hypers=list(spec.numeric_hypers),
        host_scalars={name: text for text, name in host.items()},
        scalar_state_updates=scalar_updates,
        tensor_updates=tensor_updates,
        scalar_states=scalar_states,
    )


def serialize(outputs: dict[str, Expr]) -> dict:
    """A topologically ordered node list plus the node index of each output."""
    nodes: list[dict] = []
    index: dict[int, int] = {}
    for n in walk(outputs.values()):
        rec: dict = {"op": n.op, "dtype": n.dtype, "kind": n.kind}
        if n.args:
            rec["args"] = [index[id(a)] for a in n.args]
        if n.op == "const":
            rec["value"] = n.value
        if n.name is not None:
            rec["name"] = n.name
        index[id(n)] = len(nodes)
        nodes.append(rec)
    return {"nodes": nodes, "outputs": {k: index[id(v)] for k, v in outputs.items()}}

"""Values that go through memory: how lowering keeps a kernel's size linear in its graph.

Lowering binds every node once (``v: T.let = ...``), but TVM 0.27's arithmetic analyzer
substitutes each pure let-bound value into its users whenever it binds a variable
(``Analyzer::Bind``, called by StmtSimplify, LowerIntrin and the LLVM code generator for
every binding) and then walks the result as a tree. A node reused at every level of a
chain of depth d is walked 2**d times: a degree-9 polynomial inside an octant reduction
(atan2 written out) took minutes to build. A buffer load is a leaf to every one of those
walks, so lowering stores a value whose unfolded tree grows past ``LIMIT`` nodes into a
small scratch buffer of its own and binds the load instead::

    _t7[__lane__] = <value>
    v7: T.let = _t7[__lane__]

Storing and loading a float is exact, and the scratch buffers are no kernel arguments, so
nothing changes for the in-place updates (every read of an argument still precedes every
store into one). The schedule allocates the buffers (one vector of the loop's lanes per
buffer, on the stack: LLVM keeps them in registers) and names the lane index
(``with_lane``); a template without scratch support gets the plain bindings back
(``folded``). Kernels whose values stay small have none and are unchanged.
"""
from __future__ import annotations

import dataclasses
import re

LANE = "__lane__"
LIMIT = 256         # unfolded nodes a let-bound value may hold before it goes through memory
PREFIX = "_t"

_STORE = re.compile(rf"^({PREFIX}\d+)\[{LANE}\] = (.*)$")


def uses(op: str, const_exponent: float | None = None) -> int:
    """How many times lowering's rendering of ``op`` names each operand (sign and NaN-aware
    min/max test their operands' bits besides using them; x ** 2 is x * x)."""
    if op == "sign":
        return 4
    if op in ("min", "max"):
        return 3
    if op == "pow" and const_exponent == 2.0:
        return 2
    return 1


def barrier(name: str, var: str, value: str) -> list[str]:
    """The two lines that bind ``var`` to ``value`` through scratch buffer ``name``."""
    return [f"{name}[{LANE}] = {value}", f"{var}: T.let = {name}[{LANE}]"]


def with_lane(body: list[str], lane: str) -> list[str]:
    """``body`` with the scratch buffers indexed by ``lane``."""
    return [line.replace(LANE, lane) for line in body]


def folded(k):
    """A copy of the lowered kernel ``k`` with plain let bindings in place of its scratch
    buffers (for templates that allocate none)."""
    if not k.scratch:
        return k
    body, pending = [], {}
    for line in k.body:
        m = _STORE.match(line)
        if m:
            pending[m.group(1)] = m.group(2)
            continue
        for name, value in list(pending.items()):
            load = f"{name}[{LANE}]"
            if line.endswith(f"T.let = {load}"):
                line = line[: -len(load)] + value
                del pending[name]
        body.append(line)
    assert not pending, pending
    return dataclasses.replace(k, body=body, scratch=[])

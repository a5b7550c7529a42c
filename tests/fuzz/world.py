"""Running the phases of a call on a compiled optimizer and its reference twin
(``World``), and sorting typed failures into categories.

Part of the fuzzer (tests/fuzz/__init__.py says what it checks; ``python tests/fuzz/run.py``
runs it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

import optgen
from optgen.commands import random_statistics
from optgen.runtime import RowSparse

from .case import Case, GradSpec, _made
from .checks import BUG_KINDS
from .draw import ArraySpec, artifact, make_values, materialize


# -- running a case --------------------------------------------------------------------
@dataclass
class Outcome:
    kind: str                       # ok | typed | skipped | one of BUG_KINDS
    phase: str = ""
    exc: str = ""
    category: str = ""
    message: str = ""
    detail: str = ""
    notes: list = field(default_factory=list)   # typed errors worth a look (no name prefix)
    values_compared: bool = False   # whether every step of the call was tame (see TAME)

    @property
    def bug(self) -> bool:
        return self.kind in BUG_KINDS

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v not in ("", [], False)}


CATEGORIES = [
    ("not C-contiguous", "contiguity"), ("not aligned", "alignment"), ("read-only", "read-only"),
    ("byte order", "byte-order"), ("share memory|shares memory", "aliasing"),
    ("NaN or Inf", "nonfinite-gradient"),
    ("row index|RowSparse|row-sparse|has no rows", "row-sparse"),
    ("lr sequence|past the end|lr must be|lr schedule", "lr-schedule"),
    ("gradients for|arrays for|list of arrays|grads must", "grad-count"),
    ("must be a numpy|must be an array|parameters must be arrays|got a single array",
     "not-an-array"),
    ("grad_centralization", "grad-centralization"), ("has shape|expected \\(", "shape"),
    ("low-precision parameters need", "low-precision"),
    ("has dtype|dtype", "dtype"), ("must be finite", "hyper-nonfinite"),
    ("invalid hyperparameters", "hyper-requirement"), ("must satisfy", "hyper-constraint"),
    ("unknown hyperparameter|both set|betas must", "hyper-name"),
    ("hyperparameter .* must be|is a flag", "hyper-type"),
    ("needs .*=\\[|unexpected input|is None but", "inputs"),
    ("group", "groups"),
    ("param_names|lr_mult|wd_mult", "names-mults"),
    ("nonfinite|clip_global_norm|loss_scale|begin_num_update|lazy_update|must be a bool", "option"),
]


def categorize(message: str) -> str:
    import re
    for pattern, cat in CATEGORIES:
        if re.search(pattern, message):
            return cat
    return "other"


class World:
    """One side (compiled or reference): its arrays and optimizer, built from the case.
    ``promote``: the float64 oracle, every float32 array (parameters, gradients, inputs)
    widened to float64 from the same float32 values (see ``compare``)."""

    def __init__(self, case: Case, backend: str, promote: bool = False):
        self.case, self.backend, self.promote = case, backend, promote
        arrays = []
        for p in case.params:
            if isinstance(p, ArraySpec):
                arrays.append(self.up(materialize(p)))
            else:   # a view sharing memory with an earlier parameter
                src = arrays[p[1]]
                arrays.append(src.reshape(-1)[: max(src.size // 2, 1)] if src.size else src)
        self.arrays = arrays
        self.before = [a.tobytes() for a in arrays]
        self.dtypes = [a.dtype for a in (materialize(p) if isinstance(p, ArraySpec) else None
                                         for p in case.params) if a is not None]
        self.opt = None

    def up(self, x):
        """float32 -> float64 in the oracle (a plain copy), anything else as it is."""
        if self.promote and isinstance(x, np.ndarray) and x.dtype == np.float32:
            return np.array(x, dtype=np.float64)
        if self.promote and isinstance(x, RowSparse):
            return RowSparse(x.indices, self.up(x.rows))
        return x

    def params_arg(self):
        c = self.case
        if c.container == "dict":
            return dict(zip(c.names, self.arrays))
        if c.container == "groups":
            groups = []
            for gi in sorted(set(c.group_of)):
                members = [a for a, g in zip(self.arrays, c.group_of) if g == gi]
                d = {"params": members}
                if gi == 1:
                    d.update(_made(c.group_extra))
                groups.append(d)
            return groups
        return list(self.arrays)

    def construct(self):
        art = artifact(self.case.spec, self.case.base)
        self.opt = optgen.create(art, self.params_arg(), backend=self.backend,
                                 **_made(self.case.options))

    def good_grads(self, seed: int) -> tuple[list, dict]:
        rng = np.random.default_rng(seed)
        dts = self.dtypes if self.promote else [p.dtype for p in self.opt.params]
        grads = [self.up(rng.standard_normal(p.shape).astype(d))
                 for p, d in zip(self.opt.params, dts)]
        inputs = {n: [self.up(rng.standard_normal(p.shape).astype(d))
                      for p, d in zip(self.opt.params, dts)]
                  for n in self.opt.artifact.inputs}
        return grads, {**inputs, **self.statistics(seed)}

    def statistics(self, seed: int) -> dict:
        """Valid statistics (THOR's A and G) for every 2-D parameter on a step that
        refreshes, so that such a step is a good call."""
        return random_statistics(self.opt, np.random.default_rng(seed + 1))

    def grad(self, g: GradSpec, i: int, sofar: list):
        opt = self.opt
        if g.kind == "none":
            return None
        if g.kind == "alias-param":
            return opt.params[i]
        if g.kind == "alias-view":
            return opt.params[i].view()
        if g.kind == "alias-state":
            states = [v for k, v in sorted(opt.state[i].items()) if isinstance(v, np.ndarray)]
            return states[0] if states else opt.params[i]
        if g.kind == "alias-other-param":
            return opt.params[g.ref]
        if g.kind == "same-as":
            return sofar[g.ref]
        if g.kind == "list":
            return make_values(g.array).tolist()
        if g.kind == "memoryview":
            return memoryview(make_values(g.array).reshape(-1).view(np.uint8))
        if g.kind == "rowsparse":
            rs = g.rs
            rng = np.random.default_rng(rs["seed"])
            cnt, rows0 = rs["count"], rs["rows0"]
            idx = rng.integers(0, max(rows0, 1), cnt)
            if rs["idx"] == "out-of-range":
                idx[rng.integers(0, cnt)] = rows0
            elif rs["idx"] == "negative":
                idx[rng.integers(0, cnt)] = -1
            elif rs["idx"] == "float":
                idx = idx.astype(np.float64) + 0.5
            elif rs["idx"] == "2d":
                idx = idx.reshape(1, -1)
            return self.up(RowSparse(idx, make_values(g.array)))
        return self.up(materialize(g.array))

    def step_args(self) -> tuple[Any, dict]:
        c = self.case
        if isinstance(c.grads, tuple) and c.grads[0] == "count":
            grads = self.good_grads(1)[0]
            grads = (grads + grads)[: c.grads[1]]
        elif isinstance(c.grads, tuple) and c.grads[0] == "single":
            grads = self.good_grads(1)[0][0]
        else:
            specs = c.grads if isinstance(c.grads, list) else c.grads[1]
            grads = []
            for i, g in enumerate(specs):
                grads.append(self.grad(g, i, grads))
            if isinstance(c.grads, tuple) and c.grads[0] == "tuple":
                grads = tuple(grads)
            elif isinstance(c.grads, tuple) and c.grads[0] == "generator":
                grads = (g for g in list(grads))
        inputs: dict = {}
        if c.inputs == ("missing",):
            inputs = {}
        elif c.inputs == ("unexpected",):
            inputs = {"grad_snapshot": self.good_grads(2)[0]}
        elif isinstance(c.inputs, dict):
            for nm, lst in c.inputs.items():
                arrs = []
                for i, g in enumerate(lst):
                    arrs.append(self.grad(g, i, arrs))
                inputs[nm] = arrs
        return grads, {**inputs, **self.statistics(5)}



"""One fuzzed call (``Case``) and the judging of its inputs against the rules: which
hyperparameters, learning rates and options the rules call valid.

Part of the fuzzer (tests/fuzz/__init__.py says what it checks; ``python tests/fuzz/run.py``
runs it)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any



from .draw import ArraySpec, Draw, EXTREME_HYPERS, FLAG_POOL, LrSource, PAST_END, _resolve_ok, hyper_pool, lr_numbers, lr_ok


# -- the case --------------------------------------------------------------------------
@dataclass
class GradSpec:
    kind: str                          # array, none, alias-param, alias-view, alias-state,
    array: ArraySpec | None = None     # alias-other-param, same-as, list, memoryview, rowsparse
    ref: int = 0
    rs: dict | None = None


@dataclass
class Case:
    spec: str
    base: str | None
    params: list                       # ArraySpec, or ("alias", j) for a view of param j
    container: str = "list"            # list, dict, groups
    names: list | None = None
    group_of: list | None = None
    group_extra: dict = field(default_factory=dict)   # group 1's own keys
    options: dict = field(default_factory=dict)       # create(**options), lr sources made
    warmup: int = 0
    set_hyper: dict | None = None
    set_group: Any = None
    grads: Any = None                  # list[GradSpec], or ("count", n) / ("single",)
    inputs: Any = None                 # {name: list[GradSpec]} / ("missing",) / ("unexpected",)
    expect: dict = field(default_factory=dict)        # phase -> ok | bad | either | fpe | skip
    why: dict = field(default_factory=dict)
    fpe_allowed: bool = False

    def short(self) -> str:
        params = [(p.shape, p.dtype, p.layout, p.values) if isinstance(p, ArraySpec) else p
                  for p in self.params]
        return (f"{self.spec}{'+' + self.base if self.base else ''} params={params}"
                f" container={self.container} options={self.options!r} warmup={self.warmup}"
                f" set_hyper={self.set_hyper!r} group={self.set_group!r} grads={self.grads!r}"
                f" inputs={self.inputs!r} expect={self.expect} why={self.why}")


def _worst(*verdicts: str) -> str:
    order = {"ok": 0, "either": 1, "bad": 2}
    return max(verdicts, key=lambda v: order[v]) if verdicts else "ok"


class _Judge:
    """Collects a phase's verdict: bad (must raise), either, ok (must succeed)."""

    def __init__(self):
        self.verdict, self.why = "ok", []

    def add(self, verdict: str, why: str) -> None:
        if verdict != "ok":
            self.verdict = _worst(self.verdict, verdict)
            self.why.append(f"{verdict}:{why}")


def _draw_value(draw: Draw, art, name: str, current: dict, want: str):
    """A value for hyperparameter ``name``: ``want`` "valid" picks from the candidates the
    rules accept (with the others as they are), "any" from all of them."""
    pool = hyper_pool(art.hypers[name])
    if want == "valid":   # an extreme value one time in ten (it makes the call not tame)
        extreme = draw.chance(10)
        pool = [v for v in pool if _resolve_ok(art, current, {name: v})[0] and
                (_is_extreme(v) == extreme)] or [art.hypers[name].default]
    return draw.choice(pool)


def _is_extreme(v) -> bool:
    return any(v is x for x in EXTREME_HYPERS)


def _draw_lr(draw: Draw, art, current: dict, want: str):
    """An lr: a number (from the pool) or a source (sequence, callable, schedule)."""
    kind = draw.choice(["number", "list", "tuple", "array", "fn", "cosine"], [6, 1, 1, 1, 1, 1])
    if kind == "number":
        pool = lr_numbers(art.hypers["lr"])
        if want == "valid":
            extreme = draw.chance(10)
            pool = [v for v in pool if _resolve_ok(art, current, {"lr": v})[0] and
                    _is_extreme(v) == extreme] or [art.hypers["lr"].default]
        return draw.choice(pool)
    floats = [1e-3, 0.5, 0.0, 2.0, 1e-38, 1e38, 5e-324]
    bad = [-1.0, math.nan, math.inf]
    if kind in ("list", "tuple", "array"):
        vals = [draw.choice(floats, [4, 4, 2, 2, 1, 1, 1])
                for _ in range(draw.integer(0 if want == "any" else 1, 5))]
        if want == "any" and vals and draw.chance(30):
            vals[draw.integer(0, len(vals) - 1)] = draw.choice(bad)
        return LrSource(kind, vals)
    if kind == "fn":
        return LrSource("fn", [draw.choice(floats + (bad + ["x", None] if want == "any" else []))])
    return LrSource("cosine", [draw.choice(floats[:3])])


def _bad_hyper_value(draw: Draw, art, name: str, current: dict):
    every = (lr_numbers if name == "lr" else hyper_pool)(art.hypers[name])
    pool = [v for v in every if not _resolve_ok(art, current, {name: v})[0]]
    return draw.choice(pool or every)


def _hyper_changes(draw: Draw, art, current: dict, focus: bool, n_max: int) -> dict:
    """Random hyperparameter changes (spec names, lr maybe a source); with ``focus`` one of
    them is drawn from the whole pool (likely invalid)."""
    heads = {ln["heads"] for k in art.kernels for ln in k.launches if "heads" in ln}
    names = [n for n in art.hypers if n not in heads]   # (heads: 1 divides every R)
    changes: dict = {}
    trial = dict(current)
    for _ in range(draw.integer(0, n_max)):
        name = draw.choice(names)
        info = art.hypers[name]
        if info.is_flag:
            value = draw.choice(FLAG_POOL[:4] if not focus else FLAG_POOL)
        elif name == "lr":
            value = _draw_lr(draw, art, trial, "any" if focus else "valid")
        else:
            value = _draw_value(draw, art, name, trial, "any" if focus else "valid")
        changes[name] = value
        if not isinstance(value, LrSource):
            ok, new = _resolve_ok(art, trial, {name: value})
            if ok:
                trial = new
    if focus and draw.chance(70):
        name = draw.choice([n for n in names if not art.hypers[n].is_flag])
        changes[name] = _bad_hyper_value(draw, art, name, trial)
    return changes


def _judge_hypers(art, judge: _Judge, current: dict, current_lr, changes: dict, t: int):
    """Optimizer._resolve under the intended rules: a group's new hyperparameters and lr
    source, judged into ``judge``. A sequence, callable or schedule lr must give a valid lr
    at the current step ``t``, and the spec's requirements see that value. Returns
    (hyper, lr source), or (None, None) when the change is invalid."""
    plain = {k: v for k, v in changes.items() if not isinstance(v, LrSource)}
    src = current_lr
    if "lr" in changes:
        src = changes["lr"] if isinstance(changes["lr"], LrSource) else None
        if isinstance(src, LrSource) and not src.materializes():
            judge.add("bad", "lr-sequence-values")
            return None, None
    ok, new = _resolve_ok(art, current, plain)
    if not ok:
        judge.add("bad", "hyper")
        return None, None
    if isinstance(src, LrSource):
        value = src.value(t)
        if value is PAST_END or not lr_ok(art, new, value):
            judge.add("bad", "lr-past-end" if value is PAST_END else "lr-at-step")
            return None, None
    return new, src


def _aliased(draw: Draw, art, changes: dict) -> dict:
    """Some spec names replaced by aliases (learning_rate, wd, betas), maybe both."""
    out = dict(changes)
    if "lr" in out and draw.chance(20):
        out["learning_rate"] = out.pop("lr")
        if draw.chance(10):
            out["lr"] = 0.1   # both: a TypeError
    if "weight_decay" in out and draw.chance(20):
        out["wd"] = out.pop("weight_decay")
    if "beta1" in out and "beta2" in out and "betas" not in art.hypers and draw.chance(30):
        out["betas"] = (out.pop("beta1"), out.pop("beta2"))
    return out


def _unalias(art, given: dict) -> tuple[dict | None, str]:
    """Spec names for ``given``; None when the aliases clash."""
    out = {}
    for k, v in given.items():
        if k == "betas":
            pairs = [("beta1", v[0]), ("beta2", v[1])]
        elif k == "learning_rate":
            pairs = [("lr", v)]
        elif k == "wd":
            pairs = [("weight_decay", v)]
        else:
            pairs = [(k, v)]
        for n, x in pairs:
            if n in out:
                return None, "alias-clash"
            out[n] = x
    return out, ""


def _made(options: dict) -> dict:
    return {k: (v.make() if isinstance(v, LrSource) else v) for k, v in options.items()}



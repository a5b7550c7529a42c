"""Drawing a whole call: parameters, options, groups, warm-up, set_hyper, gradients.

Part of the fuzzer (tests/fuzz/__init__.py says what it checks; ``python tests/fuzz/run.py``
runs it)."""
from __future__ import annotations

import math

import numpy as np

from optgen.core import scalar_expr

from .case import Case, GradSpec, _Judge, _aliased, _hyper_changes, _judge_hypers, _unalias
from .draw import ArraySpec, BAD_DTYPES, Draw, GOOD_DTYPES, LAYOUTS, LOW, LrSource, PAST_END, SHAPES, SHAPE_WEIGHTS, VALUE_KINDS, array_rule, artifact, finite, lr_ok, np_dtype


def generate(draw: Draw, specs: list[tuple[str, str | None]]) -> Case:
    """A random call against one of ``specs`` (with its verdicts)."""
    name, base = draw.choice(specs)
    art = artifact(name, base)
    focus = draw.choice(["valid", "grad", "hyper", "param", "options", "set_hyper", "values"],
                        [30, 22, 12, 10, 8, 10, 8])
    case = Case(name, base, [])
    cons, step = _Judge(), _Judge()

    # options (runtime)
    opts: dict = {}
    mp = draw.chance(25)
    if mp or draw.chance(5):
        opts["multi_precision"] = mp if focus != "options" or draw.chance(50) else \
            draw.choice([1, None, "yes"])
    if draw.chance(20):
        opts["nonfinite"] = draw.choice(["skip", "raise"] +
                                        (["ignore", 1, True] if focus == "options" else []))
    if draw.chance(15):
        bad = [0.0, -1.0, math.nan, math.inf, "1", True] if focus == "options" else []
        opts["clip_global_norm"] = draw.choice([1.0, 0.5, 1e-30, 1e38, 5e-324] + bad,
                                               [5, 5, 1, 1, 1] + [2] * len(bad))
    if draw.chance(10):
        bad = [0.0, -1.0, math.nan, "8", None] if focus == "options" else []
        opts["loss_scale"] = draw.choice([1024.0, 2, 0.5, 1e-30, 1e38] + bad,
                                         [4, 4, 4, 1, 1] + [3] * len(bad))
    if draw.chance(10):
        opts["begin_num_update"] = draw.choice([5, 1000, 2 ** 31, 2 ** 53 + 1, 2 ** 63, 10 ** 30,
                                                np.int64(7)]
                                               + ([-1, 1.5, True, "3"]
                                                  if focus == "options" else []))
    if draw.chance(10):
        opts["lazy_update"] = draw.choice([True, False] + ([1] if focus == "options" else []))
    mp_on = opts.get("multi_precision") is True
    # the validity of the options (mirrors docs/runtime.md "Construction")
    for k, v in opts.items():
        ok = True
        if k in ("multi_precision", "lazy_update"):
            ok = isinstance(v, (bool, np.bool_))
        elif k == "nonfinite":
            ok = v in (None, "skip", "raise") and not isinstance(v, bool)
        elif k in ("clip_global_norm", "loss_scale"):
            ok = (v is None and k == "clip_global_norm") or (
                not isinstance(v, (bool, str)) and v is not None and math.isfinite(v) and v > 0)
        elif k == "begin_num_update":
            ok = isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0
        cons.add("ok" if ok else "bad", f"option-{k}")
        if ok and k in ("clip_global_norm", "loss_scale") and "rescale_grad" not in art.hypers \
                and v is not None and (k == "clip_global_norm" or v != 1.0):   # (through rescale_grad)
            cons.add("bad", f"option-{k}-needs-rescale_grad")
    t0 = int(opts["begin_num_update"]) if cons.verdict == "ok" and "begin_num_update" in opts else 0

    # parameters
    n = draw.choice([1, 2, 3], [5, 4, 1])
    for i in range(n):
        shape = draw.choice(SHAPES, SHAPE_WEIGHTS)
        if focus == "param" and draw.chance(60):
            dtype = draw.choice(BAD_DTYPES + LOW)
        elif draw.chance(12 if mp else 2):
            dtype = draw.choice(LOW)
        else:
            dtype = draw.choice(GOOD_DTYPES, [3, 2])
        layout, k = "plain", 0
        if draw.chance(30):
            layout = "offset"
        if focus == "param" and draw.chance(50):
            layout = draw.choice(LAYOUTS)
        itemsize = np_dtype(dtype).itemsize
        if layout == "offset":
            k = itemsize * draw.integer(1, 15)
        elif layout == "misaligned":
            k = draw.choice([1, 2, 3, 5, itemsize + 1, 4 if itemsize == 8 else 1])
        elif layout == "strided":
            k = draw.choice([2, 3])
        elif layout == "size1-strides":
            k = draw.integer(0, 3)
        values = draw.choice(VALUE_KINDS, [10, 2, 2, 2, 2, 2, 2] if focus == "values"
                             else [40, 2, 1, 1, 1, 1, 2])
        if i and focus == "param" and draw.chance(15):
            case.params.append(("alias", draw.integer(0, i - 1)))
            prev = case.params[case.params[-1][1]]
            if isinstance(prev, ArraySpec) and prev.numel():
                cons.add("bad", "params-share-memory")
            else:
                cons.add("either", "alias-of-empty")
            continue
        a = ArraySpec(tuple(shape), dtype, values, draw.seed(), layout, k)
        case.params.append(a)
        if dtype in LOW and not mp_on:
            cons.add("bad", f"param-{dtype}")
        elif dtype == "float16" and len(shape) == 2 and any(k.matrix for k in art.kernels):
            cons.add("bad", f"param-{dtype}-matrix")   # (matrix kernels: no float16 ones)
        elif dtype not in GOOD_DTYPES + LOW:
            cons.add("bad", f"param-dtype-{dtype}")
        else:
            cons.add(*array_rule(a, "param"))
    arrays = []   # the ArraySpec behind each parameter (an alias: the one it views)
    for p in case.params:
        arrays.append(p if isinstance(p, ArraySpec) else arrays[p[1]])

    # container, names, groups
    case.container = draw.choice(["list", "dict", "groups"], [6, 2, 2])
    names_pool = ["w", "fc.weight", "fc.bias", "LayerNorm.gamma", "bn.beta", "emb", "conv"]
    names = [f"{draw.choice(names_pool)}{i}" for i in range(n)]
    if case.container == "dict":
        case.names = names
    elif case.container == "list" and draw.chance(10):
        case.names = names if draw.chance(80) else names[:-1]
        opts["param_names"] = case.names
        if len(case.names) != n:
            cons.add("bad", "param-names-count")
    # hyperparameters at the top
    defaults = {k: h.default for k, h in art.hypers.items()}
    top = _hyper_changes(draw, art, defaults, focus == "hyper", 4)
    given = _aliased(draw, art, top)
    spec_names, why = _unalias(art, given)
    if spec_names is None:
        cons.add("bad", why)
        top_hyper, top_lr = None, None
    else:
        top_hyper, top_lr = _judge_hypers(art, cons, defaults, None, spec_names, t0)
    opts.update(given)
    group_hyper = [top_hyper]
    group_lr = [top_lr]
    case.group_of = [0] * n
    if case.container == "groups":
        if n >= 2 and draw.chance(70):
            cut = draw.integer(1, n - 1)
            case.group_of = [0] * cut + [1] * (n - cut)
            extra = _hyper_changes(draw, art, top_hyper or defaults, focus == "hyper", 2)
            if draw.chance(15):
                extra["grad_centralization"] = True
                if not all(len(arrays[i].shape) == 4 for i in range(cut, n)):
                    cons.add("bad", "grad-centralization-shape")
            if focus == "hyper" and draw.chance(10):
                extra["no_such_key"] = 1.0
                cons.add("bad", "group-unknown-key")
            case.group_extra = extra
            hyp = {k: v for k, v in extra.items()
                   if k not in ("grad_centralization", "no_such_key")}
            h1, l1 = _judge_hypers(art, cons, top_hyper, top_lr, hyp, t0) \
                if top_hyper is not None else (None, None)
            group_hyper.append(h1)
            group_lr.append(l1)
    # lr_mult / wd_mult
    if draw.chance(8):
        key = draw.choice(["lr_mult", "wd_mult"])
        idx = draw.choice([0, n - 1, n, "fc.bias0", -1])
        bad = [-1.0, math.nan, "x"] if focus == "options" else []
        val = draw.choice([0.5, 0.0, 2, 1e38] + bad, [3, 3, 3, 1] + [3] * len(bad))
        opts[key] = {idx: val}
        named = case.names if case.names and len(case.names) == n else None
        key_ok = (isinstance(idx, int) and 0 <= idx < n) or \
            (isinstance(idx, str) and bool(named) and idx in named)
        val_ok = not isinstance(val, (str, bool)) and math.isfinite(val) and val >= 0
        cons.add("ok" if key_ok and val_ok else "bad", f"{key}")
    case.options = opts
    case.expect["construct"] = cons.verdict
    case.why["construct"] = cons.why

    # warm-up steps (good gradients); a sequence lr may run out
    case.warmup = draw.choice([0, 1, 2], [3, 4, 2])
    t = t0
    for w in range(case.warmup):
        j = _Judge()
        for gi, (h, src) in enumerate(zip(group_hyper, group_lr)):
            if h is not None and isinstance(src, LrSource) and gi in case.group_of:
                value = src.value(t)
                if value is PAST_END or not lr_ok(art, h, value):
                    j.add("bad", "lr-at-step")
        case.expect[f"warmup{w}"] = j.verdict
        case.why[f"warmup{w}"] = j.why
        t += 1

    # set_hyper
    if focus == "set_hyper" or draw.chance(10):
        j = _Judge()
        changes = _hyper_changes(draw, art, top_hyper or defaults, focus == "set_hyper", 3)
        n_groups = len(group_hyper)
        case.set_group = draw.choice([None, 0, n_groups - 1, n_groups, -1, "0"],
                                     [6, 2, 2] + ([1, 1, 1] if focus == "set_hyper" else [0, 0, 0]))
        case.set_hyper = _aliased(draw, art, changes)
        sn, why = _unalias(art, case.set_hyper)
        fixed = {n for rule in art.shape_flags.values() for n in scalar_expr.names(rule)}
        if sn is None:
            j.add("bad", why)
        elif any(k in fixed and any(h is None or h.get(k) != v for h in group_hyper)
                 for k, v in sn.items()):
            j.add("bad", "set-hyper-shape-flag")   # (it chose each parameter's states)
        elif case.set_group is not None and not (isinstance(case.set_group, int)
                                                 and 0 <= case.set_group < n_groups):
            j.add("bad", "set-hyper-group")
        elif all(h is not None for h in group_hyper):
            targets = range(n_groups) if case.set_group is None else [case.set_group]
            for gi in targets:
                h, src = _judge_hypers(art, j, group_hyper[gi], group_lr[gi], sn, t)
                if h is not None:
                    group_hyper[gi], group_lr[gi] = h, src
            if case.set_group is None and top_hyper is not None:
                _judge_hypers(art, j, top_hyper, top_lr, sn, t)
        case.expect["set_hyper"] = j.verdict
        case.why["set_hyper"] = j.why

    # the fuzzed step
    grads = []
    for i, p in enumerate(arrays):
        grads.append(_draw_grad(draw, art, case, i, p, arrays, grads, focus == "grad", step, mp_on))
    if focus == "grad" and draw.chance(8):
        case.grads = draw.choice([("count", n + 1), ("count", max(n - 1, 0)), ("single",),
                                  ("tuple", grads), ("generator", grads)])
        if case.grads[0] in ("count", "single"):
            step.add("bad", f"grads-{case.grads[0]}")
    else:
        case.grads = grads
    glist = case.grads if isinstance(case.grads, list) else \
        (case.grads[1] if case.grads[0] in ("tuple", "generator") else [])
    used = {case.group_of[i] for i, g in enumerate(glist) if g.kind != "none"}
    for gi in used:
        h, src = group_hyper[gi], group_lr[gi]
        if h is not None and isinstance(src, LrSource):
            value = src.value(t)
            if value is PAST_END or not lr_ok(art, h, value):
                step.add("bad", "lr-at-step")
    # extra inputs (SVRG)
    if art.inputs:
        if focus == "grad" and draw.chance(8):
            case.inputs = ("missing",)
            step.add("bad", "inputs-missing")
        else:
            case.inputs = {}
            for nm in art.inputs:
                lst = []
                for i, p in enumerate(arrays):
                    g = glist[i] if i < len(glist) else None
                    if g is not None and g.kind == "rowsparse":   # densified (no lazy kernel)
                        step.add("either", "row-sparse-with-inputs")
                    if draw.chance(90) or focus != "grad":
                        kind = draw.choice(VALUE_KINDS, [40, 2, 1, 1, 1, 1, 2])
                        a = ArraySpec(p.shape, p.dtype, kind, draw.seed(),
                                      draw.choice(["plain", "offset"]), 0)
                        if a.layout == "offset":
                            a.k = np_dtype(p.dtype).itemsize * 3
                        lst.append(GradSpec("array", a))
                    else:
                        lst.append(_draw_grad(draw, art, case, i, p, arrays, lst, True, step,
                                              mp_on, extra=True))
                    if lst[-1].kind == "none" and g is not None and g.kind != "none":
                        step.add("bad", "input-none")
                case.inputs[nm] = lst
    elif focus == "grad" and draw.chance(5):
        case.inputs = ("unexpected",)
        step.add("bad", "unexpected-input")
    # non-finite gradients: FloatingPointError or a skipped step
    nf = opts.get("nonfinite") if cons.verdict != "bad" else None
    cg = opts.get("clip_global_norm") if cons.verdict != "bad" else None
    nonfinite_grad = any(g.kind in ("array", "rowsparse") and not finite(g.array) or
                         g.kind == "alias-other-param"   # (its values after the warm-up)
                         for g in glist)
    if (nf in ("raise", "skip") or cg is not None) and nonfinite_grad:
        case.fpe_allowed = True
        if step.verdict == "ok":
            step.verdict = "skip" if nf == "skip" else "fpe"
    case.expect["step"] = step.verdict
    case.why["step"] = step.why
    return case


def _draw_grad(draw: Draw, art, case: Case, i: int, p: ArraySpec, arrays: list, sofar: list,
               focus: bool, judge: _Judge, mp_on: bool, extra: bool = False) -> GradSpec:
    """The gradient (or extra input) of parameter ``i``, judged into ``judge``."""
    kinds = ["array", "none", "alias-param", "alias-view", "alias-state", "alias-other-param",
             "same-as", "list", "memoryview", "rowsparse", "wrong-dtype", "wrong-shape", "layout"]
    if focus:
        kind = draw.choice(kinds, [10, 3, 2, 2, 2, 2, 2, 1, 1, 4, 2, 2, 10])
    else:
        kind = draw.choice(kinds[:2] + ["rowsparse"], [40, 2, 3 if not extra else 0])
    values = draw.choice(VALUE_KINDS, [30, 2, 1, 1, 1, 2, 4])
    empty = p.numel() == 0
    if kind == "none":
        return GradSpec("none")
    if kind in ("alias-param", "alias-view", "alias-state"):
        judge.add("either" if empty else "bad", kind)
        return GradSpec(kind)
    if kind == "alias-other-param":
        others = [j for j, q in enumerate(arrays)
                  if j != i and q.shape == p.shape and q.dtype == p.dtype]
        if others:
            judge.add("either", kind)   # accepted today; read after param j was stepped
            return GradSpec(kind, ref=draw.choice(others))
        kind = "array"
    if kind == "same-as":
        others = [j for j, g in enumerate(sofar) if g.kind == "array" and g.array.shape == p.shape
                  and g.array.dtype == p.dtype and g.array.layout in ("plain", "offset")]
        if others:
            return GradSpec(kind, ref=draw.choice(others))
        kind = "array"
    if kind in ("list", "memoryview"):
        judge.add("bad", kind)
        return GradSpec(kind, ArraySpec(p.shape, p.dtype, values, draw.seed()))
    if kind == "rowsparse":
        if extra:
            judge.add("bad", "row-sparse-input")
        return _draw_rowsparse(draw, case, i, p, focus, judge, values)
    shape, dtype, layout, k = p.shape, p.dtype, "plain", 0
    if draw.chance(30):
        layout, k = "offset", np_dtype(dtype).itemsize * draw.integer(1, 15)
    if kind == "wrong-dtype":
        dtype = draw.choice([d for d in GOOD_DTYPES + LOW + (">f4", "int32") if d != p.dtype])
        judge.add("bad", "grad-dtype")
    elif kind == "wrong-shape":
        size = p.numel()
        cands = [s for s in [(size + 1,), (size,), (1, size), (), tuple(shape) + (1,), (0,)]
                 if tuple(s) != tuple(shape)]
        shape = draw.choice(cands)
        judge.add("bad", "grad-shape")
    elif kind == "layout":
        layout = draw.choice(LAYOUTS)
        itemsize = np_dtype(dtype).itemsize
        k = {"offset": itemsize * draw.integer(1, 15),
             "misaligned": draw.choice([1, 2, 3, itemsize + 1]),
             "strided": draw.choice([2, 3]), "size1-strides": draw.integer(0, 3)}.get(layout, 0)
    a = ArraySpec(tuple(shape), dtype, values, draw.seed(), layout, k)
    verdict, why = array_rule(a, "grad")
    judge.add(verdict, f"grad-{why}")
    return GradSpec("array", a)


def _draw_rowsparse(draw: Draw, case: Case, i: int, p: ArraySpec, focus: bool, judge: _Judge,
                    values: str) -> GradSpec:
    rows0 = p.shape[0] if p.shape else 0
    count = draw.integer(0, 6)
    idx_kind = draw.choice(["ok", "out-of-range", "negative", "float", "2d"] if focus else ["ok"])
    rows_kind = draw.choice(["ok", "shape", "dtype"] if focus else ["ok"])
    seed = draw.seed()
    if not p.shape:
        judge.add("bad", "row-sparse-0d")
    if idx_kind == "ok" and rows0 == 0 and count:
        idx_kind = "out-of-range"
    if idx_kind in ("out-of-range", "negative") and count == 0:
        idx_kind = "ok"
    if idx_kind == "2d" and count == 0:
        count = 1
    if idx_kind != "ok" or rows_kind != "ok":
        judge.add("bad", f"row-sparse-{idx_kind}-{rows_kind}")
    if case.container == "groups" and case.group_extra.get("grad_centralization") \
            and case.group_of[i] == 1:
        judge.add("bad", "row-sparse-grad-centralization")
    rshape = (count,) + tuple(p.shape[1:])
    if rows_kind == "shape":
        rshape = (count,) + tuple(s + 1 for s in p.shape[1:]) if len(p.shape) > 1 else (count, 2)
    rdtype = p.dtype if rows_kind != "dtype" else ("float64" if p.dtype != "float64" else "float32")
    return GradSpec("rowsparse", ArraySpec(rshape, rdtype, values, seed),
                    rs={"count": count, "idx": idx_kind, "rows0": rows0, "seed": seed})



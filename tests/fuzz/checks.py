"""What a call is checked against: the verdicts, tolerances, snapshots of an optimizer's
parameters and states, and the comparison of a compiled run with its reference twin.

Part of the fuzzer (tests/fuzz/__init__.py says what it checks; ``python tests/fuzz/run.py``
runs it)."""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

from optgen.runtime import RowSparse

from .case import Case
from .draw import LOW


# -- what is checked -------------------------------------------------------------------
TYPED = (TypeError, ValueError)
BUG_KINDS = ("crash", "partial", "mismatch", "divergent", "accepted-invalid",
             "rejected-valid", "grad-written", "param-written", "harness")
# float32/float64/float16 tolerances of tests/helpers.py (TOL, SCALE_ATOL); bench/ does not
# import tests/, so the numbers are repeated here (tests/test_fuzz.py passes helpers'
# assert_close itself). bfloat16 (only w_low, the rounded master) gets 2 of its ulps.
TOL = {"float32": (1e-5, 1e-6, 1e-5), "float64": (1e-12, 1e-13, 1e-12),
       "float16": (2.5e-3, 1e-6, 1e-3), "bfloat16": (2 ** -6, 1e-6, 2 ** -6)}


def assert_close(actual, expected, dtype: str, msg: str) -> None:
    """tests/helpers.assert_close: rtol, and atol scaled by the largest finite value."""
    expected = np.asarray(expected)
    if expected.dtype == np.float16:
        dtype = "float16"
    rtol, atol, scale_atol = TOL[dtype]
    scale = float(np.max(np.abs(expected[np.isfinite(expected)]), initial=0.0))
    np.testing.assert_allclose(actual, expected, rtol=rtol,
                               atol=max(atol, scale_atol * scale), err_msg=msg)


def snapshot(opt) -> dict:
    """Everything a failed call must leave bit-identical."""
    def b(x):
        return (np.asarray(x).dtype.str, np.shape(x), np.asarray(x).tobytes())
    return {"t": opt.t, "steps": list(getattr(opt, "_steps", [])),
            "skipped": opt.skipped_steps, "hyper": repr(opt.hyper),
            "groups": repr([{k: v for k, v in g.items() if k != "params"}
                            for g in opt.param_groups]),
            "params": [b(p) for p in opt.params],
            "state": [{k: b(v) for k, v in st.items()} for st in opt.state]}


def _diff(a: dict, b: dict) -> str:
    for k in a:
        if a[k] != b[k]:
            if k in ("params", "state"):
                for i, (x, y) in enumerate(zip(a[k], b[k])):
                    if x != y:
                        keys = [n for n in x if x.get(n) != y.get(n)] if k == "state" else ""
                        return f"{k}[{i}] changed {keys}"
            return f"{k}: {str(a[k])[:200]} -> {str(b[k])[:200]}"
    return ""


# Values are compared only in "tame" steps: every finite number the step reads
# (parameters, states, gradients, extra inputs, hyperparameters, lr, 1/loss_scale,
# clip_global_norm, multipliers) is 0 or within [1e-30, 1e12] in magnitude. Past that the
# rules are ill-conditioned and the two backends legitimately round apart: LLVM contracts
# a*b+c into FMAs, so near overflow the kernel keeps a product finite where the reference
# rounds it to inf (rmsprop centered with g = 1e30: ms - mg*mg is inf - inf = NaN in the
# reference, fma(-mg, mg, inf) = inf in the kernel), and with denormal hyperparameters a
# result can be rounding noise over a denormal (ftml with epsilon = 1e-38 and a zero
# gradient: w = -z / d with z the FMA residue 3e-14 and d = 2.6e-36, -1.2e22 in the
# kernel, exactly -0.0 in the reference). A step that is not tame, and every later step
# of the call (its states carry the difference), still has every other check (typed
# errors, state untouched on failure, accepted/rejected as the rules say, gradients not
# written, the same state names, dtypes and shapes); only the values are not compared.
# NaN and inf *inputs* keep a step tame: NaN must propagate as in the reference.
TAME = (1e-30, 1e12)


def _tame(values) -> bool:
    for x in values:
        if x is None or isinstance(x, (bool, np.bool_, str)):
            continue
        try:
            a = np.asarray(x)
            if a.dtype.kind not in "fiu" and a.dtype.name not in LOW:
                continue
            a = np.abs(a.astype(np.float64)).reshape(-1)
        except (TypeError, ValueError):
            continue
        a = a[np.isfinite(a) & (a != 0)]
        if a.size and (a.min() < TAME[0] or a.max() > TAME[1]):
            return False
    return True


def step_is_tame(opt, case: Case, grads) -> bool:
    """Whether the next step of ``opt`` with ``grads`` is tame (see TAME)."""
    values = list(opt.params)
    for st in opt.state:
        values += list(st.values())
    gl, ins = grads if grads is not None else ([], {})
    for g in list(gl) if isinstance(gl, (list, tuple)) else []:
        values.append(g.rows if isinstance(g, RowSparse) else g)
    for lst in ins.values():
        values += list(lst) if isinstance(lst, (list, tuple)) else []
    for g in opt.param_groups:
        for k, v in g.items():
            if k in ("params", "names"):
                continue
            if callable(v):
                try:
                    v = v(opt.t)
                except Exception:   # noqa: BLE001 - an lr sequence past its end: the step fails
                    continue
            values.append(v)
    for k in ("loss_scale", "clip_global_norm"):
        v = case.options.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v:
            values += [v, 1.0 / v]    # gradients are multiplied by 1 / loss_scale
    for k in ("lr_mult", "wd_mult"):
        if isinstance(case.options.get(k), dict):
            values += [v for v in case.options[k].values() if isinstance(v, (int, float))]
    return _tame([v for v in values if not isinstance(v, (list, memoryview))])


def _arrays_of(opt) -> dict:
    out = {f"param {i}": p for i, p in enumerate(opt.params)}
    for i, st in enumerate(opt.state):
        out.update({f"state {i}.{k}": v for k, v in st.items()})
    return out


def _classes(x: np.ndarray) -> np.ndarray:
    return np.select([np.isnan(x), np.isposinf(x), np.isneginf(x)], [0, 1, 2], 3)


def compare(comp, ref, close: Callable, what: str, values: bool = True,
            oracle: Callable | None = None) -> str:
    """'' when the compiled optimizer equals the reference: the same step count, state
    names, dtypes and shapes and, when ``values`` (tame calls, see TAME), NaN and +-inf at
    the same places and finite values within ``close``'s tolerances
    (tests/helpers.assert_close).

    One legitimate difference is set aside, in float32 arrays that differ: the float32
    reference's own rounding error, measured against ``oracle()`` (the reference
    interpreter run in float64 on the same float32 values, World(promote=True)).
    Catastrophic cancellation (rmsprop centered's ms - mg*mg with a small decay)
    amplifies rounding, so the kernel may differ from the float32 reference by 4x
    (that element's error + the array's largest relative error x its magnitude) on top
    of the tolerance; an element where the float32 reference is NaN/inf and the oracle
    is not is not compared. Where the float32 reference is accurate the comparison stays
    strict, so a kernel that drops a NaN (sign(NaN) = 0) or turns a finite result into
    NaN is a mismatch.
    """
    if comp.t != ref.t:
        return f"{what}: t {comp.t} != {ref.t}"
    mine, theirs = _arrays_of(comp), _arrays_of(ref)
    if set(mine) != set(theirs):
        return f"{what}: states {sorted(mine)} != reference {sorted(theirs)}"
    wide = None
    for label in mine:
        a, e = np.asarray(mine[label]), np.asarray(theirs[label])
        if a.dtype != e.dtype or a.shape != e.shape:
            return f"{what}: {label} is {a.dtype}{a.shape}, reference {e.dtype}{e.shape}"
        if a.dtype.name not in ("float32", "float64", "float16", "bfloat16"):
            return f"{what}: {label} has dtype {a.dtype}"
        if not values:
            continue
        # a host scalar state may read sums the kernels computed in its parameter's
        # dtype (global_sum): compared at that dtype's tolerance
        at = _param_dtype(comp, label) if e.ndim == 0 or _reads_float32_sums(comp) else None
        d = _pair(label, a, e, close, what, dtype=at)
        if d and e.dtype == np.float32 and oracle is not None:
            if wide is None:
                o = oracle()
                wide = _arrays_of(o) if o is not None else {}
            o = wide.get(label)
            if o is not None and np.shape(o) == e.shape:
                d = _pair(label, a, e, close, what, np.asarray(o, np.float64))
        if d:
            return d
    return ""


def _reads_float32_sums(opt) -> bool:
    """Whether every array of ``opt`` reads global sums with float32 parts (a rule with
    global_sum over float32 and float64 parameters: a float32 part's products round in
    float32, FMA-contracted or not, so float64 results are float32-exact only)."""
    art = getattr(opt, "artifact", None)
    return art is not None and any(k.global_sums for k in art.kernels) and any(
        np.asarray(q).dtype.name in ("float32", "float16", "bfloat16") for q in opt.params)


def _param_dtype(opt, label: str) -> str | None:
    """The kernel dtype of the parameter whose state ``label`` is (None: float64)."""
    i = int(label.split()[1].split(".")[0])
    low = ("float32", "float16", "bfloat16")
    if _reads_float32_sums(opt):
        return "float32"
    dt = np.asarray(opt.params[i]).dtype.name
    return "float32" if dt in low else None


def _pair(label: str, a: np.ndarray, e: np.ndarray, close: Callable, what: str,
          oracle: np.ndarray | None = None, dtype: str | None = None) -> str:
    dt = dtype or a.dtype.name
    if dt == "bfloat16":
        a, e = a.astype(np.float32), e.astype(np.float32)
    keep = np.ones(e.shape, bool)
    slack = np.zeros(e.shape)
    if oracle is not None:   # the float32 reference's own error, measured by the oracle
        e64 = e.astype(np.float64)
        keep = _classes(e64) == _classes(oracle)
        with np.errstate(all="ignore"):
            both = np.isfinite(e64) & np.isfinite(oracle)
            err = np.where(both, np.abs(e64 - oracle), 0.0)
            rel = float(np.max(np.where(both & (oracle != 0), err / np.abs(oracle), 0.0),
                               initial=0.0))
            slack = 4 * (err + rel * np.where(both, np.abs(oracle), 0.0))
    for mask_name, f in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        ma, me = f(a) & keep, f(e) & keep
        if not np.array_equal(ma, me):
            k = np.flatnonzero((ma != me).reshape(-1))[:3]
            return (f"{what}: {label} {mask_name} at different places, e.g. flat "
                    f"{k.tolist()}: {a.reshape(-1)[k].tolist()} vs reference "
                    f"{e.reshape(-1)[k].tolist()}"
                    + (f" (float64 oracle {oracle.reshape(-1)[k].tolist()})"
                       if oracle is not None else ""))
    fin = np.isfinite(e) & keep
    af, ef = a[fin], e[fin]
    if oracle is not None and af.size:   # move the kernel's value towards the reference
        with np.errstate(all="ignore"):   # by the slack, then the usual tolerance applies
            d = af.astype(np.float64) - ef.astype(np.float64)
            af = (ef + np.sign(d) * np.maximum(np.abs(d) - slack[fin], 0.0)).astype(af.dtype)
    try:
        if dt == "bfloat16":
            assert_close(af, ef, "bfloat16", label)
        else:
            close(af, ef, dt if dt != "float16" else "float32", f"{what}: {label}")
    except AssertionError as err:
        return f"{what}: {label}: {str(err).strip()[:600]}"
    return ""


def _in_kernel(tb) -> bool:
    """Whether a traceback passes through the kernel launches (after validation)."""
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name in ("run", "run_lazy", "run_fused") and \
                code.co_filename.endswith(os.path.join("runtime", "launch.py")):
            return True
        tb = tb.tb_next
    return False



"""Running one case and judging its outcome (``run_case``).

Part of the fuzzer (tests/fuzz/__init__.py says what it checks; ``python tests/fuzz/run.py``
runs it)."""
from __future__ import annotations

import traceback
import warnings
from typing import Callable

import numpy as np

from optgen.runtime import RowSparse

from .case import Case, _made
from .checks import TYPED, _diff, _in_kernel, assert_close, compare, snapshot, step_is_tame
from .draw import ArraySpec, GOOD_DTYPES, artifact
from .world import Outcome, World, categorize


def run_case(case: Case, close: Callable = assert_close) -> Outcome:
    """Run ``case`` on the compiled and the reference backend and judge it."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return _run_case(case, close)
        except Exception as e:   # noqa: BLE001 - a bug of this harness (must not happen)
            return Outcome("harness", "harness", type(e).__name__, "", str(e)[:500],
                           traceback.format_exc()[-2000:])


def _typed(case: Case, e: BaseException) -> bool:
    return isinstance(e, TYPED) or (case.fpe_allowed and isinstance(e, FloatingPointError))


def _run_case(case: Case, close: Callable) -> Outcome:
    comp, ref = World(case, "compiled"), World(case, "reference")
    notes: list = []
    art_name = artifact(case.spec, case.base).name
    mode = {"values": True}   # see TAME: once a step is not tame, the call stays so
    done: list = []        # (prepare, run) of the phases that succeeded: the oracle replays them
    promotable = all(isinstance(p, ArraySpec) and p.dtype in GOOD_DTYPES for p in case.params) \
        and any(p.dtype == "float32" for p in case.params)

    def oracle():
        """The float64 reference run of every phase that succeeded so far (or None)."""
        if not promotable:
            return None
        w = World(case, "reference", promote=True)
        try:
            for prep, run in done:
                run(w, prep(w))
        except Exception:   # noqa: BLE001 - no oracle then; the mismatch stands
            return None
        return w.opt

    def judged(name: str, kind: str, e: BaseException | None = None, detail: str = "") -> Outcome:
        msg = str(e) if e is not None else ""
        return Outcome(kind, name, type(e).__name__ if e is not None else "",
                       categorize(msg) if e is not None else "", msg[:500], detail)

    def phase(name: str, prep: Callable, run: Callable, snap: bool = True,
              check_grads: bool = True):
        """Run one phase on both sides. Returns None to go on, or the call's Outcome."""
        expect = case.expect.get(name, "ok")
        args_c, args_r = prep(comp), prep(ref)
        before = snapshot(comp.opt) if snap else None
        if snap:
            mode["values"] = mode["values"] and step_is_tame(comp.opt, case, args_c)
        gbytes = _grad_bytes(args_c) if check_grads and args_c is not None else None
        try:
            rc = run(comp, args_c)
        except BaseException as e:   # noqa: B902 - everything is judged here
            if isinstance(e, KeyboardInterrupt):
                raise
            msg = str(e)
            if not _typed(case, e):
                return judged(name, "crash", e, "".join(
                    traceback.format_exception(type(e), e, e.__traceback__))[-2500:])
            if snap:
                after = snapshot(comp.opt)
                if after != before:
                    return judged(name, "partial", e, _diff(before, after))
            else:
                changed = [i for i, a in enumerate(comp.arrays) if a.tobytes() != comp.before[i]]
                if changed:
                    return judged(name, "param-written", e,
                                  f"parameters {changed} written by a failed constructor")
            if _in_kernel(e.__traceback__):
                return judged(name, "partial", e, "raised by a kernel launch, not by the "
                              "checks before it")
            if not msg.startswith(f"{art_name}:") and not msg.startswith(case.spec):
                notes.append(f"{name}: {type(e).__name__} without the optimizer's name: "
                             f"{msg[:200]}")
            try:
                run(ref, args_r)
            except BaseException as er:   # noqa: B902
                if type(er) is not type(e):
                    return judged(name, "divergent", e, f"reference raised {type(er).__name__}: "
                                  f"{str(er)[:300]}")
            else:
                return judged(name, "divergent", e, "the reference backend accepted it")
            fpe = isinstance(e, FloatingPointError)
            if expect in ("ok", "skip") or (expect == "fpe") != fpe and expect != "either":
                want = {"ok": "success", "skip": "a skipped step (False)", "bad": "a TypeError or "
                        "ValueError", "fpe": "FloatingPointError"}[expect]
                return judged(name, "rejected-valid", e,
                              f"expected {want} ({case.why.get(name)})")
            out = Outcome("typed", name, type(e).__name__, categorize(msg), msg[:300])
            if snap:   # the optimizer goes on as if the call never happened
                out2 = recovery(name)
                if out2 is not None:
                    return out2
            out.notes = notes
            return out
        # success on the compiled side
        if expect == "bad":
            return judged(name, "accepted-invalid",
                          detail=f"expected a TypeError/ValueError ({case.why.get(name)})")
        if expect == "fpe":
            return judged(name, "accepted-invalid",
                          detail="expected FloatingPointError (non-finite gradient)")
        if gbytes is not None and _grad_bytes(args_c) != gbytes:
            return judged(name, "grad-written", detail="a gradient or input changed in step()")
        try:
            rr = run(ref, args_r)
        except BaseException as er:   # noqa: B902
            return judged(name, "divergent", er, "the compiled backend succeeded, the "
                          "reference raised")
        done.append((prep, run))
        if rc != rr:
            return judged(name, "mismatch", detail=f"returned {rc!r}, reference {rr!r}")
        if expect == "skip":
            if rc is not False:
                return judged(name, "mismatch", detail="expected a skipped step (False)")
            after = snapshot(comp.opt)
            if {k: v for k, v in after.items() if k != "skipped"} != \
                    {k: v for k, v in before.items() if k != "skipped"}:
                return judged(name, "partial",
                              detail="skipped step changed " + _diff(before, after))
        d = compare(comp.opt, ref.opt, close, name, mode["values"], oracle)
        return judged(name, "mismatch", detail=d) if d else None

    def recovery(name: str) -> Outcome | None:
        """One good step on both sides after a failed phase: the same outcome, the same
        values. (It may fail itself, typed, on both sides: an lr sequence that ran out.)"""
        prep = lambda w: w.good_grads(77)                     # noqa: E731
        run = lambda w, a: w.opt.step(a[0], **a[1])           # noqa: E731
        mode["values"] = mode["values"] and step_is_tame(comp.opt, case, prep(comp))
        errors = []
        for w in (comp, ref):
            try:
                run(w, prep(w))
                errors.append(None)
            except BaseException as e:   # noqa: B902
                if isinstance(e, KeyboardInterrupt):
                    raise
                errors.append(e)
        ec, er = errors
        if ec is not None and not isinstance(ec, TYPED):
            return judged(f"{name}+recovery", "crash", ec, "a good step after the failed call")
        if type(ec) is not type(er):
            return judged(f"{name}+recovery", "divergent", ec or er,
                          f"a good step after the failed call: compiled {type(ec).__name__}, "
                          f"reference {type(er).__name__}")
        if ec is not None:
            return None
        done.append((prep, run))
        d = compare(comp.opt, ref.opt, close, f"{name}+recovery", mode["values"], oracle)
        return judged(f"{name}+recovery", "mismatch", detail=d) if d else None

    # construction
    out = phase("construct", lambda w: None, lambda w, a: w.construct(), snap=False)
    if out is not None:
        return out
    changed = [i for i, a in enumerate(comp.arrays) if a.tobytes() != comp.before[i]]
    if changed:
        return judged("construct", "param-written",
                      detail=f"parameters {changed} changed by the constructor")
    for k in range(case.warmup):
        out = phase(f"warmup{k}", lambda w, k=k: w.good_grads(100 + k),
                    lambda w, a: w.opt.step(a[0], **a[1]))
        if out is not None:
            return out
    if case.set_hyper is not None:
        kw = {} if case.set_group is None else {"group": case.set_group}
        out = phase("set_hyper", lambda w: None,
                    lambda w, a: w.opt.set_hyper(**_made(case.set_hyper), **kw), check_grads=False)
        if out is not None:
            return out
    # a gradient that is another parameter moves during the step: no grad-written check
    moving = isinstance(case.grads, list) and any(g.kind == "alias-other-param" for g in case.grads)
    out = phase("step", lambda w: w.step_args(), lambda w, a: w.opt.step(a[0], **a[1]),
                check_grads=not moving)
    if out is not None:
        return out
    return Outcome("skipped" if case.expect.get("step") == "skip" else "ok", "step", notes=notes,
                   values_compared=mode["values"])


def _grad_bytes(grads) -> list:
    gl, ins = grads
    out = []
    items = list(gl) if isinstance(gl, (list, tuple)) else []
    for lst in ins.values():
        items += list(lst) if isinstance(lst, (list, tuple)) else []
    for g in items:
        if isinstance(g, np.ndarray):
            out.append(g.tobytes())
        elif isinstance(g, RowSparse):
            out.append(np.asarray(g.rows).tobytes())
    return out



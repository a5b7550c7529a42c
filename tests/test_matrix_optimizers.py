"""THOR and Muon (specs/thor.py, specs/muon.py) against the independent oracles in
matrix_oracles.py, plus THOR's statistics contract and a loose check against
torch.optim.Muon.

Problem: one optimizer over seven parameters of different shapes, all stepped together:
square 16x16, wide 8x24, tall 24x8, a row 1x17, a column 17x1, 33x65 (odd sizes, and
C = 65 > 32 = batch: A is rank-deficient, only damping makes it invertible) and a 1-D
bias of 16 (THOR: no preconditioning; Muon: AdamW). Everything runs STEPS = 50 steps
and is compared after each step of CHECK_AT, for both backends ("compiled" kernels and
the "reference" interpreter) and both dtypes.

THOR's data behave like a layer's: every step draws a fresh batch of 32 inputs
a [32, C] (N(0, 1) plus a fixed per-feature offset) and output gradients delta [32, R]
(N(0, 1) / 32, the gradient of a *mean* loss), and the step's gradient is delta^T a,
A = a^T a, G = delta^T delta: random SPD (semi-definite where the batch is smaller than
the side) statistics consistent with the gradient. Like a trainer, the test passes A=
and G= only when ``opt.refresh_due`` (which must equal the rule's schedule).
Muon's gradients are 0.5 * (fixed per-element offset + N(0, 1)), so that the momentum
buffer does not hover at 0, and its initial weights are small (0.05 * N(0, 1)) so that
the weights are dominated by the orthogonalized updates a mistake would change.

Inputs: optgen gets arrays of the tested dtype; the float64 oracle gets the very same
arrays (the float32 initial weights, gradients and statistics, converted exactly). The
oracle rounds THOR's inverses to the parameter dtype when storing them, as the rule does.

Tolerances (``TOL``): assert_allclose with rtol and atol = ATOL_REL * max|expected| over
the compared array (an element near 0 carries the round-off of its larger neighbours;
relative to itself that is unbounded).

* float32, rtol 1e-4. Matrix products and inverses accumulate more round-off than the
  elementwise rules (tests/test_oracles.py uses 1e-5). Measured with a float32 run of the
  oracles against the float64 ones on exactly this problem: Muon's errors beyond rtol 1e-4
  stay below 1.0e-6 * max|expected| (the Newton-Schulz output X; w, buffer, AdamW states
  <= 2.3e-7), so ATOL_REL = 1e-5 (10x margin). THOR is worse conditioned: on 33x65 the
  damped G (33 x 33 from 32 samples) has eigenvalues near the damping 0.03, and
  d = G_inv g A_inv reaches norm ~2e3 from a gradient of norm ~10; the float32 oracle's
  momentum is then 2.3e-5 * max|m| off, so ATOL_REL = 1e-4 (4x margin). The inverses
  themselves are computed in float64 and rounded once (<= 6e-8 relative).
  A rule mistake is far larger: a misplaced batch_size, a missing weight decay term
  (0.01 * w against |d| ~ 15: ~1e-3), a wrong Nesterov form or NS coefficient is >= 1e-3
  of the compared values.
* float64, rtol 1e-9, ATOL_REL 1e-9: the oracle against a different float64
  implementation (Cholesky-based inverses) differs by <= 5e-11 relative on any element,
  <= 4e-15 * max beyond rtol 1e-12.

torch.optim.Muon (torch >= 2.9) runs Newton-Schulz in bfloat16, so it cannot match to
1e-4: ``test_muon_loosely_matches_torch`` only asks for the same momentum buffer (it is
kept in full precision) and a per-step update direction with cosine similarity > 0.99
(observed >= 0.999).
"""
from __future__ import annotations

import re
import zlib

import numpy as np
import pytest

import optgen
from catalog_oracles import make_oracle
from matrix_oracles import (MuonOracle, ThorOracle, muon_scale, newton_schulz,
                            thor_inverses)

SHAPES = [(16, 16), (8, 24), (24, 8), (1, 17), (17, 1), (33, 65), (16,)]
STEPS = 50
CHECK_AT = (1, 2, 3, 4, 7, 10, 25, 50)
BATCH = 32
BACKENDS = ["compiled", "reference"]
DTYPES = ["float32", "float64"]

# (rtol, ATOL_REL) per optimizer and dtype; see the module docstring
TOL = {("thor", "float32"): (1e-4, 1e-4), ("muon", "float32"): (1e-4, 1e-5),
       ("thor", "float64"): (1e-9, 1e-9), ("muon", "float64"): (1e-9, 1e-9)}

# optgen's name for a state the oracle calls by the first name: the contract fixes THOR's
# names (m, A_inv, G_inv); for Muon any of these conventional names is accepted
STATE_NAMES = {
    "m": ("m",), "A_inv": ("A_inv",), "G_inv": ("G_inv",),
    "momentum_buffer": ("momentum_buffer", "buf", "momentum", "m", "B"),
    "exp_avg": ("exp_avg", "m"), "exp_avg_sq": ("exp_avg_sq", "v"),
}


def seed_for(*parts) -> int:
    """A fixed seed per test case (stable across runs and processes, unlike hash())."""
    return zlib.crc32(repr(parts).encode())


# -- problems -------------------------------------------------------------------------
def thor_problem(seed, dtype, steps=STEPS, shapes=SHAPES, batch=BATCH):
    """(initial weights, [(grads, A, G) per step]) in ``dtype``; A, G None for 1-D."""
    rng = np.random.default_rng(seed)
    w0 = [(0.5 * rng.standard_normal(s)).astype(dtype) for s in shapes]
    offsets = [0.5 * rng.standard_normal(s[1]) if len(s) == 2 else
               rng.standard_normal(s) for s in shapes]
    problem = []
    for _ in range(steps):
        grads, A, G = [], [], []
        for s, off in zip(shapes, offsets):
            if len(s) == 2:
                R, C = s
                a = rng.standard_normal((batch, C)) + off            # the layer's inputs
                delta = rng.standard_normal((batch, R)) / batch      # d mean loss / d out
                grads.append((delta.T @ a).astype(dtype))
                A.append((a.T @ a).astype(dtype))
                G.append((delta.T @ delta).astype(dtype))
            else:
                grads.append((0.1 * (off + rng.standard_normal(s))).astype(dtype))
                A.append(None)
                G.append(None)
        problem.append((grads, A, G))
    return w0, problem


def muon_problem(seed, dtype, steps=STEPS, shapes=SHAPES):
    """(initial weights, [grads per step]) in ``dtype``."""
    rng = np.random.default_rng(seed)
    w0 = [(0.05 * rng.standard_normal(s)).astype(dtype) for s in shapes]
    offsets = [rng.standard_normal(s) for s in shapes]
    return w0, [[(0.5 * (off + rng.standard_normal(off.shape))).astype(dtype)
                 for off in offsets] for _ in range(steps)]


# -- comparison -----------------------------------------------------------------------
def check(actual, expected, what, rtol, atol_rel):
    expected = np.asarray(expected, np.float64)
    actual = np.asarray(actual, np.float64)
    assert actual.shape == expected.shape, \
        f"{what}: optgen has shape {actual.shape}, the rule {expected.shape}"
    atol = atol_rel * float(np.max(np.abs(expected), initial=0.0))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


def opt_state(opt, i, name, label):
    for candidate in STATE_NAMES.get(name, (name,)):
        if candidate in opt.state[i]:
            return opt.state[i][candidate]
    raise AssertionError(f"{label}: parameter {i} has no state {name!r} "
                         f"(optgen has {sorted(opt.state[i])})")


def compare(opt, oracle, step, label, tol):
    for i in range(len(oracle.w)):
        what = f"{label}: parameter {i} {oracle.w[i].shape}"
        check(opt.params[i], oracle.w[i], f"{what}: w after step {step}", *tol)
        for name, value in oracle.states(i).items():
            check(opt_state(opt, i, name, label), value,
                  f"{what}: state {name} after step {step}", *tol)


# -- 1. THOR against its oracle -------------------------------------------------------
THOR_BASE = dict(lr=0.05, damping=0.03, momentum=0.9, batch_size=BATCH, frequency=3)
THOR_CASES = {
    "mom": dict(THOR_BASE),
    "wd": dict(THOR_BASE, weight_decay=1e-2),
    "nesterov-wd": dict(THOR_BASE, use_nesterov=True, weight_decay=1e-2),
    "clip-wd": dict(THOR_BASE, enable_clip_grad=True, weight_decay=1e-3),
    # batch_size 16 with 32-sample statistics: A/16 and G*16 (a swap is 4x off)
    "nesterov-clip-f2": dict(lr=0.02, damping=0.1, momentum=0.8, batch_size=16, frequency=2,
                             use_nesterov=True, enable_clip_grad=True, weight_decay=1e-2),
    "nomom-f5": dict(lr=0.01, damping=1.0, momentum=0.0, batch_size=BATCH, frequency=5,
                     weight_decay=1e-4),
}


def run_thor(hyper, dtype, backend, seed, steps=STEPS, check_at=CHECK_AT):
    w0, problem = thor_problem(seed, dtype, steps)
    params = [w.copy() for w in w0]
    opt = optgen.create("thor", params, backend=backend, **hyper)
    oracle = ThorOracle(w0, store_dtype=np.dtype(dtype), **hyper)
    label = f"thor {dtype} {backend} {hyper}"
    for t, (grads, A, G) in enumerate(problem, 1):
        due = opt.refresh_due
        assert due is oracle.refresh_due, f"{label}: refresh_due={due!r} before step {t}"
        if due:
            opt.step(grads, A=A, G=G)
        else:
            opt.step(grads)
        oracle.step(grads, A, G)
        if t in check_at:
            compare(opt, oracle, t, label, TOL["thor", dtype])
    assert all(p is q for p, q in zip(opt.params, params)), "parameters not updated in place"
    assert all(p.dtype == np.dtype(dtype) for p in params)
    return opt, oracle


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(THOR_CASES))
def test_thor_vs_oracle(case, dtype, backend):
    hyper = THOR_CASES[case]
    _, oracle = run_thor(hyper, dtype, backend, seed_for("thor", case, dtype))
    f = hyper["frequency"]
    refreshed = [t for t, r in enumerate(oracle.refreshed, 1) if r]
    assert refreshed == list(range(1, STEPS + 1, f))
    if hyper.get("enable_clip_grad"):    # the clip both acts and does not act in this run
        flags = [c for step in oracle.clipped for c in step]
        assert any(flags) and not all(flags), f"clip never or always binds: {case}"


def test_thor_momentum_zero_is_preconditioned_sgd():
    """momentum 0, frequency 2: w_t = w_{t-1} - lr * (G_inv g A_inv + wd w), spelled out
    here without the oracle class (a check of the oracle as much as of optgen)."""
    hyper = dict(lr=0.03, damping=0.05, momentum=0.0, batch_size=BATCH, frequency=2,
                 weight_decay=0.02)
    w0, problem = thor_problem(seed_for("thor-sgd"), "float64", steps=5,
                               shapes=[(6, 9), (5,)])
    params = [w.copy() for w in w0]
    opt = optgen.create("thor", params, **hyper)
    w = [x.copy() for x in w0]
    for t, (grads, A, G) in enumerate(problem, 1):
        if t % 2 == 1:
            A_inv, G_inv = thor_inverses(A[0], G[0], hyper["damping"], BATCH)
        opt.step(grads, A=A, G=G)
        w[0] = w[0] - hyper["lr"] * (G_inv @ grads[0] @ A_inv + hyper["weight_decay"] * w[0])
        w[1] = w[1] - hyper["lr"] * (grads[1] + hyper["weight_decay"] * w[1])
        for i in range(2):
            np.testing.assert_allclose(params[i], w[i], rtol=1e-9, atol=1e-12,
                                       err_msg=f"parameter {i} after step {t}")


def test_thor_identity_statistics_is_momentum():
    """Statistics whose damped forms are the identity (A/bs + damping I = I, likewise
    G*bs) make THOR MindSpore's Momentum exactly (catalog oracle)."""
    lam = 0.25
    hyper = dict(lr=0.05, damping=lam, momentum=0.9, batch_size=BATCH, frequency=2,
                 use_nesterov=True, weight_decay=0.01)
    rng = np.random.default_rng(seed_for("thor-identity"))
    shapes = [(7, 5), (7,)]
    w0 = [rng.standard_normal(s) for s in shapes]
    params = [w.copy() for w in w0]
    opt = optgen.create("thor", params, **hyper)
    ref = [make_oracle("momentum", w, lr=0.05, momentum=0.9, use_nesterov=True,
                       weight_decay=0.01) for w in w0]
    A = [BATCH * (1 - lam) * np.eye(5), None]
    G = [(1 - lam) / BATCH * np.eye(7), None]
    for t in range(6):
        grads = [rng.standard_normal(s) for s in shapes]
        opt.step(grads, A=A, G=G)
        for r, g in zip(ref, grads):
            r.step(g)
    np.testing.assert_allclose(opt.state[0]["A_inv"], np.eye(5), rtol=0, atol=1e-14)
    np.testing.assert_allclose(opt.state[0]["G_inv"], np.eye(7), rtol=0, atol=1e-14)
    for i in range(2):
        np.testing.assert_allclose(params[i], ref[i].w, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(opt.state[i]["m"], ref[i].states()["moment"],
                                   rtol=1e-12, atol=1e-14)


def test_thor_huge_damping_is_scaled_momentum():
    """damping -> infinity: A_inv ~ G_inv ~ I/damping, so THOR approaches momentum SGD
    with lr / damping^2 on the 2-D weights (relative deviation ~ |A/bs| / damping)."""
    lam = 1e4
    hyper = dict(lr=0.05, damping=lam, momentum=0.9, batch_size=BATCH, frequency=3)
    w0, problem = thor_problem(seed_for("thor-damping"), "float64", steps=8,
                               shapes=[(8, 12), (6,)])
    params = [w.copy() for w in w0]
    opt = optgen.create("thor", params, **hyper)
    ref = [make_oracle("momentum", w0[0], lr=0.05 / lam ** 2, momentum=0.9),
           make_oracle("momentum", w0[1], lr=0.05, momentum=0.9)]
    for grads, A, G in problem:
        opt.step(grads, A=A, G=G) if opt.refresh_due else opt.step(grads)
        for r, g in zip(ref, grads):
            r.step(g)
    dw, dr = params[0] - w0[0], ref[0].w - w0[0]
    assert np.abs(dw - dr).max() <= 1e-3 * np.abs(dr).max()
    np.testing.assert_allclose(params[1], ref[1].w, rtol=1e-12)


def test_thor_loss_scale():
    """loss_scale=S with gradients multiplied by S: the same steps as unscaled gradients
    (the statistics are not scaled)."""
    hyper = dict(THOR_BASE, weight_decay=1e-2, frequency=2)
    S = 1024.0
    w0, problem = thor_problem(seed_for("thor-loss-scale"), "float64", steps=6)
    params = [w.copy() for w in w0]
    opt = optgen.create("thor", params, loss_scale=S, **hyper)
    oracle = ThorOracle(w0, **hyper)
    for t, (grads, A, G) in enumerate(problem, 1):
        opt.step([S * g for g in grads], A=A, G=G)
        oracle.step(grads, A, G)
    compare(opt, oracle, 6, "thor loss_scale", TOL["thor", "float64"])


def test_thor_named_parameters_default_decay_filter():
    """Parameters passed by name: the default filter leaves biases out of weight decay."""
    hyper = dict(THOR_BASE, weight_decay=0.05)
    w0, problem = thor_problem(seed_for("thor-names"), "float64", steps=7,
                               shapes=[(6, 4), (6,), (3, 6), (3,)])
    names = ["fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"]
    params = {n: w.copy() for n, w in zip(names, w0)}
    opt = optgen.create("thor", params, **hyper)
    oracle = ThorOracle(w0, decay=["bias" not in n for n in names], **hyper)
    for grads, A, G in problem:
        opt.step(grads, A=A, G=G) if opt.refresh_due else opt.step(grads)
        oracle.step(grads, A, G)
    compare(opt, oracle, 7, "thor named", TOL["thor", "float64"])


# -- 2. THOR's refresh schedule and statistics ------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("frequency", [2, 3, 5])
def test_thor_refreshes_exactly_every_frequency_steps(frequency, backend):
    """Statistics passed on every step: A_inv and G_inv are recomputed from the step's
    statistics at t = 1, 1 + f, 1 + 2f, ... and left bit-for-bit alone on the others
    (whose statistics must be ignored); refresh_due says so before each step."""
    hyper = dict(THOR_BASE, frequency=frequency)
    steps = 3 * frequency + 2
    w0, problem = thor_problem(seed_for("thor-refresh", frequency), "float32", steps=steps)
    params = [w.copy() for w in w0]
    opt = optgen.create("thor", params, backend=backend, **hyper)
    matrices = [i for i, w in enumerate(w0) if w.ndim == 2]
    previous = None
    for t, (grads, A, G) in enumerate(problem, 1):
        due = (t - 1) % frequency == 0
        assert isinstance(opt.refresh_due, bool), type(opt.refresh_due)
        assert opt.refresh_due is due, f"refresh_due={opt.refresh_due} before step {t}"
        opt.step(grads, A=A, G=G)
        now = {i: (np.array(opt.state[i]["A_inv"]), np.array(opt.state[i]["G_inv"]))
               for i in matrices}
        for i in matrices:
            R, C = w0[i].shape
            a_inv, g_inv = now[i]
            assert a_inv.shape == (C, C) and g_inv.shape == (R, R), (i, a_inv.shape, g_inv.shape)
            assert a_inv.dtype == np.float32 and g_inv.dtype == np.float32
            if due:
                A_inv, G_inv = thor_inverses(A[i], G[i], hyper["damping"], BATCH)
                check(a_inv, A_inv, f"A_inv {i} after step {t}", 1e-5, 1e-6)
                check(g_inv, G_inv, f"G_inv {i} after step {t}", 1e-5, 1e-6)
                if previous is not None:
                    assert not np.array_equal(a_inv, previous[i][0]), (i, t)
                    assert not np.array_equal(g_inv, previous[i][1]), (i, t)
            else:
                assert np.array_equal(a_inv, previous[i][0]), f"A_inv {i} changed at step {t}"
                assert np.array_equal(g_inv, previous[i][1]), f"G_inv {i} changed at step {t}"
        previous = now
    assert opt.refresh_due is (steps % frequency == 0)


def _snapshot(opt):
    return ([np.array(p) for p in opt.params],
            [{k: np.array(v) for k, v in s.items()} for s in opt.state])


def _assert_untouched(opt, snap, what):
    params, states = snap
    for i, (p, q) in enumerate(zip(opt.params, params)):
        assert np.array_equal(p, q), f"{what}: parameter {i} changed"
    for i, (s, q) in enumerate(zip(opt.state, states)):
        assert set(s) == set(q), f"{what}: states of parameter {i} changed"
        for k in q:
            assert np.array_equal(np.array(s[k]), q[k]), f"{what}: state {k} of {i} changed"


def _named_thor(backend, seed):
    names = ["fc1_weight", "fc1_bias", "fc2_weight"]
    w0, problem = thor_problem(seed, "float32", steps=8, shapes=[(8, 5), (8,), (3, 8)])
    params = {n: w.copy() for n, w in zip(names, w0)}
    return optgen.create("thor", params, backend=backend, **THOR_BASE), problem


@pytest.mark.parametrize("backend", BACKENDS)
def test_thor_missing_statistic_on_a_refresh_step(backend):
    """A refresh step without a 2-D parameter's A or G (None in the list, or no A=/G= at
    all) is a ValueError naming the parameter, raised before anything is updated: the
    weights, the states and the schedule are left as they were. (The failing parameter is
    the last one, so a runtime that updates as it goes would already have changed
    parameter 0.)"""
    opt, problem = _named_thor(backend, seed_for("thor-missing", backend))
    for t, (grads, A, G) in enumerate(problem[:5], 1):
        if t in (1, 4):                                 # refresh steps (frequency 3)
            assert opt.refresh_due
            snap = _snapshot(opt)
            bad = [
                dict(A=[A[0], None, None], G=G),        # A of fc2_weight missing
                dict(A=A, G=[G[0], None, None]),        # G of fc2_weight missing
            ]
            for kw in bad:
                with pytest.raises(ValueError, match=r"parameter 2|fc2_weight"):
                    opt.step(grads, **kw)
                _assert_untouched(opt, snap, f"step {t} {kw}")
            with pytest.raises(ValueError, match=r"parameter 0|fc1_weight"):
                opt.step(grads, A=[None, None, A[2]], G=G)
            _assert_untouched(opt, snap, f"step {t}, A of fc1_weight missing")
            with pytest.raises(ValueError):
                opt.step(grads)                         # no statistics at all
            _assert_untouched(opt, snap, f"step {t} without A=/G=")
            assert opt.refresh_due, "a rejected step advanced the schedule"
            opt.step(grads, A=A, G=G)
        else:
            assert not opt.refresh_due
            opt.step(grads)                             # not needed between refreshes
    assert opt.t == 5, opt.t                          # rejected steps do not count


@pytest.mark.parametrize("backend", BACKENDS)
def test_thor_wrong_statistic_shape(backend):
    """A statistic of the wrong shape (A must be C x C, G R x R, with W [R, C]) is a
    ValueError, raised before anything is updated."""
    opt, problem = _named_thor(backend, seed_for("thor-shape", backend))
    grads, A, G = problem[0]
    snap = _snapshot(opt)
    f32 = np.float32
    bad = [
        dict(A=[A[0], None, np.eye(3, dtype=f32)], G=G),            # R x R given for A
        dict(A=A, G=[G[0], None, np.eye(8, dtype=f32)]),            # C x C given for G
        dict(A=[np.eye(6, dtype=f32), None, A[2]], G=G),            # C + 1
        dict(A=[A[0][:, :4], None, A[2]], G=G),                     # not square
        dict(A=[A[0].reshape(-1), None, A[2]], G=G),                # flattened
    ]
    for kw in bad:
        with pytest.raises(ValueError):
            opt.step(grads, **kw)
        _assert_untouched(opt, snap, f"shape {[None if a is None else a.shape for a in kw['A']]}"
                                     f" {[None if g is None else g.shape for g in kw['G']]}")
    assert opt.refresh_due
    opt.step(grads, A=A, G=G)                      # the right shapes still work


# -- 3. Muon against its oracle -------------------------------------------------------
MUON_BASE = dict(lr=0.02, momentum=0.95, nesterov=True, ns_steps=5, weight_decay=0.0,
                 match_rms_adamw=False)
MUON_CASES = {
    "nesterov": dict(MUON_BASE),
    "plain-wd": dict(MUON_BASE, nesterov=False, weight_decay=0.1),
    "rms-adamw-ns3-wd": dict(MUON_BASE, match_rms_adamw=True, ns_steps=3, weight_decay=0.05),
    # the classic cubic iteration 1.5 X - 0.5 X X^T X (ns_c = 0), more steps
    "cubic-ns8-mom0.8": dict(MUON_BASE, momentum=0.8, ns_steps=8, ns_a=1.5, ns_b=-0.5,
                             ns_c=0.0),
    # AdamW's own hyperparameters, visible eps; one Newton-Schulz step
    "adamw-hypers-ns1": dict(MUON_BASE, lr=0.01, nesterov=False, match_rms_adamw=True,
                             ns_steps=1, weight_decay=0.1, beta1=0.8, beta2=0.99, eps=1e-3),
}


def create_muon(params, **hyper):
    """optgen.create("muon", ...) from the oracle's settings: its ``match_rms_adamw`` is
    the spec's ``rms_scale=0.2`` (torch's adjust_lr_fn="match_rms_adamw"); without it
    rms_scale stays unset, the scale sqrt(max(1, R / C))."""
    hyper = dict(hyper)
    if hyper.pop("match_rms_adamw", False):
        hyper["rms_scale"] = 0.2
    return optgen.create("muon", params, **hyper)


def run_muon(hyper, dtype, backend, seed, steps=STEPS, check_at=CHECK_AT):
    w0, problem = muon_problem(seed, dtype, steps)
    params = [w.copy() for w in w0]
    opt = create_muon(params, backend=backend, **hyper)
    oracle = MuonOracle(w0, **hyper)
    label = f"muon {dtype} {backend} {hyper}"
    for t, grads in enumerate(problem, 1):
        opt.step(grads)
        oracle.step(grads)
        if t in check_at:
            compare(opt, oracle, t, label, TOL["muon", dtype])
    assert all(p is q for p, q in zip(opt.params, params)), "parameters not updated in place"
    assert all(p.dtype == np.dtype(dtype) for p in params)
    return opt, oracle


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(MUON_CASES))
def test_muon_vs_oracle(case, dtype, backend):
    run_muon(MUON_CASES[case], dtype, backend, seed_for("muon", case, dtype))


def test_muon_rms_scale():
    """rms_scale=0.2 scales the 2-D update by 0.2 * sqrt(max(R, C)) (torch's
    adjust_lr_fn="match_rms_adamw"); unset, by sqrt(max(1, R / C))."""
    g = np.random.default_rng(seed_for("muon-flag")).standard_normal((6, 10))
    for flag in (False, True):
        w = np.zeros((6, 10))
        hyper = {k: v for k, v in MUON_BASE.items() if k != "match_rms_adamw"}
        opt = optgen.create("muon", [w], **dict(hyper, nesterov=False),
                            **({"rms_scale": 0.2} if flag else {}))
        opt.step([g])
        check(w, -0.02 * muon_scale(w.shape, flag) * newton_schulz(g), f"flag {flag}",
              1e-9, 1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_muon_single_step_is_scaled_orthogonalization(backend):
    """Step 1 from w = 0 with nesterov off: B = (1 - momentum) g and w = -lr * scale * X,
    X = NS(g) (the normalization removes the (1 - momentum)), spelled out without the
    oracle class."""
    rng = np.random.default_rng(seed_for("muon-one", backend))
    for shape in [(16, 16), (8, 24), (24, 8), (33, 65)]:
        for match in (False, True):
            w = np.zeros(shape)
            g = rng.standard_normal(shape)
            opt = create_muon([w], backend=backend,
                              **dict(MUON_BASE, nesterov=False, match_rms_adamw=match))
            opt.step([g])
            X = newton_schulz(g)
            assert np.linalg.svd(X, compute_uv=False).max() < 1.21
            check(w, -0.02 * muon_scale(shape, match) * X, f"{shape} {match}", 1e-9, 1e-9)
            check(opt_state(opt, 0, "momentum_buffer", "muon"), 0.05 * g, "buffer", 1e-12, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_muon_zero_gradient(backend):
    """A zero gradient: ||X|| is clamped to ns_eps, so no NaN and no update beyond the
    weight decay; AdamW parameters likewise."""
    w0 = [np.full((4, 6), 0.5), np.full((5,), -0.5)]
    params = [w.copy() for w in w0]
    opt = create_muon(params, backend=backend, **dict(MUON_BASE, weight_decay=0.1))
    opt.step([np.zeros((4, 6)), np.zeros(5)])
    for p, w in zip(params, w0):
        assert np.all(np.isfinite(p))
        np.testing.assert_allclose(p, w * (1 - 0.02 * 0.1), rtol=1e-12)


def test_muon_loosely_matches_torch():
    """torch.optim.Muon on the 2-D shapes, float32, 20 steps, same gradients: its
    Newton-Schulz runs in bfloat16 (~1e-2 relative), so only the momentum buffer (full
    precision) is compared closely, and each step's update w_t - w_{t-1} in direction
    (cosine similarity > 0.99), for optgen and for the oracle."""
    torch = pytest.importorskip("torch", reason="needs torch")
    if not hasattr(torch.optim, "Muon"):
        pytest.skip(f"torch {torch.__version__} has no torch.optim.Muon (added in 2.9)")
    shapes = [s for s in SHAPES if len(s) == 2]
    for nesterov in (True, False):
        for adjust in (None, "match_rms_adamw"):
            hyper = dict(MUON_BASE, nesterov=nesterov, weight_decay=0.1,
                         match_rms_adamw=adjust is not None)
            w0, problem = muon_problem(seed_for("muon-torch", nesterov, adjust), "float32",
                                       steps=20, shapes=shapes)
            params = [w.copy() for w in w0]
            opt = create_muon(params, **hyper)
            oracle = MuonOracle(w0, **hyper)
            tp = [torch.nn.Parameter(torch.tensor(w)) for w in w0]
            topt = torch.optim.Muon(tp, lr=0.02, weight_decay=0.1, momentum=0.95,
                                    nesterov=nesterov, ns_steps=5, adjust_lr_fn=adjust)
            worst = {"optgen": 1.0, "oracle": 1.0}
            for t, grads in enumerate(problem, 1):
                before = [np.array(p, np.float64) for p in params]
                before_t = [p.detach().numpy().astype(np.float64) for p in tp]
                before_o = [w.copy() for w in oracle.w]
                opt.step(grads)
                oracle.step(grads)
                for p, g in zip(tp, grads):
                    p.grad = torch.tensor(g)
                topt.step()
                for i in range(len(shapes)):
                    dt = tp[i].detach().numpy().astype(np.float64) - before_t[i]
                    for who, d in (("optgen", params[i] - before[i]),
                                   ("oracle", oracle.w[i] - before_o[i])):
                        cos = float(np.sum(d * dt) / (np.linalg.norm(d) * np.linalg.norm(dt)))
                        worst[who] = min(worst[who], cos)
                    buf = topt.state[tp[i]]["momentum_buffer"].numpy()
                    check(opt_state(opt, i, "momentum_buffer", "muon"), buf,
                          f"buffer {shapes[i]} step {t}", 1e-5, 1e-6)
            assert worst["optgen"] > 0.99 and worst["oracle"] > 0.99, (nesterov, adjust, worst)


# -- 4. the oracles themselves ---------------------------------------------------------
def _ns_scalar(x, steps=5, coeffs=(3.4445, -4.7750, 2.0315)):
    a, b, c = coeffs
    for _ in range(steps):
        x = a * x + b * x ** 3 + c * x ** 5
    return x


def test_newton_schulz_singular_values():
    """Keller Jordan's quintic iteration maps each singular value sigma of u (relative to
    ||u||_F) through the scalar polynomial iteration, keeping the singular vectors:
    X = U diag(p^5(sigma / ||u||)) V^T. p^5 sends [0.002, 1] into [0.68, 1.21] (not to 1:
    the coefficients trade accuracy for speed); singular values below 0.002 * ||u|| stay
    small (a random square matrix has some)."""
    rng = np.random.default_rng(0)
    grid = np.linspace(0.002, 1.0, 100_001)
    assert 0.68 < _ns_scalar(grid).min() and _ns_scalar(grid).max() < 1.21
    for shape in [(16, 16), (8, 24), (24, 8), (1, 17), (17, 1), (33, 65), (65, 33)]:
        u = rng.standard_normal(shape)
        U, sigma, Vt = np.linalg.svd(u, full_matrices=False)
        X = newton_schulz(u)
        expected = U @ np.diag(_ns_scalar(sigma / np.linalg.norm(u))) @ Vt
        np.testing.assert_allclose(X, expected, rtol=0, atol=1e-12, err_msg=str(shape))
        s = np.linalg.svd(X, compute_uv=False)
        assert s.max() < 1.21 and s[sigma >= 0.002 * np.linalg.norm(u)].min() > 0.68, shape
        # the cubic iteration 1.5 X - 0.5 X X^T X with many steps converges to U V^T
        X = newton_schulz(u, steps=60, coeffs=(1.5, -0.5, 0.0))
        np.testing.assert_allclose(X, U @ Vt, atol=1e-9, err_msg=str(shape))


@pytest.mark.parametrize("name", ["muon", "thor"])
@pytest.mark.parametrize("low", ["float16"])
def test_low_precision_matrix_parameter_is_refused_at_construction(name, low):
    """Matrix products have float32/float64 kernels and bfloat16 ones with a master
    (test_matrix_low_precision.py): a float16 2-D parameter under multi_precision is a
    TypeError when the optimizer is made (found by the fuzzer: it used to pass
    construction, then fail in the first step after counting it), while a float16 1-D
    parameter (Muon's AdamW fallback) is fine."""
    from optgen.runtime import tensors
    dt = tensors.numpy_dtype(low)
    w = np.zeros((4, 3), dt)
    with pytest.raises(TypeError, match=rf"parameter 0 has dtype {low}; its rule \(flags .*"
                                        r"'matrix': True.*\) has kernels for bfloat16, "
                                        r"float32, float64 only \(matrix products"):
        optgen.create(name, [w], multi_precision=True)
    if name == "muon":
        b = np.zeros(5, dt)
        opt = optgen.create(name, [b], multi_precision=True)
        assert opt.step([np.ones(5, dt)]) and opt.t == 1

"""Matrix rules (SOAP, Shampoo, Muon, THOR) on bfloat16 weights: through a float32 master
(``multi_precision=True``), a split master (``master_format`` "split16"/"split8":
optgen/core/formats/split.py) and bfloat16 states (``state_format="bf16"``).

Each run is compared with the float32 run fed the same (bfloat16) gradients:

* a float32 or split16 master is a float32 master: the master and every state equal the
  float32 run's bit for bit, and the weight is that master rounded (nearest, ties away
  from zero for split16), over steps that refresh the bases and roots;
* a split8 master's 8-bit correction is FlashOptim's, |decoded - θ| <= ULP(θ')/254 per
  encode; these rules' direction does not read the weight, so the states still equal the
  float32 run's and the master's distance from it is at most the sum of the per-step
  bounds;
* bfloat16 states (m, v; the square statistics and bases keep float32) round each step:
  their weights stay within a few bfloat16 steps' worth of lr of the float32 run's, and
  the deviation is no larger than heavyball's with its bfloat16 storage (``storage_dtype``)
  and 8-bit weight correction (``param_ecc="bf16+8"``) from heavyball's own float32 run.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import optgen
from optgen.core import formats
from helpers import EXHAUSTIVE, statistics

BF16 = ml_dtypes.bfloat16
S16, S8 = formats.of("split16"), formats.of("split8")
SHAPES = [(12, 8), (8,)]          # a preconditioned matrix and a 1-D parameter
STEPS = 6
HYPER = {"soap": dict(lr=1e-2, precondition_frequency=2),
         "shampoo": dict(lr=1e-2, precondition_frequency=2, epsilon=1e-3),
         "torch_muon": dict(lr=2e-2),
         "thor": dict(learning_rate=1e-2)}
RULES = [pytest.param(n, marks=() if n == "soap" else EXHAUSTIVE) for n in HYPER]


def _shapes(name):
    return SHAPES[:1] if name == "thor" else SHAPES     # (THOR: 2-D parameters)


def _run(name, params, grads, rng_seed=3, **options):
    """``params`` stepped by ``name`` with ``grads`` (one list per step); THOR's
    statistics drawn from the same seed for every run."""
    opt = optgen.create(name, params, **HYPER[name], **options)
    rng = np.random.default_rng(rng_seed)
    for g in grads:
        opt.step(g, **statistics(opt, rng))
    return opt


def _problem(name, seed=0):
    rng = np.random.default_rng(seed)
    theta = [(rng.standard_normal(s) * 0.5).astype(np.float32) for s in _shapes(name)]
    grads = [[(rng.standard_normal(s) * 0.1).astype(BF16) for s in _shapes(name)]
             for _ in range(STEPS)]
    ref = _run(name, [t.copy() for t in theta],
               [[g.astype(np.float32) for g in gs] for gs in grads])
    return theta, grads, ref


def _assert_states_equal(opt, ref, skip=("w__corr",)):
    for i, (mine, want) in enumerate(zip(opt.state, ref.state)):
        assert set(mine) - set(skip) == set(want)
        for n, v in want.items():
            np.testing.assert_array_equal(np.asarray(mine[n]), np.asarray(v),
                                          err_msg=f"parameter {i} state {n}")


@pytest.mark.parametrize("name", RULES)
def test_float32_master_is_the_float32_run(name):
    theta, grads, ref = _problem(name)
    opt = _run(name, [t.astype(BF16) for t in theta], grads, multi_precision=True)
    # (the master starts from the bfloat16 weight: the float32 run from the same values)
    ref = _run(name, [t.astype(BF16).astype(np.float32) for t in theta],
               [[g.astype(np.float32) for g in gs] for gs in grads])
    for i in range(len(theta)):
        master = opt.state[i]["master"]
        np.testing.assert_array_equal(master, ref.params[i])
        np.testing.assert_array_equal(opt.params[i], master.astype(BF16))
    _assert_states_equal(opt, ref, skip=("master",))


@pytest.mark.parametrize("name", RULES)
def test_split16_is_the_float32_run(name):
    theta, grads, ref = _problem(name)
    pairs = [S16.family.encode(S16, t) for t in theta]
    opt = optgen.create(name, [w for w, _ in pairs], master_format="split16", **HYPER[name])
    for i, (_, corr) in enumerate(pairs):
        opt.state[i]["w__corr"][...] = corr           # the master: theta exactly
    rng = np.random.default_rng(3)
    for gs in grads:
        opt.step(gs, **statistics(opt, rng))
    for i in range(len(theta)):
        w, corr = S16.family.encode(S16, ref.params[i])   # the float32 run, split
        np.testing.assert_array_equal(opt.params[i].view(np.uint16), w.view(np.uint16))
        np.testing.assert_array_equal(opt.state[i]["w__corr"], corr)
    _assert_states_equal(opt, ref)


def _split8_bound(weights: np.ndarray) -> np.ndarray:
    """ULP(θ') / 254 of bfloat16 weights θ' (zero and subnormals: the spacing 2^-133)."""
    tp = weights.astype(np.float64)
    e = np.where(np.isfinite(tp) & (tp != 0), np.maximum(np.frexp(tp)[1] - 1, -126), -126)
    return np.ldexp(1.0, e - 7) / 254


@pytest.mark.parametrize("name", [pytest.param(n, marks=EXHAUSTIVE) for n in HYPER])
def test_split8_is_within_its_bound_of_the_float32_run(name):
    theta, grads, ref = _problem(name)
    pairs = [S8.family.encode(S8, t) for t in theta]
    opt = optgen.create(name, [w for w, _ in pairs], master_format="split8", **HYPER[name])
    for i, (_, corr) in enumerate(pairs):
        opt.state[i]["w__corr"][...] = corr
    start = [S8.family.decode(S8, w, c) for w, c in pairs]
    bound = [np.abs(s - t).astype(np.float64) for s, t in zip(start, theta)]
    rng = np.random.default_rng(3)
    for gs in grads:
        opt.step(gs, **statistics(opt, rng))
        for i, w in enumerate(opt.params):
            bound[i] = bound[i] + _split8_bound(w) + 4e-7 * np.abs(ref.params[i])
    for i in range(len(theta)):
        mine = S8.family.decode(S8, opt.params[i], opt.state[i]["w__corr"])
        err = np.abs(mine.astype(np.float64) - ref.params[i])
        assert (err <= bound[i]).all(), (i, float(err.max()), float(bound[i].max()))
        assert err.max() > 0                       # (8 bits: not the float32 master)
    _assert_states_equal(opt, ref)

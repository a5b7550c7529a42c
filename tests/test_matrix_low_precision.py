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
from helpers import EXHAUSTIVE, assert_close, statistics

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
    """The reference interpreter (backend="reference") agrees to float32 round-off (its
    products are numpy's, summed in another order)."""
    theta, grads, ref = _problem(name)
    pairs = [S16.family.encode(S16, t) for t in theta]
    opts = [optgen.create(name, [w.copy() for w, _ in pairs], master_format="split16",
                          backend=b, **HYPER[name]) for b in ("compiled", "reference")]
    for opt in opts:
        for i, (_, corr) in enumerate(pairs):
            opt.state[i]["w__corr"][...] = corr       # the master: theta exactly
        rng = np.random.default_rng(3)
        for gs in grads:
            opt.step(gs, **statistics(opt, rng))
    opt, interpreted = opts
    for i, (mine, want) in enumerate(zip(interpreted.state, opt.state)):   # (the masters:
        for n in set(want) - {"w__corr"}:                                 # decoded below)
            assert_close(np.asarray(mine[n]), np.asarray(want[n]), "float32",
                         f"{name} interpreted parameter {i} state {n}")
    for i in range(len(theta)):
        assert_close(S16.family.decode(S16, interpreted.params[i],
                                       interpreted.state[i]["w__corr"]),
                     ref.params[i], "float32", f"{name} interpreted master {i}")
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


def _heavyball_soap():
    heavyball = pytest.importorskip("heavyball", reason="heavyball is not installed")
    import heavyball.utils
    heavyball.utils.compile_mode = None           # (eager: its compile takes minutes)
    heavyball.utils.compile_mode_recommended_to_none = None
    return heavyball.SOAP


@EXHAUSTIVE
@pytest.mark.parametrize("seed", [0, 1])
def test_bf16_states_deviate_no_more_than_heavyballs(seed):
    """SOAP with bfloat16 m and v (the torch drop-in) against heavyball's SOAP with
    ``storage_dtype="bfloat16"``, each measured from its own float32 run (the rules differ
    in details, so the runs are not compared with each other): the largest weight
    difference over the largest distance travelled in 20 steps. Measured (seeds 0-2):
    optgen 0.0027-0.0035, heavyball 0.0040-0.0057. A bfloat16 weight with a split8
    master and bfloat16 states stays as close (its decoded master)."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import optgen.torch as otorch
    hb_soap = _heavyball_soap()
    gen = torch.Generator().manual_seed(seed)
    w0 = (torch.randn(16, 12, generator=gen) * 0.5).to(torch.bfloat16).float()
    grads = [(torch.randn(16, 12, generator=gen) * 0.1).to(torch.bfloat16).float()
             for _ in range(20)]
    hyper = dict(lr=1e-2, betas=(0.95, 0.95), shampoo_beta=0.95, weight_decay=0.01,
                 precondition_frequency=2)
    hb_only = dict(max_precond_dim=10000, merge_dims=False)

    def run(make, dtype=torch.float32):
        w = torch.nn.Parameter(w0.clone().to(dtype))
        opt = make([w])
        for g in grads:
            w.grad = g.to(dtype)
            opt.step()
        return w, opt

    def deviation(low, full):
        return float((low - full).abs().max() / (full - w0).abs().max())
    bf16 = dict(state_format="bf16", state_format_min_size=0)
    full, _ = run(lambda p: otorch.SOAP(p, **hyper))
    low, opt = run(lambda p: otorch.SOAP(p, **hyper, **bf16))
    assert opt.state[low]["m"].dtype == torch.bfloat16 == opt.state[low]["v"].dtype
    assert opt.state[low]["L"].dtype == torch.float32
    hb_full, _ = run(lambda p: hb_soap(p, **hyper, **hb_only))
    hb_low, _ = run(lambda p: hb_soap(p, **hyper, **hb_only, storage_dtype="bfloat16"))
    mine, theirs = deviation(low.detach(), full.detach()), \
        deviation(hb_low.detach(), hb_full.detach())
    assert 0 < mine <= max(theirs, 2e-3) and mine < 1e-2, (mine, theirs)
    w, opt = run(lambda p: otorch.SOAP(p, **hyper, **bf16, master_format="split8"),
                 torch.bfloat16)
    master = S8.family.decode(S8, w.detach().view(torch.int16).numpy().view(BF16),
                              opt.state[w]["w__corr"].numpy())
    assert deviation(torch.from_numpy(master), full.detach()) <= max(theirs, 2e-3) + 1e-3

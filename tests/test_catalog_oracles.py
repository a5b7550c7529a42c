"""Every spec of docs/catalog.md against the independent oracles in catalog_oracles.py.

Conventions are those of test_oracles.py (see its docstring): optgen's float32 kernels are
compared with float64 oracles fed the very same float32 inputs (initial parameters and
every gradient); rtol = RTOL = 1e-5 plus atol = ATOL_REL * max|expected| over the compared
array; fresh gradients every step, GRAD_SCALE * (per-element bias + N(0, 1)); parameter
and every state named in the contract compared after the CHECK_AT steps of 100.

The grid: every spec x its configurations (``CASES``, below: every flag value, and
non-default hyperparameters wherever a default would hide a term) x 4 shapes x
rescale_grad {1, 0.14} x clip_gradient {None, 0.5} x weight_decay {0, 0.03}. For the
decoupled specs (adamweightdecay, adamw, lion, lamb, adafactor, cautious_adamw, mars_adamw,
schedule_free_adamw) the weight-decay axis is their own weight_decay; for lars it is the
base's weight_decay that enters lambda.

Sign-based rules (signum, lion): ``sign(c)`` jumps at c = 0, so an element whose c lies
within float32 round-off of 0 may legitimately take the other sign in a float32 kernel
(a 2*lr difference in w, and with coupled weight decay in everything after). The oracle
records such elements (|c| <= 1e-5 * the magnitude of c's terms) and they are left out
of the comparison from then on; fewer than 1% may be left out.

Also here: torch.optim comparisons where torch has the optimizer (torch in float64, the
same gradients), the contract's constraints, the defaults, the whole-tensor specs with a
zero parameter, and lazy row-sparse updates.
"""
from __future__ import annotations

import math
import zlib
import re

import numpy as np
import pytest

import optgen
from catalog_oracles import (DEFAULTS, LARS_DEFAULT_BASE, PREPROC_DEFAULTS, densify,
                             make_oracle, preprocess)
from helpers import sampled_product
from test_oracles import (CHECK_AT, CLIP, PREPROC, PREPROC_IDS, RESCALE, SHAPE_IDS, SHAPES,
                          STEPS, TORCH_PREPROC, TORCH_PREPROC_IDS, TORCH_REASON, WD,
                          make_problem, seed_for, tol)

MAX_AMBIGUOUS = 0.01     # fraction of elements a sign-based rule may leave out


# -- comparison helpers ------------------------------------------------------------------
def check(actual, expected, what, mask=None):
    """assert_allclose at the file's tolerance; arrays are compared by value after a
    reshape to the oracle's shape (a state may be stored flat or with kept dims)."""
    expected = np.asarray(expected, np.float64)
    actual = np.asarray(actual, np.float64)
    if expected.ndim == 0:
        np.testing.assert_allclose(actual.reshape(()), expected, err_msg=what, **tol(expected))
        return
    assert actual.size == expected.size, \
        f"{what}: optgen has shape {actual.shape}, the contract {expected.shape}"
    actual = actual.reshape(expected.shape)
    kw = tol(expected)
    if mask is not None and mask.shape == expected.shape and mask.any():
        actual, expected = actual[~mask], expected[~mask]
    np.testing.assert_allclose(actual, expected, err_msg=what, **kw)


def compare(opt, oracle, step, label, i=0):
    mask = oracle.ambiguous
    assert mask.mean() <= MAX_AMBIGUOUS, \
        f"{label}: {mask.mean():.2%} of the elements had an ambiguous sign by step {step}"
    check(opt.params[i], oracle.w, f"{label}: w after step {step}", mask)
    for name, value in oracle.states().items():
        assert name in opt.state[i], \
            f"{label}: optgen has no state {name!r} (has {sorted(opt.state[i])})"
        check(opt.state[i][name], value, f"{label}: state {name} after step {step}", mask)


def create(spec, params, hyper):
    return optgen.create(spec, params, **hyper)


def run_vs_oracle(spec, hyper, shape, seed, steps=STEPS, check_at=CHECK_AT, w0=None):
    w_init, grads = make_problem(shape, seed)
    if w0 is not None:
        w_init = np.asarray(w0, np.float32).reshape(shape)
    w = w_init.copy()
    opt = create(spec, [w], hyper)
    oracle = make_oracle(spec, w_init, **hyper)
    label = f"{spec} {shape} {hyper}"
    for t in range(1, steps + 1):
        g = next(grads)
        opt.step([g])
        oracle.step(g)
        if t in check_at:
            compare(opt, oracle, t, label)
    assert opt.params[0] is w and w.dtype == np.float32      # updated in place
    return opt, oracle


# -- 1. the table: every spec, every flag, against its oracle -----------------------------
# spec -> {configuration id: hyperparameters}. The preprocessing axes are added by the grid.
CASES: dict[str, dict[str, dict]] = {
    "sgd": {                    # (test_oracles.py has more sgd; these cover the flag)
        "nesterov": dict(momentum=0.9, nesterov=True),
        "mom-damp": dict(momentum=0.9, dampening=0.3),
        "plain": dict(),                                   # lr default 0.01, no momentum
    },
    "momentum": {
        "lr0.01": dict(lr=0.01),                           # momentum default 0.9
        "nesterov": dict(lr=0.01, momentum=0.8, use_nesterov=True),
    },
    "nag": {
        "lr0.01": dict(lr=0.01, momentum=0.8),
    },
    "signum": {
        "mom-wd_lh": dict(lr=0.01, momentum=0.9, wd_lh=0.05),
        "signsgd": dict(lr=0.01, momentum=0.0),
    },
    "adam": {                   # eps=1e-3: eps visible; 1e-8: invisible at rtol 1e-5
        "eps1e-3": dict(lr=0.01, eps=1e-3),
        "nesterov": dict(lr=0.01, use_nesterov=True),
        "nesterov-eps1e-3": dict(lr=0.01, eps=1e-3, beta1=0.8, beta2=0.99, use_nesterov=True),
    },
    "lazyadam": {               # dense gradients: plain adam (row-sparse: see section 5)
        "eps1e-3": dict(lr=0.01, eps=1e-3),
        "nesterov": dict(lr=0.01, use_nesterov=True),
    },
    "adamweightdecay": {
        "eps-default": dict(lr=0.01),
        "eps1e-3": dict(lr=0.01, eps=1e-3, beta1=0.8, beta2=0.99),
    },
    "adamw": {
        "eps1e-8": dict(lr=0.01),
        "eps1e-3": dict(lr=0.01, eps=1e-3, beta1=0.8, beta2=0.99),
    },
    "adamax": {
        "eps1e-8": dict(lr=0.01),
        "eps1e-3": dict(lr=0.01, eps=1e-3, beta1=0.8, beta2=0.99),
    },
    "nadam": {
        "eps1e-8": dict(lr=0.01),
        "eps1e-3-md0.04": dict(lr=0.01, eps=1e-3, momentum_decay=0.04),
    },
    "radam": {                  # rho_t > 5 from step 6 on: both branches run
        "eps1e-8": dict(lr=0.01),
        "eps1e-3-b2-0.99": dict(lr=0.01, eps=1e-3, beta2=0.99),
    },
    "adabelief": {              # eps enters s every step and the denominator
        "eps-default": dict(lr=0.01),
        "eps1e-3": dict(lr=0.01, eps=1e-3),
    },
    "adadelta": {
        "default": dict(),                                 # lr 1.0, rho 0.9, eps 1e-6
        "rho0.95-eps1e-4": dict(lr=0.5, rho=0.95, eps=1e-4),
    },
    "lion": {
        "lr3e-3": dict(lr=3e-3),
        "betas": dict(lr=3e-3, beta1=0.5, beta2=0.9),
    },
    "ftml": {
        "lr0.01": dict(lr=0.01),
        "b1-0.8-eps1e-3": dict(lr=0.01, beta1=0.8, epsilon=1e-3),
    },
    "ftrl": {                   # l1 = 0.5, 2: |linear| <= l1 zeroes a few elements
        "l1-l2": dict(lr=0.05, l1=0.5, l2=0.1),
        "plain": dict(lr=0.05),
        "lr_power-0.3": dict(lr=0.05, lr_power=-0.3, l1=2.0, l2=0.05, initial_accum=0.5),
        "lr_power0": dict(lr=0.05, lr_power=0.0, l1=0.5),
    },
    "rmsprop": {
        # epsilon >= 1e-6 throughout: with epsilon 1e-10 inside the sqrt, the first step's
        # moment = lr*g/sqrt((1-decay)*g^2 + epsilon) rises from 0 to lr/sqrt(1-decay)
        # within |g| < ~1e-4, and a g that small (0.14*grad cancelling 0.03*w) carries a
        # relative error ~3e-5 in any float32 kernel (0.14 and 0.03 rounded to float32):
        # seen as a 3e-5 miss on one element. The default epsilon runs in test_defaults.
        "mom": dict(lr=0.01, momentum=0.5, epsilon=1e-6),
        "plain-eps1e-3": dict(lr=0.01, decay=0.8, epsilon=1e-3),
        "centered-mom-eps1e-3": dict(lr=0.01, centered=True, momentum=0.5, epsilon=1e-3),
        # decay 0.99: with 0.9 and clip 0.5 at rescale_grad 1, an element clipped to the
        # same value for ~50 steps running has mean_square - mean_grad^2 -> 0, which
        # float32 cannot resolve (a float32 run of the oracle is 1e-4 off)
        "centered": dict(lr=0.01, centered=True, decay=0.99, epsilon=1e-6),
    },
    "proximal_adagrad": {
        # l1 shrinks |w| by lr*l1 a step: 0.0025 leaves most of w in place after 100 steps
        # (with l1 = 0.5 nearly all of w is 0 by then, and the few survivors carry the
        # round-off of values 10x larger: ill-conditioned at rtol 1e-5 even for a float32
        # version of the oracle itself)
        "l1-l2": dict(lr=0.05, l1=0.05, l2=0.1),
        "plain": dict(lr=0.05, initial_accum=0.5),
    },
    "adagrad": {
        "lr0.05": dict(lr=0.05),
        "eps-no-init": dict(lr=0.05, eps=0.1, initial_accum=0.0),
        "no-update-slots": dict(lr=0.05, update_slots=False),
    },
    "lamb": {                   # ||w|| is 14.7 .. 31.8 on these shapes
        "default": dict(lr=0.01),
        "no-bias-corr": dict(lr=0.01, bias_correction=False, eps=1e-3),
        "lower-bound": dict(lr=0.01, lower_bound=40.0),              # clamps ||w|| up
        "upper-bound": dict(lr=0.01, lower_bound=1.0, upper_bound=5.0),  # clamps it down
    },
    "lars": {                   # lambda ~ coefficient*||w||/||g||: 0.02 -> ~7e-3
        "momentum": dict(base="momentum", lr=0.1, coefficient=0.02),
        "momentum-nesterov-clip": dict(base="momentum", lr=0.5, momentum=0.8,
                                       use_nesterov=True, coefficient=0.02, use_clip=True),
        "momentum-clip-binds": dict(base="momentum", lr=0.05, coefficient=1.0, use_clip=True),
        "momentum-eps5": dict(base="momentum", lr=0.1, coefficient=0.05, epsilon=5.0),
        "sgd": dict(base="sgd", lr=0.1, momentum=0.9, dampening=0.3, coefficient=0.02),
        "sgd-nesterov-clip": dict(base="sgd", lr=0.5, momentum=0.9, nesterov=True,
                                  coefficient=0.02, use_clip=True),
        "sgd-plain": dict(base="sgd", lr=0.1, coefficient=0.02),
    },
    "adafactor": {
        "default": dict(),                                 # relative_step, scale_parameter
        "beta1": dict(beta1=0.9),
        "lr": dict(relative_step=False, lr=0.01),
        "relative-lr-ignored": dict(relative_step=True, lr=0.5),  # rho ignores lr then
        "lr-noscale-beta1": dict(relative_step=False, scale_parameter=False, lr=0.003,
                                 beta1=0.5),
        "warmup-noscale": dict(warmup_init=True, scale_parameter=False),
        "warmup-beta1": dict(warmup_init=True, beta1=0.9),
        "eps-clip-decay": dict(eps1=1e-3, eps2=2.0, clip_threshold=0.5, decay_rate=0.5),
    },
    "cautious_adamw": {         # eps=1e-3: visible, before the bias correction
        "eps-default": dict(lr=0.01),
        "eps1e-3-nobias": dict(lr=0.01, eps=1e-3, beta1=0.8, beta2=0.99, correct_bias=False),
    },
    "mars_adamw": {             # 2-D shapes take MARS, the others the AdamW branch
        "both-branches": dict(lr=0.01, gamma=0.1, beta1=0.9, beta2=0.999, eps=1e-3,
                              lr_1d_factor=0.5, beta1_1d=0.8, beta2_1d=0.99,
                              weight_decay_1d=0.05),
        "optimize_1d": dict(lr=0.01, optimize_1d=True),
    },
    "schedule_free_adamw": {
        "default": dict(lr=0.01),
        "warmup-r-power": dict(lr=0.01, warmup_steps=20, r=0.5, weight_lr_power=1.0,
                               beta1=0.8, eps=1e-3),
    },
}
GRID = [(spec, cid, cfg) for spec, cfgs in CASES.items() for cid, cfg in cfgs.items()]
GRID_IDS = [f"{spec}-{cid}" for spec, cid, _ in GRID]


def test_table_covers_the_catalog():
    assert set(CASES) == set(DEFAULTS)
    flags = {"sgd": ["nesterov"], "momentum": ["use_nesterov"], "adam": ["use_nesterov"],
             "lazyadam": ["use_nesterov"], "rmsprop": ["centered"],
             "adagrad": ["update_slots"], "lamb": ["bias_correction"],
             "lars": ["use_clip"],
             "adafactor": ["scale_parameter", "relative_step", "warmup_init"],
             "cautious_adamw": ["correct_bias"], "mars_adamw": ["optimize_1d"]}
    for spec, names in flags.items():
        for name in names:
            seen = {cfg.get(name, DEFAULTS[spec][name]) for cfg in CASES[spec].values()}
            assert seen == {False, True}, (spec, name, seen)
    assert {cfg["base"] for cfg in CASES["lars"].values()} == {"momentum", "sgd"}


# every configuration x a pairwise covering of shape x rescale x clip x weight decay (8 of
# 32: every two of those axes meet in every combination of their values, rotated per
# configuration); --exhaustive runs all 32 (tests/run_exhaustive.sh)
@pytest.mark.parametrize("spec,cid,cfg,shape,rescale_grad,clip_gradient,weight_decay",
                         sampled_product(GRID, [SHAPES, RESCALE, CLIP, WD], head_ids=GRID_IDS,
                                         factor_ids=[SHAPE_IDS, [f"rs{r}" for r in RESCALE],
                                                     [f"clip{c}" for c in CLIP],
                                                     [f"wd{w}" for w in WD]]))
def test_spec_vs_oracle(spec, cid, cfg, shape, rescale_grad, clip_gradient, weight_decay):
    hyper = dict(cfg, rescale_grad=rescale_grad, clip_gradient=clip_gradient,
                 weight_decay=weight_decay)
    run_vs_oracle(spec, hyper, shape,
                  seed_for("catalog", spec, cid, shape, rescale_grad, clip_gradient,
                           weight_decay))


# -- 2. defaults ---------------------------------------------------------------------------
def default_hyper(spec):
    if spec == "lars":
        return {**PREPROC_DEFAULTS, **DEFAULTS[LARS_DEFAULT_BASE], **DEFAULTS["lars"]}
    return {**PREPROC_DEFAULTS, **DEFAULTS[spec]}


@pytest.mark.parametrize("spec", list(DEFAULTS))
def test_defaults(spec):
    """optgen.create(spec, params) with nothing else: the contract's defaults, and 30
    steps of the rule with them."""
    w0, _ = make_problem((31, 17), seed_for("defaults", spec))
    opt = optgen.create(spec, [w0.copy()])
    for name, value in default_hyper(spec).items():
        assert name in opt.hyper, f"{spec}: no hyperparameter {name!r}"
        assert opt.hyper[name] == value, f"{spec}: default {name}={opt.hyper[name]!r}, " \
                                         f"the contract says {value!r}"
    run_vs_oracle(spec, {}, (31, 17), seed_for("defaults-run", spec), steps=30,
                  check_at=(1, 2, 30))


# -- 3. whole-tensor specs: zero parameter, zero gradient -------------------------------------
ZERO_CASES = {
    # ||w|| = 0: ratio 1 on the first step
    "lamb-w0": ("lamb", dict(lr=0.01), "zeros"),
    "lamb-w0-wd": ("lamb", dict(lr=0.01, weight_decay=0.03, rescale_grad=0.14), "zeros"),
    # ||w|| = 0 clamped up to lower_bound: ratio lower_bound/||r||
    "lamb-w0-lower": ("lamb", dict(lr=0.01, lower_bound=0.5), "zeros"),
    # zero gradient and weight_decay 0: r = 0, ratio 1, nothing moves
    "lamb-g0": ("lamb", dict(lr=0.01), "zero-grad"),
    "lars-w0-momentum": ("lars", dict(base="momentum", lr=0.1, coefficient=0.02,
                                      weight_decay=0.03), "zeros"),
    "lars-w0-sgd-clip": ("lars", dict(base="sgd", lr=0.1, momentum=0.9, coefficient=0.02,
                                      use_clip=True), "zeros"),
    "lars-g0-momentum": ("lars", dict(base="momentum", lr=0.1, coefficient=0.02),
                         "zero-grad"),
    # RMS(w) = 0: alpha = eps2 * rho
    "adafactor-w0": ("adafactor", dict(), "zeros"),
}


@pytest.mark.parametrize("shape", [(31, 17), (1000,)], ids=["2d-31x17", "1d-1000"])
@pytest.mark.parametrize("case", list(ZERO_CASES))
def test_zero_norms(case, shape):
    spec, hyper, kind = ZERO_CASES[case]
    seed = seed_for("zero", case, shape)
    if kind == "zeros":
        run_vs_oracle(spec, hyper, shape, seed, steps=20, check_at=(1, 2, 20),
                      w0=np.zeros(shape))
        return
    w0, _ = make_problem(shape, seed)
    w = w0.copy()
    opt = create(spec, [w], hyper)
    oracle = make_oracle(spec, w0, **hyper)
    for t in range(1, 4):
        g = np.zeros(shape, np.float32)
        opt.step([g])
        oracle.step(g)
        compare(opt, oracle, t, f"{case} {shape}")
    np.testing.assert_array_equal(w, w0)


# -- 4. the contract's constraints ------------------------------------------------------------
# (spec, hyperparameters, the name the ValueError must carry)
INVALID = [
    ("sgd", dict(lr=-0.1), "lr"),
    ("sgd", dict(momentum=-0.5), "momentum"),
    ("sgd", dict(dampening=1.5), "dampening"),
    ("sgd", dict(nesterov=True), "nesterov"),                       # momentum 0
    ("sgd", dict(nesterov=True, momentum=0.9, dampening=0.3), "nesterov"),
    ("sgd", dict(rescale_grad=0.0), "rescale_grad"),
    ("sgd", dict(clip_gradient=-1.0), "clip_gradient"),
    ("sgd", dict(weight_decay=-0.1), "weight_decay"),
    ("momentum", dict(lr=-1.0), "lr"),
    ("momentum", dict(momentum=-0.1), "momentum"),
    ("nag", dict(momentum=-0.1), "momentum"),
    ("nag", dict(rescale_grad=-1.0), "rescale_grad"),
    ("signum", dict(momentum=1.0), "momentum"),
    ("signum", dict(wd_lh=-0.1), "wd_lh"),
    ("adam", dict(beta1=1.0), "beta1"),
    ("adam", dict(beta2=-0.1), "beta2"),
    ("adam", dict(eps=0.0), "eps"),
    ("lazyadam", dict(eps=0.0), "eps"),
    ("lazyadam", dict(beta1=1.0), "beta1"),
    ("adamweightdecay", dict(beta1=0.0), "beta1"),                  # 0 < b1
    ("adamweightdecay", dict(beta2=1.0), "beta2"),
    ("adamweightdecay", dict(eps=0.0), "eps"),
    ("adamweightdecay", dict(weight_decay=-0.1), "weight_decay"),
    ("adamw", dict(beta2=1.0), "beta2"),
    ("adamw", dict(eps=0.0), "eps"),
    ("adamw", dict(weight_decay=-0.01), "weight_decay"),
    ("adamax", dict(eps=-1e-8), "eps"),
    ("adamax", dict(beta1=1.0), "beta1"),
    ("nadam", dict(momentum_decay=-0.1), "momentum_decay"),
    ("nadam", dict(eps=0.0), "eps"),
    ("radam", dict(beta1=1.0), "beta1"),
    ("radam", dict(eps=0.0), "eps"),
    ("adabelief", dict(eps=0.0), "eps"),
    ("adabelief", dict(beta2=1.0), "beta2"),
    ("adadelta", dict(rho=1.5), "rho"),
    ("adadelta", dict(eps=0.0), "eps"),
    ("adadelta", dict(lr=-1.0), "lr"),
    ("lion", dict(beta1=1.5), "beta1"),
    ("lion", dict(beta2=-0.1), "beta2"),
    ("lion", dict(weight_decay=-1.0), "weight_decay"),
    ("ftml", dict(lr=0.0), "lr"),                                   # lr > 0
    ("ftml", dict(beta1=0.0), "beta1"),                             # 0 < b1
    ("ftml", dict(beta2=1.0), "beta2"),
    ("ftml", dict(epsilon=0.0), "epsilon"),
    ("ftrl", dict(lr_power=0.5), "lr_power"),
    ("ftrl", dict(lr=0.0), "lr"),                                   # lr > 0
    ("ftrl", dict(l1=-1.0), "l1"),
    ("ftrl", dict(l2=-1.0), "l2"),
    ("ftrl", dict(initial_accum=-0.1), "initial_accum"),
    ("rmsprop", dict(decay=1.0), "decay"),
    ("rmsprop", dict(momentum=-1.0), "momentum"),
    ("rmsprop", dict(epsilon=0.0), "epsilon"),
    ("proximal_adagrad", dict(l1=-1.0), "l1"),
    ("proximal_adagrad", dict(l2=-1.0), "l2"),
    ("proximal_adagrad", dict(initial_accum=-1.0), "initial_accum"),
    ("proximal_adagrad", dict(lr=-1.0), "lr"),
    ("adagrad", dict(initial_accum=-1.0), "initial_accum"),
    ("adagrad", dict(eps=-1.0), "eps"),
    ("lamb", dict(eps=0.0), "eps"),
    ("lamb", dict(eps=-1e-6), "eps"),
    ("lamb", dict(beta1=0.0), "beta1"),                             # 0 < b1
    ("lamb", dict(beta2=1.0), "beta2"),
    ("lamb", dict(lower_bound=0.0), "lower_bound"),
    ("lamb", dict(upper_bound=-1.0), "upper_bound"),
    ("lamb", dict(weight_decay=-1.0), "weight_decay"),
    ("lars", dict(coefficient=0.0), "coefficient"),
    ("lars", dict(epsilon=-1.0), "epsilon"),
    ("lars", dict(base="momentum", momentum=-1.0), "momentum"),     # the base's rule
    ("lars", dict(base="sgd", lr=-0.1), "lr"),
    ("lars", dict(base="sgd", momentum=0.9, dampening=0.3, nesterov=True), "nesterov"),
    ("adafactor", dict(relative_step=False, lr=0.0), "lr"),         # lr > 0
    ("adafactor", dict(relative_step=False), "lr"),                 # lr must be set
    ("adafactor", dict(eps1=0.0), "eps1"),                          # seed: eps <= 0 raises
    ("adafactor", dict(eps2=0.0), "eps2"),
    ("adafactor", dict(beta1=0.0), "beta1"),                        # seed: beta1 in (0, 1)
    ("adafactor", dict(clip_threshold=0.0), "clip_threshold"),
    ("adafactor", dict(decay_rate=1.5), "decay_rate"),
    ("adafactor", dict(beta1=1.0), "beta1"),
    ("adafactor", dict(weight_decay=-1.0), "weight_decay"),
]
# boundary values the contract allows
VALID = [
    ("sgd", dict(momentum=0.9, nesterov=True)),
    ("sgd", dict(dampening=1.0, clip_gradient=0.0)),
    ("signum", dict(momentum=0.0)),
    ("adam", dict(beta1=0.0, beta2=0.0)),
    ("adamax", dict(eps=0.0)),
    ("adadelta", dict(rho=1.0)),
    ("adadelta", dict(rho=0.0)),
    ("lion", dict(beta1=1.0, beta2=1.0)),
    ("lion", dict(beta1=0.0, beta2=0.0)),
    ("ftrl", dict(lr_power=0.0, initial_accum=0.0)),
    ("proximal_adagrad", dict(initial_accum=0.0)),
    ("adagrad", dict(eps=0.0, initial_accum=0.0)),
    ("rmsprop", dict(decay=0.0)),
    ("lamb", dict(lower_bound=1e-3, upper_bound=10.0)),
    ("lars", dict(epsilon=0.0)),
    ("lars", dict(base="sgd")),
    ("adafactor", dict(relative_step=False, lr=0.01)),
    ("adafactor", dict(eps1=1e-45, eps2=1e-45, decay_rate=0.0, beta1=1e-9)),
    ("adafactor", dict(decay_rate=1.0)),
]
WRONG_TYPE = [
    ("ftrl", dict(l1="0.1")),
    ("rmsprop", dict(centered=1)),
    ("lamb", dict(bias_correction="yes")),
    ("adagrad", dict(update_slots=None)),
]


def _ids(table):
    return [f"{row[0]}-" + "-".join(f"{k}={v}" for k, v in row[1].items()) for row in table]


@pytest.mark.parametrize("spec,hyper,name", INVALID, ids=_ids(INVALID))
def test_constraint_violation(spec, hyper, name):
    w = np.zeros(4, np.float32)
    with pytest.raises(ValueError) as err:
        optgen.create(spec, [w], **hyper)
    msg = str(err.value)
    assert not msg.startswith("unknown optimizer"), msg
    assert re.search(rf"(?<![A-Za-z0-9_]){name}(?![A-Za-z0-9_])", msg), \
        f"{spec} {hyper}: the message does not name {name}: {msg}"


@pytest.mark.parametrize("spec,hyper,name", [r for r in INVALID if r[0] != "lars"
                                             and "nesterov" not in r[1]
                                             and "relative_step" not in r[1]][::3],
                         ids=_ids([r for r in INVALID if r[0] != "lars"
                                   and "nesterov" not in r[1]
                                   and "relative_step" not in r[1]][::3]))
def test_constraint_violation_set_hyper(spec, hyper, name):
    """set_hyper validates the same rules, and leaves the hyperparameters as they were."""
    opt = optgen.create(spec, [np.zeros(4, np.float32)])
    before = opt.hyper
    with pytest.raises(ValueError, match=name):
        opt.set_hyper(**hyper)
    assert opt.hyper == before


@pytest.mark.parametrize("spec,hyper", VALID, ids=_ids(VALID))
def test_constraint_boundaries_accepted(spec, hyper):
    w = np.zeros(4, np.float32)
    opt = optgen.create(spec, [w], **hyper)
    opt.step([np.ones(4, np.float32)])
    assert np.all(np.isfinite(w))


@pytest.mark.parametrize("spec,hyper", WRONG_TYPE, ids=_ids(WRONG_TYPE))
def test_wrong_type(spec, hyper):
    with pytest.raises(TypeError, match=next(iter(hyper))):
        optgen.create(spec, [np.zeros(4, np.float32)], **hyper)


# -- 5. lazy row-sparse updates ---------------------------------------------------------------
LAZY_CASES = {
    "lazyadam": ("lazyadam", dict(lr=0.01, eps=1e-3)),           # lazy_update by default
    "lazyadam-nesterov": ("lazyadam", dict(lr=0.01, use_nesterov=True, lazy_update=True)),
    # dampening 0: then a row touched for the first time after step 1 starts its buffer at
    # g either way (b = momentum*0 + g)
    "sgd-momentum": ("sgd", dict(lr=0.01, momentum=0.9, lazy_update=True)),
    "sgd-nesterov": ("sgd", dict(lr=0.01, momentum=0.9, nesterov=True, lazy_update=True)),
}
# lazy_update=False (or not given, for specs other than lazyadam): the dense gradient
DENSE_SPARSE_CASES = {
    "lazyadam-off": ("lazyadam", dict(lr=0.01, eps=1e-3, lazy_update=False)),
    "sgd-momentum-off": ("sgd", dict(lr=0.01, momentum=0.9, lazy_update=False)),
    "sgd-momentum-default": ("sgd", dict(lr=0.01, momentum=0.9, dampening=0.3)),
    "adam-default": ("adam", dict(lr=0.01, eps=1e-3)),
}
LAZY_SHAPES = [(31, 17), (8, 3, 3, 3), (1000,)]
LAZY_SHAPE_IDS = ["2d-31x17", "4d-8x3x3x3", "1d-1000"]
LAZY_STEPS = 50
LAZY_CHECK_AT = (1, 2, 10, LAZY_STEPS)


def sparse_problem(shape, seed):
    """Initial w and a generator of (indices, rows): about a quarter of the rows drawn
    with replacement (so some appear twice), in random order."""
    w0, grads = make_problem(shape, seed)
    rng = np.random.default_rng(seed + 1)
    n = shape[0]

    def gen():
        while True:
            g = next(grads)
            k = int(rng.integers(1, max(2, n // 4) + 1))
            idx = rng.integers(0, n, size=k).astype(np.int64)
            yield idx, np.ascontiguousarray(g[:k])
    return w0, gen()


def _snapshot(opt):
    return [opt.params[0].copy()] + [np.array(v, copy=True) for v in opt.state[0].values()
                                     if isinstance(v, np.ndarray)]


@pytest.mark.parametrize("rescale_grad,clip_gradient,weight_decay", PREPROC, ids=PREPROC_IDS)
@pytest.mark.parametrize("shape", LAZY_SHAPES, ids=LAZY_SHAPE_IDS)
@pytest.mark.parametrize("case", list(LAZY_CASES))
def test_lazy_row_sparse(case, shape, rescale_grad, clip_gradient, weight_decay):
    """Only the listed rows of w and of every state change (untouched rows bit-identical);
    the touched rows follow the dense rule on those rows (duplicates summed first)."""
    spec, cfg = LAZY_CASES[case]
    hyper = dict(cfg, rescale_grad=rescale_grad, clip_gradient=clip_gradient,
                 weight_decay=weight_decay)
    w0, sparse = sparse_problem(shape, seed_for("lazy", case, shape, rescale_grad,
                                                clip_gradient, weight_decay))
    w = w0.copy()
    opt = optgen.create(spec, [w], **hyper)
    oracle = make_oracle(spec, w0, **hyper)
    label = f"lazy {spec} {shape} {hyper}"
    for t in range(1, LAZY_STEPS + 1):
        idx, rows = next(sparse)
        before = _snapshot(opt)
        opt.step([optgen.RowSparse(idx, rows)])
        oracle.step_rows(idx, rows)
        untouched = np.setdiff1d(np.arange(shape[0]), idx)
        for b, a in zip(before, _snapshot(opt)):
            if a.shape[:1] == (shape[0],):
                np.testing.assert_array_equal(a[untouched], b[untouched],
                                              err_msg=f"{label}: untouched rows changed "
                                                      f"at step {t}")
        if t in LAZY_CHECK_AT:
            compare(opt, oracle, t, label)


@pytest.mark.parametrize("shape", LAZY_SHAPES, ids=LAZY_SHAPE_IDS)
@pytest.mark.parametrize("case", list(DENSE_SPARSE_CASES))
def test_row_sparse_not_lazy_is_dense(case, shape):
    spec, cfg = DENSE_SPARSE_CASES[case]
    hyper = dict(cfg, rescale_grad=0.14, clip_gradient=0.5, weight_decay=0.03)
    w0, sparse = sparse_problem(shape, seed_for("dense-sparse", case, shape))
    w = w0.copy()
    opt = optgen.create(spec, [w], **hyper)
    oracle = make_oracle(spec, w0, **hyper)
    for t in range(1, LAZY_STEPS + 1):
        idx, rows = next(sparse)
        opt.step([optgen.RowSparse(idx, rows)])
        oracle.step(densify(idx, rows, shape))
        if t in LAZY_CHECK_AT:
            compare(opt, oracle, t, f"row-sparse, not lazy: {spec} {shape} {hyper}")


def test_lazy_empty_row_sparse_changes_nothing():
    """A row-sparse gradient naming no rows leaves w and the states bit-identical (the
    step still counts: the next bias correction uses t + 1)."""
    shape = (31, 17)
    hyper = dict(lr=0.01, eps=1e-3)
    w0, sparse = sparse_problem(shape, seed_for("lazy-empty"))
    w = w0.copy()
    opt = optgen.create("lazyadam", [w], **hyper)
    oracle = make_oracle("lazyadam", w0, **hyper)
    empty = (np.zeros(0, np.int64), np.zeros((0, 17), np.float32))
    for t in range(1, 11):
        if t in (1, 5):
            before = _snapshot(opt)
            opt.step([optgen.RowSparse(*empty)])
            oracle.step_rows(*empty)
            for b, a in zip(before, _snapshot(opt)):
                np.testing.assert_array_equal(a, b, err_msg=f"empty step {t} changed state")
        else:
            idx, rows = next(sparse)
            opt.step([optgen.RowSparse(idx, rows)])
            oracle.step_rows(idx, rows)
    compare(opt, oracle, 10, "lazyadam with empty steps")


# -- 6. against torch.optim -----------------------------------------------------------------
def torch_grad64(torch, g, rescale_grad, clip_gradient):
    """torch.optim has no rescale/clip: apply them (in float64) to the float32 gradient."""
    return torch.from_numpy(preprocess(None, g, rescale_grad, clip_gradient, 0.0))


# Each entry: spec, optgen hyperparameters, torch factory (params, weight_decay) -> opt,
# {our state: (torch state, factor)} with ours = factor * theirs, and the shapes.
# Bridges:
#  * momentum <-> SGD(momentum, dampening=0, nesterov=use_nesterov): torch's first-step
#    buffer b = g equals our 0*momentum + g, so the buffers agree exactly.
#  * nag <-> SGD(nesterov=True) at constant lr: our s = lr * torch's buffer, and
#    w -= momentum*s + lr*g = lr*(g + momentum*b).
#  * rmsprop <-> RMSprop(alpha=decay, eps=0): torch puts eps outside the sqrt and lr
#    outside the buffer. Our epsilon=1e-20 inside the sqrt is invisible next to
#    mean_square (~0.01..10), torch eps=0; with constant lr our moment = lr * torch's
#    momentum_buffer.
#  * adagrad <-> Adagrad(lr_decay=0, initial_accumulator_value=initial_accum, eps=eps):
#    exact (update_slots=True).
#  * adamax, nadam, radam, adadelta: exact, same conventions (weight decay coupled in both).
#  * adamw <-> AdamW: exact; weight_decay is decoupled in both.
#  * adafactor <-> torch.optim.Adafactor(lr=1e-2, beta2_decay=-decay_rate,
#    eps=(eps1, eps2), d=clip_threshold): torch's rho_t = min(lr, 1/sqrt(t)) with lr=1e-2 is
#    our relative_step rho, and it always scales by max(eps2, RMS(w)) (scale_parameter).
#    eps1 differs: torch clamps V at eps1^2, we add eps1 to g^2; with eps1=1e-30 both are
#    invisible. Not bridged: beta1 (torch has no first moment), weight_decay (torch
#    multiplies by 1 - lr*wd with the raw lr 1e-2, we by 1 - wd*alpha), relative_step off.
#    So only weight_decay=0 cases are compared.
def _sgd(torch, lr, **kw):
    return lambda p, wd: torch.optim.SGD(p, lr=lr, weight_decay=wd, foreach=False, **kw)


TORCH_CASES = {
    "momentum": ("momentum", dict(lr=0.01, momentum=0.9),
                 lambda torch: _sgd(torch, 0.01, momentum=0.9),
                 {"moment": ("momentum_buffer", 1.0)}),
    "momentum-nesterov": ("momentum", dict(lr=0.01, momentum=0.8, use_nesterov=True),
                          lambda torch: _sgd(torch, 0.01, momentum=0.8, nesterov=True),
                          {"moment": ("momentum_buffer", 1.0)}),
    "nag": ("nag", dict(lr=0.01, momentum=0.9),
            lambda torch: _sgd(torch, 0.01, momentum=0.9, nesterov=True),
            {"momentum_buffer": ("momentum_buffer", 0.01)}),
    "rmsprop": ("rmsprop", dict(lr=0.01, decay=0.9, epsilon=1e-20),
                lambda torch: lambda p, wd: torch.optim.RMSprop(
                    p, lr=0.01, alpha=0.9, eps=0.0, weight_decay=wd, foreach=False),
                {"mean_square": ("square_avg", 1.0)}),
    # decay 0.99: see CASES["rmsprop"]["centered"] (with 0.8, clipped runs of the same
    # gradient make the centered variance vanish; float32 cannot resolve it)
    "rmsprop-centered-mom": ("rmsprop", dict(lr=0.01, decay=0.99, momentum=0.5,
                                             centered=True, epsilon=1e-20),
                             lambda torch: lambda p, wd: torch.optim.RMSprop(
                                 p, lr=0.01, alpha=0.99, eps=0.0, momentum=0.5, centered=True,
                                 weight_decay=wd, foreach=False),
                             {"mean_square": ("square_avg", 1.0),
                              "mean_grad": ("grad_avg", 1.0),
                              "moment": ("momentum_buffer", 0.01)}),
    "adagrad": ("adagrad", dict(lr=0.05, initial_accum=0.1, eps=1e-3),
                lambda torch: lambda p, wd: torch.optim.Adagrad(
                    p, lr=0.05, lr_decay=0, initial_accumulator_value=0.1, eps=1e-3,
                    weight_decay=wd, foreach=False),
                {"accum": ("sum", 1.0)}),
    "adamax": ("adamax", dict(lr=0.01, eps=1e-3),
               lambda torch: lambda p, wd: torch.optim.Adamax(
                   p, lr=0.01, eps=1e-3, weight_decay=wd, foreach=False),
               {"m": ("exp_avg", 1.0), "u": ("exp_inf", 1.0)}),
    "nadam": ("nadam", dict(lr=0.01, eps=1e-3, momentum_decay=0.04),
              lambda torch: lambda p, wd: torch.optim.NAdam(
                  p, lr=0.01, eps=1e-3, momentum_decay=0.04, weight_decay=wd, foreach=False),
              {"m": ("exp_avg", 1.0), "v": ("exp_avg_sq", 1.0),
               "mu_product": ("mu_product", 1.0)}),
    "radam": ("radam", dict(lr=0.01, eps=1e-3),
              lambda torch: lambda p, wd: torch.optim.RAdam(
                  p, lr=0.01, eps=1e-3, weight_decay=wd, foreach=False),
              {"m": ("exp_avg", 1.0), "v": ("exp_avg_sq", 1.0)}),
    "adamw": ("adamw", dict(lr=0.01, eps=1e-3),
              lambda torch: lambda p, wd: torch.optim.AdamW(
                  p, lr=0.01, eps=1e-3, weight_decay=wd, foreach=False),
              {"m": ("exp_avg", 1.0), "v": ("exp_avg_sq", 1.0)}),
    "adadelta": ("adadelta", dict(lr=0.5, rho=0.95, eps=1e-4),
                 lambda torch: lambda p, wd: torch.optim.Adadelta(
                     p, lr=0.5, rho=0.95, eps=1e-4, weight_decay=wd, foreach=False),
                 {"acc_grad": ("square_avg", 1.0), "acc_delta": ("acc_delta", 1.0)}),
    "adafactor": ("adafactor", dict(eps1=1e-30),
                  lambda torch: lambda p, wd: torch.optim.Adafactor(
                      p, lr=1e-2, beta2_decay=-0.8, eps=(1e-30, 1e-3), d=1.0,
                      weight_decay=0.0, foreach=False),
                  {"exp_avg_sq": ("variance", 1.0), "exp_avg_sq_row": ("row_var", 1.0),
                   "exp_avg_sq_col": ("col_var", 1.0)}),
    "adafactor-clip-decay": ("adafactor", dict(eps1=1e-30, eps2=0.5, clip_threshold=1.5,
                                               decay_rate=0.5),
                             lambda torch: lambda p, wd: torch.optim.Adafactor(
                                 p, lr=1e-2, beta2_decay=-0.5, eps=(1e-30, 0.5), d=1.5,
                                 weight_decay=0.0, foreach=False),
                             {"exp_avg_sq": ("variance", 1.0),
                              "exp_avg_sq_row": ("row_var", 1.0),
                              "exp_avg_sq_col": ("col_var", 1.0)}),
}
TORCH_SHAPES = {"adafactor": [(1000,), (31, 17), (8, 3, 3, 3)]}
TORCH_GRID = [(case, shape, pre) for case, (spec, *_) in TORCH_CASES.items()
              for shape in TORCH_SHAPES.get(spec, [(31, 17)])
              for pre in TORCH_PREPROC
              if not (spec == "adafactor" and pre[2])]          # adafactor: wd 0 only
TORCH_GRID_IDS = [f"{case}-{'x'.join(map(str, shape))}-rs{p[0]}-clip{p[1]}-wd{p[2]}"
                  for case, shape, p in TORCH_GRID]


def _snap(states):
    return {k: np.array(v, np.float64, copy=True) for k, v in states.items()}


def _torch_run(case, shape, pre, with_optgen):
    """Steps torch (float64), the float64 oracle and (if with_optgen) optgen in fp32 on the
    same gradients. Returns, for each CHECK_AT step, copies of: the torch parameter, torch's
    states (ours = factor * theirs, under our names), the oracle's w and states, and
    optgen's w and states."""
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    spec, hyper, factory, names = TORCH_CASES[case]
    rescale_grad, clip_gradient, weight_decay = pre
    hyper = dict(hyper, rescale_grad=rescale_grad, clip_gradient=clip_gradient,
                 weight_decay=weight_decay)
    w0, grads = make_problem(shape, seed_for("catalog-torch", case, shape, *pre))
    tparam = torch.nn.Parameter(torch.from_numpy(w0.astype(np.float64)))
    oracle = make_oracle(spec, w0, **hyper)
    opt = optgen.create(spec, [w0.copy()], **hyper) if with_optgen else None
    snaps = []
    # torch keeps scalar states (NAdam's mu_product, step counts) in the default dtype:
    # float64 here, else NAdam's mu_product alone is off by ~3e-8 relative. Restored
    # before any comparison can fail.
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        topt = factory(torch)([tparam], weight_decay)
        for t in range(1, STEPS + 1):
            g = next(grads)
            tparam.grad = torch_grad64(torch, g, rescale_grad, clip_gradient)
            topt.step()
            oracle.step(g)
            if opt is not None:
                opt.step([g])
            if t in CHECK_AT:
                tstate = topt.state[tparam]
                theirs = {ours: factor * np.array(tstate[name].detach().numpy(), np.float64)
                          for ours, (name, factor) in names.items()
                          if tstate.get(name) is not None}
                snaps.append(dict(
                    t=t, torch_w=tparam.detach().numpy().copy(), torch_states=theirs,
                    oracle_w=oracle.w.copy(), oracle_states=_snap(oracle.states()),
                    opt_w=None if opt is None else opt.params[0].copy(),
                    opt_states=None if opt is None else _snap(opt.state[0])))
    finally:
        torch.set_default_dtype(default_dtype)
    return snaps


@pytest.mark.parametrize("case,shape,pre", TORCH_GRID, ids=TORCH_GRID_IDS)
def test_spec_vs_torch(case, shape, pre):
    label = f"{case} {shape} rs={pre[0]} clip={pre[1]} wd={pre[2]} vs torch"
    for s in _torch_run(case, shape, pre, with_optgen=True):
        check(s["opt_w"], s["torch_w"], f"{label}: w after step {s['t']}")
        for ours, exp in s["torch_states"].items():
            check(s["opt_states"][ours], exp, f"{label}: {ours} after step {s['t']}")


@pytest.mark.parametrize("case,shape,pre", TORCH_GRID, ids=TORCH_GRID_IDS)
def test_oracle_vs_torch(case, shape, pre):
    """The oracles themselves (float64) against torch (float64): agreement to 1e-8
    validates both the oracle and the bridge above, independently of optgen. (Not
    tighter: a g that is the difference of rescale_grad*grad and weight_decay*w keeps
    fewer digits, and torch may fuse that addition where numpy rounds twice.)"""
    label = f"oracle {case} {shape} rs={pre[0]} clip={pre[1]} wd={pre[2]} vs torch"
    for s in _torch_run(case, shape, pre, with_optgen=False):
        tw = s["torch_w"]
        np.testing.assert_allclose(s["oracle_w"], tw, rtol=1e-8,
                                   atol=1e-10 * np.abs(tw).max(),
                                   err_msg=f"{label}: w after step {s['t']}")
        for ours, exp in s["torch_states"].items():
            np.testing.assert_allclose(
                s["oracle_states"][ours].reshape(exp.shape), exp, rtol=1e-8,
                atol=1e-10 * max(np.abs(exp).max(), 1e-300),
                err_msg=f"{label}: {ours} after step {s['t']}")


# -- 7. the oracles themselves: properties the contract states ----------------------------
def test_oracle_lamb_ratio_rules():
    w = np.zeros(10)
    o = make_oracle("lamb", w, lr=0.1)
    o.step(np.ones(10))
    assert o.last_ratio == 1.0                                  # ||w|| = 0
    o = make_oracle("lamb", w, lr=0.1, lower_bound=0.5)
    o.step(np.ones(10))
    assert math.isclose(o.last_ratio, 0.5 / math.sqrt(10) * (1 + 1e-6), rel_tol=1e-5)


def test_oracle_lars_clip_rule():
    w = np.ones(100)
    o = make_oracle("lars", w, base="momentum", lr=0.1, coefficient=1.0, use_clip=True)
    o.step(np.full(100, 2.0))
    assert o.last_lambda == 1.0                                  # min(5/0.1, 1)
    o = make_oracle("lars", w, base="momentum", lr=0.1, coefficient=0.02)
    o.step(np.full(100, 2.0))
    assert math.isclose(o.last_lambda, 0.02 * 10 / (20 + 1e-5))


# -- svrg: the base rule on the variance-reduced gradient ----------------------------
SVRG_CASES = {
    "sgd-momentum": ("sgd", dict(lr=0.05, momentum=0.9, weight_decay=0.03, clip_gradient=0.5)),
    "adam": ("adam", dict(lr=0.01, rescale_grad=0.14)),
    "rmsprop-centered": ("rmsprop", dict(lr=0.01, centered=True, epsilon=1e-6)),
}


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("case", list(SVRG_CASES))
def test_svrg_is_base_on_variance_reduced_gradient(case, shape):
    """svrg (seed 002, Johnson & Zhang): the base optimizer stepped on
    grad - grad_snapshot + full_grad, with the base's own preprocessing."""
    base, hyper = SVRG_CASES[case]
    w0, grads = make_problem(shape, zlib.crc32(case.encode()))
    _, snaps = make_problem(shape, 1 + zlib.crc32(case.encode()))
    full = next(make_problem(shape, 2 + zlib.crc32(case.encode()))[1])
    w = w0.copy()
    opt = optgen.create("svrg", [w], base=base, **hyper)
    oracle = make_oracle(base, w0, **hyper)
    for t in range(1, 51):
        g, s = next(grads), next(snaps)
        opt.step([g], grad_snapshot=[s], full_grad=[full])
        # the float32 kernel forms (grad - snapshot) + full in float32 (two roundings the
        # rule cannot avoid; where the terms cancel they dominate), so the oracle starts
        # from that float32 value and computes the rest in float64
        oracle.step(((g - s) + full).astype(np.float64))
        if t in (1, 10, 50):
            compare(opt, oracle, t, f"svrg({base}) {shape}")


def test_svrg_needs_its_inputs():
    w = np.zeros(4, np.float32)
    opt = optgen.create("svrg", [w])
    g = np.ones(4, np.float32)
    with pytest.raises(TypeError, match="grad_snapshot"):
        opt.step([g])
    with pytest.raises(ValueError, match="full_grad 0 has shape"):
        opt.step([g], grad_snapshot=[g.copy()], full_grad=[np.ones(3, np.float32)])
    assert opt.t == 0 and not w.any()


# -- lars: the name filter (MindSpore lars_filter) ------------------------------------
@pytest.mark.parametrize("base", ["momentum", "sgd"])
def test_lars_filter_by_name(base):
    """Parameters named like LayerNorm or bias step the base rule on the clipped, rescaled
    gradient without LARS scaling and without weight decay; the others get LARS."""
    hyper = dict(lr=0.05, weight_decay=0.03, coefficient=0.02, rescale_grad=0.14,
                 clip_gradient=0.5, **({"momentum": 0.9} if base == "sgd" else {}))
    names = ["encoder.weight", "encoder.LayerNorm.weight", "encoder.bias"]
    shape = (31, 17)
    problems = [make_problem(shape, seed_for("lars-filter", base, n)) for n in names]
    w0 = [p[0] for p in problems]
    ws = [w.copy() for w in w0]
    opt = optgen.create("lars", ws, base=base, param_names=names, **hyper)
    base_hyper = {k: v for k, v in hyper.items() if k != "coefficient"}
    oracles = [make_oracle("lars", w0[0], base=base, **hyper),
               make_oracle(base, w0[1], **{**base_hyper, "weight_decay": 0.0}),
               make_oracle(base, w0[2], **{**base_hyper, "weight_decay": 0.0})]
    for t in range(1, 31):
        gs = [next(p[1]) for p in problems]
        opt.step(gs)
        for o, g in zip(oracles, gs):
            o.step(g)
        if t in (1, 10, 30):
            for i, o in enumerate(oracles):
                compare(opt, o, t, f"lars({base}) {names[i]}", i=i)
    custom = optgen.create("lars", [w.copy() for w in w0], base=base, param_names=names,
                           name_filters={"apply_lars": lambda n: n.endswith("weight")}, **hyper)
    assert [custom._flags(i)["apply_lars"] for i in range(3)] == [True, True, False]
    with pytest.raises(ValueError, match="param_names must be 3 strings"):
        optgen.create("lars", [w.copy() for w in w0], base=base, param_names=["a"])


# -- adafactor compression: float16 running averages ----------------------------------
@pytest.mark.parametrize("beta1", [None, 0.9])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_adafactor_compression(shape, beta1):
    """compression=True (MindSpore): the running averages are stored as float16, rounded
    once per step; the update uses the unrounded new values. The oracle computes in
    float64 and rounds its states the same way, so a state can land one float16 ulp
    (2**-10 relative) from optgen's where the float32 value sits near a rounding
    boundary; that difference then feeds later steps, hence the looser tolerances."""
    hyper = dict(compression=True, beta1=beta1)
    w0, grads = make_problem(shape, seed_for("adafactor-compression", shape, beta1))
    w = w0.copy()
    opt = optgen.create("adafactor", [w], **hyper)
    oracle = make_oracle("adafactor", w0, **hyper)
    for t in range(1, 51):
        g = next(grads)
        opt.step([g])
        oracle.step(g)
        if t in (1, 10, 50):
            np.testing.assert_allclose(w, oracle.w, rtol=1e-4, atol=1e-4 * np.abs(oracle.w).max(),
                                       err_msg=f"w after step {t}")
            for name, value in oracle.states().items():
                mine = opt.state[0][name]
                assert mine.dtype == np.float16, name
                np.testing.assert_allclose(mine.astype(np.float64), value.reshape(mine.shape),
                                           rtol=3e-3, atol=1e-3 * np.abs(value).max(),
                                           err_msg=f"{name} after step {t}")

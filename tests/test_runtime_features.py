"""The trainer-side runtime: registry and aliases, parameter groups, lr schedules,
gradient handling (loss scale, global-norm clipping, non-finite steps), threads."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import optgen
from optgen import schedules
from optgen.compiler import pipeline

SPECS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "specs")


def _rand(rng, shape, dtype=np.float32):
    return np.asarray(rng.standard_normal(shape), dtype=dtype)


def _snapshot(opt):
    return ([np.array(p, copy=True) for p in opt.params],
            [{k: np.array(v, copy=True) for k, v in st.items()} for st in opt.state],
            opt.t, list(opt._steps))


def _assert_same(opt, snap):
    params, states, t, steps = snap
    assert opt.t == t and opt._steps == steps
    for p, q in zip(opt.params, params):
        assert np.asarray(p).tobytes() == q.tobytes()
    for st, sq in zip(opt.state, states):
        assert set(st) == set(sq)
        for k in st:
            assert np.asarray(st[k]).tobytes() == sq[k].tobytes()


# -- construction, registry, aliases --------------------------------------------------
def test_create_from_name_path_and_registry(tmp_path, rng):
    g = _rand(rng, 9)
    w0 = _rand(rng, 9)
    ws = [w0.copy() for _ in range(3)]
    path = os.path.join(SPECS, "sgd.py")
    mine = tmp_path / "my_sgd.py"
    mine.write_text(open(path).read())
    assert optgen.register("my_sgd", mine, overwrite=True) == str(mine)
    opts = [optgen.create("sgd", [ws[0]], lr=0.1, momentum=0.9),
            optgen.create(path, [ws[1]], lr=0.1, momentum=0.9),
            optgen.create("my_sgd", [ws[2]], lr=0.1, momentum=0.9)]
    for _ in range(3):
        for o in opts:
            o.step([g])
    assert ws[0].tobytes() == ws[1].tobytes() == ws[2].tobytes()
    assert not np.array_equal(ws[0], w0)
    with pytest.raises(ValueError, match=r"register: 'adam' is already a known optimizer"):
        optgen.register("adam", mine)
    with pytest.raises(ValueError, match=r"register: name must be an identifier"):
        optgen.register("my sgd", mine)
    with pytest.raises(FileNotFoundError, match=r"register: spec file"):
        optgen.register("nothing", tmp_path / "missing.py")
    with pytest.raises(ValueError, match=r"or optgen.register one"):
        optgen.create("no_such_optimizer", [ws[0]])


ALIASES = [  # (spec, alias kwargs, spec-named kwargs)
    ("adam", {"learning_rate": 0.05, "wd": 0.01}, {"lr": 0.05, "weight_decay": 0.01}),
    ("adam", {"betas": (0.8, 0.99), "nesterov": True}, {"beta1": 0.8, "beta2": 0.99,
                                                         "use_nesterov": True}),
    ("ftml", {"eps": 1e-6}, {"epsilon": 1e-6}),
    ("sgd", {"use_nesterov": True, "momentum": 0.9}, {"nesterov": True, "momentum": 0.9}),
    ("sgd", {"lr_scheduler": schedules.constant(0.3)}, {"lr": 0.3}),
]


@pytest.mark.parametrize("spec,alias,canonical", ALIASES)
def test_aliases_equal_spec_names(spec, alias, canonical, rng):
    w0, g = _rand(rng, 17), _rand(rng, 17)
    a, b = w0.copy(), w0.copy()
    oa, ob = optgen.create(spec, [a], **alias), optgen.create(spec, [b], **canonical)
    for _ in range(3):
        oa.step([g])
        ob.step([g])
    assert a.tobytes() == b.tobytes()


def test_loss_scale_and_begin_num_update(rng):
    w0, g = _rand(rng, 33), _rand(rng, 33)
    a, b = w0.copy(), w0.copy()
    oa = optgen.create("adam", [a], loss_scale=128.0, begin_num_update=5, lr=0.01)
    ob = optgen.create("adam", [b], rescale_grad=1 / 128.0, lr=0.01)
    ob.t, ob._steps = 5, [5]
    assert oa.t == 5
    for _ in range(4):
        oa.step([g])
        ob.step([g])
    assert a.tobytes() == b.tobytes() and oa.t == 9
    for bad, exc in ((0.0, ValueError), (-1.0, ValueError), ("2", TypeError), (math.inf, ValueError)):
        with pytest.raises(exc, match="loss_scale"):
            optgen.create("adam", [a], loss_scale=bad)
    with pytest.raises(ValueError, match=r"begin_num_update must be an int >= 0, got -1"):
        optgen.create("adam", [a], begin_num_update=-1)


# -- parameters and groups ------------------------------------------------------------
def test_group_overrides_change_only_their_group(rng):
    shapes = [(5, 3), (7,), (4, 2, 3)]
    w0 = [_rand(rng, s) for s in shapes]
    grads = [[_rand(rng, s) for s in shapes] for _ in range(5)]
    ws = [w.copy() for w in w0]
    opt = optgen.create("adam", [{"params": [ws[0], ws[2]]},
                                 {"params": [ws[1]], "lr": 0.05, "weight_decay": 0.1,
                                  "betas": (0.5, 0.9)}], lr=0.01)
    solo = [w.copy() for w in w0]
    ref_a = optgen.create("adam", [solo[0], solo[2]], lr=0.01)
    ref_b = optgen.create("adam", [solo[1]], lr=0.05, weight_decay=0.1, beta1=0.5, beta2=0.9)
    for gs in grads:
        opt.step([gs[0], gs[2], gs[1]])      # the optimizer's order: group by group
        ref_a.step([gs[0], gs[2]])
        ref_b.step([gs[1]])
    for w, s in zip(ws, solo):
        assert w.tobytes() == s.tobytes()
    groups = opt.param_groups
    assert [len(g["params"]) for g in groups] == [2, 1]
    assert groups[0]["lr"] == 0.01 and groups[1]["lr"] == 0.05 and groups[1]["beta1"] == 0.5
    # set_hyper on one group leaves the other alone
    opt.set_hyper(group=1, lr=0.2)
    assert [g["lr"] for g in opt.param_groups] == [0.01, 0.2]
    opt.set_hyper(lr=0.3)
    assert [g["lr"] for g in opt.param_groups] == [0.3, 0.3] and opt.hyper["lr"] == 0.3
    with pytest.raises(ValueError, match=r"group must be an index below 2"):
        opt.set_hyper(group=2, lr=0.1)


def test_group_flags_pick_their_own_kernels(rng):
    w0, g = _rand(rng, 40), _rand(rng, 40)
    a, b = w0.copy(), w0.copy()
    opt = optgen.create("sgd", [{"params": [a], "nesterov": True}, {"params": [b]}],
                        lr=0.1, momentum=0.9)
    ra, rb = w0.copy(), w0.copy()
    oa = optgen.create("sgd", [ra], lr=0.1, momentum=0.9, nesterov=True)
    ob = optgen.create("sgd", [rb], lr=0.1, momentum=0.9)
    for _ in range(3):
        opt.step([g, g])
        oa.step([g])
        ob.step([g])
    assert a.tobytes() == ra.tobytes() and b.tobytes() == rb.tobytes()
    assert not np.array_equal(a, b)


def test_dict_params_and_order_params(rng):
    a, b, c = _rand(rng, 3), _rand(rng, 4), _rand(rng, 5)
    opt = optgen.create("sgd", [{"params": {"a": a, "c": c}, "lr": 0.5},
                                {"params": {"b": b}},
                                {"order_params": [b, c, a]}], lr=0.1)
    assert opt.params[0] is b and opt.params[1] is c and opt.params[2] is a
    assert opt.names == ["b", "c", "a"]
    before = [x.copy() for x in (b, c, a)]
    opt.step([np.ones(4, np.float32), np.ones(5, np.float32), np.ones(3, np.float32)])
    np.testing.assert_allclose(b, before[0] - 0.1, rtol=1e-6)
    np.testing.assert_allclose(c, before[1] - 0.5, rtol=1e-6)
    np.testing.assert_allclose(a, before[2] - 0.5, rtol=1e-6)
    by_name = optgen.create("sgd", [{"params": {"a": a}}, {"params": {"b": b}},
                                    {"order_params": ["b", "a"]}])
    assert by_name.names == ["b", "a"]


def _group_errors():
    a, b = np.zeros(3, np.float32), np.zeros(4, np.float32)
    return [
        ("two-groups", [{"params": [a]}, {"params": [a, b]}], ValueError,
         r"adam: a parameter is in both group 0 and group 1"),
        ("unknown-key", [{"params": [a], "lrr": 0.1}], ValueError,
         r"adam: group 0: unknown key 'lrr'; a group takes 'params', 'grad_centralization'"),
        ("empty", [{"params": [a]}, {"params": []}], ValueError, r"adam: group 1: has no parameters"),
        ("no-params", [{"lr": 0.1}], ValueError, r"adam: group 0: has no 'params' key"),
        ("mixed", [{"params": [a]}, b], TypeError, r"params mixes group dicts and arrays"),
        ("bad-value", [{"params": [a], "lr": -1.0}], ValueError, r"adam: invalid lr=-1\.0"),
        ("bad-gc", [{"params": [a], "grad_centralization": 1}], TypeError,
         r"group 0: grad_centralization must be a bool"),
        ("order-missing", [{"params": [a]}, {"params": [b]}, {"order_params": [a]}], ValueError,
         r"order_params misses 1 parameter\(s\) of the groups"),
        ("order-extra", [{"params": [a]}, {"order_params": [a, b]}], ValueError,
         r"order_params has a parameter which is in no group"),
        ("order-twice", [{"params": [a, b]}, {"order_params": [a, a, b]}], ValueError,
         r"order_params lists a parameter twice"),
        ("order-keys", [{"params": [a]}, {"order_params": [a], "lr": 0.1}], ValueError,
         r"a dict with 'order_params' may have no other keys"),
        ("gc-not-conv", [{"params": [a], "grad_centralization": True}], ValueError,
         r"adam: parameter 0 has shape \(3,\); grad_centralization applies only to 4-D"),
        ("empty-list", [], ValueError, r"adam: params is empty"),
    ]


@pytest.mark.parametrize("case", [c[0] for c in _group_errors()])
def test_group_errors(case):
    _, params, exc, pattern = next(c for c in _group_errors() if c[0] == case)
    with pytest.raises(exc, match=pattern):
        optgen.create("adam", params)


def test_grad_centralization_matches_oracle(rng):
    w0 = _rand(rng, (6, 3, 3, 3), np.float64)
    b0 = _rand(rng, 6, np.float64)
    w, b = w0.copy(), b0.copy()
    opt = optgen.create("sgd", [{"params": [w], "grad_centralization": True}, {"params": [b]}],
                        lr=0.1)
    ow, ob = w0.copy(), b0.copy()
    for _ in range(3):
        gw, gb = _rand(rng, w.shape, np.float64), _rand(rng, 6, np.float64)
        keep = gw.copy()
        opt.step([gw, gb])
        assert gw.tobytes() == keep.tobytes()           # the trainer's gradient is not modified
        ow -= 0.1 * (gw - gw.mean(axis=(1, 2, 3), keepdims=True))
        ob -= 0.1 * gb
    np.testing.assert_allclose(w, ow, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(b, ob, rtol=1e-12, atol=1e-14)


def test_lr_and_wd_multipliers_and_decay_filter(rng):
    names = ["fc_weight", "fc_bias", "bn_gamma", "bn_beta"]
    w0 = {n: _rand(rng, 6, np.float64) for n in names}
    g = _rand(rng, 6, np.float64)

    def run(**kw):
        ws = {n: v.copy() for n, v in w0.items()}
        opt = optgen.create("sgd", ws, lr=0.1, weight_decay=0.5, **kw)
        opt.step([g] * 4)
        return ws, opt

    def sgd(w, lr, wd):
        return w - lr * (g + wd * w)

    ws, opt = run()   # default filter: no decay on bias, gamma, beta
    assert opt._wd_mult == [1.0, 0.0, 0.0, 0.0]
    np.testing.assert_allclose(ws["fc_weight"], sgd(w0["fc_weight"], 0.1, 0.5), rtol=1e-14)
    np.testing.assert_allclose(ws["fc_bias"], sgd(w0["fc_bias"], 0.1, 0.0), rtol=1e-14)
    ws, _ = run(decay_filter=None)
    np.testing.assert_allclose(ws["bn_beta"], sgd(w0["bn_beta"], 0.1, 0.5), rtol=1e-14)
    ws, _ = run(decay_filter=lambda n: n.startswith("bn"))
    np.testing.assert_allclose(ws["bn_beta"], sgd(w0["bn_beta"], 0.1, 0.5), rtol=1e-14)
    np.testing.assert_allclose(ws["fc_weight"], sgd(w0["fc_weight"], 0.1, 0.0), rtol=1e-14)
    ws, _ = run(lr_mult={"fc_weight": 2.0, 3: 0.5}, wd_mult={"fc_bias": 1.0})
    np.testing.assert_allclose(ws["fc_weight"], sgd(w0["fc_weight"], 0.2, 0.5), rtol=1e-14)
    np.testing.assert_allclose(ws["bn_beta"], sgd(w0["bn_beta"], 0.05, 0.0), rtol=1e-14)
    np.testing.assert_allclose(ws["fc_bias"], sgd(w0["fc_bias"], 0.1, 0.5), rtol=1e-14)
    # a group that sets weight_decay itself decays all its parameters (MindSpore)
    ws = {n: v.copy() for n, v in w0.items()}
    opt = optgen.create("sgd", [{"params": ws, "weight_decay": 0.5}], lr=0.1)
    assert opt._wd_mult == [1.0] * 4
    with pytest.raises(ValueError, match=r"lr_mult names 'nope', which is not a parameter name"):
        opt.set_lr_mult({"nope": 1.0})
    with pytest.raises(ValueError, match=r"wd_mult\['fc_bias'\] must be a finite float >= 0"):
        opt.set_wd_mult({"fc_bias": -1.0})
    with pytest.raises(ValueError, match=r"lr_mult key 9 is neither"):
        opt.set_lr_mult({9: 1.0})
    with pytest.raises(TypeError, match=r"decay_filter must be 'default', None or a callable"):
        optgen.create("sgd", ws, decay_filter="bias")


def test_none_gradient_skips_the_parameter(rng):
    a0, b0, g = _rand(rng, 5), _rand(rng, 5), _rand(rng, 5)
    a, b = a0.copy(), b0.copy()
    opt = optgen.create("adam", [a, b], lr=0.1)
    opt.step([g, None])
    assert b.tobytes() == b0.tobytes() and not np.array_equal(a, a0)
    assert opt._steps == [1, 0] and opt.t == 1
    opt.step([g, g])   # b's first update uses its own step count (bias correction t=1)
    ref = b0.copy()
    optgen.create("adam", [ref], lr=0.1).step([g])
    assert b.tobytes() == ref.tobytes()


# -- learning rates -------------------------------------------------------------------
def _sgd_path(lr, steps=50, **kw):
    """w after each of ``steps`` SGD updates with gradient 1 (float64): w_k = -sum lr_i."""
    w = np.zeros(3, np.float64)
    opt = optgen.create("sgd", [w], lr=lr, **kw)
    out = []
    for _ in range(steps):
        opt.step([np.ones(3)])
        out.append(w[0])
    return np.array(out)


def test_lr_sequence_matches_hand_computation():
    values = [0.1 * (k % 7) + 0.01 * k for k in range(50)]
    expected = -np.cumsum(values)
    for given in (values, np.array(values), tuple(values), iter(values)):
        np.testing.assert_allclose(_sgd_path(given), expected, rtol=1e-13)
    w = np.zeros(2)
    opt = optgen.create("sgd", [w], lr=[0.5, 0.25])
    opt.step([np.ones(2)])
    opt.step([np.ones(2)])
    with pytest.raises(ValueError, match=r"sgd: lr sequence has 2 values and step 2 was requested"):
        opt.step([np.ones(2)])
    assert w[0] == -0.75 and opt.t == 2


SCHEDULES = [
    schedules.factor(0.5, 10, 0.5),
    schedules.multi_factor(0.5, [5, 20, 30], 0.3),
    schedules.polynomial(0.4, 40, final_lr=0.01, power=2.0, warmup_steps=5),
    schedules.cosine(0.3, 45, final_lr=0.001, warmup_steps=10, warmup_begin_lr=0.01),
    schedules.linear_warmup(8, schedules.cosine(0.2, 30)),
    schedules.one_cycle(0.5, 50),
    schedules.join([schedules.constant(0.1), schedules.factor(0.2, 5, 0.9)], [10]),
    schedules.cosine(0.3, 45) * 0.5,
]


@pytest.mark.parametrize("sched", SCHEDULES, ids=repr)
def test_schedules_drive_the_step(sched):
    """The i-th update uses schedule(i) (hand computations of each schedule's values are
    in test_schedules.py)."""
    expected = -np.cumsum([sched(i) for i in range(50)])
    np.testing.assert_allclose(_sgd_path(sched), expected, rtol=1e-12, atol=1e-15)


def test_callable_lr_and_begin_num_update():
    np.testing.assert_allclose(_sgd_path(lambda step: 0.01 * step, steps=10),
                               -np.cumsum([0.01 * i for i in range(10)]), rtol=1e-13)
    np.testing.assert_allclose(_sgd_path(lambda step: 0.01 * step, steps=3, begin_num_update=4),
                               -np.cumsum([0.04, 0.05, 0.06]), rtol=1e-13)


def test_group_lr_schedules_and_changes_never_rebuild(rng):
    a, b = np.zeros(4), np.zeros(4)
    opt = optgen.create("sgd", [{"params": [a], "lr": schedules.cosine(0.1, 20)},
                                {"params": [b], "lr": [0.01 * k for k in range(20)]}])
    opt.step([np.ones(4), np.ones(4)])
    builds = pipeline.BUILD_COUNT
    for k in range(1, 20):
        opt.step([np.ones(4), np.ones(4)])
        if k == 10:
            opt.set_hyper(group=0, lr=0.5)
    assert pipeline.BUILD_COUNT == builds
    sched = schedules.cosine(0.1, 20)
    assert a[0] == pytest.approx(-(sum(sched(i) for i in range(11)) + 0.5 * 9), rel=1e-12)
    assert b[0] == pytest.approx(-sum(0.01 * k for k in range(20)), rel=1e-12)
    assert opt.learning_rate == 0.5


@pytest.mark.parametrize("lr,exc,pattern", [
    (lambda s: math.nan if s == 2 else 0.1, ValueError, r"sgd: lr schedule returned nan at step 2"),
    (lambda s: -0.1 if s == 2 else 0.1, ValueError, r"at step 2: must be >= 0"),
    (lambda s: "x", TypeError, r"lr schedule returned"),
])
def test_bad_schedule_values_change_nothing(lr, exc, pattern, rng):
    w = _rand(rng, 8, np.float64)
    opt = optgen.create("sgd", [w], lr=0.1, momentum=0.9)
    opt.step([np.ones(8)])
    opt.step([np.ones(8)])
    snap = _snapshot(opt)
    with pytest.raises(exc, match=pattern):
        opt.set_hyper(lr=lr)
    opt.set_hyper(lr=lambda s: 0.1)
    _assert_same(opt, snap)


def test_schedule_value_checked_against_the_spec_constraint(rng):
    w = _rand(rng, 8, np.float64)
    opt = optgen.create("ftrl", [w], lr=lambda s: 0.1 if s < 2 else 0.0)
    opt.step([np.ones(8)])
    opt.step([np.ones(8)])
    snap = _snapshot(opt)
    with pytest.raises(ValueError, match=r"ftrl: invalid lr=0\.0: must satisfy lr > 0"):
        opt.step([np.ones(8)])
    _assert_same(opt, snap)


# -- gradient handling ----------------------------------------------------------------
@pytest.mark.parametrize("max_norm", [0.5, 3.0, 1e6])
@pytest.mark.parametrize("rescale,loss_scale", [(1.0, 1.0), (0.25, 1.0), (1.0, 64.0)])
def test_global_norm_clipping_matches_numpy(max_norm, rescale, loss_scale, rng):
    shapes = [(13, 7), (5,), (3, 2, 4), ()]
    ws = [_rand(rng, s, np.float64) for s in shapes]
    w0 = [w.copy() for w in ws]
    opt = optgen.create("sgd", ws, lr=1.0, rescale_grad=rescale, loss_scale=loss_scale,
                        clip_global_norm=max_norm)
    grads = [np.asarray(_rand(rng, s, np.float64) * 3) for s in shapes]
    opt.step(grads)
    scaled = [g * rescale / loss_scale for g in grads]
    norm = np.linalg.norm(np.concatenate([g.ravel() for g in scaled]))
    coef = min(1.0, max_norm / (norm + 1e-6))
    assert opt.last_grad_norm == pytest.approx(norm, rel=1e-12)
    for w, a, g in zip(ws, w0, scaled):
        np.testing.assert_allclose(w, a - coef * g, rtol=1e-12, atol=1e-14)


def test_global_norm_clipping_float32_adam_vs_prescaled(rng):
    shapes = [(64, 33), (1000,)]
    w0 = [_rand(rng, s) for s in shapes]
    a, b = [w.copy() for w in w0], [w.copy() for w in w0]
    oa = optgen.create("adam", a, lr=0.01, clip_global_norm=1.0)
    ob = optgen.create("adam", b, lr=0.01)
    for _ in range(10):
        grads = [_rand(rng, s) for s in shapes]
        norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
        coef = min(1.0, 1.0 / (norm + 1e-6))
        oa.step(grads)
        ob.step([(g.astype(np.float64) * coef).astype(np.float32) for g in grads])
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("spec", ["adam", "lamb", "sgd"])
def test_nonfinite_skip_leaves_everything_bit_identical(spec, bad, rng):
    shapes = [(6, 5), (11,)]
    ws = [_rand(rng, s) for s in shapes]
    opt = optgen.create(spec, ws, lr=0.01, nonfinite="skip",
                        **({"momentum": 0.9} if spec == "sgd" else {}))
    for _ in range(3):
        assert opt.step([_rand(rng, s) for s in shapes]) is True
    snap = _snapshot(opt)
    grads = [_rand(rng, s) for s in shapes]
    grads[1][4] = bad
    assert opt.step(grads) is False
    _assert_same(opt, snap)
    assert opt.skipped_steps == 1 and math.isnan(opt.last_grad_norm)
    assert opt.step([_rand(rng, s) for s in shapes]) is True and opt.t == 4


def test_nonfinite_raise_and_clip_without_check(rng):
    w = _rand(rng, 7)
    g = _rand(rng, 7)
    g[3] = np.nan
    for kw in ({"nonfinite": "raise"}, {"clip_global_norm": 1.0}):
        opt = optgen.create("adam", {"layer.weight": w}, **kw)
        snap = _snapshot(opt)
        with pytest.raises(FloatingPointError,
                           match=r"adam: gradient 0 \(layer.weight\) has NaN or Inf values; "
                                 r"the step was not applied"):
            opt.step([g])
        _assert_same(opt, snap)
    with pytest.raises(ValueError, match=r"nonfinite must be None, 'skip' or 'raise'"):
        optgen.create("adam", [w], nonfinite="ignore")
    with pytest.raises(ValueError, match=r"invalid clip_global_norm=0\.0"):
        optgen.create("adam", [w], clip_global_norm=0.0)


def test_huge_finite_gradients_are_not_nonfinite():
    w = np.zeros(4, np.float64)
    opt = optgen.create("sgd", [w], lr=1.0, nonfinite="raise", clip_global_norm=1.0)
    assert opt.step([np.full(4, 1e200)])     # the squared norm overflows; the values do not
    assert opt.last_grad_norm == math.inf and np.all(w == 0.0)


# -- threads --------------------------------------------------------------------------
def test_threads_default_to_all_cores_and_can_be_set():
    code = ("import os, numpy as np, optgen\n"
            "o = optgen.create('adam', [np.zeros(1 << 16, np.float32)])\n"
            "o.step([np.ones(1 << 16, np.float32)])\n"
            "print(optgen.get_num_threads(), len(os.sched_getaffinity(0)))\n"
            "optgen.set_num_threads(1); o.step([np.ones(1 << 16, np.float32)])\n"
            "print(optgen.get_num_threads())\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.split("\n")[:2]
    n, cores = map(int, first.split())
    assert n == cores and second == "1"
    with pytest.raises(ValueError, match=r"set_num_threads: n must be an int >= 1, got 0"):
        optgen.set_num_threads(0)


def test_loss_scale_and_global_clip_need_rescale_grad(tmp_path):
    """The runtime scales gradients through rescale_grad; a spec without it cannot take
    loss_scale or clip_global_norm, which would otherwise be silently ignored."""
    path = tmp_path / "plain_sgd.py"
    path.write_text("from optgen.dsl import Spec\n"
                    "spec = Spec('plain_sgd')\n"
                    "lr = spec.hyper('lr', 0.1, 'lr >= 0')\n"
                    "@spec.update\n"
                    "def plain_sgd(w, grad, flags):\n"
                    "    return {w: w - lr * grad}\n")
    w = np.ones(3)
    for option in ({"loss_scale": 1024.0}, {"clip_global_norm": 1e-3}):
        with pytest.raises(ValueError, match=rf"plain_sgd: {next(iter(option))} needs a spec "
                                             "with rescale_grad"):
            optgen.create(str(path), [w], **option)
    opt = optgen.create(str(path), [w], nonfinite="skip")
    assert opt.step([np.full(3, np.nan)]) is False
    assert opt.step([np.ones(3)]) is True
    np.testing.assert_allclose(w, 0.9)

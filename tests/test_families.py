"""The elementwise families (specs/adopt.py, ademamix.py, laprop.py, yogi.py,
adabound.py, qhadam.py, qhm.py, adamod.py, diffgrad.py, sgdw.py, padam.py, grams.py and
their optgen.torch classes, optgen/torch/families.py):

* compiled kernels and the reference interpreter step alike, and both match the
  oracles of family_oracles.py (written from the papers, float64), 20 float32 steps;
* each torch class against pytorch-optimizer's class of the same rule on a small torch
  model, 40 float32 steps under a cosine lr schedule, checkpointed and rebuilt at step
  20: parameters within 1e-5 of the largest magnitude (where the defaults differ, both
  are given the same values: docs/catalog.md lists the differences).

The catalog-wide tests take these specs by sampling (tests/helpers.py, FAMILY_SPECS).
"""
from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

import optgen
import optgen.torch as otorch
from family_oracles import ORACLES
from helpers import assert_close
from test_recent_optimizers import assert_near, backward, net, rebuilt, schedule

STEPS = 20
# spec -> (hyperparameters of the spec, the oracle's arguments)
CASES = {
    "adopt": (dict(lr=0.01, beta2=0.99, weight_decay=0.01), dict(lr=0.01, beta2=0.99,
                                                                  weight_decay=0.01)),
    "adopt-decouple-noclip": (dict(lr=0.01, decouple=True, weight_decay=0.1, clip_power=None),
                              dict(lr=0.01, decouple=True, weight_decay=0.1, clip_power=None)),
    "ademamix": (dict(lr=0.01, beta3=0.99, alpha=5.0, alpha_warmup=12.0, beta3_warmup=8.0,
                      weight_decay=0.05),
                 dict(lr=0.01, betas=(0.9, 0.999, 0.99), alpha=5.0, t_alpha=12, t_beta3=8,
                      weight_decay=0.05)),
    "laprop": (dict(lr=0.01, beta2=0.99), dict(lr=0.01, beta2=0.99)),
    "yogi": (dict(lr=0.01, initial_accumulator=1e-3), dict(lr=0.01, initial_accumulator=1e-3)),
    "adabound": (dict(lr=0.01, base_lr=0.01, final_lr=0.05, gamma=0.05),
                 dict(lr=0.01, final_lr=0.05, gamma=0.05)),
    "adabound-amsbound": (dict(lr=0.01, base_lr=0.01, amsbound=True, gamma=0.05),
                          dict(lr=0.01, amsbound=True, gamma=0.05)),
    "qhadam": (dict(lr=0.01, nu1=0.7, nu2=0.9), dict(lr=0.01, nus=(0.7, 0.9))),
    "qhm": (dict(lr=0.1, momentum=0.9, nu=0.7), dict(lr=0.1, momentum=0.9, nu=0.7)),
    "adamod": (dict(lr=0.01, beta3=0.9), dict(lr=0.01, beta3=0.9)),
    "diffgrad": (dict(lr=0.01), dict(lr=0.01)),
    "sgdw": (dict(lr=0.05, momentum=0.9, weight_decay=0.1, nesterov=True),
             dict(lr=0.05, momentum=0.9, weight_decay=0.1, nesterov=True)),
    "padam": (dict(lr=0.05, partial=0.125), dict(lr=0.05, partial=0.125)),
    "grams": (dict(lr=0.01, weight_decay=0.1), dict(lr=0.01, weight_decay=0.1)),
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")   # (tests/conftest.py)


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_reference_and_paper_agree(case):
    name = case.split("-")[0]
    hyper, oracle_kw = CASES[case]
    rng = np.random.default_rng(7)
    shapes = [(13, 7), (5,)]
    ws = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[(rng.standard_normal(s) * 10.0 ** rng.uniform(-2, 0)).astype(np.float32)
              for s in shapes] for _ in range(STEPS)]
    runs = {}
    for backend in ("compiled", "reference"):
        params = [w.copy() for w in ws]
        opt = optgen.create(name, params, backend=backend, **hyper)
        for g in grads:
            opt.step([x.copy() for x in g])
        runs[backend] = (params, opt)
    for i, w0 in enumerate(ws):
        want = ORACLES[name](w0, [g[i] for g in grads], **oracle_kw)
        assert np.abs(want - w0).max() > 1e-3, f"{case}: the oracle did not move"
        assert_close(runs["compiled"][0][i], runs["reference"][0][i], "float32", case)
        for backend, (params, _) in runs.items():
            assert_near(params[i], want, f"{case} {backend}, parameter {i}")
    for state in runs["compiled"][1].state:   # (the states too: the same names, values)
        assert state


def pytorch_optimizer():
    return importlib.import_module("pytorch_optimizer")   # (a few seconds: only here)


# class -> (ours' arguments, pytorch-optimizer's class name, its extra arguments)
TORCH_CASES = {
    "ADOPT": (dict(lr=3e-3, weight_decay=0.01), "ADOPT", {}),
    "ADOPT-decouple": (dict(lr=3e-3, weight_decay=0.01, decouple=True), "ADOPT",
                       dict(weight_decouple=True)),
    "AdEMAMix": (dict(lr=3e-3, weight_decay=0.01, alpha=5.0, beta3_warmup=30, alpha_warmup=30,
                      betas=(0.9, 0.999, 0.99)), "AdEMAMix",
                 dict(weight_decouple=True, t_alpha_beta3=30)),
    "LaProp": (dict(lr=3e-3, weight_decay=0.01), "LaProp", {}),
    "Yogi": (dict(lr=3e-3, weight_decay=0.01), "Yogi", {}),
    "AdaBound": (dict(lr=3e-3, weight_decay=0.01, gamma=0.01, final_lr=0.05), "AdaBound",
                 dict(weight_decouple=False)),
    "AdaBound-amsbound": (dict(lr=3e-3, amsbound=True), "AdaBound", dict(ams_bound=True)),
    "QHAdam": (dict(lr=3e-3, nus=(0.7, 0.9), weight_decay=0.01), "QHAdam", {}),
    "QHM": (dict(lr=0.05, momentum=0.9, nu=0.7, weight_decay=0.01), "QHM", {}),
    "AdaMod": (dict(lr=3e-3, weight_decay=0.01, beta3=0.99), "AdaMod",
               dict(weight_decouple=False)),
    "DiffGrad": (dict(lr=3e-3, weight_decay=0.01), "DiffGrad", dict(weight_decouple=False)),
    "SGDW": (dict(lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=True), "SGDW", {}),
    "PAdam": (dict(lr=0.01, weight_decay=0.01, amsgrad=False), "PAdam", {}),
    "Grams": (dict(lr=3e-3, weight_decay=0.01), "Grams", {}),
    "Tiger": (dict(lr=3e-3, weight_decay=0.01), "Tiger", {}),
}


def _theirs_kwargs(ours: dict, extra: dict) -> dict:
    """Ours' arguments in pytorch-optimizer's names: AdaMod's beta3 joins betas; the
    options it has not (the warm-ups, given as t_alpha_beta3; amsbound, decouple) go."""
    kw = {k: v for k, v in ours.items()
          if k not in ("decouple", "beta3_warmup", "alpha_warmup", "amsbound", "amsgrad")}
    if "beta3" in kw:
        kw["betas"] = (0.9, 0.999, kw.pop("beta3"))
    return kw | extra


@pytest.mark.parametrize("case", list(TORCH_CASES))
def test_matches_pytorch_optimizer(case):
    hyper, their_name, extra = TORCH_CASES[case]
    ours_cls = getattr(otorch, case.split("-")[0])

    def ours(params):
        return ours_cls(params, **hyper)

    a, b = net(), net()
    theirs = getattr(pytorch_optimizer(), their_name)(a.parameters(),
                                                      **_theirs_kwargs(hyper, extra))
    opt = ours(b.parameters())
    pairs = [(a, theirs, schedule(theirs)), (b, opt, schedule(opt))]
    for step in range(40):
        if step == 20:
            pairs[1] = rebuilt(b, opt, pairs[1][2], ours)
            b, opt = pairs[1][0], pairs[1][1]
        for model, o, sched in pairs:
            backward(model, step)
            o.step()
            sched.step()
    start = net()
    for (name, p), q, p0 in zip(a.named_parameters(), b.parameters(), start.parameters()):
        assert (p - p0).abs().max() > 1e-3, f"{case} {name}: nothing moved"
        assert_near(q.detach(), p.detach(), f"{case} {name}")


BAD = [   # (class, arguments, exception, message)
    ("ADOPT", dict(clip_lambda=lambda step: step ** 0.5), ValueError, "clip_lambda must be None"),
    ("LaProp", dict(centered=True), ValueError, "centered=True is not built"),
    ("LaProp", dict(amsgrad=True), ValueError, "amsgrad=True is not built"),
    ("QHM", dict(momentum=0.9, nu=0.7), ValueError, "lr must be given"),
    ("QHM", dict(lr=0.1, weight_decay_type="direct"), ValueError, "weight_decay_type"),
    ("AdEMAMix", dict(betas=(0.9, 0.999, 0.5)), ValueError, "beta1 <= beta3 < 1"),
    ("QHAdam", dict(nus=(1.5, 1.0)), ValueError, "0 <= nu1 <= 1"),
    ("AdaBound", dict(gamma=0.0), ValueError, "0 < gamma < 1"),
]


@pytest.mark.parametrize("cls,kwargs,exc,message", BAD, ids=[f"{c}-{i}" for i, (c, *_) in
                                                             enumerate(BAD)])
def test_bad_arguments_are_refused_before_anything_changes(cls, kwargs, exc, message):
    p = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(exc, match=message):
        getattr(otorch, cls)([p], **kwargs)
    assert torch.equal(p.detach(), torch.ones(3))


def test_adabound_base_lr_is_each_groups_initial_lr():
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    opt = otorch.AdaBound([{"params": [a]}, {"params": [b], "lr": 0.01}], lr=0.001)
    assert [g["base_lr"] for g in opt.param_groups] == [0.001, 0.01]

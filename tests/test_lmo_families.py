"""The matrix families Scion (specs/scion.py, the LIONS-EPFL authors' Scion) and MuonLaProp
(specs/muon_laprop.py, heavyball's), heavyball's OrthoLaProp and LaPropOrtho
(specs/ortho_laprop.py) and their optgen.torch classes (optgen/torch/lmo_families.py):

* compiled kernels and the reference interpreter step alike, and both match oracles
  written here from the papers (numpy, float64: Pethick et al.'s SCG / uSCG with the
  authors' LMOs; LaProp's momentum of the normalized gradient, then Muon's iteration;
  OrthoGrad's projection before or after LaProp);
* each torch class against heavyball 3.2.1's class of the same rule, in float64 on square
  weights (there heavyball iterates with Muon's coefficients when told
  ``zeroth_power_mode="legacy_newtonschulz"``; elsewhere it runs five per-step triples);
* ``orthogonalize(laprop)`` (optgen.transforms) is muon_laprop on 2-D parameters, and
  ``cautious(laprop)`` heavyball's LaProp(caution=True);
* what the classes do not build is refused before anything changes.

The catalog-wide tests take these specs by sampling (tests/helpers.py, FAMILY_SPECS).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import optgen
import optgen.torch as otorch
from helpers import assert_close
from optgen.transforms import cautious, orthogonalize, spec_file
from test_recent_optimizers import assert_near

STEPS = 8
SHAPES = [(9, 5), (4, 7), (6,)]
pytestmark = pytest.mark.usefixtures("one_torch_thread")   # (tests/conftest.py)


def newton_schulz(x, steps=5, a=3.4445, b=-4.7750, c=2.0315, eps=1e-7):
    """Muon's quintic iteration (Jordan et al. 2024): X = x / ||x||_F, then
    X = a X + (b A + c A A) X with A = X X^T, on the wide side."""
    x = x / max(np.linalg.norm(x), eps)
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    for _ in range(steps):
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    return x.T if tall else x


def scion(w, grads, lr=1e-3, momentum=1.0, scale=1.0, sign=False, unconstrained=False):
    """Pethick et al. 2025, Algorithms 1 (uSCG) and 2 (SCG): d = (1 - alpha) d + alpha g,
    s = lmo(d) over the ball of radius rho = scale; uSCG w += gamma s, SCG
    w = (1 - gamma) w + gamma s. The LMOs are the authors' (scion.py): Spectral
    -sqrt(d_out / d_in) U V^T by Newton-Schulz, Sign -sign(d) / d_in, BiasRMS
    -d / (rms(d) + 1e-8)."""
    w = w.astype(np.float64)
    d = np.zeros_like(w)
    for g in grads:
        d = (1 - momentum) * d + momentum * g
        if w.ndim != 2:
            s = -d / (np.sqrt(np.mean(d * d)) + 1e-8)
        elif sign:
            s = -np.sign(d) / w.shape[1]
        else:
            s = -math.sqrt(w.shape[0] / w.shape[1]) * newton_schulz(d)
        w = w + lr * scale * s if unconstrained else (1 - lr) * w + lr * scale * s
    return w


def muon_laprop(w, grads, lr=0.0025, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0):
    """LaProp (Ziyin et al. 2020, Algorithm 1) with bias corrections, its step on 2-D
    weights orthogonalized as Muon's and scaled by sqrt(max(1, R / C)) (heavyball's
    MuonLaProp); eps a lower bound of the corrected sqrt(v), as heavyball's."""
    w = w.astype(np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        v = beta2 * v + (1 - beta2) * g * g
        m = beta1 * m + (1 - beta1) * g / np.maximum(np.sqrt(v / (1 - beta2 ** t)), eps)
        u = m / (1 - beta1 ** t)
        if w.ndim == 2:
            u = math.sqrt(max(1.0, w.shape[0] / w.shape[1])) * newton_schulz(u)
        w = w * (1 - lr * weight_decay) - lr * u
    return w


def ortho_laprop(w, grads, lr=0.0025, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0,
                 after=False):
    """OrthoGrad (Prieto et al. 2025, eq. 9-10: x_perp = x - (w.x / w.w) w, rescaled to
    ||x||) on the gradient before LaProp, or on LaProp's step after it (``after``), with
    heavyball's eps in w.w and its floor 1e-6 of ||x_perp||."""
    def ortho(w, x):
        y = x - np.sum(w * x) / (np.sum(w * w) + eps) * w
        return y * np.linalg.norm(x) / max(np.linalg.norm(y), 1e-6)
    w = w.astype(np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        g = g if after else ortho(w, g)
        v = beta2 * v + (1 - beta2) * g * g
        m = beta1 * m + (1 - beta1) * g / np.maximum(np.sqrt(v / (1 - beta2 ** t)), eps)
        u = m / (1 - beta1 ** t)
        w = w * (1 - lr * weight_decay) - lr * (ortho(w, u) if after else u)
    return w


ORACLES = {"scion": scion, "muon_laprop": muon_laprop, "ortho_laprop": ortho_laprop}
CASES = {   # case -> (hyperparameters of the spec and of the oracle)
    "scion": dict(lr=0.05, momentum=0.5, scale=2.0),
    "scion-sign-unconstrained": dict(lr=0.05, momentum=0.3, sign=True, unconstrained=True),
    "muon_laprop": dict(lr=0.02, beta1=0.8, beta2=0.95, weight_decay=0.1),
    "ortho_laprop": dict(lr=0.02, beta1=0.8, beta2=0.95, weight_decay=0.1),
    "ortho_laprop-after": dict(lr=0.02, beta1=0.8, beta2=0.95, weight_decay=0.1, after=True),
}


def problem(seed=7):
    rng = np.random.default_rng(seed)
    ws = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[(rng.standard_normal(s) * 10.0 ** rng.uniform(-2, 0)).astype(np.float32)
              for s in SHAPES] for _ in range(STEPS)]
    return ws, grads


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_reference_and_paper_agree(case):
    name, hyper = case.split("-")[0], CASES[case]
    ws, grads = problem()
    runs = {}
    for backend in ("compiled", "reference"):
        params = [w.copy() for w in ws]
        opt = optgen.create(name, params, backend=backend, **hyper)
        for g in grads:
            opt.step([x.copy() for x in g])
        runs[backend] = params
    for i, w0 in enumerate(ws):
        want = ORACLES[name](w0, [g[i].astype(np.float64) for g in grads], **hyper)
        assert np.abs(want - w0).max() > 1e-2, f"{case}: the oracle did not move"
        assert_close(runs["compiled"][i], runs["reference"][i], "float32", case)
        for backend, params in runs.items():
            assert_near(params[i], want, f"{case} {backend}, parameter {i} {SHAPES[i]}")


def test_orthogonalize_laprop_is_muon_laprop_on_2d_parameters():
    """LaProp's authors keep lr inside the momentum and add eps; heavyball bias-corrects
    and bounds: at a constant lr and a negligible eps the two momenta are proportional,
    and the iteration normalizes, so the 2-D steps agree (other parameters take each its
    own LaProp)."""
    ws, grads = problem(3)
    h = dict(lr=0.02, beta1=0.8, beta2=0.95, weight_decay=0.1)
    got = optgen.create(spec_file(orthogonalize("laprop")), [w.copy() for w in ws],
                        backend="reference", eps=0.0, **h)
    want = optgen.create("muon_laprop", [w.copy() for w in ws], backend="reference",
                         eps=1e-30, **h)
    for g in grads:
        got.step([x.copy() for x in g])
        want.step([x.copy() for x in g])
    for i in (0, 1):
        assert np.abs(want.params[i] - ws[i]).max() > 1e-2
        assert_close(got.params[i], want.params[i], "float32", f"2-D parameter {SHAPES[i]}")


@pytest.fixture
def heavyball_legacy(monkeypatch):
    """heavyball 3.2.1, eager, orthogonalizing square matrices with Muon's coefficients."""
    heavyball = pytest.importorskip("heavyball", reason="the heavyball comparison needs "
                                    "heavyball (the test extra)")
    import heavyball.utils
    monkeypatch.setattr(heavyball.utils, "compile_mode", None)
    monkeypatch.setattr(heavyball.utils, "zeroth_power_mode", "legacy_newtonschulz")
    return heavyball


def square_problem(seed=5):
    """Square weights (where heavyball iterates with Muon's coefficients) and a bias, in
    float64, and their gradients."""
    rng = np.random.default_rng(seed)
    shapes = [(6, 6), (6,)]
    ws = [rng.standard_normal(s) for s in shapes]
    return ws, [[rng.standard_normal(s) * 0.1 for s in shapes] for _ in range(STEPS)]


def against_heavyball(name, ws, grads, theirs_cls, theirs_kw, **ours_kw):
    """Our spec (the reference interpreter, float64) against heavyball's class, fed the
    same gradients."""
    ours = optgen.create(name, [w.copy() for w in ws], backend="reference", **ours_kw)
    ps = [torch.nn.Parameter(torch.tensor(w)) for w in ws]
    theirs = theirs_cls(ps, **theirs_kw)
    for gs in grads:
        ours.step([g.copy() for g in gs])
        for p, g in zip(ps, gs):
            p.grad = torch.tensor(g)
        theirs.step()
    for i, p in enumerate(ps):
        assert np.abs(ours.params[i] - ws[i]).max() > 1e-3, f"{name} w[{i}]: nothing moved"
        assert_near(ours.params[i], p.detach().numpy(), f"heavyball w[{i}]")   # (float64:
        # the two write the iteration in different orders; it amplifies round-off to ~1e-8)


def test_muon_laprop_matches_heavyball(heavyball_legacy):
    ws, grads = square_problem()
    h = dict(lr=0.01, weight_decay=0.1)
    against_heavyball("muon_laprop", ws, grads, heavyball_legacy.MuonLaProp,
                      dict(h, betas=(0.85, 0.95)), beta1=0.85, beta2=0.95, **h)


@pytest.mark.parametrize("after", [False, True], ids=["OrthoLaProp", "LaPropOrtho"])
def test_ortho_laprop_matches_heavyball(heavyball_legacy, after):
    """(heavyball stores its averages in float32: within 1e-7 of ours)"""
    ws, grads = square_problem()
    h = dict(lr=0.01, weight_decay=0.1)
    cls = heavyball_legacy.LaPropOrtho if after else heavyball_legacy.OrthoLaProp
    against_heavyball("ortho_laprop", ws, grads, cls, dict(h, betas=(0.85, 0.95)),
                      beta1=0.85, beta2=0.95, after=after, **h)


@pytest.mark.parametrize("constrained", [False, True], ids=["unconstrained", "constrained"])
def test_scion_matches_heavyball(heavyball_legacy, constrained):
    """heavyball's Scion is the authors' "Auto" Scion with its momentum 1 - beta1 (its
    average is bias-corrected, which the LMOs do not see), unconstrained, with decoupled
    weight decay: weight_decay=1 is the authors' constrained step. It re-initializes the
    parameters at its first step (scion_auto_init_param_, seeded by the parameter's
    index): both start from that draw, which it then repeats."""
    import heavyball.utils
    ws, grads = square_problem()
    scale = 2.0
    for i, w in enumerate(ws):
        t = torch.tensor(w)
        heavyball.utils.scion_auto_init_param_(t, scale, seed=i)
        ws[i] = t.numpy()
    against_heavyball("scion", ws, grads, heavyball_legacy.Scion,
                      dict(lr=0.02, betas=(0.8, 0.99), scale=scale,
                           weight_decay=1.0 if constrained else 0.0),
                      lr=0.02, momentum=0.2, scale=scale, unconstrained=not constrained)


def test_cautious_laprop_is_heavyballs_laprop_with_caution(heavyball_legacy):
    """LaProp's decay applies after its step, (w - s) (1 - lr wd), which the transforms
    take apart too: cautious(laprop) is heavyball's LaProp(caution=True) at a constant lr
    and no decay (heavyball bias-corrects where the authors keep lr in the momentum, and
    bounds sqrt(v) by 1e-8 where they add eps: eps=0 here)."""
    ws, grads = square_problem(9)
    h = dict(lr=0.01, beta1=0.8, beta2=0.95)
    against_heavyball(spec_file(cautious("laprop")), ws, grads, heavyball_legacy.LaProp,
                      dict(lr=0.01, betas=(0.8, 0.95), caution=True), eps=0.0, **h)


def torch_run(opt, params, grads):
    for gs in grads:
        for p, g in zip(params, gs):
            p.grad = torch.tensor(g)
        opt.step()


def test_the_torch_classes_step_their_rules():
    """The classes pass their authors' arguments on as the specs' (Scion's norm per group,
    MuonLaProp's betas): float32, against the oracles."""
    ws, grads = problem()
    ps = [torch.nn.Parameter(torch.tensor(w)) for w in ws]
    sign = torch.nn.Parameter(torch.tensor(ws[1]))
    sign_group = {"params": [sign], "norm": "Sign", "momentum": 0.3, "scale": 1.0,
                  "unconstrained": True}
    opt = otorch.Scion([{"params": ps}, sign_group], lr=0.05, momentum=0.5, scale=2.0)
    torch_run(opt, [*ps, sign], [[*gs, gs[1]] for gs in grads])
    for i, p in enumerate(ps):
        want = scion(ws[i], [g[i].astype(np.float64) for g in grads], **CASES["scion"])
        assert_near(p.detach().numpy(), want, f"Scion, parameter {i}")
    want = scion(ws[1], [g[1].astype(np.float64) for g in grads],
                 **CASES["scion-sign-unconstrained"])
    assert_near(sign.detach().numpy(), want, "Scion, the Sign group")
    for cls, case in (("MuonLaProp", "muon_laprop"), ("OrthoLaProp", "ortho_laprop"),
                      ("LaPropOrtho", "ortho_laprop-after")):
        h = dict(CASES[case])
        ps = [torch.nn.Parameter(torch.tensor(w)) for w in ws]
        torch_run(getattr(otorch, cls)(ps, lr=h["lr"], betas=(h["beta1"], h["beta2"]),
                                       weight_decay=h["weight_decay"]), ps, grads)
        for i, p in enumerate(ps):
            want = ORACLES[case.split("-")[0]](ws[i], [g[i].astype(np.float64) for g in grads],
                                               **h)
            assert_near(p.detach().numpy(), want, f"{cls}, parameter {i}")


def test_scion_init_is_the_authors_norm_matched_draw():
    torch.manual_seed(1)
    hidden, head, bias = (torch.nn.Parameter(torch.randn(s)) for s in ((8, 4), (3, 8), (8,)))
    opt = otorch.Scion([{"params": [hidden, bias], "scale": 2.0},
                        {"params": [head], "norm": "Sign", "scale": 3.0, "unconstrained": True}])
    opt.init()
    sv = torch.linalg.svdvals(hidden.detach().double())
    assert torch.allclose(sv, torch.full_like(sv, 2.0 * math.sqrt(8 / 4))), sv
    assert set(head.detach().abs().flatten().tolist()) == {3.0 / 8}
    assert not bias.detach().any()


def test_scion_takes_named_parameters_with_one_norm():
    model = torch.nn.Sequential(torch.nn.Linear(4, 6, bias=False), torch.nn.Linear(6, 3))
    with pytest.raises(ValueError, match="norm='Sign' does not take a 1-D parameter"):
        otorch.Scion(model.named_parameters(), norm="Sign")
    opt = otorch.Scion(model[0].named_parameters(), norm="Sign", unconstrained=True)
    assert opt.param_groups[0]["sign"] and opt.param_groups[0]["param_names"] == ["weight"]


BAD = [   # (class, parameter shapes, arguments, message)
    ("Scion", [(4, 3)], dict(norm="ColNorm"), "norm='ColNorm' is not built"),
    ("Scion", [(2, 3, 3)], {}, "does not take a 3-D parameter"),
    ("Scion", [(4,)], dict(norm="Sign"), "norm='Sign' does not take a 1-D parameter"),
    ("Scion", [(4, 3)], dict(norm="BiasRMS"), "norm='BiasRMS' does not take a 2-D"),
    ("Scion", [(4, 3)], dict(norm="Sign", norm_kwargs=dict(normalized=False)),
     "normalized=False of norm 'Sign' is not built"),
    ("Scion", [(4, 3)], dict(momentum=1.5), "0 <= momentum <= 1"),
    ("MuonLaProp", [(4, 3)], dict(caution=True), "caution=True is not built"),
    ("MuonLaProp", [(4, 3)], dict(palm=True), "palm=True is not built"),
    ("LaPropOrtho", [(4, 3)], dict(mars=True), "LaPropOrtho: mars=True is not built"),
]


@pytest.mark.parametrize("cls,shapes,kwargs,message", BAD,
                         ids=[f"{c}-{i}" for i, (c, *_) in enumerate(BAD)])
def test_bad_arguments_are_refused_before_anything_changes(cls, shapes, kwargs, message):
    ps = [torch.nn.Parameter(torch.ones(s)) for s in shapes]
    with pytest.raises(ValueError, match=message):
        getattr(otorch, cls)(ps, **kwargs)
    assert all(torch.equal(p.detach(), torch.ones(p.shape)) for p in ps)

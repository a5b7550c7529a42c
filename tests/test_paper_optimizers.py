"""Prodigy, CAME and Adam-atan2 (optgen.torch.Prodigy / CAME / AdamAtan2, specs/prodigy.py,
specs/came.py, specs/adam_atan2.py) against their authors' packages (prodigyopt,
came-pytorch, adam-atan2-pytorch) side by side on a small torch model, float32, 100 steps
under a torch lr scheduler, checkpointed through ``state_dict`` and rebuilt at step 50:
parameters within 1e-5 of the largest magnitude of each; and Prodigy and CAME against
numpy oracles written from the papers' algorithms (Adam-atan2's is
tests/test_math_functions.py::test_adam_atan2_matches_the_paper)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from adam_atan2_pytorch.adam_atan2 import AdamAtan2 as TheirAdamAtan2
from came_pytorch import CAME as TheirCAME
from prodigyopt import Prodigy as TheirProdigy

import optgen
import optgen.torch as otorch
from test_recent_optimizers import STEPS, CHECKPOINT_AT, assert_near, backward, net, rebuilt, \
    schedule

CASES = {   # name -> (ours, theirs, keyword arguments both take)
    "prodigy": (otorch.Prodigy, TheirProdigy, dict(weight_decay=0.01)),
    "prodigy_coupled": (otorch.Prodigy, TheirProdigy,
                        dict(decouple=False, weight_decay=0.001, betas=(0.85, 0.99), beta3=0.98,
                             use_bias_correction=True, growth_rate=1.05, d_coef=0.8)),
    "prodigy_safeguard": (otorch.Prodigy, TheirProdigy, dict(safeguard_warmup=True, d0=1e-5)),
    "came": (otorch.CAME, TheirCAME, dict(lr=2e-3, weight_decay=0.01)),
    "came_eps": (otorch.CAME, TheirCAME, dict(lr=1e-3, eps=(1e-20, 1e-12), clip_threshold=0.5,
                                              betas=(0.8, 0.99, 0.999))),
    "adam_atan2": (otorch.AdamAtan2, TheirAdamAtan2, dict(lr=3e-3, weight_decay=0.1)),
    "adam_atan2_decoupled": (otorch.AdamAtan2, TheirAdamAtan2,
                             dict(lr=3e-3, weight_decay=1e-4, decoupled_wd=True,
                                  cautious_wd=True, betas=(0.8, 0.95), a=1.0, b=2.0)),
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")   # (tests/conftest.py)


@pytest.mark.parametrize("case", list(CASES))
def test_is_the_authors(case):
    ours_cls, theirs_cls, hyper = CASES[case]

    def ours(params):
        return ours_cls(params, **hyper)

    a, b = net(), net()
    theirs, opt = theirs_cls(a.parameters(), **hyper), ours(b.parameters())
    pairs = [(a, theirs, schedule(theirs)), (b, opt, schedule(opt))]
    for step in range(STEPS):
        if step == CHECKPOINT_AT:
            b, opt, sched = rebuilt(b, opt, pairs[1][2], ours)
            pairs[1] = (b, opt, sched)
        for model, o, sched in pairs:
            backward(model, step)
            o.step()
            sched.step()
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert_near(q.detach(), p.detach(), name)
    if ours_cls is otorch.Prodigy:
        d = theirs.param_groups[0]["d"]
        assert d > 10 * hyper.get("d0", 1e-6)        # the estimate grew from d0
        np.testing.assert_allclose(float(opt.state[next(b.parameters())]["d"]), d, rtol=1e-4)


# -- oracles written from the papers --------------------------------------------------------
def prodigy_oracle(ws, grad_of, steps, lr, beta1, beta2, eps, d0):
    """Mishchenko & Defazio 2024, Algorithm 4 (Prodigy, Adam version), without weight
    decay: r and s weigh the gradient by lr * d**2; d_hat = r / ||s||_1 over all
    parameters; d grows to max(d, d_hat); the step uses the estimate of this step in
    eps * d (as the authors' code). float64."""
    x0 = [w.astype(np.float64) for w in ws]
    x = [w.copy() for w in x0]
    m = [np.zeros_like(w) for w in x]
    v = [np.zeros_like(w) for w in x]
    s = [np.zeros_like(w) for w in x]
    r, d, rb = 0.0, d0, np.sqrt(beta2)
    for k in range(steps):
        g = [gi.astype(np.float64) for gi in grad_of(x, k)]
        r = rb * r + (1 - rb) * lr * d * d * sum(float(np.dot(gi.ravel(), (a - b).ravel()))
                                                 for gi, a, b in zip(g, x0, x))
        s = [rb * si + (1 - rb) * lr * d * d * gi for si, gi in zip(s, g)]
        m = [beta1 * mi + (1 - beta1) * d * gi for mi, gi in zip(m, g)]
        v = [beta2 * vi + (1 - beta2) * d * d * gi * gi for vi, gi in zip(v, g)]
        d_new = max(d, r / sum(float(np.abs(si).sum()) for si in s))
        x = [xi - lr * d * mi / (np.sqrt(vi) + d_new * eps) for xi, mi, vi in zip(x, m, v)]
        d = d_new
    return x, d


def came_oracle(w, grads, lr, beta1, beta2, beta3, eps1, eps2, clip):
    """Luo et al. 2023, Algorithm 1 (CAME) for a matrix: factored second moment and
    confidence from row and column sums (the paper's 1_m, 1_n products). float64."""
    w = w.astype(np.float64)
    n, k = w.shape
    r, c, rr, cc = np.zeros(n), np.zeros(k), np.zeros(n), np.zeros(k)
    m = np.zeros_like(w)
    for g in grads:
        g = g.astype(np.float64)
        sq = g * g + eps1
        r = beta2 * r + (1 - beta2) * sq.sum(axis=1)
        c = beta2 * c + (1 - beta2) * sq.sum(axis=0)
        u = g / np.sqrt(np.outer(r, c) / r.sum())
        u = u / max(1.0, np.sqrt(np.mean(u * u)) / clip)
        m = beta1 * m + (1 - beta1) * u
        res = (u - m) ** 2 + eps2
        rr = beta3 * rr + (1 - beta3) * res.sum(axis=1)
        cc = beta3 * cc + (1 - beta3) * res.sum(axis=0)
        w = w - lr * m / np.sqrt(np.outer(rr, cc) / rr.sum())
    return w


def _grads(rng, shapes, steps):
    return [[rng.standard_normal(s).astype(np.float32) * 10.0 ** rng.uniform(-3, 0)
             for s in shapes] for _ in range(steps)]


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_prodigy_matches_the_paper(backend):
    rng = np.random.default_rng(3)
    shapes = [(37, 11), (29,)]
    ws = [rng.standard_normal(s) for s in shapes]    # (float64: the gradient follows w)
    targets = [3 * rng.standard_normal(s) for s in shapes]
    noise = _grads(rng, shapes, 40)

    def grad_of(xs, k):   # a noisy quadratic around ``targets``
        return [(x - t) + 0.1 * n for x, t, n in zip(xs, targets, noise[k])]

    hp = dict(lr=0.5, beta1=0.9, beta2=0.99, eps=1e-8, d0=1e-4)
    params = [w.copy() for w in ws]
    opt = optgen.create("prodigy", params, backend=backend, **hp)
    for k in range(len(noise)):
        opt.step(grad_of(params, k))
    want, d = prodigy_oracle(ws, grad_of, len(noise), **hp)
    assert d > 100 * hp["d0"]
    for got, exp in zip(params, want):
        assert_near(got, exp, "prodigy")


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_came_matches_the_paper(backend):
    rng = np.random.default_rng(5)
    w0 = rng.standard_normal((23, 17)).astype(np.float32)
    grads = [gs[0] for gs in _grads(rng, [(23, 17)], 40)]
    hp = dict(lr=1e-2, beta1=0.9, beta2=0.999, beta3=0.9999, eps1=1e-30, eps2=1e-16)
    w = w0.copy()
    opt = optgen.create("came", [w], backend=backend, clip_threshold=1.0, **hp)
    for g in grads:
        opt.step([g])
    assert_near(w, came_oracle(w0, grads, clip=1.0, **hp), "came")

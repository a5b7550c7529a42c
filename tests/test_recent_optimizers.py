"""Schedule-Free AdamW, MARS-AdamW and Cautious AdamW (specs/schedule_free_adamw.py,
specs/mars_adamw.py, specs/cautious_adamw.py) against their authors' rules on a small
torch model (a 1-D convolution, whose 3-D kernel MARS treats as the authors do, and a
2-layer MLP), float32, 100 steps under a torch lr scheduler, with the optgen optimizer
checkpointed through ``state_dict`` and rebuilt at step 50; parameters (and states)
within 1e-5 of the largest magnitude of each tensor.

* Schedule-Free AdamW: the authors' package, ``schedulefree.AdamWScheduleFree``, side by
  side (both models in the same trajectory), train()/eval() included.
* MARS and Cautious AdamW: ``pytorch_optimizer`` departs from the authors' code
  (docs/catalog.md says how), so optgen is compared with the oracles of
  catalog_oracles.py (the authors' rules, fed the model's gradients), and those oracles,
  switched to pytorch-optimizer's departures, with ``pytorch_optimizer.MARS`` and with its
  cautious mask (``AdEMAMix`` with alpha 0: AdamW, cautious).

The catalog-wide tests cover the rest: reference interpreter vs kernels
(test_kernel_vs_reference.py), the oracles on every shape (test_catalog_oracles.py),
constructor, scheduler and checkpoint of the torch class (test_torch_make_specs.py).
"""
from __future__ import annotations

import importlib
import io

import numpy as np
import pytest
import schedulefree
import torch

import optgen
import optgen.torch as otorch
from catalog_oracles import CautiousAdamW, MARSAdamW

STEPS, CHECKPOINT_AT = 100, 50
REL = 1e-5


pytestmark = pytest.mark.usefixtures("one_torch_thread")   # (tests/conftest.py)


def pytorch_optimizer():
    return importlib.import_module("pytorch_optimizer")   # (a few seconds: only here)


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv1d(2, 4, 3), torch.nn.Flatten(),
                               torch.nn.Linear(24, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 1))


def backward(model: torch.nn.Module, step: int) -> None:
    """Fresh gradients: the loss of minibatch ``step`` at the model's weights."""
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(16, 2, 8, generator=g), torch.randn(16, 1, generator=g)
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()


def schedule(opt) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS, eta_min=1e-4)


def rebuilt(model, opt, sched, make_opt):
    """A fresh model, optimizer and scheduler from a torch.save of the three."""
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                "sched": sched.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    model = net()
    model.load_state_dict(saved["model"])
    opt = make_opt(model.parameters())
    opt.load_state_dict(saved["opt"])
    sched = schedule(opt)
    sched.load_state_dict(saved["sched"])
    return model, opt, sched


def assert_near(actual, expected, what: str) -> None:
    expected = np.asarray(expected, np.float64)
    actual = np.asarray(actual, np.float64).reshape(expected.shape)
    scale = np.abs(expected).max(initial=0.0)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=REL * scale, err_msg=what)


# -- Schedule-Free AdamW: the authors' package ------------------------------------------------
SF_HYPER = dict(lr=0.02, betas=(0.85, 0.995), eps=1e-6, weight_decay=0.01, warmup_steps=10,
                r=0.5, weight_lr_power=1.5)


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "loop"])
def test_schedule_free_adamw_is_the_authors(foreach):
    def ours(params):
        return otorch.AdamWScheduleFree(params, **SF_HYPER)

    a, b = net(), net()
    theirs = schedulefree.AdamWScheduleFree(a.parameters(), foreach=foreach, **SF_HYPER)
    opt = ours(b.parameters())
    assert otorch.make("schedule_free_adamw") is otorch.AdamWScheduleFree
    before = [p.detach().clone() for p in b.parameters()]
    opt.eval()                                   # before any step: nothing moves
    assert all(torch.equal(p, q) for p, q in zip(b.parameters(), before))
    with pytest.raises(RuntimeError, match="eval mode; call optimizer.train"):
        opt.step()
    pairs = [(a, theirs, schedule(theirs)), (b, opt, schedule(opt))]
    for _, o, _ in pairs:
        o.train()
    for step in range(STEPS):
        if step == CHECKPOINT_AT:                # eval() to save, as the authors advise
            theirs.eval()
            theirs.train()
            opt.eval()
            b, opt, sched = rebuilt(b, opt, pairs[1][2], ours)
            assert not opt.param_groups[0]["train_mode"]
            opt.train()
            pairs[1] = (b, opt, sched)
        for model, o, sched in pairs:
            backward(model, step)
            o.step()
            sched.step()
    for mode in ("train", "eval"):               # y, then x
        for _, o, _ in pairs:
            getattr(o, mode)()
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            assert_near(q.detach(), p.detach(), f"{mode} mode: {name}")
    for p, q in zip(a.parameters(), b.parameters()):
        mine, authors = opt.state[q], theirs.state[p]
        assert_near(mine["z"], authors["z"], "z")
        assert_near(mine["exp_avg_sq"], authors["exp_avg_sq"], "exp_avg_sq")
        group = theirs.param_groups[0]
        assert mine["k"] == group["k"] == STEPS
        assert mine["lr_max"] == pytest.approx(group["lr_max"], rel=1e-12)
        assert mine["weight_sum"] == pytest.approx(group["weight_sum"], rel=1e-12)


def test_schedule_free_switch_moves_the_master_copy():
    """multi_precision: train()/eval() move the float32 master and round it into the
    bfloat16 parameter; x and y satisfy y = (1 - beta1) z + beta1 x."""
    p = torch.nn.Parameter(torch.randn(64).to(torch.bfloat16))
    opt = otorch.AdamWScheduleFree([p], lr=0.1, multi_precision=True)
    opt.train()
    for step in range(3):
        p.grad = torch.randn(64, generator=torch.Generator().manual_seed(step)).bfloat16()
        opt.step()
    st = opt.state[p]
    y = st["master"].clone()
    opt.eval()
    x = st["master"].clone()
    assert torch.equal(p, x.bfloat16())
    torch.testing.assert_close(y, 0.1 * st["z"] + 0.9 * x, rtol=1e-6, atol=1e-6)
    opt.train()
    torch.testing.assert_close(st["master"], y, rtol=1e-6, atol=1e-6)
    assert torch.equal(p, st["master"].bfloat16())


# -- MARS and Cautious AdamW: the authors' rules (oracles), pytorch-optimizer's departures ----
class PyOptMARS(MARSAdamW):
    pyopt = True


class PyOptCautious(CautiousAdamW):
    pyopt = True


def _oracles(model, oracle_cls, hyper):
    return [oracle_cls(p.detach().numpy(), **hyper) for p in model.parameters()]


def _step_oracles(model, oracles, lr):
    for o, p in zip(oracles, model.parameters()):
        o.h["lr"] = lr
        o.step(p.grad.numpy())


def beside_oracles(model, opt, oracle_cls, hyper, make=None):
    """``opt`` trains ``model`` for STEPS steps under the scheduler, rebuilt from a
    checkpoint at CHECKPOINT_AT where ``make`` is given; an oracle per tensor is fed the
    same gradients. Returns the model, the optimizer and the oracles at the end."""
    sched = schedule(opt)
    oracles = _oracles(model, oracle_cls, hyper)
    for step in range(STEPS):
        if step == CHECKPOINT_AT and make is not None:
            model, opt, sched = rebuilt(model, opt, sched, make)
        backward(model, step)
        lr = opt.param_groups[0]["lr"]
        opt.step()
        _step_oracles(model, oracles, lr)
        sched.step()
    for (name, p), o in zip(model.named_parameters(), oracles):
        assert_near(p.detach(), o.w, f"{type(opt).__name__} {name}")
    return model, opt, oracles


def run_optgen_vs_oracle(spec, hyper, oracle_cls):
    """optgen's class on the model (checkpointed at step 50), the oracle of the
    authors' rule fed the same gradients: parameters and states."""
    def make(params):
        return otorch.make(spec)(params, **hyper)

    model = net()
    model, opt, oracles = beside_oracles(model, make(model.parameters()), oracle_cls, hyper,
                                         make)
    for (name, p), o in zip(model.named_parameters(), oracles):
        for state, value in o.s.items():
            assert_near(opt.state[p][state], value, f"{spec} {name}: {state}")
        assert o.ambiguous.mean() == 0, f"{spec} {name}: a mask element within round-off"


MARS_HYPER = dict(lr=0.01, beta1=0.9, beta2=0.99, gamma=0.05, weight_decay=0.01,
                  eps=1e-6, beta1_1d=0.85, beta2_1d=0.98, weight_decay_1d=0.05)


@pytest.mark.parametrize("optimize_1d", [False, True])
def test_mars_adamw_is_the_authors_rule(optimize_1d):
    run_optgen_vs_oracle("mars_adamw", dict(MARS_HYPER, optimize_1d=optimize_1d), MARSAdamW)


@pytest.mark.parametrize("optimize_1d", [False, True])
def test_mars_oracle_matches_pytorch_optimizer(optimize_1d):
    h = dict(MARS_HYPER, optimize_1d=optimize_1d)
    model = net()
    opt = pytorch_optimizer().MARS(
        model.parameters(), lr=h["lr"], betas=(h["beta1"], h["beta2"]), gamma=h["gamma"],
        mars_type="adamw", optimize_1d=optimize_1d, lr_1d=h["lr"] * 0.5,
        betas_1d=(h["beta1_1d"], h["beta2_1d"]), weight_decay=h["weight_decay"],
        weight_decay_1d=h["weight_decay_1d"], eps=h["eps"])
    beside_oracles(model, opt, PyOptMARS, dict(h, lr_1d_factor=0.5))


CAUTIOUS_HYPER = dict(lr=0.01, beta1=0.85, beta2=0.99, eps=1e-5, weight_decay=0.01)


@pytest.mark.parametrize("correct_bias", [True, False])
def test_cautious_adamw_is_the_authors_rule(correct_bias):
    run_optgen_vs_oracle("cautious_adamw", dict(CAUTIOUS_HYPER, correct_bias=correct_bias),
                         CautiousAdamW)


def test_cautious_oracle_matches_pytorch_optimizer():
    h = dict(CAUTIOUS_HYPER, correct_bias=True)
    model = net()
    opt = pytorch_optimizer().AdEMAMix(model.parameters(), lr=h["lr"],
                                     betas=(h["beta1"], h["beta2"], 0.999), alpha=0.0,
                                     weight_decay=h["weight_decay"], weight_decouple=True,
                                     eps=h["eps"], cautious=True)
    beside_oracles(model, opt, PyOptCautious, h)


def test_cautious_mask_mean_is_clamped_per_tensor():
    """The second step keeps one element of 2000 (mean 5e-4): the mask is divided by the
    clamp 1e-3, not by its mean; a second tensor in the same step keeps half of its
    elements and is rescaled by its own mean."""
    n = 2000
    g1 = np.ones(n, np.float32)
    g2 = np.full(n, -0.5, np.float32)
    g2[7] = 1.0
    h1 = np.where(np.arange(n) % 2 == 0, 1.0, -0.5).astype(np.float32)
    ws = [np.zeros(n, np.float32), np.zeros(n, np.float32)]
    opt = optgen.create("cautious_adamw", ws, lr=0.1)
    oracles = [CautiousAdamW(w, lr=0.1) for w in ws]
    for grads in ([g1, g1], [g2, h1]):
        opt.step(grads)
        for o, g in zip(oracles, grads):
            o.step(g)
    assert np.count_nonzero(ws[0] != ws[0][0]) == 1          # one element kept its step
    for w, o in zip(ws, oracles):
        assert_near(w, o.w, "cautious: w")
    kept = (oracles[0].w - oracles[0].w[0])[7]               # the kept step, x 1/1e-3
    assert abs(kept) > 10 * abs(oracles[0].w[0])

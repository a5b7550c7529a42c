"""optgen's compiled optimizers against independent oracles.

The oracles below are written from the *published* update rules (MXNet's gradient
preprocessing, Adam in the MXNet/MindSpore form, SGD in the torch.optim form), in plain
numpy, and deliberately not derived from specs/*.py: a mistake in a spec, in the IR, in
lowering or in the host-scalar split then shows up as a disagreement here.

Precision: optgen's float32 kernels are compared against oracles evaluated in float64
from the very same float32 inputs (initial parameters and every gradient). The oracle is
then (practically) the exact result, so the comparison measures optgen's own float32
round-off, independent of how the kernel orders or fuses its operations (FMA,
vectorisation), and a float64 oracle cannot share a float32 rounding problem with the
kernel. rtol=1e-5 is ~80 float32 ulps: over 100 steps optgen's round-off stays below it
(observed max ~5e-6 relative, on parameters whose clipped gradient adds the same
increment every step so that the roundings all have one sign), while a mistake in the rule
(bias correction, a missing (1 - beta), dampening on step 1, clip before rescale, weight
decay before clip, eps inside the bias correction) changes the result by far more.

atol: an element can pass near zero while still carrying the round-off it picked up when
it, or the values it was computed from, were large, and relative to a value near zero that
is arbitrarily large. Each comparison therefore also allows ``ATOL_REL * max|expected|``
(over the compared array): ATOL_REL = 2e-6, about 17 float32 ulps of the array's largest
element. Beyond rtol the grid needed at most 3.9e-7 * max|expected| (sgd w; adam w, m and
sgd's buffer ~1.3e-7), so that is a 5x margin, and it is still 5x tighter than rtol on
the largest element: only elements much smaller than the rest of their array get slack.

The grid uses the default beta2 = 0.999. optgen computes compound scalars such as
``1 - beta2`` on the host in float64 and rounds them once to float32; computing them in a
float32 kernel from beta2 rounded to float32 lost 1.3e-5 of relative precision in v
(``test_adam_beta2_0999_precision`` guards against that regression).

Gradients are drawn fresh every step, ``GRAD_SCALE * (bias + N(0, 1))`` with a fixed
per-element bias (so the first moment does not just hover at 0). GRAD_SCALE = 2.5 makes
clip_gradient=0.5 act on most elements at rescale_grad=1 and on some at rescale_grad=0.14;
``test_grid_exercises_clipping`` checks that. Adam's eps runs over {1e-8, 1e-3}: with
|g| ~ 1, eps=1e-8 is invisible at rtol=1e-5 and only eps=1e-3 tests where eps goes.
"""
from __future__ import annotations

import itertools
import math
import zlib

import numpy as np
import pytest

import optgen

STEPS = 100
CHECK_AT = (1, 2, 10, 50, STEPS)          # steps after which everything is compared
SHAPES = [(1000,), (31, 17), (8, 3, 3, 3), (1009,)]
SHAPE_IDS = ["1d-1000", "2d-31x17", "4d-8x3x3x3", "prime-1009"]
GRAD_SCALE = 2.5
RTOL = 1e-5
ATOL_REL = 2e-6

RESCALE = [1.0, 0.14]
CLIP = [None, 0.5]
WD = [0.0, 0.03]
PREPROC = list(itertools.product(RESCALE, CLIP, WD))
PREPROC_IDS = [f"rs{r}-clip{c}-wd{w}" for r, c, w in PREPROC]

# SGD run-time configurations (nesterov is the compile-time flag: its own kernel)
SGD_CONFIGS = [
    dict(momentum=0.9, dampening=0.0, nesterov=False),
    dict(momentum=0.9, dampening=0.0, nesterov=True),
    dict(momentum=0.9, dampening=0.3, nesterov=False),
    dict(momentum=0.0, dampening=0.0, nesterov=False),
    # torch: without momentum there is no buffer and dampening has no effect
    dict(momentum=0.0, dampening=0.3, nesterov=False),
]
SGD_IDS = ["mom", "nesterov", "mom-damp", "plain", "plain-damp"]

BETA2 = 0.999
ADAM_HYPER = dict(lr=0.01, beta1=0.9, beta2=BETA2)
ADAM_EPS = [1e-8, 1e-3]
SGD_LR = 0.01


# -- oracles (published rules, float64 numpy) -------------------------------------------
def preprocess(w, grad, rescale_grad, clip_gradient, weight_decay):
    """MXNet: g = clip(grad * rescale_grad, -c, c) + weight_decay * w (clip only if c)."""
    g = np.asarray(grad, np.float64) * rescale_grad
    if clip_gradient is not None:
        g = np.clip(g, -clip_gradient, clip_gradient)
    return g + weight_decay * w


class AdamOracle:
    """Adam, MXNet/MindSpore form: bias correction folded into lr, eps not corrected."""

    def __init__(self, w, *, lr, beta1, beta2, eps, weight_decay=0.0, rescale_grad=1.0,
                 clip_gradient=None):
        self.w = np.array(w, np.float64)
        self.m = np.zeros_like(self.w)
        self.v = np.zeros_like(self.w)
        self.t = 0
        self.h = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                      rescale_grad=rescale_grad, clip_gradient=clip_gradient)

    def step(self, grad):
        h = self.h
        self.t += 1
        t = self.t
        g = preprocess(self.w, grad, h["rescale_grad"], h["clip_gradient"], h["weight_decay"])
        b1, b2 = h["beta1"], h["beta2"]
        self.m = b1 * self.m + (1 - b1) * g
        self.v = b2 * self.v + (1 - b2) * g * g
        lr_t = h["lr"] * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        self.w = self.w - lr_t * self.m / (np.sqrt(self.v) + h["eps"])

    def states(self):
        return {"m": self.m, "v": self.v}


class SGDOracle:
    """SGD, torch.optim form (momentum, dampening, nesterov, coupled weight decay)."""

    def __init__(self, w, *, lr, momentum=0.0, dampening=0.0, nesterov=False,
                 weight_decay=0.0, rescale_grad=1.0, clip_gradient=None):
        self.w = np.array(w, np.float64)
        self.buf = None
        self.h = dict(lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov,
                      weight_decay=weight_decay, rescale_grad=rescale_grad,
                      clip_gradient=clip_gradient)

    def step(self, grad):
        h = self.h
        g = preprocess(self.w, grad, h["rescale_grad"], h["clip_gradient"], h["weight_decay"])
        mu = h["momentum"]
        if mu == 0:
            self.buf = None          # torch keeps no buffer without momentum
            d = g
        else:
            if self.buf is None:     # first step: the buffer is the gradient itself
                self.buf = g.copy()
            else:
                self.buf = mu * self.buf + (1 - h["dampening"]) * g
            d = g + mu * self.buf if h["nesterov"] else self.buf
        self.w = self.w - h["lr"] * d

    def states(self):
        return {} if self.buf is None else {"momentum_buffer": self.buf}


# -- helpers ----------------------------------------------------------------------------
def seed_for(*parts) -> int:
    """A fixed seed per test case (stable across runs and processes, unlike hash())."""
    return zlib.crc32(repr(parts).encode())


def make_problem(shape, seed, dtype=np.float32):
    """Initial parameters plus a generator of fresh gradients (same dtype)."""
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal(shape).astype(dtype)
    bias = (0.5 * rng.standard_normal(shape)).astype(dtype)

    def grads():
        while True:
            yield (GRAD_SCALE * (bias + rng.standard_normal(shape))).astype(dtype)
    return w0, grads()


def tol(expected, rtol=RTOL, atol_rel=ATOL_REL):
    return dict(rtol=rtol, atol=atol_rel * float(np.max(np.abs(expected), initial=0.0)))


def assert_close(actual, expected, what, **kw):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected,
                               err_msg=what, **(kw or tol(expected)))


def compare(opt, oracle, step, label, **kw):
    assert_close(opt.params[0], oracle.w, f"{label}: w after step {step}", **kw)
    for name, value in oracle.states().items():
        assert_close(opt.state[0][name], value, f"{label}: state {name} after step {step}", **kw)


def run_vs_oracle(opt, oracle, grads, label, steps=STEPS, check_at=CHECK_AT, **kw):
    for t in range(1, steps + 1):
        g = next(grads)
        opt.step([g])
        oracle.step(g)
        if t in check_at:
            compare(opt, oracle, t, label, **kw)


# -- 1. spec vs oracle, fp32 ------------------------------------------------------------
def make_adam(w, w0, **hyper):
    return optgen.create("adam", [w], **hyper), AdamOracle(w0, **hyper)


def make_sgd(w, w0, **hyper):
    return optgen.create("sgd", [w], **hyper), SGDOracle(w0, **hyper)


@pytest.mark.parametrize("rescale_grad,clip_gradient,weight_decay", PREPROC, ids=PREPROC_IDS)
@pytest.mark.parametrize("eps", ADAM_EPS, ids=[f"eps{e}" for e in ADAM_EPS])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_adam_vs_oracle(shape, eps, rescale_grad, clip_gradient, weight_decay):
    hyper = dict(ADAM_HYPER, eps=eps, rescale_grad=rescale_grad, clip_gradient=clip_gradient,
                 weight_decay=weight_decay)
    w0, grads = make_problem(shape, seed_for("adam", shape, eps, rescale_grad, clip_gradient,
                                             weight_decay))
    w = w0.copy()
    opt, oracle = make_adam(w, w0, **hyper)
    run_vs_oracle(opt, oracle, grads, f"adam {shape} {hyper}")
    assert opt.params[0] is w and w.dtype == np.float32   # updated in place


@pytest.mark.parametrize("rescale_grad,clip_gradient,weight_decay", PREPROC, ids=PREPROC_IDS)
@pytest.mark.parametrize("cfg", SGD_CONFIGS, ids=SGD_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_sgd_vs_oracle(shape, cfg, rescale_grad, clip_gradient, weight_decay):
    hyper = dict(cfg, lr=SGD_LR, rescale_grad=rescale_grad, clip_gradient=clip_gradient,
                 weight_decay=weight_decay)
    w0, grads = make_problem(shape, seed_for("sgd", shape, tuple(cfg.values()), rescale_grad,
                                             clip_gradient, weight_decay))
    w = w0.copy()
    opt, oracle = make_sgd(w, w0, **hyper)
    # Without momentum the published rule has no buffer (SGDOracle.states() is empty), so
    # only w is compared; optgen keeps a momentum_buffer state there anyway.
    run_vs_oracle(opt, oracle, grads, f"sgd {shape} {hyper}")
    assert opt.params[0] is w and w.dtype == np.float32


LARGE_CASES = {
    "adam": ("adam", dict(ADAM_HYPER, eps=1e-3)),
    "sgd-nesterov": ("sgd", dict(SGD_CONFIGS[1], lr=SGD_LR)),
    "sgd-mom-damp": ("sgd", dict(SGD_CONFIGS[2], lr=SGD_LR)),
}
HARD_PREPROC = dict(rescale_grad=0.14, clip_gradient=0.5, weight_decay=0.03)


@pytest.mark.parametrize("case", list(LARGE_CASES))
def test_large_tensor_parallel_path(case):
    """A prime length above the kernels' 32768-element threshold for their parallel loop
    (and not a multiple of the vector width, so the scalar tail runs too)."""
    name, hyper = LARGE_CASES[case]
    shape = (40009,)
    w0, grads = make_problem(shape, seed_for("large", case))
    w = w0.copy()
    opt, oracle = (make_adam if name == "adam" else make_sgd)(w, w0, **hyper, **HARD_PREPROC)
    run_vs_oracle(opt, oracle, grads, f"{case} {shape}", steps=30, check_at=(1, 2, 30))


@pytest.mark.parametrize("case", list(LARGE_CASES))
def test_float64_kernels_vs_oracle(case):
    """The float64 kernels follow the float64 oracle to near machine precision."""
    name, hyper = LARGE_CASES[case]
    hyper = dict(hyper, beta2=0.999) if name == "adam" else hyper   # no float32 rounding
    w0, grads = make_problem((1009,), seed_for("f64", case), dtype=np.float64)
    w = w0.copy()
    opt, oracle = (make_adam if name == "adam" else make_sgd)(w, w0, **hyper, **HARD_PREPROC)
    assert w.dtype == np.float64
    run_vs_oracle(opt, oracle, grads, f"{case} float64", rtol=1e-12,
                  atol=1e-13 * float(np.max(np.abs(w0))))


def test_grid_exercises_clipping():
    """The gradient scale makes clip_gradient=0.5 bind for some, not all, elements."""
    _, grads = make_problem((1000,), 0)
    g = next(grads).astype(np.float64)
    for rescale in RESCALE:
        frac = np.mean(np.abs(g * rescale) > 0.5)
        assert 0.02 < frac < 0.98, (rescale, frac)


def test_adam_beta2_0999_precision():
    """Adam with the default beta2 = 0.999 against the exact rule: v at rtol=1e-5.

    Regression: 1 - beta2 must be computed on the host in float64 and rounded once; a
    float32 kernel computing it from beta2 rounded to float32 (0.99900001287) put v off
    by 1.3e-5 relative."""
    shape = (1000,)
    hyper = dict(ADAM_HYPER, beta2=0.999, eps=1e-8)
    w0, grads = make_problem(shape, seed_for("beta2-0.999"))
    w = w0.copy()
    opt, oracle = make_adam(w, w0, **hyper)
    for t in range(1, 11):
        g = next(grads)
        opt.step([g])
        oracle.step(g)
    # w and m are fine; only v (whose update is scaled by 1 - beta2) is not. v > 0 has no
    # elements near zero, so it is checked at atol=0: today every element is ~1.29e-5 low.
    assert_close(opt.params[0], oracle.w, "w after step 10")
    assert_close(opt.state[0]["m"], oracle.m, "m after step 10")
    assert_close(opt.state[0]["v"], oracle.v, "v after step 10", rtol=RTOL, atol=0.0)


# -- 2. vs torch.optim ------------------------------------------------------------------
TORCH_REASON = "torch is an optional test dependency (pip install optgen[test])"


def torch_grad(torch, g, rescale_grad, clip_gradient):
    """torch.optim has no rescale/clip options: apply them to the gradient (in fp32)."""
    tg = torch.from_numpy(g.copy()) * rescale_grad
    if clip_gradient is not None:
        tg = tg.clamp(-clip_gradient, clip_gradient)
    return tg


TORCH_PREPROC = [(1.0, None, 0.0), (1.0, None, 0.03), (0.14, 0.5, 0.0), (0.14, 0.5, 0.03),
                 (1.0, 0.5, 0.03)]
TORCH_PREPROC_IDS = [f"rs{r}-clip{c}-wd{w}" for r, c, w in TORCH_PREPROC]


def _compare_torch(opt, tparam, tstate, names, step, label):
    expected = tparam.detach().numpy().astype(np.float64)
    assert_close(opt.params[0], expected, f"{label}: w after step {step}")
    for ours, theirs in names.items():
        exp = tstate[theirs].numpy().astype(np.float64)
        assert_close(opt.state[0][ours], exp, f"{label}: {ours} vs torch {theirs} "
                     f"after step {step}")


@pytest.mark.parametrize("rescale_grad,clip_gradient,weight_decay", TORCH_PREPROC,
                         ids=TORCH_PREPROC_IDS)
@pytest.mark.parametrize("cfg", SGD_CONFIGS, ids=SGD_IDS)
def test_sgd_vs_torch(cfg, rescale_grad, clip_gradient, weight_decay):
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    shape = (31, 17)
    w0, grads = make_problem(shape, seed_for("torch-sgd", tuple(cfg.values()), rescale_grad,
                                             clip_gradient, weight_decay))
    w = w0.copy()
    opt = optgen.create("sgd", [w], lr=SGD_LR, **cfg, weight_decay=weight_decay,
                        rescale_grad=rescale_grad, clip_gradient=clip_gradient)
    tparam = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    topt = torch.optim.SGD([tparam], lr=SGD_LR, momentum=cfg["momentum"],
                           dampening=cfg["dampening"], nesterov=cfg["nesterov"],
                           weight_decay=weight_decay, foreach=False)
    names = {"momentum_buffer": "momentum_buffer"} if cfg["momentum"] else {}
    label = f"sgd vs torch {cfg} rs={rescale_grad} clip={clip_gradient} wd={weight_decay}"
    for t in range(1, STEPS + 1):
        g = next(grads)
        opt.step([g])
        tparam.grad = torch_grad(torch, g, rescale_grad, clip_gradient)
        topt.step()
        if t in CHECK_AT:
            _compare_torch(opt, tparam, topt.state[tparam], names, t, label)


@pytest.mark.parametrize("rescale_grad,clip_gradient,weight_decay", TORCH_PREPROC,
                         ids=TORCH_PREPROC_IDS)
@pytest.mark.parametrize("eps", ADAM_EPS, ids=[f"eps{e}" for e in ADAM_EPS])
def test_adam_vs_torch(eps, rescale_grad, clip_gradient, weight_decay):
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    shape = (8, 3, 3, 3)
    h = dict(ADAM_HYPER, eps=eps)
    w0, grads = make_problem(shape, seed_for("torch-adam", eps, rescale_grad, clip_gradient,
                                             weight_decay))
    w = w0.copy()
    opt = optgen.create("adam", [w], **h, weight_decay=weight_decay,
                        rescale_grad=rescale_grad, clip_gradient=clip_gradient)
    tparam = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    # weight_decay: both are coupled L2 (added to the gradient before the moments).
    # foreach=False, fused=False: the single-tensor path, which reads group["eps"] anew on
    # every step(), so the per-step eps below takes effect.
    topt = torch.optim.Adam([tparam], lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=eps,
                            weight_decay=weight_decay, foreach=False, fused=False)
    label = f"adam vs torch eps={eps} rs={rescale_grad} clip={clip_gradient} wd={weight_decay}"
    for t in range(1, STEPS + 1):
        g = next(grads)
        opt.step([g])
        # torch: w -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps_torch)
        #           = lr*sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps_torch*sqrt(1-b2^t)),
        # which is the MXNet form (eps outside the bias correction) exactly when
        # eps_torch = eps / sqrt(1 - b2^t). Set it before each step. (With eps=1e-3 the
        # two forms differ by up to ~3% of the update, so the bridge is really tested.)
        topt.param_groups[0]["eps"] = eps / math.sqrt(1 - h["beta2"] ** t)
        tparam.grad = torch_grad(torch, g, rescale_grad, clip_gradient)
        topt.step()
        if t in CHECK_AT:
            assert int(topt.state[tparam]["step"]) == t
            _compare_torch(opt, tparam, topt.state[tparam], {"m": "exp_avg", "v": "exp_avg_sq"},
                           t, label)


def test_adam_vs_torch_beta2_0999():
    """Regression for the 1 - beta2 precision bug (see test_adam_beta2_0999_precision)."""
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    shape = (1000,)
    h = dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8)
    w0, grads = make_problem(shape, seed_for("torch-adam-0.999"))
    w = w0.copy()
    opt = optgen.create("adam", [w], **h)
    tparam = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    topt = torch.optim.Adam([tparam], lr=h["lr"], betas=(h["beta1"], h["beta2"]),
                            eps=h["eps"], foreach=False, fused=False)
    for t in range(1, 11):
        g = next(grads)
        opt.step([g])
        topt.param_groups[0]["eps"] = h["eps"] / math.sqrt(1 - h["beta2"] ** t)
        tparam.grad = torch.from_numpy(g.copy())
        topt.step()
    _compare_torch(opt, tparam, topt.state[tparam], {"m": "exp_avg"}, 10,
                   "adam vs torch, beta2=0.999")
    v_torch = topt.state[tparam]["exp_avg_sq"].numpy().astype(np.float64)
    assert_close(opt.state[0]["v"], v_torch, "v vs torch exp_avg_sq after step 10", rtol=RTOL,
                 atol=0.0)


# -- 3. hyperparameters changed between steps -------------------------------------------
def test_adam_set_hyper_schedule():
    """lr and beta1 change between steps; the oracle uses the values current at each step
    (lr_t uses the current beta1 in 1 - beta1**t, as the published rule is written)."""
    shapes = [(1000,), (8, 3, 3, 3)]            # two parameters in one optimizer
    problems = [make_problem(s, seed_for("sched-adam", s)) for s in shapes]
    ws = [w0.copy() for w0, _ in problems]
    hyper = dict(ADAM_HYPER, eps=1e-3, **HARD_PREPROC)
    opt = optgen.create("adam", ws, **hyper)
    oracles = [AdamOracle(w0, **hyper) for w0, _ in problems]
    betas = [0.9, 0.5, 0.0, 0.95, 0.8]
    for t in range(1, STEPS + 1):
        lr = 0.02 * 0.97 ** t if t % 7 else 0.0      # lr = 0 freezes w but not m, v
        beta1 = betas[(t // 9) % len(betas)]
        opt.set_hyper(lr=lr, beta1=beta1)
        assert opt.hyper["lr"] == lr and opt.hyper["beta1"] == beta1
        gs = [next(g) for _, g in problems]
        before = [w.copy() for w in ws]
        opt.step(gs)
        for o, g in zip(oracles, gs):
            o.h.update(lr=lr, beta1=beta1)
            o.step(g)
        if lr == 0.0:
            for w, b in zip(ws, before):
                np.testing.assert_array_equal(w, b, err_msg=f"lr=0 moved w at step {t}")
        if t in CHECK_AT or t % 9 == 0:
            for i, o in enumerate(oracles):
                assert_close(ws[i], o.w, f"w[{i}] after step {t}")
                for name, value in o.states().items():
                    assert_close(opt.state[i][name], value, f"{name}[{i}] after step {t}")


def test_sgd_set_hyper_schedule():
    """lr, momentum and weight_decay change between steps of a momentum SGD."""
    shape = (31, 17)
    w0, grads = make_problem(shape, seed_for("sched-sgd"))
    w = w0.copy()
    opt = optgen.create("sgd", [w], lr=SGD_LR, momentum=0.9, dampening=0.3)
    oracle = SGDOracle(w0, lr=SGD_LR, momentum=0.9, dampening=0.3)
    for t in range(1, STEPS + 1):
        changes = dict(lr=0.01 * (1 + (t % 5)), momentum=(0.9, 0.5, 0.99)[t % 3],
                       weight_decay=0.03 if t % 4 == 0 else 0.0)
        opt.set_hyper(**changes)
        oracle.h.update(changes)
        g = next(grads)
        opt.step([g])
        oracle.step(g)
        if t in CHECK_AT or t % 9 == 0:
            compare(opt, oracle, t, "sgd schedule")


@pytest.mark.parametrize("dampening", [0.0, 0.3])
def test_sgd_momentum_switched_on_later_vs_torch(dampening):
    """torch starts the momentum buffer (b = g) on the first step that has momentum; steps
    without momentum leave it alone. optgen tracks that with a scalar state."""
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    rng = np.random.default_rng(11)
    w = rng.standard_normal(257).astype(np.float32)
    p = torch.nn.Parameter(torch.tensor(w.copy()))
    opt = optgen.create("sgd", [w], lr=0.1, momentum=0.0, dampening=dampening)
    topt = torch.optim.SGD([p], lr=0.1, momentum=0.0, dampening=dampening)
    schedule = [0.0, 0.0, 0.0, 0.9, 0.9, 0.0, 0.5, 0.5]
    for step, mom in enumerate(schedule, 1):
        opt.set_hyper(momentum=mom)
        topt.param_groups[0]["momentum"] = mom
        g = rng.standard_normal(257).astype(np.float32)
        opt.step([g])
        p.grad = torch.tensor(g.copy())
        topt.step()
        np.testing.assert_allclose(w, p.detach().numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=f"step {step} (momentum {mom})")

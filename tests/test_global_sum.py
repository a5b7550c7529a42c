"""global_sum(): sums over every parameter of the optimizer, read by the update and by
scalar states in the same step. Compiled kernels against the reference interpreter,
a tiny rule against a hand-written numpy oracle, D-Adaptation Adam against its
algorithm written from the paper, and the errors."""
import textwrap

import numpy as np
import pytest

import optgen
from optgen.errors import SpecError
from helpers import assert_close

SHAPES = [(0,), (1,), (15,), (16,), (17,), (1009,), (3, 5)]

GNORM_SGD = '''
"""SGD normalized by the global gradient norm; a scalar state sums the squared norms.

    G = sum over all parameters of grad * grad
    w = w - lr * grad / sqrt(G + 1e-12);  seen = seen + G
"""
from optgen.dsl import Spec, global_sum, sqrt

spec = Spec("gnorm_sgd", __doc__)
lr = spec.hyper("lr", 0.1, "lr >= 0", "learning rate")
seen = spec.state("seen", 0.0, "sum of the squared global norms", shape="scalar")


@spec.update
def gnorm_sgd(w, grad, flags):
    total = global_sum(grad * grad)
    return {seen: seen + total, w: w - lr * grad / sqrt(total + 1e-12)}
'''


def _write(tmp_path, name, text):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _grads(rng, dtype):
    return [rng.standard_normal(s).astype(dtype) for s in SHAPES]


def _two_groups(params, **second):
    return [{"params": params[:4]}, {"params": params[4:], **second}]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tiny_rule_vs_numpy_oracle(tmp_path, dtype):
    path = _write(tmp_path, "gnorm_sgd", GNORM_SGD)
    rng = np.random.default_rng(3)
    params = _grads(rng, dtype)
    want = [p.astype(np.float64) for p in params]
    opt = optgen.create(path, _two_groups(params, lr=0.05))
    seen = 0.0
    for _ in range(3):
        grads = _grads(rng, dtype)
        total = sum(float(np.sum(g * g, dtype=np.float64)) for g in grads)   # (as kernels)
        for j, (w, g) in enumerate(zip(want, grads)):
            w -= (0.1 if j < 4 else 0.05) * g / np.sqrt(total + 1e-12)
        seen += total
        opt.step(grads)
    for j, (got, w) in enumerate(zip(params, want)):
        assert_close(got, w, dtype, f"parameter {j}")
    for j, st in enumerate(opt.state):
        assert_close(st["seen"], seen, dtype, f"scalar state of parameter {j}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("flags", [{}, {"decouple": True, "use_bias_correction": True}])
def test_dadapt_compiled_vs_reference(dtype, flags):
    rng = np.random.default_rng(5)
    start = _grads(rng, dtype)
    drift = _grads(rng, dtype)        # a steady direction: the estimate d grows
    grads = [[a + (0.3 * b).astype(dtype) for a, b in zip(drift, _grads(rng, dtype))]
             for _ in range(4)]
    out = {}
    for backend in ("compiled", "reference"):
        params = [p.copy() for p in start]
        opt = optgen.create("dadapt_adam", _two_groups(params, weight_decay=0.1),
                            backend=backend, growth_rate=1.5, **flags)
        for g in grads:
            opt.step([x.copy() for x in g])
        out[backend] = params, opt
    (pc, oc), (pr, orf) = out["compiled"], out["reference"]
    assert oc.state[0]["d"] > 1e-6          # the estimate moved
    for j, (a, b) in enumerate(zip(pc, pr)):
        assert_close(a, b, dtype, f"parameter {j}")
    for j, (a, b) in enumerate(zip(oc.state, orf.state)):
        for name in sorted(b):
            assert_close(a[name], b[name], dtype, f"parameter {j} state {name}")


class DAdaptAdamOracle:
    """D-Adaptation Adam (Defazio & Mishchenko 2023, Algorithm with Adam moments as
    the authors' DAdaptAdam runs it), in float64 numpy."""

    def __init__(self, params, lr=1.0, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 d0=1e-6, growth_rate=np.inf, decouple=False, bias_correction=False):
        self.p = [np.array(p, np.float64) for p in params]
        self.m = [np.zeros_like(p) for p in self.p]
        self.v = [np.zeros_like(p) for p in self.p]
        self.s = [np.zeros_like(p) for p in self.p]
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay
        self.d, self.nw, self.k = d0, 0.0, 0
        self.growth, self.decouple, self.bc = growth_rate, decouple, bias_correction

    def step(self, grads):
        b1, b2 = self.betas
        r = np.sqrt(b2)
        k = self.k + 1
        scale = np.sqrt(1 - b2 ** k) / (1 - b1 ** k) if self.bc else 1.0
        dlr = self.d * self.lr * scale
        numerator, l1 = 0.0, 0.0
        for j, g in enumerate(grads):
            g = np.asarray(g, np.float64)
            if not self.decouple:
                g = g + self.wd * self.p[j]
            numerator += dlr * float(np.sum(g * self.s[j] / (np.sqrt(self.v[j]) + self.eps)))
            self.m[j] = b1 * self.m[j] + dlr * (1 - b1) * g
            self.v[j] = b2 * self.v[j] + (1 - b2) * g * g
            self.s[j] = r * self.s[j] + dlr * (1 - r) * g
            l1 += float(np.sum(np.abs(self.s[j])))
        if l1 == 0:
            return
        self.nw = r * self.nw + (1 - r) * numerator
        self.d = max(self.d, min(self.nw / ((1 - r) * l1), self.d * self.growth))
        for j in range(len(self.p)):
            if self.decouple:
                self.p[j] = self.p[j] - self.wd * dlr * self.p[j]
            self.p[j] = self.p[j] - self.m[j] / (np.sqrt(self.v[j]) + self.eps)
        self.k = k


@pytest.mark.parametrize("cfg", [{}, {"decouple": True, "weight_decay": 0.1,
                                      "use_bias_correction": True, "growth_rate": 1.5},
                                 {"weight_decay": 0.05, "lr": 0.5}])
def test_dadapt_vs_oracle(cfg):
    """30 steps on a quadratic (gradients from the iterates: the dynamics must agree)."""
    rng = np.random.default_rng(7)
    params = [rng.standard_normal(s) for s in SHAPES]
    target = [rng.standard_normal(s) for s in SHAPES]
    oracle = DAdaptAdamOracle(params, lr=cfg.get("lr", 1.0),
                              weight_decay=cfg.get("weight_decay", 0.0),
                              growth_rate=cfg.get("growth_rate", np.inf),
                              decouple=cfg.get("decouple", False),
                              bias_correction=cfg.get("use_bias_correction", False))
    ps = [p.copy() for p in params]
    opt = optgen.create("dadapt_adam", ps, **cfg)
    for _ in range(30):
        opt.step([p - t for p, t in zip(ps, target)])
        oracle.step([p - t for p, t in zip(oracle.p, target)])
    assert oracle.d > 1e-5           # d grew by orders of magnitude
    # (30 steps of Adam's near-sign steps carry float64 round-off to ~1e-11)
    for j, (a, b) in enumerate(zip(ps, oracle.p)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9, err_msg=f"parameter {j}")
    for st in opt.state:
        np.testing.assert_allclose(st["d"], oracle.d, rtol=1e-9, err_msg="d")


def test_dadapt_zero_gradients_leave_w():
    w = np.ones(5)
    opt = optgen.create("dadapt_adam", [w], weight_decay=0.1, decouple=True)
    opt.step([np.zeros(5)])
    assert (w == 1.0).all() and opt.state[0]["d"] == 1e-6


def test_global_sum_errors(tmp_path):
    nested = GNORM_SGD.replace("global_sum(grad * grad)", "global_sum(grad * sum(grad))") \
        .replace("import Spec, global_sum, sqrt", "import Spec, global_sum, sqrt, sum")
    with pytest.raises(SpecError, match="already reduces"):
        optgen.create(_write(tmp_path, "nested", nested), [np.ones(3)])
    per_tensor = GNORM_SGD.replace("seen + total", "seen + sum(grad)") \
        .replace("import Spec, global_sum, sqrt", "import Spec, global_sum, sqrt, sum")
    with pytest.raises(SpecError, match="scalar state 'seen' is computed from tensor"):
        optgen.create(_write(tmp_path, "per_tensor", per_tensor), [np.ones(3)])


def test_split_parameters_refused():
    from optgen.runtime import shards
    split = shards.Shards([shards.Split("c", (8,))], collective=None)
    w = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="dadapt_adam: its rule sums over all parameters"):
        optgen.create("dadapt_adam", [w], shards=split)


def test_clip_global_norm_on_kernels_is_torch_clip_grad_norm(monkeypatch):
    """clip_global_norm's norm comes from the sum-of-squares kernel (the array library's
    pass would raise here), and steps as torch.nn.utils.clip_grad_norm_ + step does."""
    import torch
    import optgen.torch as otorch
    from optgen.runtime import tensors

    def refused(*args):
        raise AssertionError("clip_global_norm read the gradients outside the kernels")

    monkeypatch.setattr(tensors, "sum_of_squares", refused)
    torch.manual_seed(0)
    mine, ref = (torch.nn.Sequential(torch.nn.Linear(17, 33), torch.nn.Tanh(),
                                     torch.nn.Linear(33, 1)) for _ in range(2))
    ref.load_state_dict(mine.state_dict())
    opt = otorch.AdamW(mine.parameters(), lr=0.01, clip_global_norm=0.5)
    theirs = torch.optim.AdamW(ref.parameters(), lr=0.01)
    for step in range(10):
        x, y = torch.randn(16, 17), torch.randn(16, 1)
        for model in (mine, ref):
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
        assert torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5) > 0.5   # (clips)
        opt.step()
        theirs.step()
    for p, q in zip(mine.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=0,
                                   atol=1e-5 * float(q.detach().abs().max()))

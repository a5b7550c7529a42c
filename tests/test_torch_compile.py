"""The drop-ins under torch.compile (optgen/torch/ops.py): forward, backward, ``step`` and
``zero_grad`` in one ``fullgraph=True`` graph (fullgraph makes any graph break an error),
50 steps under an lr scheduler equal to the same steps run eagerly, and no recompile when
the scheduler or the trainer changes lr and betas.

Backward inside the compiled function needs ``torch._dynamo.config.trace_autograd_ops``
(a torch setting, off by default). Most rows compile with the ``aot_eager`` backend
(dynamo and AOTAutograd's functionalization, which is where a mutating custom op can go
wrong, without inductor's code generation: seconds instead of tens of seconds); two
rows use the default inductor backend."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch.compile needs torch")
from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

import optgen.torch as ot  # noqa: E402
from helpers import family_sampled, torch_drop_in as _cls, torch_mlp as _model  # noqa: E402

# every drop-in but THOR (whose refresh steps take statistics: those run eagerly), and LARS
KW = {"Momentum": dict(momentum=0.9), "SGD": dict(momentum=0.9, weight_decay=1e-3),
      "Adadelta": dict(lr=0.5), "FTRL": dict(lr=0.05), "Muon": dict(lr=0.02)}
NAMES = [pytest.param(n, id=n, marks=family_sampled(spec, "torch_compile"))
         for spec, n in sorted(ot.CLASSES.items(), key=lambda kv: kv[1]) if n != "THOR"] + ["LARS"]


def _data(steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g))
            for _ in range(steps)]


def _train(name, compiled, steps=50, backend="aot_eager", flat=False, **kw):
    """``steps`` steps of a small MLP, StepLR halving lr every 10 steps; returns the model,
    the optimizer and the compile counter (None when eager)."""
    model = _model()
    opt = _cls(name)(model.parameters(), flat=flat, **{"lr": 1e-2, **KW.get(name, {}), **kw})
    if hasattr(opt, "train"):    # Schedule-Free steps in train mode (its train()/eval())
        opt.train()
    sched = torch.optim.lr_scheduler.StepLR(opt, 10, 0.5)

    def train_step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    counter = None
    if compiled:
        torch._dynamo.reset()
        counter = CompileCounterWithBackend(backend)
        train_step = torch.compile(train_step, backend=counter, fullgraph=True)
    for x, y in _data(steps):
        train_step(x, y)
        sched.step()
    return model, opt, counter


@pytest.fixture(autouse=True)
def _trace_backward():
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        yield
    torch._dynamo.reset()


def _same(a, b, what, rtol=1e-5, atol=1e-6):
    for i, (p, q) in enumerate(zip(a.parameters(), b.parameters())):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=rtol, atol=atol,
                                   err_msg=f"{what}: parameter {i}")


@pytest.mark.parametrize("name", NAMES)
def test_compiled_train_step_equals_eager(name):
    eager, e_opt, _ = _train(name, compiled=False)
    comp, c_opt, counter = _train(name, compiled=True)
    assert counter.frame_count == 1, f"{name}: {counter.frame_count} compiles (recompiled)"
    _same(comp, eager, f"{name} compiled vs eager")
    assert any((p != q).any() for p, q in zip(comp.parameters(), _model().parameters()))
    # the states and step count the compiled run left are torch's state_dict as eagerly
    sd_c, sd_e = c_opt.state_dict(), e_opt.state_dict()
    assert sd_c["param_groups"] == sd_e["param_groups"]
    for i, rec in sd_e["state"].items():
        assert set(sd_c["state"][i]) == set(rec)
        for k, v in rec.items():
            if isinstance(v, torch.Tensor):
                np.testing.assert_allclose(sd_c["state"][i][k].numpy(), v.numpy(), rtol=1e-4,
                                           atol=1e-6, err_msg=f"{name}: state {i}.{k}")
    assert float(sd_c["state"][0]["step"]) == 50


def test_compiled_offloaded_step():
    """offload="cpu" (optgen/torch/offload.py) under a compiled train step: the op copies
    gradients to the host and parameters back as it does eagerly."""
    eager, _, _ = _train("AdamW", compiled=False, steps=20, offload="cpu")
    comp, opt, counter = _train("AdamW", compiled=True, steps=20, offload="cpu")
    assert counter.frame_count == 1
    _same(comp, eager, "offloaded compiled vs eager")
    assert opt._offload.copies["params_to_device"] == 20 * 4


@pytest.mark.parametrize("name", ["AdamW", "LAMB"])
def test_compiled_with_inductor(name):
    eager, _, _ = _train(name, compiled=False, steps=20)
    comp, _, counter = _train(name, compiled=True, steps=20, backend="inductor")
    assert counter.frame_count == 1
    _same(comp, eager, f"{name} inductor vs eager")   # inductor's forward rounds differently


def test_changing_hyperparameters_never_recompiles():
    """lr and betas set by hand between compiled steps: the graph reads no
    hyperparameter, so there is nothing to guard on; the new values reach the kernels."""
    model = _model()
    opt = ot.AdamW(model.parameters(), lr=1e-2)
    twin = _model()
    ref = ot.AdamW(twin.parameters(), lr=1e-2)

    def train_step(m, o, x, y):
        torch.nn.functional.mse_loss(m(x), y).backward()
        o.step()
        o.zero_grad()

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(train_step, backend=counter, fullgraph=True)
    for i, (x, y) in enumerate(_data(12)):
        for o in (opt, ref):
            o.param_groups[0]["lr"] = 1e-2 / (1 + i)
            o.param_groups[0]["betas"] = (0.9 - 0.01 * i, 0.999 - 0.001 * i)
            o.param_groups[0]["weight_decay"] = 0.01 * i
        compiled(model, opt, x, y)
        train_step(twin, ref, x, y)
    assert counter.frame_count == 1
    assert opt._core._groups[0].hyper["beta1"] == pytest.approx(0.9 - 0.11)
    _same(model, twin, "hand-set hyperparameters")


@pytest.mark.parametrize("flat", [False, True])
def test_compiled_step_alone(flat):
    """``torch.compile(opt.step)`` on its own after an eager backward, plain and with
    flat=True groups (gradient views of one buffer; with backward in the same graph torch
    2.13's dynamo fails on parameters that are views, docs/runtime.md)."""
    model, twin = _model(), _model()
    opt = ot.Lion(model.parameters(), lr=1e-3, flat=flat)
    ref = ot.Lion(twin.parameters(), lr=1e-3, flat=flat)
    counter = CompileCounterWithBackend("aot_eager")
    step = torch.compile(opt.step, backend=counter, fullgraph=True)
    for x, y in _data(10):
        for m in (model, twin):
            torch.nn.functional.mse_loss(m(x), y).backward()
        step()
        ref.step()
        opt.zero_grad()
        ref.zero_grad()
    assert counter.frame_count == 1
    _same(model, twin, "compiled opt.step", rtol=0, atol=0)


def test_compiled_step_errors_are_typed_and_change_nothing():
    """A bad gradient under torch.compile: the runtime's typed error from inside the op
    (dynamo re-raises it unchanged), parameters and states untouched."""
    model = _model()
    opt = ot.Adam(model.parameters(), lr=1e-2, nonfinite="raise")
    before = [p.detach().clone() for p in model.parameters()]

    @torch.compile(backend="aot_eager", fullgraph=True)
    def bad_step():
        for p in model.parameters():
            p.grad = torch.full_like(p, float("nan"))
        opt.step()

    with pytest.raises(FloatingPointError):
        bad_step()
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p.detach(), q)
    assert all(float(s.get("step", 0)) == 0 for s in opt.state.values())

    # fullgraph turns an exception raised while tracing into dynamo's Unsupported
    with pytest.raises((TypeError, torch._dynamo.exc.Unsupported),
                       match="statistics .A. are not passed to a step under torch.compile"):
        torch.compile(lambda: opt.step(A=[None]), backend="aot_eager", fullgraph=True)()


@pytest.mark.parametrize("fmt", [dict(state_format="q8"), dict(state_format="q4"),
                                 dict(state_format="fp8"), dict(state_format="bf16"),
                                 dict(state_format="bf16", stochastic_rounding=True)])
def test_compiled_step_with_state_formats(fmt):
    """Low-bit states (docs/state-formats.md) under a compiled train step: the same op,
    the same results as eager, one compile (every tensor formatted: min size 0)."""
    kw = dict(state_format_min_size=0, **fmt)
    eager, e_opt, _ = _train("AdamW", compiled=False, steps=20, **kw)
    comp, c_opt, counter = _train("AdamW", compiled=True, steps=20, **kw)
    assert counter.frame_count == 1
    _same(comp, eager, f"{fmt} compiled vs eager", rtol=0, atol=0)
    p = next(comp.parameters())
    want = torch.uint8 if fmt["state_format"] in ("q8", "q4", "fp8") else torch.bfloat16
    assert c_opt.state[p]["m"].dtype == want

"""Weights written from outside the optimizer where torch's version counter cannot tell:
through ``p.data`` (pruning, WGAN's clamp), a compiled step's own write-back, and an
offloaded master on the host (runtime/storage.py ``adopt``, optgen/core/formats/split.py,
optgen/torch/offload.py ``follow``)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import ml_dtypes  # noqa: E402
import optgen  # noqa: E402
import optgen.torch as ot  # noqa: E402
from optgen.core import formats  # noqa: E402

MASTERS = {"split16": dict(master_format="split16"), "split8": dict(master_format="split8"),
           "fp32": dict(multi_precision=True)}


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 8)).to(torch.bfloat16)


def _train(model, opt, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=g).to(torch.bfloat16)
        model(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("master", MASTERS)
@pytest.mark.parametrize("how", ["prune", "clamp"])
def test_writes_through_data_are_what_steps(master, how):
    """``p.data.mul_(mask)`` / ``p.data.clamp_``: a step that moves nothing (lr 0, zero
    gradients) keeps the written weights exactly (no NaN, the pruning not undone), and
    the others (split8: within one bfloat16 step; its master is within ULP/254 of the
    float32 one, so a weight next to a midpoint may round either way)."""
    m = _model()
    opt = ot.AdamW(m.parameters(), lr=1e-2, **MASTERS[master])
    _train(m, opt, 3)
    w = m[0].weight
    before = w.detach().clone()
    with torch.no_grad():
        if how == "prune":
            w.data.mul_(torch.rand(w.shape, generator=torch.Generator().manual_seed(3)) < 0.5)
        else:
            w.data.clamp_(-0.01, 0.01)
    written = w.detach().clone()
    for g in opt.param_groups:
        g["lr"] = 0.0
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    assert not w.isnan().any()
    hit = written != before
    assert hit.sum() > 100 and torch.equal(w[hit], written[hit])
    if master == "split8":
        assert ((w.float() - written.float()).abs() <= _half_ulp(written) * 2).all()
    else:
        assert torch.equal(w, written)


def _half_ulp(w):
    bits = (w.view(torch.int16).numpy().astype(np.uint32) & 0xFFFF) << 16
    return torch.from_numpy(formats.split.half_ulp(bits))


@pytest.mark.parametrize("master", ["split16", "split8"])
def test_pairs_that_cannot_belong_decode_as_the_weight(master):
    """A correction that no encoding gives its weight (split16: a zero weight with a
    negative correction, NaN; split8: a binade's first value with one past the midpoint
    below) decodes as the weight: the compiled kernel as the reference, bit for bit, and
    an lr-0 step keeps every finite weight."""
    rng = np.random.default_rng(5)
    firsts = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0 ** -20, -(2.0 ** 30), np.inf, -np.inf]
    w0 = np.concatenate([np.repeat(np.float32(firsts), 64),
                         rng.standard_normal(640).astype(np.float32)]).astype(ml_dtypes.bfloat16)
    ctype = np.int16 if master == "split16" else np.int8
    lo, hi = (-0x8000, 0x8000) if master == "split16" else (-127, 128)
    c0 = rng.integers(lo, hi, w0.size).astype(ctype)
    out = []
    for backend in ("compiled", "reference"):
        w = w0.copy()
        opt = optgen.create("adamw", [w], lr=0.0, weight_decay=0.0, master_format=master,
                            backend=backend)
        opt.state[0]["w__corr"][...] = c0
        opt.step([np.zeros_like(w)])
        out.append((w.view(np.uint16).copy(), opt.state[0]["w__corr"].copy()))
    assert np.array_equal(out[0][0], out[1][0]) and np.array_equal(out[0][1], out[1][1])
    kept = np.ones(w0.size, bool)
    if master == "split8":   # (its encoding of a tie below a binade's first value, |rho|
        kept[640:] = False   # 64, and other pairs near a midpoint may round either way)
        kept &= np.abs(c0.astype(int)) != 64
    assert np.array_equal(out[0][0][kept], w0.view(np.uint16)[kept])
    fmt = formats.parse("test", "master_format", master)
    assert not np.isnan(fmt.family.decode(fmt, w0, c0)).any()


@pytest.mark.parametrize("master", MASTERS)
def test_compiled_step_keeps_the_master(master):
    """torch.compile (aot_eager): the compiled step's write-back of the weights is not a
    write from outside: 20 steps at lr 1e-5 equal the eager ones bit for bit."""
    runs = []
    for compiled in (False, True):
        m = _model()
        opt = ot.AdamW(m.parameters(), lr=1e-5, **MASTERS[master])

        def step(x):
            m(x).float().pow(2).mean().backward()
            opt.step()
            opt.zero_grad()

        if compiled:
            torch._dynamo.reset()
            step = torch.compile(step, backend="aot_eager", fullgraph=True)
        g = torch.Generator().manual_seed(1)
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            for _ in range(20):
                step(torch.randn(16, 32, generator=g).to(torch.bfloat16))
        runs.append([p.detach().clone() for p in m.parameters()])
    torch._dynamo.reset()
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("how", ["load_state_dict", "copy_", "p.data"])
def test_offloaded_master_takes_written_weights(how):
    """offload="cpu": weights loaded as 5.0 (in place, or through p.data) are what the
    host master steps from; the other parameter keeps its master."""
    torch.manual_seed(0)
    m = torch.nn.Linear(16, 8)
    opt = ot.AdamW(m.parameters(), lr=1e-3, offload="cpu")
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        m(torch.randn(4, 16, generator=g)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    bias = m.bias.detach().clone()
    five = torch.full_like(m.weight, 5.0)
    with torch.no_grad():
        if how == "load_state_dict":
            m.load_state_dict({"weight": five, "bias": bias})
        elif how == "copy_":
            m.weight.copy_(five)
        else:
            m.weight.data.mul_(0).add_(5.0)
    for gr in opt.param_groups:
        gr["lr"] = 0.0
    m(torch.randn(4, 16, generator=g)).pow(2).mean().backward()
    opt.step()
    assert torch.equal(m.weight, five) and torch.equal(m.bias, bias)
    assert torch.equal(opt._offload.master(m.weight), five)


def test_bfloat16_without_a_master_names_every_way():
    m = torch.nn.Linear(4, 4).to(torch.bfloat16)
    with pytest.raises(TypeError, match="multi_precision=True.*master_format='split16' or "
                                        "'split8'.*stochastic_rounding=True"):
        ot.AdamW(m.parameters())

"""multi_precision: float16/bfloat16 parameters with a float32 master copy and float32
states; the fused kernel updates the master and writes the rounded parameter."""
import numpy as np
import pytest

import optgen
from optgen.runtime import tensors

LOW = ["float16", "bfloat16"]
SHAPES = [(33, 17), (1000,), (0,), (1,), (3, 4, 5)]


def _low(x, dtype):
    return np.ascontiguousarray(x.astype(np.float32).astype(tensors.numpy_dtype(dtype)))


def _adam_oracle(w, grads, lr, beta1, beta2, eps):
    """MXNet/MindSpore Adam in float32 arithmetic, written from the rule (the fp32 oracle):
    m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= lr sqrt(1-b2^t)/(1-b1^t) m/(sqrt(v)+eps)."""
    f = np.float32
    w = w.astype(f).copy()
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        g = g.astype(f)
        m = f(beta1) * m + f(1 - beta1) * g
        v = f(beta2) * v + f(1 - beta2) * g * g
        lr_t = f(lr * np.sqrt(1 - beta2 ** t) / (1 - beta1 ** t))
        w = w - lr_t * m / (np.sqrt(v) + f(eps))
    return w, m, v


@pytest.mark.parametrize("low", LOW)
def test_200_steps_match_the_fp32_oracle_on_the_master(low, rng):
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8)
    init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    params = [_low(x, low) for x in init]
    opt = optgen.create("adam", params, multi_precision=True, **hyper)
    fp32 = [p.astype(np.float32) for p in params]            # the same start, in float32
    ref = optgen.create("adam", fp32, **hyper)
    grads = [[_low(rng.standard_normal(s), low) for s in SHAPES] for _ in range(200)]
    for gs in grads:
        assert opt.step(gs)
        ref.step([g.astype(np.float32) for g in gs])
    for i, p in enumerate(params):
        master = opt.state[i]["master"]
        assert master.dtype == np.float32 and opt.state[i]["m"].dtype == np.float32
        np.testing.assert_allclose(master, fp32[i], rtol=1e-6, atol=1e-7)
        w, m, v = _adam_oracle(init[i].astype(tensors.numpy_dtype(low)),
                               [gs[i] for gs in grads], **hyper)
        np.testing.assert_allclose(master, w, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(opt.state[i]["v"], v, rtol=1e-5, atol=1e-9)
        assert p.dtype == tensors.numpy_dtype(low)
        assert p.tobytes() == master.astype(tensors.numpy_dtype(low)).tobytes()


@pytest.mark.parametrize("spec,kw", [("lamb", {"weight_decay": 0.01}), ("sgd", {"momentum": 0.9}),
                                     ("adafactor", {}), ("lars", {"base": "momentum"})])
@pytest.mark.parametrize("low", LOW)
def test_other_specs_follow_their_fp32_run(spec, kw, low, rng):
    kw = dict(kw)
    base = kw.pop("base", None)
    shapes = [(16, 9), (257,)]
    params = [_low(rng.standard_normal(s), low) for s in shapes]
    opt = optgen.create(spec, params, base=base, multi_precision=True, **kw)
    fp32 = [p.astype(np.float32) for p in params]
    ref = optgen.create(spec, fp32, base=base, **kw)
    for _ in range(20):
        gs = [_low(rng.standard_normal(s), low) for s in shapes]
        opt.step(gs)
        ref.step([g.astype(np.float32) for g in gs])
    for i, p in enumerate(params):
        np.testing.assert_allclose(opt.state[i]["master"], fp32[i], rtol=1e-6, atol=1e-7)
        assert p.tobytes() == opt.state[i]["master"].astype(p.dtype).tobytes()


def test_mixed_precision_with_torch_checkpoint_and_errors(tmp_path, rng):
    torch = pytest.importorskip("torch", reason="torch bfloat16 tensors")
    p = torch.randn(300, dtype=torch.bfloat16)
    opt = optgen.create("adam", [p], multi_precision=True, lr=1e-2)
    for _ in range(3):
        opt.step([torch.randn(300, dtype=torch.bfloat16)])
    assert opt.state[0]["master"].dtype == torch.float32
    assert torch.equal(p, opt.state[0]["master"].to(torch.bfloat16))
    opt.save(tmp_path / "mp.ckpt")
    q = p.clone()
    other = optgen.create("adam", [q], multi_precision=True, lr=1e-2)
    other.load(tmp_path / "mp.ckpt")
    g = torch.randn(300, dtype=torch.bfloat16)
    opt.step([g])
    other.step([g.clone()])
    assert torch.equal(p, q) and torch.equal(opt.state[0]["master"], other.state[0]["master"])
    with pytest.raises(TypeError, match=r"parameter 0 has dtype float16; low-precision parameters "
                                        r"need multi_precision=True"):
        optgen.create("adam", [np.zeros(4, np.float16)])
    w = np.zeros(4, np.float16)
    opt = optgen.create("adam", [w], multi_precision=True)
    with pytest.raises(TypeError, match=r"gradient 0 has dtype float32, parameter 0 has dtype float16"):
        opt.step([np.zeros(4, np.float32)])


def test_nonfinite_skip_in_float16(rng):
    w = _low(rng.standard_normal(50), "float16")
    opt = optgen.create("adam", [w], multi_precision=True, nonfinite="skip", loss_scale=1024.0)
    g = _low(rng.standard_normal(50) * 1024, "float16")
    assert opt.step([g])
    before = w.copy(), opt.state[0]["master"].copy(), opt.state[0]["m"].copy()
    g[7] = np.inf            # an overflowed float16 gradient
    assert opt.step([g]) is False
    assert w.tobytes() == before[0].tobytes()
    assert opt.state[0]["master"].tobytes() == before[1].tobytes()
    assert opt.state[0]["m"].tobytes() == before[2].tobytes()


@pytest.mark.parametrize("low", LOW)
def test_lazy_row_sparse_updates_in_mixed_precision(low, rng):
    emb = _low(rng.standard_normal((50, 8)), low)
    opt = optgen.create("lazyadam", [emb], multi_precision=True, lr=1e-2)
    fp32 = emb.astype(np.float32)
    ref = optgen.create("lazyadam", [fp32], lr=1e-2)
    untouched = emb[10:].copy()
    for _ in range(5):
        idx = rng.choice(10, size=6, replace=False)   # (duplicates sum in the grad's dtype)
        rows = _low(rng.standard_normal((6, 8)), low)
        opt.step([optgen.RowSparse(idx, rows)])
        ref.step([optgen.RowSparse(idx, rows.astype(np.float32))])
    np.testing.assert_allclose(opt.state[0]["master"], fp32, rtol=1e-6, atol=1e-7)
    assert emb.tobytes() == opt.state[0]["master"].astype(emb.dtype).tobytes()
    assert emb[10:].tobytes() == untouched.tobytes()

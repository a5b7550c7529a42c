"""Split master formats against oracles written from the published rules, not the specs:

* split16 is a float32 master: 50 AdamW steps equal torch.optim.AdamW on a float32 copy
  to float32 round-off, and the bfloat16 weight is that master rounded to nearest at
  every step;
* split8 is FlashOptim's (arXiv 2602.23349): each of 50 AdamW steps equals a numpy model
  (decode θ' + ρ/127 · ULP(θ')/2, AdamW in float32, encode), and its master stays within
  ULP(θ')/254 of the float32-master step from the same state;
* checkpoints round-trip bit for bit, and float32-master (multi_precision) checkpoints
  convert both ways;
* the torch drop-in steps a bfloat16 nn.Linear with a split master.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import optgen
from optgen.core import formats

BF16 = ml_dtypes.bfloat16
S16, S8 = formats.of("split16"), formats.of("split8")
HYPER = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
N = 1031


def _grads(rng, steps):
    return [(rng.standard_normal(N) * 0.1).astype(BF16) for _ in range(steps)]


def test_split16_is_a_float32_master_adamw():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    theta0 = (rng.standard_normal(N) * 0.3).astype(np.float32)   # not bfloat16 values
    w, corr = S16.family.encode(S16, theta0)
    opt = optgen.create("adamw", [w], master_format="split16", **HYPER)
    opt.state[0]["w__corr"][...] = corr                # the master: theta0 exactly
    ref = torch.nn.Parameter(torch.from_numpy(theta0.copy()))
    topt = torch.optim.AdamW([ref], lr=HYPER["lr"], betas=(0.9, 0.999), eps=1e-8,
                             weight_decay=0.01)
    for k, g in enumerate(_grads(rng, 50)):
        opt.step([g])
        ref.grad = torch.from_numpy(g.astype(np.float32))
        topt.step()
        mine = S16.family.decode(S16, w, opt.state[0]["w__corr"])
        want = ref.detach().numpy()
        np.testing.assert_allclose(mine, want, rtol=2e-6, atol=1e-7, err_msg=f"step {k}")
        # the weight: the master rounded to nearest (the master is exact: no ties here
        # but at exact ties, where it is the neighbour away from zero)
        tie = (mine.view(np.uint32) & 0xFFFF) == 0x8000
        nearest = mine.astype(BF16)
        assert np.array_equal(w.view(np.uint16)[~tie], nearest.view(np.uint16)[~tie])
        away = (mine.view(np.uint32)[tie] + 0x8000) >> 16
        assert np.array_equal(w.view(np.uint16)[tie], away.astype(np.uint16))


def _flashoptim_decode(w: np.ndarray, rho: np.ndarray) -> np.ndarray:
    tp = w.astype(np.float32)
    e = np.maximum(np.frexp(tp)[1] - 1, -126)          # exponent(θ'); zero: -126
    half = np.ldexp(np.float32(1), e - 8).astype(np.float32)   # ULP(θ') / 2
    return np.where(rho == 0, tp, tp + (rho.astype(np.float32) / np.float32(127)) * half)


def _flashoptim_encode(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    tp = theta.astype(BF16)
    tpf = tp.astype(np.float32)
    e = np.maximum(np.frexp(tpf)[1] - 1, -126)
    half = np.ldexp(np.float32(1), e - 8).astype(np.float32)
    rho = np.rint(np.clip((theta - tpf) / half, -1, 1) * 127).astype(np.int8)
    return tp, rho, half


def _adamw(theta, m, v, g, t):
    """AdamW (Loshchilov & Hutter; torch.optim.AdamW's form) in float32, its scalar
    factors (1 - beta, 1 - lr * wd, ...) computed in float64 and rounded once."""
    f = np.float32
    lr, b1, b2, eps, wd = (HYPER[k] for k in ("lr", "beta1", "beta2", "eps", "weight_decay"))
    m = f(b1) * m + f(1 - b1) * g
    v = f(b2) * v + f(1 - b2) * g * g
    mhat, vhat = m / f(1 - b1 ** t), v / f(1 - b2 ** t)
    return theta * f(1 - lr * wd) - f(lr) * mhat / (np.sqrt(vhat) + f(eps)), m, v


def test_split8_is_flashoptims_master():
    rng = np.random.default_rng(6)
    w = (rng.standard_normal(N) * 0.3).astype(BF16)
    opt = optgen.create("adamw", [w], master_format="split8", **HYPER)
    flips = 0
    for t, g in enumerate(_grads(rng, 50), start=1):
        st = opt.state[0]
        before = _flashoptim_decode(w, st["w__corr"])
        theta, m, v = _adamw(before, st["m"].copy(), st["v"].copy(), g.astype(np.float32), t)
        tp, rho, half = _flashoptim_encode(theta)
        opt.step([g])
        np.testing.assert_allclose(st["m"], m, rtol=1e-5, atol=1e-5 * np.abs(m).max())
        np.testing.assert_allclose(st["v"], v, rtol=1e-5, atol=1e-5 * v.max())
        # the kernel's float32 step differs from numpy's in the last bits: the weight
        # may round to the other neighbour where theta is within those bits of a tie
        same = w.view(np.uint16) == tp.view(np.uint16)
        flips += int(np.sum(~same))
        d = np.abs(st["w__corr"].astype(int) - rho.astype(int))
        assert d[same].max(initial=0) <= 1, f"step {t}"
        got = _flashoptim_decode(w, st["w__corr"])
        # within ULP(θ')/254 of the float32-master step (and its float32 round-off)
        err = np.abs(got.astype(np.float64) - theta)
        assert (err <= half / 127 + np.abs(theta) * 2.0 ** -21).all(), f"step {t}"
    assert flips <= N * 50 // 1000


# -- checkpoints ------------------------------------------------------------------------
@pytest.mark.parametrize("master", ["split16", "split8"])
def test_checkpoint_round_trip_is_bit_exact(master, tmp_path):
    rng = np.random.default_rng(7)
    grads = _grads(rng, 6)
    w0 = (rng.standard_normal(N) * 0.3).astype(BF16)
    whole = w0.copy()
    a = optgen.create("adamw", [whole], master_format=master, **HYPER)
    for g in grads:
        a.step([g])
    half = w0.copy()
    b = optgen.create("adamw", [half], master_format=master, **HYPER)
    for g in grads[:3]:
        b.step([g])
    b.save(str(tmp_path / "ckpt.npz"))
    resumed = half.copy()
    c = optgen.create("adamw", [resumed], master_format=master, **HYPER)
    c.load(str(tmp_path / "ckpt.npz"))
    assert c.state[0]["w__corr"].dtype == S16.family.corr_dtypes[master]
    for g in grads[3:]:
        c.step([g])
    assert np.array_equal(resumed.view(np.uint16), whole.view(np.uint16))
    assert np.array_equal(c.state[0]["w__corr"], a.state[0]["w__corr"])
    assert np.array_equal(c.state[0]["m"], a.state[0]["m"])


@pytest.mark.parametrize("master", ["split16", "split8"])
def test_float32_master_checkpoints_convert(master):
    rng = np.random.default_rng(8)
    w = (rng.standard_normal(N) * 0.3).astype(BF16)
    fp32 = optgen.create("adamw", [w], multi_precision=True, **HYPER)
    for g in _grads(rng, 3):
        fp32.step([g])
    theta = fp32.state[0]["master"].copy()
    mine = w.copy()
    split = optgen.create("adamw", [mine], master_format=master, **HYPER)
    with pytest.warns(UserWarning, match=f"converted .*float32 master -> {master}"):
        split.load_state_dict(fp32.state_dict())
    fmt = formats.of(master)
    got = fmt.family.decode(fmt, mine, split.state[0]["w__corr"])
    if master == "split16":
        assert np.array_equal(got.view(np.uint32), theta.view(np.uint32))
    else:
        np.testing.assert_allclose(got, theta, rtol=2.0 ** -15, atol=0)
    assert np.array_equal(split.state[0]["m"], fp32.state[0]["m"]) and split.t == 3
    # and back: the float32 master is the split one decoded
    back = optgen.create("adamw", [mine.copy()], multi_precision=True, **HYPER)
    with pytest.warns(UserWarning, match=f"converted .*{master} -> float32 master"):
        back.load_state_dict(split.state_dict())
    assert np.array_equal(back.state[0]["master"], got)


def test_torch_drop_in_with_a_bfloat16_linear():
    torch = pytest.importorskip("torch")
    import optgen.torch as ot
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 33, dtype=torch.bfloat16)
    head = torch.nn.Parameter(torch.zeros(33))        # a float32 parameter beside
    twins = [p.detach().clone() for p in model.parameters()] + [head.detach().clone()]
    kw = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    opt = ot.AdamW([*model.parameters(), head], master_format="split8", **kw)
    ref = optgen.create("adamw", twins, master_format="split8", lr=1e-2, beta1=0.9,
                        beta2=0.999, eps=1e-8, weight_decay=0.01)
    x = torch.randn(16, 64, dtype=torch.bfloat16)
    for _ in range(4):
        opt.zero_grad()
        loss = ((model(x).float() + head) ** 2).mean()
        loss.backward()
        ref.step([p.grad.clone() for p in [*model.parameters(), head]])
        opt.step()
    for p, q in zip([*model.parameters(), head], twins):
        assert p.dtype == q.dtype and torch.equal(p.detach(), q)
    sd = opt.state_dict()
    assert sd["state"][0]["w__corr"].dtype == torch.int8
    assert "w__corr" not in sd["state"][2]          # (float32: its plain kernel)
    assert len(sd["state"][0]) == len(sd["state"][2]) + 1
    again = ot.AdamW([*model.parameters(), head], master_format="split8", **kw)
    again.load_state_dict(sd)
    assert torch.equal(again.state_dict()["state"][0]["w__corr"], sd["state"][0]["w__corr"])
    with pytest.raises(ValueError, match="offload='cpu' keeps a float32 master copy"):
        ot.AdamW(model.parameters(), master_format="split8", offload="cpu")
    with pytest.raises(TypeError, match="adamw.*float16.*master_format='split16'"):
        ot.AdamW([torch.nn.Parameter(torch.zeros(4, dtype=torch.float16))],
                 master_format="split16")


def test_torch_float32_master_state_dict_converts():
    torch = pytest.importorskip("torch")
    import optgen.torch as ot
    torch.manual_seed(1)
    model = torch.nn.Linear(32, 16, dtype=torch.bfloat16)
    fp32 = ot.AdamW(model.parameters(), lr=1e-2, multi_precision=True)
    model(torch.randn(4, 32, dtype=torch.bfloat16)).float().pow(2).mean().backward()
    fp32.step()
    masters = [fp32.state[p]["master"].clone() for p in model.parameters()]
    split = ot.AdamW(model.parameters(), lr=1e-2, master_format="split16")
    with pytest.warns(UserWarning, match=r"converted .*\(float32 master -> split16\)"):
        split.load_state_dict(fp32.state_dict())
    for p, m in zip(model.parameters(), masters):
        corr = split.state[p]["w__corr"].numpy()
        got = S16.family.decode(S16, p.detach().view(torch.int16).numpy().view(BF16), corr)
        assert np.array_equal(got, m.numpy())
    back = ot.AdamW(model.parameters(), lr=1e-2, multi_precision=True)
    with pytest.warns(UserWarning, match=r"converted .*\(split16 -> float32 master\)"):
        back.load_state_dict(split.state_dict())
    for p, m in zip(model.parameters(), masters):
        assert torch.equal(back.state[p]["master"], m)

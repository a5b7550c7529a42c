"""Schedule-Free AdamW's ``train()``/``eval()`` with every state and master format
(optgen/torch/schedule_free.py): the switch moves the stored truth (a float32 master, a
split master's weight and correction, or the parameter) toward z read as its values
(bf16 widened, q8 codes dequantized), in float32, and stores it back in its format.

Each format's eval() master is exactly the float32 lerp of its own truth and z (split8:
within its master's bound), an eval -> train round trip gives the master back (float32
rounding; split8: its bound), steps go on after it, and the eval() weights are those of
the float32-state run within the format's error."""
import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import optgen.torch as ot  # noqa: E402
from optgen.core import formats  # noqa: E402
from optgen.runtime import tensors  # noqa: E402

BETA1, LR = 0.9, 1e-2
# name -> (parameter dtype, options, max |eval weight - the float32 run's|): the float32
# run keeps float32 states and a float32 master (bfloat16 weights: multi_precision=True);
# a bfloat16 weight may be one bfloat16 step (2**-8 relative) from it
BF16_STEP = 2.0 ** -8 * 0.2      # (every |w| here is below 0.2)
CONFIGS = {
    "state_bf16": (torch.float32, dict(state_format="bf16", state_format_min_size=0), 2e-3),
    "state_q8": (torch.float32, dict(state_format="q8", state_format_min_size=0), 4e-3),
    "master_split16": (torch.bfloat16, dict(master_format="split16"), BF16_STEP),
    "master_split8": (torch.bfloat16, dict(master_format="split8"), BF16_STEP),
    "multi_precision": (torch.bfloat16, dict(multi_precision=True), 0.0),
    "offload": (torch.float32, dict(offload="cpu"), 0.0),
}


def _run(dtype, options, steps=3):
    torch.manual_seed(0)
    m = torch.nn.Linear(80, 64).to(dtype)
    opt = ot.AdamWScheduleFree(m.parameters(), lr=LR, betas=(BETA1, 0.999), **options)
    opt.train()
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        m(torch.randn(16, 80, generator=g).to(dtype)).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return m, opt


@functools.lru_cache(maxsize=None)
def _reference(dtype):
    """The eval() weights of the float32 run (float32 states; a float32 master)."""
    ref, opt = _run(dtype, {} if dtype == torch.float32 else dict(multi_precision=True))
    opt.eval()
    return [p.detach().clone() for p in ref.parameters()]


def _truth(opt, i):
    """Parameter ``i``'s master in float32: what the kernels step."""
    st, p = opt._core.state[i], opt._params[i]
    if formats.CORRECTION in st:
        fmt = formats.master(opt._artifact.state_format)
        return torch.from_numpy(np.asarray(fmt.family.decode(
            fmt, tensors.to_numpy(p, "torch"), st[formats.CORRECTION].numpy()), np.float32))
    if "master" in st:
        return st["master"].clone()
    return opt._runtime_tensor(p).detach().float().clone()


def _z(opt, i):
    """z of parameter ``i`` as float32 values (q8: its codes dequantized)."""
    st = opt._core.state[i]
    if "z" + formats.ABSMAX in st:
        fmt = formats.from_stored(opt._artifact.stored["z"])
        return torch.from_numpy(fmt.dequantize((st["z"].numpy(), st["z" + formats.ABSMAX].numpy()),
                                               tuple(opt._params[i].shape)))
    return st["z"].float()


def _rounded(opt, theta, dtype):
    """The weight a master rounds to (a split format's own rounding: split.py)."""
    fmt = formats.master(opt._artifact.state_format)
    if fmt is None:
        return theta.to(dtype)
    w, _ = fmt.family.encode(fmt, theta.numpy())
    return torch.from_numpy(np.asarray(w).astype(np.float32)).to(dtype)


def _bound(name, theta):
    """How far the format's store may put a master from the float32 value."""
    if name == "master_split8":   # |θ̂ - θ| <= ULP(bfloat16(θ)) / 254
        return float(theta.abs().max()) * 2.0 ** -7 / 254 * 2
    return 0.0


@pytest.mark.parametrize("name", list(CONFIGS))
def test_switch_moves_the_stored_truth(name):
    dtype, options, err = CONFIGS[name]
    m, opt = _run(dtype, options)
    n = len(opt._params)
    y = [_truth(opt, i) for i in range(n)]
    z = [_z(opt, i) for i in range(n)]
    opt.eval()
    for i in range(n):
        want = torch.lerp(y[i], z[i], 1 - 1 / BETA1)
        got = _truth(opt, i)
        torch.testing.assert_close(got, want, rtol=0, atol=_bound(name, want),
                                   msg=f"{name}: eval() master of parameter {i}")
        assert torch.equal(opt._params[i].detach(), _rounded(opt, want, dtype)), \
            f"{name}: parameter {i} is not its master rounded"
    x = [p.detach().float().clone() for p in m.parameters()]
    opt.train()
    for i in range(n):
        torch.testing.assert_close(_truth(opt, i), y[i], rtol=2e-6,
                                   atol=1e-7 + 2 * _bound(name, y[i]),
                                   msg=f"{name}: eval -> train of parameter {i}")
    m(torch.randn(16, 80).to(dtype)).float().pow(2).mean().backward()
    opt.step()                                       # (train mode again: steps go on)
    assert all(float(opt.state[p]["step"]) == 4 for p in m.parameters())
    for i, (a, b) in enumerate(zip(x, _reference(dtype))):
        assert float((a - b.detach().float()).abs().max()) <= err, \
            f"{name}: eval() weight {i} vs the float32-state run"

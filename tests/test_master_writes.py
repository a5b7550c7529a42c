"""Weights written from outside the optimizer (in place, ``p.data = new``,
``nn.Module.load_state_dict``) win over a master the optimizer keeps: a float32 master
takes them where the weight is no longer its rounding, a split master decodes to the
written weight; a checkpoint's masters loaded after the model's weights are kept
(runtime/storage.py, optgen/core/formats/split.py)."""
import copy

import pytest

torch = pytest.importorskip("torch")
import ml_dtypes  # noqa: E402
import optgen.torch as ot  # noqa: E402
from optgen.core import formats  # noqa: E402

CORR = "w__corr"


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(80, 64).to(torch.bfloat16)     # a 5120-element weight, a bias


def _train(model, opt, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 80, generator=g).to(torch.bfloat16)
        model(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("master", ["split16", "split8"])
@pytest.mark.parametrize("how", ["in place", "p.data", "module load"])
def test_a_written_weight_is_the_split_master(master, how):
    """The written weight is what steps: in place its correction's low bits stay (within
    half a bfloat16 step of it; none where they cannot belong to it: a zeroed weight's
    split16 NaN), moved to new data (``p.data = new``) the correction starts at zero."""
    m = _model()
    opt = ot.AdamW(m.parameters(), lr=1e-2, master_format=master)
    _train(m, opt, 3)
    w = m.weight
    assert opt.state[w][CORR].abs().sum() > 0
    new = torch.zeros_like(w)                       # at ±0 a stale correction would
    new[0] = torch.linspace(-1, 1, w.shape[1])      # decode to NaN (split16)
    with torch.no_grad():
        if how == "in place":
            w.copy_(new)
        elif how == "p.data":
            w.data = new.clone()
        else:
            m.load_state_dict({"weight": new, "bias": m.bias.detach().clone()})
    for g in opt.param_groups:
        g["lr"], g["weight_decay"] = 0.0, 0.0
    _train(m, opt, 1)
    assert torch.equal(m.weight, new)               # the master rounds to the new weight
    theta = _decoded(master, m.weight, opt.state[m.weight][CORR])
    assert not theta.isnan().any()
    half_ulp = _half_ulp(new)
    assert ((theta - new.float()).abs() <= half_ulp).all()
    if how == "p.data":
        assert int(opt.state[m.weight][CORR].abs().sum()) == 0
    assert opt.state[m.bias][CORR].abs().sum() > 0  # (the same values: its master kept)


def _decoded(master, w, corr):
    """The float32 master of a bfloat16 weight and its correction (the numpy decode the
    reference interpreter runs)."""
    fmt = formats.parse("test", "master_format", master)
    bits = w.detach().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return torch.from_numpy(fmt.family.decode(fmt, bits, corr.numpy()))


def _half_ulp(w):
    bits = (w.detach().view(torch.int16).numpy().astype("uint32") & 0xFFFF) << 16
    return torch.from_numpy(formats.split.half_ulp(bits))


def test_a_written_weight_becomes_the_float32_master():
    """Where the weight is no longer the master's rounding the master is the weight, element
    by element; a state_dict taken before the next step holds the masters so."""
    m = _model()
    opt = ot.AdamW(m.parameters(), lr=1e-2, multi_precision=True)
    _train(m, opt, 3)
    master = opt.state[m.weight]["master"]
    kept = master.clone()
    with torch.no_grad():
        m.weight.copy_(m.weight.clone())            # the same values: the master stays
    opt.state_dict()                                # (masters as the next step reads them)
    assert torch.equal(master, kept) and not torch.equal(master, m.weight.float())
    with torch.no_grad():
        m.weight[:8].mul_(2)                        # these elements, not the others
    opt.state_dict()
    assert torch.equal(master[:8], m.weight[:8].float()) and torch.equal(master[8:], kept[8:])


@pytest.mark.parametrize("master", ["split8", "fp32"])
def test_model_weights_then_optimizer_state_resume_exactly(master):
    kw = {"multi_precision": True} if master == "fp32" else {"master_format": master}
    a = _model()
    opt_a = ot.AdamW(a.parameters(), lr=1e-2, **kw)
    _train(a, opt_a, 3)
    saved_model, saved_opt = copy.deepcopy(a.state_dict()), copy.deepcopy(opt_a.state_dict())
    _train(a, opt_a, 3, seed=2)
    b = _model(seed=5)
    opt_b = ot.AdamW(b.parameters(), lr=1e-2, **kw)
    _train(b, opt_b, 1, seed=7)                      # its own history, overwritten next
    b.load_state_dict(saved_model)                   # (writes the weights in place)
    opt_b.load_state_dict(saved_opt)
    _train(b, opt_b, 3, seed=2)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)

"""torch.optim checkpoints into the drop-ins and back (optgen/torch_format.py): a run
saved by torch.optim.Adam/AdamW continues in optgen.torch.Adam/AdamW, and the reverse,
with the same parameters as the run that stayed (float32 rounding; optgen's Adam adds
eps before the step-size bias correction, torch after it: a difference of order eps)."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch.optim checkpoints need torch")
import optgen.torch as ot  # noqa: E402

HYPER = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=1e-3)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _run(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _close(a, b, what):
    for i, (p, q) in enumerate(zip(a.parameters(), b.parameters())):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5,
                                   atol=1e-6, err_msg=f"{what}: parameter {i}")


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_torch_checkpoint_continues_in_optgen(name):
    model = _model()
    theirs = getattr(torch.optim, name)(model.parameters(), **HYPER)
    _run(model, theirs, 10, seed=1)
    twin = copy.deepcopy(model)
    mine = getattr(ot, name)(twin.parameters(), lr=0.5)        # values come from the file
    mine.load_state_dict(theirs.state_dict())
    assert mine.param_groups[0]["lr"] == HYPER["lr"]
    assert tuple(mine.param_groups[0]["betas"]) == HYPER["betas"]
    for p, q in zip(model.parameters(), twin.parameters()):   # the states, exactly
        assert torch.equal(mine.state[q]["m"], theirs.state[p]["exp_avg"])
        assert torch.equal(mine.state[q]["v"], theirs.state[p]["exp_avg_sq"])
        assert int(mine.state[q]["step"]) == 10
    _run(model, theirs, 20, seed=2)
    _run(twin, mine, 20, seed=2)
    _close(twin, model, f"{name}: torch checkpoint, 20 steps in optgen vs in torch")


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_optgen_checkpoint_continues_in_torch(name):
    model = _model()
    mine = getattr(ot, name)(model.parameters(), **HYPER)
    _run(model, mine, 10, seed=1)
    sd = mine.state_dict(format="torch")
    assert set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    twin = copy.deepcopy(model)
    theirs = getattr(torch.optim, name)(twin.parameters(), lr=0.5)
    theirs.load_state_dict(sd)
    assert theirs.param_groups[0]["lr"] == HYPER["lr"]
    _run(model, mine, 20, seed=2)
    _run(twin, theirs, 20, seed=2)
    _close(twin, model, f"{name}: optgen checkpoint, 20 steps in torch vs in optgen")


def _trained_torch(cls, **kw):
    model = _model()
    opt = cls(model.parameters(), **kw)
    _run(model, opt, 3, seed=1)
    return opt.state_dict()


@pytest.mark.parametrize("make_sd,mine,message", [
    (lambda: _trained_torch(torch.optim.Adam, lr=1e-2, amsgrad=True), ot.Adam,
     r"amsgrad=True; optgen's adam rule has no amsgrad variant"),
    (lambda: _trained_torch(torch.optim.AdamW, lr=1e-2, maximize=True), ot.AdamW,
     r"maximize=True"),
    (lambda: _trained_torch(torch.optim.Adam, lr=1e-2, decoupled_weight_decay=True), ot.Adam,
     r"decoupled_weight_decay=True, which is AdamW: load it into optgen.torch.AdamW"),
    (lambda: _trained_torch(torch.optim.SGD, lr=1e-2, momentum=0.9), ot.SGD,
     r"sgd: loading a torch.optim checkpoint is implemented for adam \(torch.optim.Adam\), "
     r"adamw \(torch.optim.AdamW\) only"),
])
def test_unconvertible_torch_checkpoints_are_refused_and_change_nothing(make_sd, mine, message):
    sd = make_sd()
    model = _model()
    opt = mine(model.parameters(), lr=1e-2)
    _run(model, opt, 2, seed=3)
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(ValueError, match=message):
        opt.load_state_dict(sd)
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"]
    for k, rec in before["state"].items():
        assert all(torch.equal(torch.as_tensor(v), torch.as_tensor(after["state"][k][n]))
                   for n, v in rec.items())


def test_state_dict_format_is_checked():
    opt = ot.SGD(_model().parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"format must be 'optgen' or 'torch', got 'tf'"):
        opt.state_dict(format="tf")
    with pytest.raises(ValueError, match=r"sgd: writing a torch.optim checkpoint is "
                                         r"implemented for adam"):
        opt.state_dict(format="torch")

"""torch.optim checkpoints into the drop-ins and back (optgen/torch/torch_checkpoints.py): a run
saved by torch.optim.X continues in optgen.torch.X, and the reverse, for Adam, AdamW,
Adamax, NAdam, RAdam, Adadelta, Adagrad and SGD,
with the same parameters as the run that stayed (float32 rounding; optgen's Adam adds
eps before the step-size bias correction, torch after it: a difference of order eps)."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch.optim checkpoints need torch")
import optgen.torch.seeds as ot  # noqa: E402  (the seeds' forms: optgen/torch/torch_checkpoints.py)
from helpers import torch_mlp as _model, torch_train as _run  # noqa: E402

HYPER = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=1e-3)
# drop-in -> torch.optim keyword arguments (busy: momentum, decay and eps off defaults)
CASES = {
    "Adam": HYPER, "AdamW": HYPER,
    "Adamax": dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-7, weight_decay=1e-3),
    "NAdam": dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=1e-3, momentum_decay=0.005),
    "RAdam": dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=1e-3),
    "Adadelta": dict(lr=0.5, rho=0.8, eps=1e-5, weight_decay=1e-3),
    "Adagrad": dict(lr=0.05, eps=1e-9, weight_decay=1e-3, initial_accumulator_value=0.1),
    "SGD": dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3),
}
STATES = {"Adam": {"m": "exp_avg", "v": "exp_avg_sq"}, "AdamW": {"m": "exp_avg", "v": "exp_avg_sq"},
          "Adamax": {"m": "exp_avg", "u": "exp_inf"},
          "NAdam": {"m": "exp_avg", "v": "exp_avg_sq", "mu_product": "mu_product"},
          "RAdam": {"m": "exp_avg", "v": "exp_avg_sq"},
          "Adadelta": {"acc_grad": "square_avg", "acc_delta": "acc_delta"},
          "Adagrad": {"accum": "sum"}, "SGD": {"momentum_buffer": "momentum_buffer"}}


def _close(a, b, what):
    for i, (p, q) in enumerate(zip(a.parameters(), b.parameters())):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5,
                                   atol=1e-6, err_msg=f"{what}: parameter {i}")


@pytest.mark.parametrize("name", list(CASES))
def test_torch_checkpoint_continues_in_optgen(name):
    model = _model()
    theirs = getattr(torch.optim, name)(model.parameters(), **CASES[name])
    _run(model, theirs, 10, seed=1)
    twin = copy.deepcopy(model)
    mine = getattr(ot, name)(twin.parameters(), lr=0.5)        # values come from the file
    mine.load_state_dict(theirs.state_dict())
    assert mine.param_groups[0]["lr"] == CASES[name]["lr"]
    for p, q in zip(model.parameters(), twin.parameters()):   # the states, exactly
        for ours, their in STATES[name].items():
            assert torch.equal(torch.as_tensor(mine.state[q][ours]).to(theirs.state[p][their]),
                               theirs.state[p][their]), f"{name}: {ours} <- {their}"
    _run(model, theirs, 20, seed=2)
    _run(twin, mine, 20, seed=2)
    _close(twin, model, f"{name}: torch checkpoint, 20 steps in optgen vs in torch")


@pytest.mark.parametrize("name", list(CASES))
def test_optgen_checkpoint_continues_in_torch(name):
    model = _model()
    kw = {("initial_accum" if k == "initial_accumulator_value" else k): v
          for k, v in CASES[name].items()}
    mine = getattr(ot, name)(model.parameters(), **kw)
    _run(model, mine, 10, seed=1)
    sd = mine.state_dict(format="torch")
    assert set(sd["state"][0]) == set(STATES[name].values()) | ({"step"} if name != "SGD"
                                                               else set())
    twin = copy.deepcopy(model)
    theirs = getattr(torch.optim, name)(twin.parameters(), lr=0.5)
    theirs.load_state_dict(sd)
    assert theirs.param_groups[0]["lr"] == CASES[name]["lr"]
    _run(model, mine, 20, seed=2)
    _run(twin, theirs, 20, seed=2)
    _close(twin, model, f"{name}: optgen checkpoint, 20 steps in torch vs in optgen")


def test_torch_sgd_without_momentum_has_no_buffer_and_continues():
    """torch keeps momentum_buffer None while momentum is 0: the drop-in starts its
    buffer on the first step with momentum, as torch does."""
    model = _model()
    theirs = torch.optim.SGD(model.parameters(), lr=0.05)
    _run(model, theirs, 3, seed=1)
    assert theirs.state_dict()["state"].get(0, {}).get("momentum_buffer") is None
    twin = copy.deepcopy(model)
    mine = ot.SGD(twin.parameters(), lr=0.05)
    mine.load_state_dict(theirs.state_dict())
    for o in (theirs, mine):
        o.param_groups[0]["momentum"] = 0.9
    _run(model, theirs, 10, seed=2)
    _run(twin, mine, 10, seed=2)
    _close(twin, model, "SGD: momentum switched on after a torch checkpoint without buffers")


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
    (lambda: _trained_torch(torch.optim.RMSprop, lr=1e-2), ot.RMSprop,
     r"rmsprop: loading a torch.optim checkpoint is not offered: torch.optim.RMSprop adds "
     r"eps outside the square root"),
    (lambda: _trained_torch(torch.optim.Adafactor, lr=1e-2), ot.Adafactor,
     r"adafactor: loading a torch.optim checkpoint is not offered: torch.optim.Adafactor's "
     r"step size is min\(lr, 1/sqrt\(t\)\)"),
    (lambda: _trained_torch(torch.optim.Adam, lr=1e-2), ot.Lion,
     r"lion: loading a torch.optim checkpoint is implemented for adam \(torch.optim.Adam\), "
     r"adamw \(torch.optim.AdamW\), .* only; lion's states have no exact"),
    (lambda: _trained_torch(torch.optim.Adagrad, lr=1e-2, lr_decay=0.01), ot.Adagrad,
     r"lr_decay=0.01; optgen's adagrad rule has no lr_decay variant"),
    (lambda: _trained_torch(torch.optim.NAdam, lr=1e-2, decoupled_weight_decay=True), ot.NAdam,
     r"decoupled_weight_decay=True; optgen's nadam couples weight decay"),
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
    opt = ot.RMSprop(_model().parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"format must be 'optgen' or 'torch', got 'tf'"):
        opt.state_dict(format="tf")
    with pytest.raises(ValueError, match=r"rmsprop: writing a torch.optim checkpoint is "
                                         r"not offered: torch.optim.RMSprop"):
        opt.state_dict(format="torch")
    with pytest.raises(ValueError, match=r"lion: writing a torch.optim checkpoint is "
                                         r"implemented for adam"):
        ot.Lion(_model().parameters(), lr=0.1).state_dict(format="torch")


@pytest.mark.parametrize("source", ["torch", "optgen"])
def test_distributed_checkpoint_helpers_accept_both_formats(source):
    """torch.distributed.checkpoint's state-dict helpers (FQN-keyed, what DCP saves):
    a state dict taken from torch.optim.AdamW or from optgen's AdamW, set into optgen's
    AdamW with set_optimizer_state_dict, continues like the optimizer it came from."""
    from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict,
                                                         set_optimizer_state_dict)
    model = _model()
    make = torch.optim.AdamW if source == "torch" else ot.AdamW
    theirs = make(model.parameters(), lr=1e-2)
    _run(model, theirs, 10, seed=1)
    sd = get_optimizer_state_dict(model, theirs)
    assert set(sd["state"]) == {n for n, _ in model.named_parameters()}   # keyed by FQN
    twin = copy.deepcopy(model)
    mine = ot.AdamW(twin.parameters(), lr=0.5)
    set_optimizer_state_dict(twin, mine, sd)
    assert mine.param_groups[0]["lr"] == 1e-2
    _run(model, theirs, 20, seed=2)
    _run(twin, mine, 20, seed=2)
    _close(twin, model, f"{source} AdamW through the DCP helpers, 20 steps")


def test_drop_in_save_and_load_files(tmp_path):
    """``opt.save(path)`` / ``opt.load(path)`` on a drop-in (optgen's npz + json file; with
    FSDP2 shards a folder, tests/test_distributed.py): the loaded optimizer takes the
    checkpoint's hyperparameters (param_groups too) and continues as the run that stayed;
    a missing or foreign file is a ValueError that changes nothing."""
    stay, moved = _model(), _model()
    a = ot.AdamW(stay.parameters(), lr=1e-2, weight_decay=0.1)
    _run(stay, a, 5)
    a.save(tmp_path / "opt.npz")
    moved.load_state_dict(stay.state_dict())
    b = ot.AdamW(moved.parameters(), lr=0.5)
    b.load(tmp_path / "opt.npz")
    assert b.param_groups[0]["lr"] == 1e-2 and b.param_groups[0]["weight_decay"] == 0.1
    assert int(b.state[next(moved.parameters())]["step"]) == 5
    _run(stay, a, 5, seed=2)
    _run(moved, b, 5, seed=2)
    for p, q in zip(stay.parameters(), moved.parameters()):
        assert torch.equal(p, q)
    before = [v.clone() for st in b.state.values() for v in st.values()]
    (tmp_path / "junk.npz").write_bytes(b"not a checkpoint")
    (tmp_path / "folder").mkdir()
    for bad in ("missing.npz", "junk.npz", "folder"):
        with pytest.raises(ValueError, match="checkpoint"):
            b.load(tmp_path / bad)
    assert all(torch.equal(x, y) for x, y in
               zip(before, [v for st in b.state.values() for v in st.values()]))

"""Parameter names reach a spec's name flags from the torch classes as torch.optim takes
names: ``model.named_parameters()`` (pairs) and groups with ``'param_names'`` (torch
2.6+); ``state_dict`` keeps them in its groups, and a load that renames parameters moves
the flags with the names. A spec with name flags and no names: every flag on, as the
runtime (docs/dsl.md, name flags). The oracle steps each parameter by its name."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import optgen.torch as ot  # noqa: E402

SPEC = os.path.join(os.path.dirname(__file__), "specs", "named_decay.py")
LR, WD = 0.1, 0.5


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3),
                               torch.nn.Linear(3, 2))


def oracle(named, steps):
    """named: (name, weight, grads per step) -> the weights after ``steps`` steps."""
    out = {}
    for name, w, grads in named:
        w = w.astype(np.float64)
        decayed = not any(x in name for x in ("bias", "norm")) if name else True
        for g in grads[:steps]:
            w = w - LR * (g + (WD * w if decayed else 0.0))
        out[name] = w
    return out


def run(opt, m, steps=3):
    grads = []
    for k in range(steps):
        torch.manual_seed(100 + k)
        for p in m.parameters():
            p.grad = torch.randn_like(p)
        grads.append([p.grad.numpy().copy() for p in m.parameters()])
        opt.step()
    return grads


def check(m, start, grads, names):
    got = {n: p.detach().numpy() for n, p in zip(names, m.parameters())}
    want = oracle([(n, w, [g[i] for g in grads]) for i, (n, w) in enumerate(zip(names, start))],
                  len(grads))
    for n in names:
        np.testing.assert_allclose(got[n], want[n], rtol=1e-6, atol=1e-7, err_msg=n)


@pytest.mark.parametrize("options", [{}, {"flat": True}, {"multi_tensor": False}])
def test_named_parameters_reach_the_name_flag(options):
    """named_parameters(): biases and the LayerNorm ("1.weight", renamed "norm" below
    through a group's param_names) are stepped without decay, the other weights with.
    (Names dropped: every parameter decayed.)"""
    m = model()
    names = ["0.weight", "0.bias", "norm.weight", "norm.bias", "2.weight", "2.bias"]
    start = [p.detach().numpy().copy() for p in m.parameters()]
    params = list(m.parameters())
    groups = [{"params": params[:2], "param_names": names[:2]},
              {"params": params[2:4], "param_names": names[2:4]},
              {"params": params[4:], "param_names": names[4:]}]
    opt = ot.make(SPEC)(groups, lr=LR, weight_decay=WD, **options)
    check(m, start, run(opt, m), names)
    m = model()
    opt = ot.make(SPEC)(m.named_parameters(), lr=LR, weight_decay=WD, **options)
    assert opt.param_groups[0]["param_names"] == [n for n, _ in m.named_parameters()]
    check(m, start, run(opt, m), [n for n, _ in m.named_parameters()])


def test_unnamed_parameters_take_every_flag_on_as_the_runtime():
    m = model()
    start = [p.detach().numpy().copy() for p in m.parameters()]
    opt = ot.make(SPEC)(m.parameters(), lr=LR, weight_decay=WD)
    check(m, start, run(opt, m), [""] * 6)


def test_state_dict_keeps_param_names_and_a_load_moves_the_flags():
    """torch's state_dict holds the groups' param_names; loading one that names the
    parameters otherwise (torch: the loaded names win) moves the name flags with them."""
    m = model()
    opt = ot.make(SPEC)(m.named_parameters(), lr=LR, weight_decay=WD)
    run(opt, m, 1)
    sd = opt.state_dict()
    names = [n for n, _ in m.named_parameters()]
    assert sd["param_groups"][0]["param_names"] == names
    fresh = model()
    plain = ot.make(SPEC)(fresh.parameters(), lr=LR, weight_decay=WD)
    plain.load_state_dict(sd)
    assert plain.param_groups[0]["param_names"] == names
    start = [p.detach().numpy().copy() for p in fresh.parameters()]
    check(fresh, start, run(plain, fresh, 2), names)


@pytest.mark.parametrize("names", [["a"], ["a", 3], "ab"])
def test_bad_param_names_are_refused_before_anything_changes(names):
    ps = list(model().parameters())
    opt = ot.make(SPEC)([{"params": ps[2:], "param_names": ["c", "d", "e", "f"]}], lr=LR)
    with pytest.raises(ValueError, match=r"param group 1: 'param_names' must be 2 strings"):
        opt.add_param_group({"params": ps[:2], "param_names": names})
    assert len(opt.param_groups) == 1 and len(opt._core.params) == 4


def test_param_names_keyword_says_how_torch_names_parameters():
    m = model()
    with pytest.raises(TypeError, match=r"named_parameters\(\)"):
        ot.make(SPEC)(m.parameters(), lr=LR, param_names=["a"] * 6)

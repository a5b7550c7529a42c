"""The paper's signature: tuples a spec declares (``spec.hyper(..., tuple=)``: Prodigy's
``betas`` pair beside ``beta3``, CAME's ``eps`` pair), ``float("inf")`` where an optional
hyperparameter's None stands for it, ``beta3=None``, and ``backend="reference"`` on the
torch classes. No kernel is built here but Adam's (the reference backend needs none)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import optgen
import optgen.torch as otorch
from optgen.core.hyper import HyperInfo
from optgen.dsl import Spec
from optgen.errors import SpecError
from optgen.runtime import groups
from optgen.runtime.hyper_names import tuple_names


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


def _infos(**tuples):
    names = ["lr", "beta1", "beta2", "beta3", "eps1", "eps2"]
    return {n: HyperInfo(n, 0.5, tuple=tuples.get(n)) for n in names}


@pytest.mark.parametrize("tuples, want", [
    ({}, {"betas": ["beta1", "beta2", "beta3"]}),                          # Adan, CAME
    ({"beta1": "betas", "beta2": "betas"}, {"betas": ["beta1", "beta2"]}),  # Prodigy
    ({"eps1": "eps", "eps2": "eps"}, {"eps": ["eps1", "eps2"], "betas": ["beta1", "beta2",
                                                                          "beta3"]}),
])
def test_tuple_names(tuples, want):
    assert tuple_names(_infos(**tuples)) == want


def test_tuples_split_and_join():
    infos = _infos(beta1="betas", beta2="betas", eps1="eps", eps2="eps")
    given = {"betas": (0.8, 0.9), "eps": [1e-30, 1e-16], "beta3": None}
    spec_names = groups.alias("p", infos, given)
    assert spec_names == {"beta1": 0.8, "beta2": 0.9, "eps1": 1e-30, "eps2": 1e-16,
                          "beta3": None}
    assert groups.torch_view(infos, spec_names) == {"betas": (0.8, 0.9), "eps": (1e-30, 1e-16),
                                                    "beta3": None}
    with pytest.raises(TypeError, match=r"p: betas must be a pair \(beta1, beta2\), got "
                                        r"\(0.8, 0.9, 0.99\)"):
        groups.alias("p", infos, {"betas": (0.8, 0.9, 0.99)})
    with pytest.raises(TypeError, match=r"p: eps must be a pair \(eps1, eps2\), got 1e-08"):
        groups.alias("p", infos, {"eps": 1e-8})
    with pytest.raises(TypeError, match=r"'eps' and 'eps1' both set hyperparameter eps1"):
        groups.alias("p", infos, {"eps": (1.0, 2.0), "eps1": 1.0})


def test_torch_classes_take_the_authors_tuples():
    model = _model()
    prodigy = otorch.Prodigy(model.parameters(), betas=(0.8, 0.99), beta3=None,
                             growth_rate=float("inf"), backend="reference")
    group = prodigy.param_groups[0]
    assert group["betas"] == (0.8, 0.99) and group["beta3"] is None
    assert group["growth_rate"] == float("inf")     # as given (the kernel's None: unbounded)
    came = otorch.CAME(model.parameters(), lr=1e-3, eps=(1e-20, 1e-12), backend="reference")
    assert came.param_groups[0]["eps"] == (1e-20, 1e-12)
    assert came.param_groups[0]["betas"] == (0.9, 0.999, 0.9999)
    with pytest.raises(TypeError, match=r"betas must be a pair \(beta1, beta2\)"):
        otorch.Prodigy(model.parameters(), betas=(0.9, 0.999, 0.9))
    with pytest.raises(TypeError, match=r"eps must be a pair \(eps1, eps2\)"):
        otorch.CAME(model.parameters(), lr=1e-3, eps=1e-8)
    with pytest.raises(ValueError, match="CAME: lr must be given"):
        otorch.CAME(model.parameters())
    with pytest.raises(ValueError, match="slice_p=11 is not built"):
        otorch.Prodigy(model.parameters(), slice_p=11)
    with pytest.raises(ValueError, match="regen_reg_rate=0.1 is not built"):
        otorch.AdamAtan2(model.parameters(), regen_reg_rate=0.1)
    with pytest.raises(ValueError, match="cautious_factor=0.5 is not built"):
        otorch.AdamAtan2(model.parameters(), cautious_factor=0.5)


@pytest.mark.parametrize("value, error, message", [
    (float("inf"), None, None),                                # the None it stands for
    (-float("inf"), ValueError, "growth_rate must be finite, got -inf"),
    (float("nan"), ValueError, "growth_rate must be finite, got nan"),
])
def test_inf_where_none_is_inf(value, error, message):
    w = np.ones(3)
    if error is None:
        opt = optgen.create("prodigy", [w], growth_rate=value, backend="reference")
        opt.step([np.full(3, 0.5)])          # (unbounded growth: the kernel's inf)
        assert np.all(w < 1)
        return
    with pytest.raises(error, match=message):
        optgen.create("prodigy", [w], growth_rate=value, backend="reference")


def test_inf_is_refused_where_it_is_not_the_none_value():
    with pytest.raises(ValueError, match="hyperparameter eps must be finite, got inf"):
        optgen.create("prodigy", [np.ones(3)], eps=float("inf"), backend="reference")


def test_torch_backend_reference_equals_compiled():
    a, b = _model(), _model()
    ref = otorch.make("adam")(a.parameters(), lr=0.01, backend="reference")
    fused = otorch.make("adam")(b.parameters(), lr=0.01)
    for step in range(3):
        x = torch.randn(8, 5, generator=torch.Generator().manual_seed(step))
        for model, opt in ((a, ref), (b, fused)):
            model.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="backend must be 'compiled' or 'reference', got 'numpy'"):
        otorch.make("adam")(_model().parameters(), backend="numpy")


@pytest.mark.parametrize("name", ["lr", "1x", 3])
def test_spec_tuple_names_are_checked(name):
    spec = Spec("t", "doc")
    spec.hyper("lr", 0.1, "lr > 0")
    with pytest.raises(SpecError, match="tuple must be a name no hyperparameter has"):
        spec.hyper("eps1", 1e-8, tuple=name)

"""Shampoo's ``max_preconditioner_dim``: a parameter with a side longer than it takes
the Adam graft alone and keeps no statistics (specs/shampoo.py), so a long vector with
``precondition_1d=True`` or a wide matrix never asks for an n x n preconditioner.

Checked against the independent oracle (shampoo_oracles.py, which states the cap) on a
small case where the cap applies, and on a 10^6-element bias that would want 4 TB of
statistics without it. SOAP has its authors' cap, ``max_precond_dim`` (a longer side keeps
Q = I), checked the same way against its oracle (soap_oracle.py).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import optgen
import optgen.torch
from shampoo_oracles import ShampooOracle
from soap_oracle import SoapOracle

MATRIX_STATES = {"L", "R", "L_root", "R_root"}


def test_cap_follows_the_oracle():
    """cap 4: the 3x7 matrix takes the graft; 2x3 and 4x4 (a side equal to the cap) are
    preconditioned; 12 steps, roots every 3 from step 4."""
    rng = np.random.default_rng(3)
    shapes = [(3, 7), (2, 3), (4, 4), (7,)]
    hyper = dict(max_preconditioner_dim=4, precondition_frequency=3, epsilon=1e-2,
                 lr=0.01, weight_decay=0.1)
    w0 = [rng.standard_normal(s) for s in shapes]
    params = [w.copy() for w in w0]
    opt = optgen.create("shampoo", params, **hyper)   # test_matrix_shampoo's kernels
    oracle = ShampooOracle(w0, **hyper)
    for _ in range(12):
        g = [rng.standard_normal(s) for s in shapes]
        opt.step(g)
        oracle.step(g)
    for i, s in enumerate(shapes):
        np.testing.assert_allclose(params[i], oracle.w[i], rtol=1e-10, atol=1e-12,
                                   err_msg=f"parameter {i} {s}")
        assert set(opt.state[i]) == set(oracle.states(i)), f"parameter {i} {s}"
        for name, value in oracle.states(i).items():
            np.testing.assert_allclose(opt.state[i][name], value, rtol=1e-10, atol=1e-12)
    # the capped matrix is not what it would be preconditioned (the test can fail)
    uncapped = ShampooOracle(w0, **{**hyper, "max_preconditioner_dim": 8})
    assert set(uncapped.states(0)) > set(oracle.states(0))


def test_long_vector_with_precondition_1d_takes_the_graft():
    """A (10^6,) bias with precondition_1d=True: no n x n statistic, and its step is
    Adam's (bias-corrected, the spec's defaults), written out here."""
    n = 10 ** 6
    w = np.linspace(-1, 1, n)
    g = np.cos(np.arange(n, dtype=np.float64))
    opt = optgen.create("shampoo", [w], precondition_1d=True, lr=1e-3)
    expect = w.copy()
    for _ in range(2):
        opt.step([g])
    assert not MATRIX_STATES & set(opt.state[0])
    assert all(np.size(v) <= n for v in opt.state[0].values())
    m = v = 0.0
    for t in (1, 2):
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g ** 2
        expect = expect - 1e-3 * (m / (1 - 0.9 ** t)) / (
            np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    np.testing.assert_allclose(w, expect, rtol=0, atol=1e-12)


def test_torch_drop_in_takes_the_cap():
    lin = torch.nn.Linear(7, 3).double()     # float64: the kernels the tests above built
    opt = optgen.torch.Shampoo(lin.parameters(), max_preconditioner_dim=4,
                               precondition_1d=True)
    lin(torch.ones(2, 7, dtype=torch.float64)).sum().backward()
    opt.step()
    assert not MATRIX_STATES & set(opt.state[lin.weight])       # 3 x 7: graft
    assert "R" in opt.state[lin.bias]                          # 3 <= 4: preconditioned


def test_cap_is_fixed_once_made():
    """It chose which states exist: a new value is a ValueError naming it, nothing
    changes; the same value is accepted."""
    w = [np.ones((3, 7))]
    opt = optgen.create("shampoo", w, max_preconditioner_dim=4, precondition_1d=True)
    opt.step([np.ones((3, 7))])
    before = {k: np.copy(v) for k, v in opt.state[0].items()}
    with pytest.raises(ValueError, match=r"shampoo: max_preconditioner_dim is fixed.*"
                                         r"matrix.*got 8"):
        opt.set_hyper(max_preconditioner_dim=8)
    assert opt.groups[0].hyper["max_preconditioner_dim"] == 4
    assert set(opt.state[0]) == set(before)
    opt.set_hyper(max_preconditioner_dim=4, lr=0.5)
    assert opt.groups[0].hyper["lr"] == 0.5
    with pytest.raises(ValueError, match="max_preconditioner_dim"):
        optgen.create("shampoo", [np.ones(3)], max_preconditioner_dim=0)


def test_soap_cap_follows_the_oracle():
    """optgen.torch.SOAP(max_precond_dim=4): the 3x7 matrix is preconditioned on its rows
    only, the 5x5 not at all; 8 steps against the authors' rule (float32, as
    test_matrix_soap.py: the weights within 1e-5 of their largest)."""
    rng = np.random.default_rng(5)
    shapes = [(3, 7), (5, 5)]
    w0 = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    params = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in w0]
    opt = optgen.torch.SOAP(params, max_precond_dim=4, precondition_frequency=3)
    oracle = SoapOracle(w0, max_precond_dim=4, precondition_frequency=3)
    for _ in range(8):
        g = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        for p, gi in zip(params, g):
            p.grad = torch.from_numpy(gi)
        opt.step()
        oracle.step(g)
    for i, p in enumerate(params):
        np.testing.assert_allclose(p.detach().numpy(), oracle.w[i], rtol=0,
                                   atol=1e-5 * np.max(np.abs(oracle.w[i])))
    assert {"L", "Q_L"} <= set(opt.state[params[0]]) and "R" not in opt.state[params[0]]
    assert not {"L", "R", "Q_L", "Q_R"} & set(opt.state[params[1]])
    before = [p.detach().clone() for p in params]
    opt.param_groups[0]["max_precond_dim"] = 10000
    with pytest.raises(ValueError, match="soap: max_precond_dim is fixed"):
        opt.step()
    assert all(torch.equal(a, p.detach()) for a, p in zip(before, params))

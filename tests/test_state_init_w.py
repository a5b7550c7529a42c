"""A state that starts as a copy of the parameter (``spec.state(name, "w")``): Prodigy's
w0 and any pull toward the start (tests/specs/pull_to_start.py), against a numpy oracle
on the compiled and reference backends, in a torch flat group (one buffer for the
parameters, where other states of a chain share one too) and through a torch checkpoint
(the loaded copy is the saved one, not the parameter at load time)."""
from __future__ import annotations

import io
import os

import numpy as np
import pytest
import torch

import optgen
import optgen.torch as otorch
from optgen.dsl import Spec
from optgen.errors import SpecError

SPEC = os.path.join(os.path.dirname(__file__), "specs", "pull_to_start.py")
LR, K = 0.1, 0.2


def oracle(w0, grads):
    w = w0.astype(np.float64)
    for g in grads:
        w = w - LR * g + K * (w0 - w)
    return w


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_copy_of_w_against_the_oracle(backend):
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal(s).astype(np.float32) for s in [(7, 3), (5,)]]
    start = [w.copy() for w in ws]
    grads = [[rng.standard_normal(w.shape).astype(np.float32) for w in ws] for _ in range(6)]
    opt = optgen.create(SPEC, ws, backend=backend, lr=LR, k=K)
    for gs in grads:
        opt.step(gs)
    for i, (w, w0) in enumerate(zip(ws, start)):
        np.testing.assert_array_equal(opt.state[i]["w0"], w0)
        np.testing.assert_allclose(w, oracle(w0, [gs[i] for gs in grads]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("flat", [False, True])
def test_torch_flat_groups_and_checkpoints(flat):
    torch.manual_seed(0)
    cls = otorch.make(SPEC)
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    start = [p.detach().clone() for p in params]
    opt = cls(params, flat=flat, lr=LR, k=K)
    grads = [[torch.randn(p.shape) for p in params] for _ in range(4)]
    for gs in grads[:2]:
        for p, g in zip(params, gs):
            p.grad = g.clone()
        opt.step()
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    other = cls(twins, flat=flat, lr=LR, k=K)      # (its own copy would be the moved w)
    other.load_state_dict(torch.load(buffer, weights_only=False))
    for gs in grads[2:]:
        for p, g in zip(twins, gs):
            p.grad = g.clone()
        other.step()
    for i, (p, w0) in enumerate(zip(twins, start)):
        torch.testing.assert_close(other.state[p]["w0"], w0, rtol=0, atol=0)
        want = oracle(w0.numpy(), [gs[i].numpy() for gs in grads])
        np.testing.assert_allclose(p.detach().numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("init, shape", [("w", "scalar"), ("w", "row"), ("w0", "param"),
                                         (True, "param")])
def test_init_w_refusals(init, shape):
    spec = Spec("t", "doc")
    with pytest.raises(SpecError, match="init must be a number, a hyperparameter expression "
                                        r"or 'w' \(shape='param' only\)"):
        spec.state("s", init, shape=shape)

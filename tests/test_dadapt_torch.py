"""optgen.torch.DAdaptAdam (specs/dadapt_adam.py) against the authors' package,
``dadaptation.DAdaptAdam``, side by side on a small torch model: float32, 100 steps
under a torch lr scheduler, the optgen optimizer checkpointed through ``state_dict`` and
rebuilt at step 50; parameters, states and the estimate d within 1e-5 of the largest
magnitude of each tensor. tests/test_global_sum.py checks the rule against an oracle
written from the paper and the kernels against the reference interpreter."""
from __future__ import annotations

import dadaptation
import numpy as np
import pytest
import torch

import optgen.torch as otorch
from test_recent_optimizers import STEPS, CHECKPOINT_AT, assert_near, backward, net, rebuilt, \
    schedule

CONFIGS = {
    "default": dict(),
    "decoupled": dict(decouple=True, weight_decay=0.01, use_bias_correction=True,
                      growth_rate=1.05, betas=(0.85, 0.99)),
    "coupled": dict(weight_decay=0.001, lr=0.5, d0=1e-5),
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")   # (tests/conftest.py)


@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_dadapt_adam_is_the_authors(cfg):
    hyper = CONFIGS[cfg]

    def ours(params):
        return otorch.DAdaptAdam(params, **hyper)

    a, b = net(), net()
    theirs = dadaptation.DAdaptAdam(a.parameters(), **hyper)
    opt = ours(b.parameters())
    assert otorch.make("dadapt_adam") is otorch.DAdaptAdam
    pairs = [(a, theirs, schedule(theirs)), (b, opt, schedule(opt))]
    for step in range(STEPS):
        if step == CHECKPOINT_AT:
            b, opt, sched = rebuilt(b, opt, pairs[1][2], ours)
            pairs[1] = (b, opt, sched)
        for model, o, sched in pairs:
            backward(model, step)
            o.step()
            sched.step()
    d = theirs.param_groups[0]["d"]
    assert d > 10 * hyper.get("d0", 1e-6)        # the estimate grew from d0
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert_near(q.detach(), p.detach(), name)
        mine, authors = opt.state[q], theirs.state[p]
        for ours_name, their_name in [("m", "exp_avg"), ("v", "exp_avg_sq"), ("s", "s")]:
            # (the states hold the trajectory's float32 round-off: m and s scaled by d,
            # a bias's mean of residuals; 1e-4 of their largest value)
            want = authors[their_name].double()
            np.testing.assert_allclose(mine[ours_name].double().numpy(), want.numpy(), rtol=0,
                                       atol=1e-4 * float(want.abs().max()),
                                       err_msg=f"{name}: {ours_name}")
        np.testing.assert_allclose(float(mine["d"]), d, rtol=1e-5)


def test_refusals():
    model = net()
    with pytest.raises(ValueError, match="log_every"):
        otorch.DAdaptAdam(model.parameters(), log_every=10)
    with pytest.raises(ValueError, match="lr"):
        otorch.DAdaptAdam(model.parameters(), lr=-1.0)
    with pytest.raises(ValueError, match="step_in_backward"):
        otorch.DAdaptAdam(model.parameters(), step_in_backward=True)

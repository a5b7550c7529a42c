"""optgen.torch.Shampoo against Distributed Shampoo's rule (tests/distributed_shampoo_oracle.py).

The configuration both express: Adam grafting, root inverses by eigendecomposition,
EMA factors with their bias correction, decoupled weight decay, whole-matrix blocks
(target_parameter_dimensionality=2, max_preconditioner_dim 1024), a bias preconditioned
as a vector. optgen takes it with ``fresh_roots=True`` (the roots on steps f, 2f, ... from
statistics that include the step's gradient) and ``precondition_1d=True``. Both train the
same MLP from the same start on the same batches for 50 steps; optgen in float32, the
oracle in float64. bench/distributed_shampoo_compare.py runs Distributed Shampoo itself.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch drop-in needs torch")
import optgen.torch as otorch                               # noqa: E402
from distributed_shampoo_oracle import DistributedShampooOracle  # noqa: E402

STEPS = 50
DS = dict(lr=0.01, betas=(0.9, 0.95), epsilon=1e-6, weight_decay=0.01,
          weight_decay_type="decoupled", max_preconditioner_dim=1024,
          target_parameter_dimensionality=2, precondition_frequency=5,
          start_preconditioning_step=10, use_bias_correction=True,
          grafting=dict(beta2=0.999, epsilon=1e-8))
OPTGEN = dict(lr=0.01, beta1=0.9, shampoo_beta2=0.95, epsilon=1e-6, weight_decay=0.01,
              precondition_frequency=5, start_preconditioning_step=10, beta2=0.999,
              eps=1e-8, root=4.0, fresh_roots=True, precondition_1d=True)


def _model(dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(),
                              torch.nn.Linear(10, 4, bias=False))
    return net.to(dtype)


def _batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 6, generator=g), torch.randint(0, 4, (16,), generator=g))
            for _ in range(STEPS)]


def _grads(net, x, y) -> list:
    net.zero_grad()
    torch.nn.functional.cross_entropy(net(x.to(net[0].weight.dtype)), y).backward()
    return [p.grad for p in net.parameters()]


def _off(steps: int, **options) -> tuple[float, float, list]:
    """The largest weight difference between optgen.torch.Shampoo (OPTGEN and
    ``options``) and the oracle after ``steps`` steps, the largest weight, the weights."""
    net = _model()
    opt = otorch.Shampoo(net.parameters(), **{**OPTGEN, **options})
    ref_net = _model(torch.float64)
    oracle = DistributedShampooOracle([p.detach().numpy() for p in ref_net.parameters()], **DS)
    for x, y in _batches()[:steps]:
        _grads(net, x, y)
        opt.step()
        oracle.step([g.numpy() for g in _grads(ref_net, x, y)])
        with torch.no_grad():
            for p, w in zip(ref_net.parameters(), oracle.w):
                p.copy_(torch.from_numpy(w))
    err = max(float(np.abs(p.detach().numpy() - w).max())
              for p, w in zip(net.parameters(), oracle.w))
    return err, max(float(np.abs(w).max()) for w in oracle.w), oracle.w


def test_optgen_shampoo_follows_distributed_shampoo():
    err, scale, w = _off(STEPS)
    assert err <= 1e-5 * scale, (err, scale)
    moved = max(float(np.abs(a - p.detach().numpy()).max())
                for a, p in zip(w, _model().parameters()))
    assert moved > 1e-2 * scale         # the 50 steps moved the weights


def test_default_timing_differs_from_distributed_shampoo():
    """Without fresh_roots the roots lag one step behind Distributed Shampoo's on the
    steps that refresh: the check above can fail."""
    err, scale, _ = _off(20, fresh_roots=False)
    assert err > 1e-4 * scale


def test_fresh_roots_refuse_a_start_before_the_first_roots():
    p = torch.nn.Parameter(torch.ones(3, 2))
    with pytest.raises(ValueError, match="start_preconditioning_step must not come before"):
        otorch.Shampoo([p], fresh_roots=True, precondition_frequency=5,
                       start_preconditioning_step=3)
    assert torch.equal(p, torch.ones(3, 2))

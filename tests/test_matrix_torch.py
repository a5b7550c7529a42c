"""THOR and Muon as torch drop-ins: statistics from KFACStatistics' hooks, compared with
the numpy runtime fed by hand-written statistics of the same batches."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch drop-in needs torch")
import optgen                    # noqa: E402
import optgen.torch as otorch    # noqa: E402


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _batches(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g))
            for _ in range(n)]


def _numpy_statistics(model, x, y) -> tuple[list, list, list]:
    """Gradients, A = a^T a and G = d^T d per parameter, from an explicit forward and
    backward pass (d: the mean loss's gradient with respect to each layer's output)."""
    l1, l2 = model[0], model[2]
    a1 = x.detach().numpy().astype(np.float64)
    z1 = a1 @ l1.weight.detach().numpy().T + l1.bias.detach().numpy()
    a2 = np.tanh(z1)
    z2 = a2 @ l2.weight.detach().numpy().T + l2.bias.detach().numpy()
    p = np.exp(z2 - z2.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    d2 = p.copy()
    d2[np.arange(len(y)), y.numpy()] -= 1
    d2 /= len(y)
    d1 = (d2 @ l2.weight.detach().numpy()) * (1 - a2 * a2)
    grads = [d1.T @ a1, d1.sum(0), d2.T @ a2, d2.sum(0)]
    A = [a1.T @ a1, None, a2.T @ a2, None]
    G = [d1.T @ d1, None, d2.T @ d2, None]
    return grads, A, G


def test_thor_drop_in_with_kfac_hooks_matches_the_numpy_runtime():
    model = _model(0)
    params = [p.detach().numpy().astype(np.float32).copy() for p in model.parameters()]
    hyper = dict(lr=0.05, damping=0.1, momentum=0.9, frequency=3, batch_size=8)
    opt = otorch.THOR(model.parameters(), **hyper)
    ref = optgen.create("thor", params, **hyper)
    stats = otorch.KFACStatistics(model)
    refreshes = 0
    for x, y in _batches(7, 1):
        due = opt.refresh_due
        assert due == ref.refresh_due
        grads, A, G = _numpy_statistics(model, x, y)
        stats.record = due
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        found = stats.collect(opt)
        assert bool(found) == due
        opt.step(**found)
        refreshes += due
        as32 = lambda ms: [None if m is None else m.astype(np.float32) for m in ms]  # noqa: E731
        ref.step([g.astype(np.float32) for g in grads],
                 **({"A": as32(A), "G": as32(G)} if due else {}))
    assert refreshes == 3      # steps 1, 4 and 7
    for p, q in zip(model.parameters(), ref.params):
        np.testing.assert_allclose(p.detach().numpy(), q, rtol=1e-4, atol=1e-5)
    stats.remove()


def test_thor_drop_in_without_statistics_is_a_typed_error():
    model = _model(2)
    opt = otorch.THOR(model.parameters(), frequency=2)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = _batches(1, 3)[0]
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(ValueError, match=r"statistic 'A' .* missing"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_muon_drop_in_matches_the_numpy_runtime():
    model = _model(4)
    params = [p.detach().numpy().copy() for p in model.parameters()]
    opt = otorch.seeds.Muon(model.parameters(), lr=0.02, weight_decay=0.01)
    ref = optgen.create("muon", params, lr=0.02, weight_decay=0.01)
    for x, y in _batches(5, 5):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grads = [p.grad.numpy().copy() for p in model.parameters()]
        opt.step()
        ref.step(grads)
    for p, q in zip(model.parameters(), ref.params):
        np.testing.assert_array_equal(p.detach().numpy(), q)

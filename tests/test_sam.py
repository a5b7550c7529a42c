"""optgen.torch.SAM: sharpness-aware minimization around an optgen optimizer, against
pytorch-optimizer's SAM (the authors' signature) and against a numpy oracle written from
Foret et al. 2021 (SAM) and Kwon et al. 2021 (ASAM)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import optgen.torch as ot  # noqa: E402


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _run(model, opt, steps=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(16, 6, generator=g), torch.randn(16, 3, generator=g)

    def closure():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        return loss
    for _ in range(steps):
        closure()
        opt.step(closure)
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("adaptive,rho", [(False, 0.05), (True, 0.5)])
def test_matches_pytorch_optimizer_sam(adaptive, rho):
    po = pytest.importorskip("pytorch_optimizer", reason="pytorch-optimizer not installed")
    a, b = _model(), _model()
    mine = ot.SAM(a.parameters(), ot.AdamW, rho=rho, adaptive=adaptive, lr=1e-2,
                  weight_decay=0.01)
    theirs = po.SAM(b.parameters(), torch.optim.AdamW, rho=rho, adaptive=adaptive, lr=1e-2,
                    weight_decay=0.01, foreach=False)
    for p, q in zip(_run(a, mine), _run(b, theirs)):
        assert (p - q).abs().max() <= 1e-5 * q.abs().max(), (p - q).abs().max()
    # the same run again, through a checkpoint of the base optimizer's state
    c = _model()
    again = ot.SAM(c.parameters(), ot.AdamW, rho=rho, adaptive=adaptive, lr=1e-2,
                   weight_decay=0.01)
    _run(c, again, steps=6)
    sd = again.state_dict()
    d = _model()
    d.load_state_dict(c.state_dict())
    restored = ot.SAM(d.parameters(), ot.AdamW, rho=rho, adaptive=adaptive, lr=1e-2,
                      weight_decay=0.01)
    restored.load_state_dict(sd)
    for p, q in zip(_run(d, restored, steps=6, seed=1), _run(c, again, steps=6, seed=1)):
        assert torch.equal(p, q)


def test_matches_an_oracle_from_the_paper():
    """Linear least squares with plain SGD as the base: e = rho T^2 g / ||T g||, the
    gradient at w + e, then w -= lr * g(w + e) (SAM: T = 1; ASAM: T = |w|)."""
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((20, 4)), rng.standard_normal(20)
    for adaptive in (False, True):
        w0 = rng.standard_normal(4)
        w = w0.copy()
        grad = lambda v: 2 * X.T @ (X @ v - y) / len(y)    # noqa: E731
        for _ in range(10):
            g = grad(w)
            t = np.abs(w) if adaptive else np.ones_like(w)
            e = 0.1 * t * t * g / (np.linalg.norm(t * g) + 1e-12)
            w = w - 0.05 * grad(w + e)
        p = torch.nn.Parameter(torch.tensor(w0))
        Xt, yt = torch.tensor(X), torch.tensor(y)
        opt = ot.SAM([p], ot.SGD, rho=0.1, adaptive=adaptive, lr=0.05)

        def closure():
            opt.zero_grad()
            loss = ((Xt @ p - yt) ** 2).mean()
            loss.backward()
            return loss
        for _ in range(10):
            closure()
            opt.step(closure)
        np.testing.assert_allclose(p.detach().numpy(), w, rtol=1e-12, atol=1e-12)


def test_bad_inputs_change_nothing():
    m = _model()
    with pytest.raises(ValueError, match="rho"):
        ot.SAM(m.parameters(), ot.AdamW, rho=-1.0)
    with pytest.raises(TypeError, match="base_optimizer"):
        ot.SAM(m.parameters(), ot.AdamW(m.parameters()))
    opt = ot.SAM(m.parameters(), ot.AdamW, lr=1e-2)
    before = [p.detach().clone() for p in m.parameters()]
    m(torch.randn(2, 6)).sum().backward()
    with pytest.raises(ValueError, match="closure"):
        opt.step()

    def broken():
        raise RuntimeError("data loader failed")
    with pytest.raises(RuntimeError, match="data loader"):
        opt.step(broken)
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), before))

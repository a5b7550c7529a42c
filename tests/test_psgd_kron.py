"""PSGD-Kron: optgen.torch.PSGDKron against heavyball 3.2.1's PSGDKron (the same probe
vectors: both draw them from torch's global generator, seeded alike before each step),
against an oracle written here in numpy float64 from Li's rule (probes from the
``generator`` argument), the psgd_kron kernel against the reference interpreter with
fitted (nonzero) factors, no build after construction, and the refusals."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch drop-ins need torch")
import optgen                                   # noqa: E402
import optgen.torch as otorch                   # noqa: E402
from optgen.compiler import pipeline            # noqa: E402
from optgen.runtime.artifact import Artifact    # noqa: E402
from helpers import assert_close                # noqa: E402

# a matrix (two triangular factors), a wide one, a vector, a matrix with a side of 1
# (heavyball squeezes it to a vector) and a single value
SHAPES = [(6, 4), (3, 7), (5,), (1, 4), ()]


def _grads(shapes, steps, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=gen) for s in shapes] for _ in range(steps)]


def _run(make, shapes, grads, seeds=True):
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    opt = make(ps)
    for k, gs in enumerate(grads):
        for p, g in zip(ps, gs):
            p.grad = g.clone()
        if seeds:
            torch.manual_seed(100 + k)
        opt.step()
    return [p.detach().clone() for p in ps], opt


def _heavyball():
    heavyball = pytest.importorskip("heavyball", reason="heavyball is not installed")
    import heavyball.utils
    heavyball.utils.compile_mode = None           # (eager: its compile takes minutes)
    heavyball.utils.compile_mode_recommended_to_none = None
    return heavyball


@pytest.mark.parametrize("kw", [
    dict(lr=0.01, weight_decay=0.01),
    dict(lr=0.01, memory_save_mode="one_diag", max_size_triangular=5, warmup_steps=3,
         preconditioner_update_probability=0.6, momentum_into_precond_update=False),
], ids=["defaults", "diagonal-sides"])
def test_matches_heavyballs_PSGDKron(kw):
    """20 steps (12 with diagonal sides: D holds d_L d_R^T) on the same gradients and
    probes: float32 round-off apart (measured 7e-7 on weights of size ~2)."""
    hb = _heavyball()
    steps = 20 if len(kw) == 2 else 12
    shapes = SHAPES if len(kw) == 2 else [(6, 4), (4, 6), (5, 5), (5,)]
    grads = _grads(shapes, steps)
    theirs, _ = _run(lambda ps: hb.PSGDKron(ps, **kw), shapes, grads)
    ours, opt = _run(lambda ps: otorch.PSGDKron(ps, **kw), shapes, grads)
    torch.manual_seed(0)
    start = [torch.randn(s) for s in shapes]
    for i, (a, b, w0) in enumerate(zip(ours, theirs, start)):
        assert (b - w0).abs().max() > 1e-2                     # (the weights moved)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=5e-6, msg=f"w[{i}] {shapes[i]}")


# -- an oracle from Li's rule (numpy float64) -----------------------------------------------
def _largest_eig(a, iters):
    """heavyball's estimate: power iterations on a^2 from a's largest row."""
    norms = np.linalg.norm(a, axis=1)
    i = int(np.argmax(norms))
    s = max(norms[i], np.finfo(np.float32).tiny)
    a = a / s
    x = a[i] / s
    for _ in range(iters):
        x = a @ (a @ x)
        x = x / np.linalg.norm(x)
    return np.sqrt(x @ (a @ (a @ x))) * s


def _oracle(w, grads, probes, lr, beta, wd, precond_lr=0.1, lb_beta=0.9, damp=1e-9):
    """PSGD-Kron for one matrix W with triangular Q_1, Q_2: Q_i <- Q_i - precond_lr / l_i
    triu(T1_i - T2_i) Q_i (A = Q_1 G Q_2^T, B = Q_1^-T V Q_2^-1, T1 = A A^T or A^T A),
    then W <- W (1 - lr wd) - lr clip(P m) with P m = Q_1^T Q_1 m Q_2^T Q_2."""
    w = w.astype(np.float64)
    g0 = grads[0].astype(np.float64)
    scale = np.mean(np.abs(g0) ** 4) ** (-1 / 16)
    q = [np.sqrt(scale) * np.eye(n) for n in w.shape]
    lb, m = [0.0, 0.0], np.zeros_like(w)
    for t, (g, v) in enumerate(zip(grads, probes), 1):
        g, v = g.astype(np.float64), v.astype(np.float64)
        bt = 1 - (1 - beta) / (1 - beta ** t)
        m = bt * m + (1 - bt) * g
        big = [np.abs(x).max() for x in q]
        q = [x * np.sqrt(np.prod(big)) / b for x, b in zip(q, big)]
        gp = m + (damp + np.finfo(np.float32).eps * np.abs(m)) * v
        a = q[0] @ gp @ q[1].T
        b = np.linalg.inv(q[0]).T @ v @ np.linalg.inv(q[1])
        new = []
        for i in (0, 1):
            t1, t2 = (a @ a.T, b @ b.T) if i == 0 else (a.T @ a, b.T @ b)
            ell = _largest_eig(t1 + t2, 2)
            ell = max(ell, lb[i] + (ell - lb[i]) * (1 - lb_beta))
            lb[i] = ell
            new.append(q[i] - precond_lr / ell * np.triu(t1 - t2) @ q[i])
        q = new
        x = (q[0].T @ q[0] @ m @ q[1].T @ q[1]) / 1.5
        u = np.clip(1.5 * (0.9 * np.tanh(x) + 0.1 * np.sign(x) * np.log1p(np.abs(x))), -2, 2)
        w = w * (1 - lr * wd) - lr * u
    return w, q


def test_matches_an_oracle_from_lis_rule():
    """One matrix, 10 steps, probes from the ``generator`` argument (the oracle draws the
    same ones): float32 against float64."""
    shape, steps = (5, 3), 10
    grads = [g[0] for g in _grads([shape], steps)]
    gen = torch.Generator().manual_seed(7)
    probes = [torch.randn(shape, generator=gen).numpy() for _ in range(steps)]
    ours, opt = _run(lambda ps: otorch.PSGDKron(ps, lr=0.02, betas=(0.8, 0.9),
                                               weight_decay=0.1,
                                               generator=torch.Generator().manual_seed(7)),
                     [shape], [[g] for g in grads], seeds=False)
    torch.manual_seed(0)
    w0 = torch.randn(shape).numpy()
    w, q = _oracle(w0, [g.numpy() for g in grads], probes, 0.02, 0.8, 0.1)
    np.testing.assert_allclose(ours[0].numpy(), w, rtol=1e-4, atol=1e-5)
    assert np.abs(w - w0).max() > 0.05
    p = next(iter(opt.state))
    # the factors as the oracle has them after the last fit (the next fit balances them)
    np.testing.assert_allclose(opt.state[p]["Q_L"].numpy(), q[0], rtol=1e-4, atol=1e-5)


# -- the kernel against the reference interpreter, with nonzero factors ----------------------
@pytest.mark.parametrize("shape,kw", [((6, 4), {}), ((6, 4), {"max_size_triangular": 5}),
                                      ((7,), {})], ids=["triangular", "one-diagonal", "vector"])
def test_kernel_matches_reference_with_fitted_factors(shape, kw, rng):
    art = optgen.get_artifact("psgd_kron")
    w_c = rng.standard_normal(shape).astype(np.float32)
    w_r = w_c.copy()
    hyper = dict(lr=0.05, beta1=0.8, weight_decay=0.1, warmup_steps=2, **kw)
    comp = optgen.create(art, [w_c], **hyper)
    ref = optgen.create(art, [w_r], backend="reference", **hyper)
    for name, a in comp.state[0].items():
        if isinstance(a, np.ndarray):
            value = rng.standard_normal(a.shape).astype(a.dtype) * 3
            value = np.triu(value) if name in ("Q_L", "Q_R") else value
            a[...] = value
            ref.state[0][name][...] = value
    for _ in range(3):
        g = rng.standard_normal(shape).astype(np.float32)
        comp.step([g.copy()])
        ref.step([g])
    assert_close(w_c, w_r, "float32", f"psgd_kron w {shape}")
    assert np.abs(np.clip(w_c, -10, 10)).max() > 0


def test_no_library_is_built_or_loaded_after_construction(monkeypatch):
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s)) for s in [(6, 5), (5,), (3, 9)]]
    opt = otorch.PSGDKron(ps, lr=1e-2, max_size_triangular=8)
    loads, builds = [], []
    variant, build = Artifact.variant, pipeline.build
    monkeypatch.setattr(Artifact, "variant", lambda art, name: (
        loads.append(name) if name not in art._built else None, variant(art, name))[1])
    monkeypatch.setattr(pipeline, "build", lambda *a, **k: (builds.append(a), build(*a, **k))[1])
    for _ in range(3):
        for p in ps:
            p.grad = torch.randn(p.shape)
        opt.step()
    assert loads == [] and builds == []
    assert "D" in opt.state[ps[2]] and "Q_L" in opt.state[ps[2]]


# -- refusals --------------------------------------------------------------------------------
BAD = [({"memory_save_mode": "half_diag"}, ValueError, "memory_save_mode must be one of"),
       ({"mars": True}, ValueError, "mars=True is not built"),
       ({"delayed": True}, ValueError, "delayed=True is not built"),
       ({"update_clipping": None}, ValueError, "update_clipping=None is not built"),
       ({"flat": True}, ValueError, "flat=True is not built"),
       ({"betas": 0.9}, TypeError, "betas must be a pair"),
       ({"precond_lr": 0.0}, ValueError, "precond_lr=0.0 is out of range"),
       ({"preconditioner_update_probability": 2.0}, ValueError, r"in \[0, 1\]"),
       ({"generator": 3}, TypeError, "generator must be a torch.Generator")]


@pytest.mark.parametrize("kw,error,message", BAD, ids=[next(iter(k)) for k, _, _ in BAD])
def test_bad_arguments_are_refused(kw, error, message):
    with pytest.raises(error, match=message):
        otorch.PSGDKron([torch.nn.Parameter(torch.ones(2, 2))], **kw)


def test_refusals_at_step_and_for_shapes_change_nothing():
    with pytest.raises(ValueError, match="has 3 dimensions"):
        otorch.PSGDKron([torch.nn.Parameter(torch.ones(2, 2, 2))])
    a, b = torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.ones(4))
    opt = otorch.PSGDKron([a, b])
    a.grad, b.grad = torch.ones(3, 2), torch.zeros(4)
    with pytest.raises(ValueError, match="first gradient is all zeros"):
        opt.step()
    assert (a == 1).all() and float(opt.state[a]["step"]) == 0
    assert float(opt.state[a]["Q_L"].abs().sum()) == 0
    b.grad = torch.tensor([1.0, float("nan"), 0.0, 0.0])
    with pytest.raises(ValueError, match="NaN or Inf"):
        opt.step()
    b.grad = torch.zeros(4)                    # (a given scale needs no gradient)
    opt = otorch.PSGDKron([a, b], precond_init_scale=0.5)
    opt.step()
    assert abs(float(opt.state[b]["D"][0]) - 0.5) < 0.05 and not (a == 1).all()


def test_a_checkpoint_keeps_the_update_schedule():
    """Three steps, state_dict, a new optimizer loads it, three more steps: the run
    uninterrupted (probability 0.5: the fits come on every other step, so the schedule's
    position and the lower bounds must come back)."""
    shapes, kw = [(4, 3), (5,)], dict(lr=0.05, preconditioner_update_probability=0.5)
    grads = _grads(shapes, 6)
    whole, _ = _run(lambda ps: otorch.PSGDKron(ps, **kw), shapes, grads)
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    opt = otorch.PSGDKron(ps, **kw)
    for k in range(6):
        if k == 3:
            sd = opt.state_dict()
            opt = otorch.PSGDKron(ps, **kw)
            opt.load_state_dict(sd)
        for p, g in zip(ps, grads[k]):
            p.grad = g.clone()
        torch.manual_seed(100 + k)
        opt.step()
    for a, b in zip(ps, whole):
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=0)


def test_under_torch_compile_the_fit_runs_eagerly():
    """A compiled step (aot_eager) fits Q as the eager step does: the same weights."""
    shapes = [(4, 3), (3,)]
    grads = _grads(shapes, 3)
    eager, _ = _run(lambda ps: otorch.PSGDKron(ps, lr=0.05), shapes, grads)

    class Compiled:
        def __init__(self, ps):
            self.opt = otorch.PSGDKron(ps, lr=0.05)
            self.step = torch.compile(lambda: self.opt.step(), backend="aot_eager")
    compiled, _ = _run(Compiled, shapes, grads)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

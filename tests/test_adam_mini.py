"""Adam-mini and reductions over groups of rows (``head_mean``): the compiled kernels
against the reference interpreter, optgen.torch.AdamMini against the authors' Adam_mini
(pip adam-mini) and against a numpy oracle written from the paper, and the typed errors."""
import numpy as np
import torch
import pytest

import optgen
import optgen.torch
from optgen.errors import SpecError




@pytest.fixture(scope="module")
def art():
    return optgen.get_artifact("adam_mini")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_grouped_reduction_kernel_matches_reference(art, dtype):
    rng = np.random.default_rng(3)
    tol = dict(rtol=2e-6, atol=1e-7) if dtype == "float32" else dict(rtol=1e-13, atol=1e-14)
    # heads = 1, heads = rows, heads in between; columns small primes; a 1-D tensor
    for shape, heads in [((6, 5), 1), ((6, 7), 6), ((12, 3), 4), ((10, 2), 5), ((7,), 1),
                         ((2, 6, 5), 3)]:
        w0 = rng.standard_normal(shape).astype(dtype)
        wc, wr = w0.copy(), w0.copy()
        hp = dict(heads=heads, lr=0.01, weight_decay=0.1)
        c = optgen.create(art, [wc], **hp)
        r = optgen.create(art, [wr], backend="reference", **hp)
        for _ in range(3):
            g = rng.standard_normal(shape).astype(dtype)
            c.step([g.copy()])
            r.step([g.copy()])
        np.testing.assert_allclose(wc, wr, **tol, err_msg=f"{shape} heads={heads}")
        np.testing.assert_allclose(c.state[0]["vmean"], r.state[0]["vmean"], **tol)


def test_head_mean_reference_is_the_mean_over_each_head(art):
    """One step from zero states: vmean = (1 - beta2) * mean of g*g over each head's rows."""
    rng = np.random.default_rng(4)
    g = rng.standard_normal((12, 5))
    for backend in ("compiled", "reference"):
        o = optgen.create(art, [np.zeros((12, 5))], heads=3, beta2=0.5, backend=backend)
        o.step([g])
        want = np.repeat(0.5 * (g * g).reshape(3, 4 * 5).mean(axis=1), 4)
        np.testing.assert_allclose(o.state[0]["vmean"], want, rtol=1e-13)


@pytest.mark.parametrize("shape, heads, match", [
    ((6, 5), 4, r"6 rows, which heads=4 does not divide"),
    ((6,), 2, r"1-D parameter is one row; grouping rows by heads needs a 2-D weight"),
    ((6, 5), 0, r"heads"),
])
def test_bad_heads_are_refused_before_anything_changes(art, shape, heads, match):
    with pytest.raises(ValueError, match=match):
        optgen.create(art, [np.ones(shape, np.float32)], heads=heads)
    w = np.ones((6, 5), np.float32)
    o = optgen.create(art, [w], heads=3)
    with pytest.raises(ValueError, match="heads=4 does not divide"):
        o.set_hyper(heads=4)
    assert o.param_groups[0]["heads"] == 3
    o.step([np.ones((6, 5), np.float32)])   # still steps with heads=3


def test_head_mean_needs_int_heads(tmp_path):
    path = tmp_path / "bad_heads.py"
    path.write_text('"""x"""\nfrom optgen.dsl import Spec, head_mean\n'
                    'spec = Spec("bad_heads", __doc__)\nlr = spec.hyper("lr", 0.1, "lr > 0")\n'
                    'v = spec.state("v", 0.0, shape="row")\n'
                    '@spec.update\ndef rule(w, grad, flags):\n'
                    '    return {v: head_mean(grad, 2.5), w: w - lr * grad}\n')
    with pytest.raises(SpecError, match="int hyperparameter or an int >= 1"):
        optgen.get_artifact(str(path))


# -- the torch class --------------------------------------------------------------------
DIM, N_HEADS, N_KV = 16, 4, 2


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        kv = DIM // N_HEADS * N_KV
        self.q_proj = torch.nn.Linear(DIM, DIM, bias=False)
        self.k_proj = torch.nn.Linear(DIM, kv, bias=False)
        self.v_proj = torch.nn.Linear(DIM, kv, bias=False)
        self.o_proj = torch.nn.Linear(DIM, DIM, bias=False)


class Tiny(torch.nn.Module):
    """Names the authors' package recognizes: embed, q/k/v/o_proj, mlp, norm, lm_head."""
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, DIM)
        self.attn = Attention()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DIM, 2 * DIM), torch.nn.Linear(2 * DIM, DIM))
        self.norm = torch.nn.LayerNorm(DIM)
        self.lm_head = torch.nn.Linear(DIM, 11, bias=False)


def _run(make, steps=100, seed=0):
    torch.manual_seed(seed)
    model = Tiny()
    opt = make(model)
    gen = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen) * 0.1
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


HP = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, dim=DIM, n_heads=N_HEADS,
          n_kv_heads=N_KV)


def test_matches_the_authors_adam_mini():
    adam_mini = pytest.importorskip("adam_mini", reason="adam_mini is not installed")
    ours = _run(lambda m: optgen.torch.AdamMini(m.named_parameters(), **HP))
    theirs = _run(lambda m: adam_mini.Adam_mini(m.named_parameters(), verbose=False, **HP))
    for name, w in theirs.items():
        rel = (ours[name] - w).abs().max() / w.abs().max()
        assert rel <= 1e-5, (name, float(rel))


def _oracle(steps=100, seed=0):
    """Adam-mini from the paper (Algorithm 1 with the partition of its section 2.3),
    float64: v per block = EMA of mean(g^2) over the block; Q and K by heads, V, the
    attention projection, MLP, embedding and output by output neuron, the rest whole;
    biases Adam's per element. AdamW-style decay, Adam's bias corrections."""
    torch.manual_seed(seed)
    model = Tiny()
    w = {n: p.detach().double().numpy().copy() for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(seed + 1)
    lr, (b1, b2), eps, wd = HP["lr"], HP["betas"], HP["eps"], HP["weight_decay"]
    m = {n: np.zeros_like(x) for n, x in w.items()}
    v = {n: np.zeros_like(x) for n, x in w.items()}

    def blocks(name, x):   # the block each element belongs to, as a [blocks, size] view
        if "bias" in name:
            return x.reshape(-1, 1)
        if "q_proj" in name or "k_proj" in name:
            return x.reshape(-1, DIM * DIM // N_HEADS)
        if "norm" in name:
            return x.reshape(1, -1)
        return x.reshape(x.shape[0], -1)

    for t in range(1, steps + 1):
        for (n, p) in model.named_parameters():
            g = (torch.randn(p.shape, generator=gen) * 0.1).double().numpy()
            gb = blocks(n, g)
            mean = np.broadcast_to((gb * gb).mean(axis=1, keepdims=True), gb.shape)
            v[n] = b2 * v[n] + (1 - b2) * mean.reshape(g.shape)
            m[n] = b1 * m[n] + (1 - b1) * g
            decay = 0.0 if "norm" in n or "bias" in n else wd
            h = np.sqrt(v[n]) / np.sqrt(1 - b2 ** t) + eps
            w[n] = w[n] * (1 - lr * decay) - lr / (1 - b1 ** t) * m[n] / h
    return w


def test_matches_an_oracle_from_the_paper():
    ours = _run(lambda m: optgen.torch.AdamMini(m.named_parameters(), **HP))
    want = _oracle()
    for name, w in want.items():
        rel = np.abs(ours[name].double().numpy() - w).max() / np.abs(w).max()
        assert rel <= 1e-5, (name, float(rel))


def test_blocks_by_name():
    from optgen.torch.adam_mini import block
    opt = optgen.torch.AdamMini(Tiny().named_parameters(), **HP)
    heads = {g["param_names"][0]: g["heads"] for g in opt.param_groups}
    assert heads["attn.q_proj.weight"] == N_HEADS and heads["attn.k_proj.weight"] == N_KV
    assert heads["attn.v_proj.weight"] == DIM // N_HEADS * N_KV and heads["norm.weight"] == 1
    assert heads["embed.weight"] == 11 and block("mlp.0.bias") == "adam"
    decay = {g["param_names"][0]: g["weight_decay"] for g in opt.param_groups}
    assert decay["norm.weight"] == 0.0 and decay["mlp.0.bias"] == 0.0
    assert decay["mlp.0.weight"] == HP["weight_decay"]


@pytest.mark.parametrize("kwargs, model, match", [
    (dict(dim=DIM, n_heads=3), None, "n_heads=3"),                 # heads of 85.3 elements
    (dict(dim=DIM, n_heads=4, n_kv_heads=3), None, "must divide"),
    (dict(dim=0), None, "dim must be an int >= 1"),
    (dict(dim=DIM, n_heads=N_HEADS), "conv", "needs a 2-D weight"),
])
def test_torch_bad_inputs(kwargs, model, match):
    net = torch.nn.Module()
    if model == "conv":
        net.mlp = torch.nn.Conv1d(2, 3, 3, bias=False)
    else:
        net.q_proj = torch.nn.Linear(DIM, DIM, bias=False)
    with pytest.raises(ValueError, match=match):
        optgen.torch.AdamMini(net.named_parameters(), **kwargs)

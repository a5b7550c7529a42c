"""A parameter whose data is replaced (``p.data = new``) keeps training, as under
torch.optim (runtime/storage.py): per tensor, multi-tensor and flat runs; mixed
precision's master copy, offloaded host copies and SparseAdam's numpy views follow the
new values; a checkpoint loaded after the replacement wins; and data that cannot take
the parameter's place (another shape, dtype, non-contiguous, shared memory) is a typed
error before anything changes.

Every comparison is with torch.optim doing the same thing to its own copy of the
parameters, over several steps, to float32 rounding."""
import copy

import numpy as np
import pytest
import torch

import optgen
import optgen.torch as ot

STEPS, AT = 5, 2           # steps; the replacement comes before step AT
SHAPES = [(5, 3), (7,), (4, 4), (6, 2)]


def twins(seed: int = 0):
    """Two lists of equal parameters: optgen's and torch's."""
    torch.manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    return ps, [torch.nn.Parameter(p.detach().clone()) for p in ps]


def train(ours, theirs, opt, ref, replace, grads=None):
    """STEPS steps of both with the same gradients; ``replace(params)`` before step AT."""
    gen = torch.Generator().manual_seed(1)
    for k in range(STEPS):
        for p, q in zip(ours, theirs):
            g = torch.randn(p.shape, generator=gen)
            if grads is None:
                p.grad, q.grad = g.clone(), g.clone()
            else:
                grads(p, q, g)
        if k == AT:
            replace(ours)
            replace(theirs)
        opt.step()
        ref.step()


def new_data(ps, which=(1, 2)):
    """Replace the data of parameters ``which`` with new values (new storage)."""
    gen = torch.Generator().manual_seed(7)
    for i in which:
        ps[i].data = torch.randn(ps[i].shape, generator=gen)


def assert_same(ours, theirs, tol=1e-6):
    for i, (p, q) in enumerate(zip(ours, theirs)):
        assert torch.allclose(p, q, rtol=0, atol=tol), \
            f"parameter {i}: max diff {(p - q).abs().max().item():.3g}"


@pytest.mark.parametrize("options", [{}, {"multi_tensor": False}, {"flat": True}],
                         ids=["multi_tensor", "per_tensor", "flat"])
def test_replaced_data_trains_as_torch(options):
    ours, theirs = twins()
    opt = ot.Adam(ours, lr=0.05, weight_decay=0.1, **options)
    ref = torch.optim.Adam(theirs, lr=0.05, weight_decay=0.1)
    train(ours, theirs, opt, ref, new_data)
    assert_same(ours, theirs)


def test_flat_group_keeps_fusing_the_rest():
    """A parameter moved out of a flat group's buffer steps alone; its neighbours that
    still lie back to back keep one call between them."""
    ours, theirs = twins()
    opt = ot.SGD(ours, lr=0.1, momentum=0.9, flat=True, multi_tensor=False)
    ref = torch.optim.SGD(theirs, lr=0.1, momentum=0.9)
    train(ours, theirs, opt, ref, lambda ps: new_data(ps, which=(3,)))
    assert_same(ours, theirs)
    runs = [list(r.indices) for r in opt._core._current_runs().values()]
    assert runs == [[0, 1, 2]]


def test_replaced_gradients_are_read_as_torch():
    """New gradient tensors every step, and a gradient whose data moved under the same
    object: the gradient caches (checks, multi-tensor table, flat spans) follow."""
    ours, theirs = twins()
    opt = ot.AdamW(ours, lr=0.05)
    ref = torch.optim.AdamW(theirs, lr=0.05)

    def grads(p, q, g):
        if p.grad is None or g.view(-1)[0].item() > 0:
            p.grad = g.clone()          # a new tensor
        else:
            p.grad.data = g.clone()     # the same object, new storage
        q.grad = g.clone()
    train(ours, theirs, opt, ref, lambda ps: None, grads)
    assert_same(ours, theirs)


def test_load_state_dict_after_replacement():
    ours, theirs = twins()
    opt, ref = ot.Adam(ours, lr=0.05), torch.optim.Adam(theirs, lr=0.05)
    for p, q in zip(ours, theirs):
        g = torch.randn(p.shape)
        p.grad, q.grad = g.clone(), g.clone()
    opt.step()
    ref.step()
    saved, saved_ref = copy.deepcopy(opt.state_dict()), copy.deepcopy(ref.state_dict())
    train(ours, theirs, opt, ref, lambda ps: None)
    new_data(ours)
    new_data(theirs)
    opt.load_state_dict(saved)
    ref.load_state_dict(saved_ref)
    train(ours, theirs, opt, ref, lambda ps: None)
    assert_same(ours, theirs)


def test_offloaded_parameters_follow():
    ours, theirs = twins()
    opt = ot.AdamW(ours, lr=0.05, offload="cpu")
    ref = torch.optim.AdamW(theirs, lr=0.05)
    train(ours, theirs, opt, ref, new_data)
    assert_same(ours, theirs)


def test_sparse_adam_follows():
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(10, 3))]
    theirs = [torch.nn.Parameter(ours[0].detach().clone())]
    opt, ref = ot.SparseAdam(ours, lr=0.05), torch.optim.SparseAdam(theirs, lr=0.05)

    def grads(p, q, g):
        idx = torch.tensor([[1, 4, 7]])
        p.grad = torch.sparse_coo_tensor(idx, g[:3], p.shape)
        q.grad = torch.sparse_coo_tensor(idx, g[:3], q.shape)
    train(ours, theirs, opt, ref, lambda ps: setattr(ps[0], "data", torch.full((10, 3), 2.0)),
          grads)
    assert_same(ours, theirs)


def test_mixed_precision_master_follows_new_values():
    """bfloat16 parameters with float32 master copies: new values are stepped from (the
    master is taken again); the same values again (a clone) lose nothing."""
    torch.manual_seed(0)
    ps = [torch.randn(64).to(torch.bfloat16) for _ in range(3)]
    twin = [p.clone() for p in ps]
    opt = optgen.create("adam", ps, lr=1e-3, multi_precision=True)
    ctl = optgen.create("adam", twin, lr=1e-3, multi_precision=True)
    gs = [torch.randn(64).to(torch.bfloat16) for _ in ps]
    for _ in range(3):
        opt.step(gs)
        ctl.step(gs)
    ps[0].data = ps[0].data.clone()                   # same values: master kept
    new = torch.full((64,), 3.0, dtype=torch.bfloat16)
    ps[1].data = new.clone()                          # new values: stepped from
    opt.step(gs)
    ctl.step(gs)
    assert torch.equal(ps[0], twin[0]) and torch.equal(ps[2], twin[2])
    assert torch.equal(opt.state[0]["master"], ctl.state[0]["master"])
    assert (ps[1].float() - 3.0).abs().max() < 0.02   # (not the old values)
    assert (opt.state[1]["master"] - 3.0).abs().max() < 0.01


def _snapshot(opt, ps):
    return [p.detach().clone() for p in ps], \
        [{n: v.clone() for n, v in st.items()} for st in opt._core.state]


@pytest.mark.parametrize("options", [{}, {"multi_tensor": False}, {"flat": True}],
                         ids=["multi_tensor", "per_tensor", "flat"])
@pytest.mark.parametrize("bad, error, match", [
    (lambda ps: torch.randn(3, 5), ValueError, r"parameter 0.*replaced by data of shape "
                                               r"\(3, 5\); its states have shape \(5, 3\)"),
    (lambda ps: torch.randn(5, 3, dtype=torch.float64), TypeError,
     r"parameter 0.*replaced by float64 data.*for float32"),
    (lambda ps: torch.randn(3, 5).t(), ValueError, r"parameter 0.*not C-contiguous"),
    (lambda ps: torch.randn(5, 3), None, None),
], ids=["shape", "dtype", "strides", "same_kind_is_fine"])
def test_data_that_cannot_be_followed_raises_before_anything(options, bad, error, match):
    ours, _ = twins()
    opt = ot.Adam(ours, lr=0.05, **options)
    for p in ours:
        p.grad = torch.randn(p.shape)
    opt.step()
    old = ours[0].data
    ours[0].data = bad(ours)
    before = _snapshot(opt, ours)
    if error is None:
        opt.step()
        return
    with pytest.raises(error, match=match):
        opt.step()
    after = _snapshot(opt, ours)
    for a, b in zip(before[0] + [v for st in before[1] for v in st.values()],
                    after[0] + [v for st in after[1] for v in st.values()]):
        assert torch.equal(a, b)
    ours[0].data = old             # put right: steps again
    opt.step()


def test_data_shared_with_another_parameter_raises():
    ours, _ = twins()
    opt = ot.Adam(ours, lr=0.05)
    for p in ours:
        p.grad = torch.randn(p.shape)
    opt.step()
    ours[3].data = ours[2].data.view(-1)[:12].view(6, 2)
    with pytest.raises(ValueError, match=r"parameter 3.*shares memory with parameter 2"):
        opt.step()


def test_numpy_runtime_is_unchanged_by_the_check():
    """numpy parameters cannot be re-pointed: no watch, and the flat path still fuses."""
    ws = optgen.flatten([np.ones(10, np.float32), np.ones(6, np.float32)])
    gs = optgen.flatten([np.full(10, 0.5, np.float32), np.full(6, 0.5, np.float32)])
    opt = optgen.create("adam", ws, lr=0.1)
    opt.step(gs)
    assert opt._storage.watched == [] and list(opt._current_runs()) == [0]

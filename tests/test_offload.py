"""Offloaded states (optgen/torch/offload.py): ``offload="cpu"`` and the seeds'
``AdamOffload``. Without a GPU the "device" side is torch CPU tensors and the host side
separate buffers, so every copy runs: 50 steps equal the optimizer that keeps its states
beside the parameters, bit for bit; the copies are counted (one gradient to the host and
one parameter back per stepped parameter, never a state); checkpoints resume; bad input
is a typed error that changes nothing."""
import copy

import pytest

torch = pytest.importorskip("torch", reason="offload is a torch drop-in option")
import optgen.torch as ot  # noqa: E402
from helpers import torch_drop_in as _cls, torch_mlp as _model, torch_train as _run  # noqa: E402,E501

CASES = {"Adam": dict(lr=1e-2), "AdamW": dict(lr=1e-2, weight_decay=0.01),
         "SGD": dict(lr=0.05, momentum=0.9), "Lion": dict(lr=1e-3),
         "LAMB": dict(lr=1e-2, weight_decay=0.01), "Adafactor": dict(),
         "LARS": dict(lr=0.1, momentum=0.9)}


def _equal(a, b, what):
    for i, (p, q) in enumerate(zip(a.parameters(), b.parameters())):
        assert torch.equal(p, q), f"{what}: parameter {i} differs"


@pytest.mark.parametrize("name", list(CASES))
def test_offload_equals_states_beside_the_parameters(name):
    kept, moved = _model(), _model()
    a = _cls(name)(kept.parameters(), **CASES[name])
    b = _cls(name)(moved.parameters(), offload="cpu", **CASES[name])
    states = {k: v for i, st in enumerate(b._core.state) for k, v in
              ((f"{i}.{n}", t) for n, t in st.items()) if isinstance(v, torch.Tensor)}
    _run(kept, a, 50)
    _run(moved, b, 50)
    _equal(kept, moved, f"{name} offloaded")
    n = len(list(moved.parameters()))
    assert b._offload.copies == {"grads_to_host": 50 * n, "params_to_device": 50 * n}
    # the states are the host tensors made at construction: never copied, never replaced
    for i, st in enumerate(b._core.state):
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                assert states[f"{i}.{k}"] is v and v.device.type == "cpu"
    for p, h in zip(moved.parameters(), b._core.params):
        assert p.data_ptr() != h.data_ptr() and torch.equal(p, h)


@pytest.mark.parametrize("clip", [None, 1.0])
def test_copies_go_by_bucket(monkeypatch, clip):
    """Small buckets (the MLP's weight and bias per layer, about 100 bytes each): a
    bucket's parameters go back as soon as its last parameter is stepped, before the
    next bucket's kernels start (on CUDA those wait for their own bucket's gradient
    copies only); results equal the optimizer without offload bit for bit. With a
    global-norm clip every gradient is read before any kernel, which changes nothing
    here (CPU copies are synchronous) but the order of the log stays the same."""
    from optgen.torch import offload as torch_offload
    monkeypatch.setattr(torch_offload, "BUCKET_BYTES", 64)
    kept, moved = _model(), _model()
    a = ot.AdamW(kept.parameters(), lr=1e-2, clip_global_norm=clip)
    b = ot.AdamW(moved.parameters(), lr=1e-2, clip_global_norm=clip, offload="cpu")
    _run(kept, a, 5)
    _run(moved, b, 5)
    _equal(kept, moved, "bucketed offload")
    sizes = [p.numel() * 4 for p in moved.parameters()]     # 512, 64, 256, 16 bytes
    assert sizes == [512, 64, 256, 16]
    assert b._offload.log == [("grads", 0), ("grads", 1), ("grads", 2), ("grads", 3),
                              ("ready", 0), ("params", 0), ("ready", 1), ("params", 1),
                              ("ready", 2), ("params", 2), ("ready", 3), ("params", 3)]
    assert b._offload.copies == {"grads_to_host": 20, "params_to_device": 20}


def test_bfloat16_model_with_float32_master_on_the_host():
    kept, moved = _model(torch.bfloat16), _model(torch.bfloat16)
    a = ot.AdamW(kept.parameters(), lr=1e-2, multi_precision=True)
    b = ot.AdamW(moved.parameters(), lr=1e-2, offload="cpu")
    _run(kept, a, 50, dtype=torch.bfloat16)
    _run(moved, b, 50, dtype=torch.bfloat16)
    _equal(kept, moved, "bf16 offloaded vs multi_precision")
    assert all(h.dtype == torch.float32 for h in b._core.params)
    assert not any(torch.equal(h, p.float()) for h, p in zip(b._core.params, moved.parameters())
                   if p.numel() > 4)   # the master keeps what bfloat16 rounds away


def test_parameters_without_gradients_are_not_copied():
    model = _model()
    opt = ot.Adam(model.parameters(), lr=1e-2, offload="cpu")
    model[2].weight.requires_grad_(False)
    before = model[2].weight.detach().clone()
    _run(model, opt, 3)
    assert opt._offload.copies == {"grads_to_host": 9, "params_to_device": 9}
    assert torch.equal(model[2].weight, before)


def test_offloaded_checkpoint_resumes_after_the_model_is_loaded():
    """A trainer's resume: a new model and optimizer, the model's weights loaded, then the
    optimizer's state (which retakes the host copies from the loaded weights)."""
    straight = _model()
    opt = ot.AdamW(straight.parameters(), lr=1e-2, offload="cpu")
    _run(straight, opt, 10)
    saved_model = copy.deepcopy(straight.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())
    _run(straight, opt, 10, seed=2)

    resumed = _model()
    opt2 = ot.AdamW(resumed.parameters(), lr=1e-2, offload="cpu")
    resumed.load_state_dict(saved_model)
    opt2.load_state_dict(saved_opt)
    _run(resumed, opt2, 10, seed=2)
    _equal(straight, resumed, "resumed offloaded run")


def test_adam_offload_has_the_seed_signature():
    a, b = _model(), _model()
    seed = ot.AdamOffload(a.parameters(), learning_rate=0.01, beta1=0.8, beta2=0.99, eps=1e-7,
                          use_locking=True, use_nesterov=True, weight_decay=0.001,
                          loss_scale=4.0)
    plain = ot.seeds.Adam(b.parameters(), lr=0.01, betas=(0.8, 0.99), eps=1e-7, use_nesterov=True,
                          weight_decay=0.001, loss_scale=4.0)
    assert seed._offload is not None and plain._offload is None
    assert ot.AdamOffload is ot.AdamOffload and isinstance(seed, ot.OptgenOptimizer)
    _run(a, seed, 20)
    _run(b, plain, 20)
    _equal(a, b, "AdamOffload vs Adam")
    with pytest.raises(TypeError, match="use_locking must be a bool, got 1"):
        ot.AdamOffload(_model().parameters(), use_locking=1)


@pytest.mark.parametrize("kw,error,message", [
    (dict(offload="gpu"), ValueError, r"adam: offload must be None or one of cpu, got 'gpu'"),
    (dict(offload="cpu", target="cuda"), ValueError,
     r"adam: offload='cpu' steps the states on the host, which needs a host target "
     r"\(llvm, c\), got target='cuda'"),
    (dict(offload="cpu", flat=True), ValueError,
     r"adam: offload with flat is refused: flat=True and offload='cpu' together are not built"),
])
def test_bad_offload_options(kw, error, message):
    with pytest.raises(error, match=message):
        ot.Adam(_model().parameters(), lr=1e-2, **kw)


def test_bad_gradient_changes_nothing():
    """torch itself refuses a .grad of another shape or dtype; what reaches the step is a
    non-finite gradient: with nonfinite="raise" a FloatingPointError, nothing stepped."""
    model = _model()
    opt = ot.Adam(model.parameters(), lr=1e-2, offload="cpu", nonfinite="raise")
    _run(model, opt, 2)
    params = [p.detach().clone() for p in model.parameters()]
    states = [{k: v.clone() for k, v in st.items() if isinstance(v, torch.Tensor)}
              for st in opt._core.state]
    model[0].weight.grad[3, 1] = float("nan")
    with pytest.raises(FloatingPointError, match="adam: gradient"):
        opt.step()
    for p, q in zip(model.parameters(), params):
        assert torch.equal(p, q)
    for st, before in zip(opt._core.state, states):
        assert all(torch.equal(st[k], v) for k, v in before.items())
    assert float(opt.state_dict()["state"][0]["step"]) == 2
    with pytest.raises(TypeError, match="offload needs dense floating-point parameters"):
        ot.Adam([torch.zeros(3, dtype=torch.int32)], offload="cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device in this torch")
def test_offload_from_cuda_parameters():
    kept, moved = _model().cuda(), _model().cuda()
    a = ot.AdamW(kept.parameters(), lr=1e-2, target="cuda")
    b = ot.AdamW(moved.parameters(), lr=1e-2, offload="cpu")
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        x, y = torch.randn(32, 8, generator=g).cuda(), torch.randn(32, 4, generator=g).cuda()
        for m, o in ((kept, a), (moved, b)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()
    assert all(h.is_pinned() and h.device.type == "cpu" for h in b._core.params)
    for p, q in zip(kept.parameters(), moved.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fmt", ["q8", "q4", "bf16", "fp8"])
def test_offloaded_state_formats(fmt):
    """q8, q4 and bf16 states kept on the host: 20 steps equal the same formats beside the
    parameters, bit for bit, and the formatted states never move."""
    kept, moved = _model(), _model()
    kw = dict(lr=1e-2, state_format=fmt, state_format_min_size=0)
    a = ot.seeds.AdamW(kept.parameters(), **kw)
    b = ot.seeds.AdamW(moved.parameters(), offload="cpu", **kw)
    before = {id(v) for st in b._core.state for v in st.values()}
    _run(kept, a, 20)
    _run(moved, b, 20)
    _equal(kept, moved, f"{fmt} offloaded")
    assert {id(v) for st in b._core.state for v in st.values()} == before
    want = torch.uint8 if fmt in ("q8", "q4", "fp8") else torch.bfloat16
    assert b._core.state[0]["m"].dtype == want


@pytest.mark.parametrize("fmt", ["q8", "q4", "fp8"])
def test_flat_groups_with_state_formats(fmt):
    """flat=True (one buffer per group) with q8 or q4 states: the same as per-tensor
    parameters, bit for bit (the kernels step each tensor's own blocks)."""
    kept, moved = _model(), _model()
    kw = dict(lr=1e-2, state_format=fmt, state_format_min_size=0)
    a = ot.AdamW(kept.parameters(), **kw)
    b = ot.AdamW(moved.parameters(), flat=True, **kw)
    _run(kept, a, 20)
    _run(moved, b, 20)
    _equal(kept, moved, f"{fmt} flat")

"""torch tensors (zero-copy through DLPack) and the drop-in torch.optim classes; CUDA
paths run where a GPU is present and skip otherwise."""
import io
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is the interop target of these tests")

import optgen  # noqa: E402
import optgen.torch as ot  # noqa: E402
from optgen.torch import seeds  # noqa: E402


def _pair(rng, shape):
    a = rng.standard_normal(shape).astype(np.float32)
    return a, torch.from_numpy(a.copy())


# -- torch tensors through the runtime ------------------------------------------------
@pytest.mark.parametrize("spec,kw", [("adam", {"lr": 0.01}), ("lamb", {"weight_decay": 0.01}),
                                     ("adafactor", {}), ("sgd", {"momentum": 0.9})])
def test_torch_tensors_step_like_numpy_bit_for_bit(spec, kw, rng):
    shapes = [(17, 9), (1000,), (2, 3, 4)]
    pairs = [_pair(rng, s) for s in shapes]
    on = optgen.create(spec, [a for a, _ in pairs], clip_global_norm=5.0, **kw)
    ot_ = optgen.create(spec, [t for _, t in pairs], clip_global_norm=5.0, **kw)
    for _ in range(5):
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        on.step(grads)
        ot_.step([torch.from_numpy(g.copy()) for g in grads])
    for a, t in pairs:
        assert a.tobytes() == t.numpy().tobytes()
    for sn, st in zip(on.state, ot_.state):
        for k, v in sn.items():
            other = st[k].numpy() if isinstance(st[k], torch.Tensor) else st[k]
            assert np.asarray(v).tobytes() == np.asarray(other).tobytes()
    assert isinstance(ot_.state[0]["m" if spec in ("adam", "lamb") else next(iter(ot_.state[0]))],
                      (torch.Tensor, np.floating))


def test_parameters_that_require_grad_and_reference_backend(rng):
    p = torch.nn.Parameter(torch.randn(50, dtype=torch.float64))
    q = torch.nn.Parameter(p.detach().clone())
    a = optgen.create("adam", [p], lr=0.1)
    b = optgen.create("adam", [q], lr=0.1, backend="reference")
    for _ in range(3):
        g = torch.randn(50, dtype=torch.float64)
        a.step([g])
        b.step([g.clone()])
    assert p.requires_grad
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-12, atol=1e-14)


def test_torch_input_errors(rng):
    p = torch.zeros(6)
    opt = optgen.create("adam", [p])
    snapshot = p.clone()
    cases = [
        ([np.zeros(6, np.float32)], TypeError, r"gradient 0 must be a torch.Tensor like parameter 0, got ndarray"),
        ([torch.zeros(6, dtype=torch.float64)], TypeError, r"gradient 0 has dtype float64, parameter 0 has dtype float32"),
        ([torch.zeros(7)], ValueError, r"gradient 0 has shape \(7,\), parameter 0 has shape \(6,\)"),
        ([torch.zeros(12)[::2]], ValueError, r"gradient 0 is not C-contiguous"),
        ([p], ValueError, r"gradient 0 shares memory with parameter 0"),
        ([torch.zeros(6, device="meta")], TypeError, r"gradient 0 is on meta, parameter 0 is on cpu"),
    ]
    for grads, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            opt.step(grads)
    assert torch.equal(p, snapshot) and opt.t == 0
    with pytest.raises(TypeError, match=r"parameter 0 is on meta, but this optimizer's kernels "
                                        r"are built for llvm \(cpu\)"):
        optgen.create("adam", [torch.zeros(4, device="meta")])
    with pytest.raises(ValueError, match=r"parameter 0 is not C-contiguous"):
        optgen.create("adam", [torch.zeros(4, 4).t()])
    base = torch.zeros(10)
    with pytest.raises(ValueError, match=r"parameters 0 and 1 share memory"):
        optgen.create("adam", [base[:6], base[4:]])


# -- the drop-in classes --------------------------------------------------------------
def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = torch.tanh(x @ torch.randn(8, 1, generator=g)) + 0.1 * torch.randn(256, 1, generator=g)
    return x, y


def _mlp():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def _train(make, steps=60, sched=True):
    x, y = _data()
    model = _mlp()
    opt = make(model.parameters())
    lr_sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps) if sched else None
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if lr_sched:
            lr_sched.step()
        losses.append(loss.item())
    return losses, model, opt


def test_drop_in_adam_with_cosine_annealing_matches_torch():
    ref, _, _ = _train(lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=1e-3))
    mine, _, opt = _train(lambda p: ot.Adam(p, lr=1e-2, weight_decay=1e-3))
    assert isinstance(opt, torch.optim.Optimizer)
    for k, (a, b) in enumerate(zip(ref, mine)):
        assert abs(a - b) <= 1e-5, f"step {k}: torch {a}, optgen {b}"
    assert mine[-1] < 0.5 * mine[0]


@pytest.mark.parametrize("mine,theirs", [
    (lambda p: ot.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True)),
    (lambda p: ot.AdamW(p, lr=1e-2, weight_decay=0.1),
     lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1)),
    (lambda p: seeds.Adagrad(p, lr=0.05, initial_accum=0.1, eps=1e-10),
     lambda p: torch.optim.Adagrad(p, lr=0.05, initial_accumulator_value=0.1, eps=1e-10)),
    (lambda p: ot.NAdam(p, lr=1e-2), lambda p: torch.optim.NAdam(p, lr=1e-2)),
])
def test_drop_in_matches_torch_optimizers(mine, theirs):
    ref, _, _ = _train(theirs, steps=40)
    got, _, _ = _train(mine, steps=40)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_drop_in_torch_save_resume_is_bitwise():
    x, y = _data()

    def run(model, opt, steps):
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    ma = _mlp()
    oa = ot.LAMB(ma.parameters(), lr=1e-2, betas=(0.8, 0.99))
    run(ma, oa, 10)
    mb = _mlp()
    ob = ot.LAMB(mb.parameters(), lr=1e-2, betas=(0.8, 0.99))
    run(mb, ob, 5)
    buf = io.BytesIO()
    torch.save({"model": mb.state_dict(), "opt": ob.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    mc = _mlp()
    mc.load_state_dict(saved["model"])
    oc = ot.LAMB(mc.parameters(), lr=0.5)
    oc.load_state_dict(saved["opt"])
    assert oc.param_groups[0]["betas"] == (0.8, 0.99) and oc.param_groups[0]["lr"] == 1e-2
    run(mc, oc, 5)
    for pa, pc in zip(ma.parameters(), mc.parameters()):
        assert torch.equal(pa, pc)
    sd = oc.state_dict()
    assert set(sd["state"][0]) == {"m", "v", "step"} and float(sd["state"][0]["step"]) == 10.0


def test_drop_in_groups_closure_and_errors():
    model = _mlp()
    first, second = list(model[0].parameters()), list(model[2].parameters())
    opt = seeds.Adam([{"params": first}, {"params": second, "lr": 0.0}], lr=1e-2)
    before = [p.detach().clone() for p in second]
    x, y = _data()

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert math.isfinite(loss.item())
    for p, q in zip(second, before):
        assert torch.equal(p.detach(), q)        # lr 0 in that group
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    extra = torch.nn.Parameter(torch.zeros(3))
    opt.add_param_group({"params": [extra], "lr": 0.1})
    extra.grad = torch.ones(3)
    opt.step()
    assert torch.all(extra < 0)
    bad = opt.state_dict()
    bad["state"][0]["m"] = torch.zeros(2)
    with pytest.raises(ValueError, match=r"state_dict state 0\.m has shape \(2,\)"):
        opt.load_state_dict(bad)
    with pytest.raises(ValueError, match=r"adam: invalid beta1=1\.5"):
        seeds.Adam(model.parameters(), betas=(1.5, 0.9))
    with pytest.raises(TypeError, match=r"adam: unknown hyperparameter 'momentum'"):
        seeds.Adam(model.parameters(), momentum=0.9)
    with pytest.raises(AttributeError, match=r"optimizers: AdaBelief"):
        ot.Adamm


def test_drop_in_lr_scheduler_never_rebuilds():
    from optgen.compiler import pipeline
    _train(lambda p: ot.Adam(p, lr=1e-2), steps=2)
    builds = pipeline.BUILD_COUNT
    _train(lambda p: ot.Adam(p, lr=1e-2), steps=30)
    assert pipeline.BUILD_COUNT == builds


# -- CUDA (GPU machines only) ---------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@cuda
def test_cuda_tensor_on_cpu_kernels_is_a_clear_error():
    p = torch.zeros(8, device="cuda")
    with pytest.raises(TypeError, match=r"parameter 0 is on cuda:0, but this optimizer's "
                                        r"kernels are built for llvm \(cpu\)"):
        optgen.create("adam", [p])


@pytest.mark.gpu
@cuda
def test_cupy_array_on_cpu_kernels_is_a_clear_error():
    cupy = pytest.importorskip("cupy", reason="needs CuPy")
    with pytest.raises(TypeError, match=r"parameter 0 is on cuda:0, but this optimizer's"):
        optgen.create("adam", [cupy.zeros(8, dtype=cupy.float32)])


# -- torch imported after the kernels ---------------------------------------------------
TORCH_LATER = r"""
import sys
import numpy as np
import optgen
w = np.ones(1000, np.float32)
opt = optgen.create("adam", [w], lr=0.01)
opt.step([np.full(1000, 0.5, np.float32)])          # tvm_ffi loaded: the runtime ...
from optgen.compiler import tvm_backend
tvm_backend.host_cpu()                              # ... and TVM imported, ...
assert "torch" not in sys.modules, "optgen imported torch"   # ... without torch
import torch
import optgen.torch as ot
p = torch.nn.Parameter(torch.linspace(-1, 1, 1000)); p.grad = torch.linspace(2, -3, 1000)
q = torch.nn.Parameter(p.detach().clone()); q.grad = p.grad.clone()
mine, ref = ot.Adam([p], lr=0.01), torch.optim.Adam([q], lr=0.01)
for _ in range(3):
    mine.step(); ref.step()
assert torch.allclose(p, q, rtol=1e-5, atol=1e-5), (p - q).abs().max()   # lr 0.01 steps
print("ok")
"""


def test_torch_imported_after_tvm_still_steps(tmp_path):
    """optgen hides torch from tvm_ffi's and TVM's imports when the process has not
    imported it (runtime.artifact.torch_hidden, 1.5-2 s saved); torch tensors of a torch
    imported afterwards still go through DLPack into the kernels."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, OPTGEN_CACHE_DIR=os.environ.get("OPTGEN_CACHE_DIR",
                                                           str(tmp_path)))
    p = subprocess.run([sys.executable, "-c", TORCH_LATER], capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-2000:]

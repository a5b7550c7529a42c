"""State formats and torch.compile on a real GPU (CUDA): bf16, bf16sr, q8 and q4 states
for every elementwise catalog spec, bfloat16 parameters without a float32 master, and
the torch drop-ins' compiled step on CUDA tensors.

These run only where CuPy and torch see an NVIDIA GPU (skipped, with the reason,
everywhere else: CI has none). The compiled CUDA kernels step torch CUDA tensors; the
reference interpreter steps numpy copies of the same data.

* bf16 / bf16sr: three steps, then states within one bfloat16 rounding of the
  interpreter's (2**-7 relative; bf16sr: at least 99 % of the bits equal, since the
  stochastic rounding draws from the same counter-based stream on both sides, and a
  fused multiply-add can move the float32 value under it by one ulp);
* q8 / q4: one step at a time from the same state (the reference's states are copied in
  after each step), codes within one code and at most 1 % of them different, absmax to
  1e-5, as tests/test_state_formats_cuda.py does for its sampled rows.

A spec whose rule a format cannot store (a reduction for q8/q4, say) is refused at build
time with a typed error on every target: those rows skip with the CPU build's error text.
A format the CPU builds and cuda refuses is a failure.
"""
import itertools
import shutil

import numpy as np
import pytest

import optgen
from optgen.core import catalog
from optgen.runtime import tensors
from helpers import assert_close, busy_hypers, cupy_gpu_count, matrix_specs, valid

torch = pytest.importorskip("torch", reason="the GPU format tests step torch CUDA tensors")
cp = pytest.importorskip("cupy", reason="the CUDA tests need CuPy (pip install 'optgen[cuda]')")


def _gpu_count() -> int:
    return cupy_gpu_count(cp)


GPU = _gpu_count() > 0 and torch.cuda.is_available()
pytestmark = [
    pytest.mark.skipif(not GPU, reason="needs an NVIDIA GPU seen by CuPy and torch"),
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="building for cuda needs nvcc"),
]

SHAPES = [(0,), (1,), (255,), (256,), (257,), (1_000_003,), (33, 31)]
FORMATS = ["bf16", "bf16sr", "q8", "q4"]
BF16 = tensors.numpy_dtype("bfloat16")


def _elementwise() -> list[str]:
    return sorted(set(catalog.list_specs()) - matrix_specs()) if GPU else []


def _artifact(name: str, fmt: str, target: str):
    sr = fmt == "bf16sr"
    base = "adam" if name == "lars" else None
    return optgen.get_artifact(name, target, base=base, state_format="bf16" if sr else fmt,
                               stochastic_rounding=sr)


def _host(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        if t.dtype == torch.bfloat16:
            return t.detach().view(torch.int16).cpu().numpy().view(BF16)
        return t.detach().cpu().numpy()
    return cp.asnumpy(t) if isinstance(t, cp.ndarray) else np.asarray(t)


def _device(a: np.ndarray):
    a = np.asarray(a)
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).cuda()
    return torch.from_numpy(a.copy()).cuda()


def _first_valid(art):
    names = list(art.flags)
    for bits in itertools.product([False, True], repeat=len(names)):
        flags = dict(zip(names, bits))
        hyper = busy_hypers(art, flags)
        if valid(art, hyper):
            return flags, hyper
    pytest.fail(f"{art.name}: no valid flag combination")


def _pair(name, fmt, pdt, master, rng):
    try:
        gpu = cpu = _artifact(name, fmt, "cuda")   # (the reference runs from it on the host)
    except (optgen.BuildError, TypeError, ValueError) as e:
        try:     # (the CPU build says whether the rule has this format at all)
            _artifact(name, fmt, "llvm")
        except (optgen.BuildError, TypeError, ValueError):
            pytest.skip(f"{name} has no {fmt} kernels on any target: {type(e).__name__}: "
                        f"{str(e)[:300]}")
        raise    # the CPU has them: cuda must build them too
    flags, hyper = _first_valid(gpu)
    sr = fmt == "bf16sr"
    kw = dict(state_format="bf16" if sr else fmt, stochastic_rounding=sr, seed=7,
              state_format_min_size=0, multi_precision=master and pdt != "float32", **hyper)
    ws = [rng.standard_normal(s).astype(np.float32).astype(pdt) for s in SHAPES]
    try:     # (a combination the runtime refuses on the CPU too is no CUDA case)
        ref = optgen.create(cpu, [w.copy() for w in ws], backend="reference", **kw)
    except (TypeError, ValueError) as e:
        pytest.skip(f"{name}: {fmt} with {pdt} parameters is refused on every target: "
                    f"{type(e).__name__}: {str(e)[:300]}")
    opt = optgen.create(gpu, [_device(w) for w in ws], **kw)
    return opt, ref, flags


def _compare_weight(mine, want, fmt, label):
    """float32 weights stepped from bfloat16 states: to float32 round-off, but for the
    few elements whose state the GPU's fused multiply-adds put one bfloat16 rounding
    apart from the interpreter's (measured on an H200: at most 11 of 10**6 after three
    steps, FTRL's the largest, 1.4e-2 where its z sits near the l1 threshold); q8/q4
    (restarted from the reference's state each step) and fp32 states: round-off."""
    if fmt not in ("bf16", "bf16sr"):
        assert_close(mine, want, "float32", label)
        return
    scale = float(np.abs(want).max(initial=0))
    off = ~np.isclose(mine, want, rtol=1e-5, atol=1e-5 * scale)
    assert np.count_nonzero(off) <= max(1, 2e-5 * off.size), \
        f"{label}: {np.count_nonzero(off)} of {off.size} elements differ"
    assert (np.abs(mine - want)[off] <= 2e-2 * scale).all(), f"{label}: beyond 2e-2 max|w|"


def _compare_float_state(mine, want, label, sr):
    if want.dtype == BF16:
        assert mine.dtype == BF16, f"{label} is {mine.dtype}, not bfloat16"
        if sr:
            same = mine.view(np.uint16) == want.view(np.uint16)
            assert same.size == 0 or np.mean(same) > 0.99, f"{label}: {np.mean(same)} bits equal"
        # within one bfloat16 rounding (stochastic: two, when two float32 values a
        # round-off apart straddle a bfloat16 value), but for the few elements whose
        # float32 value the GPU's fused multiply-adds moved across a rounding boundary
        # in an earlier step (on an H200: at most 3 of 10**6 after three steps, 7 %
        # apart in FTRL's z, whose weight is ill-conditioned near the l1 threshold)
        a, b = mine.astype(np.float32), want.astype(np.float32)
        off = ~np.isclose(a, b, rtol=2 ** -6 if sr else 2 ** -7, atol=1e-30)
        assert np.count_nonzero(off) <= max(1, 1e-5 * off.size), \
            f"{label}: {np.count_nonzero(off)} of {off.size} beyond one bfloat16 rounding"
        np.testing.assert_allclose(a[off], b[off], rtol=2 ** -3, atol=1e-30, err_msg=label)
    else:
        assert_close(mine, want, str(want.dtype), label)


def _compare_codes(mine, want, fmt, label):
    assert mine.dtype == np.uint8, f"{label} is {mine.dtype}, not codes"
    assert mine.shape == want.shape, f"{label}: {mine.shape} vs {want.shape}"
    a, b = mine.astype(np.int16), want.astype(np.int16)
    diff = np.abs(a - b) if fmt == "q8" else \
        np.maximum(np.abs(a // 16 - b // 16), np.abs(a % 16 - b % 16))
    assert diff.max(initial=0) <= 1, f"{label}: codes differ by {diff.max()}"
    assert np.count_nonzero(diff) <= max(1, 0.01 * diff.size), \
        f"{label}: {np.count_nonzero(diff)} of {diff.size} codes differ"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", _elementwise())
def test_cuda_formatted_states_match_reference(name, fmt, rng):
    opt, ref, flags = _pair(name, fmt, "float32", True, rng)
    quantized = fmt in ("q8", "q4")
    for step in range(3):
        gs = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
        ins = {n: [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
               for n in opt.artifact.inputs}          # (SVRG's full and snapshot gradients)
        opt.step([_device(g) for g in gs], **{n: [_device(a) for a in v] for n, v in ins.items()})
        ref.step(gs, **ins)
        torch.cuda.synchronize()
        if not quantized and step < 2:
            continue
        for i, shape in enumerate(SHAPES):
            what = f"{name} {fmt} {flags} step {step} shape {shape}"
            _compare_weight(_host(opt.params[i]), ref.params[i], fmt, f"{what} w")
            for s, want in ref.state[i].items():
                if isinstance(want, np.floating):
                    assert float(opt.state[i][s]) == pytest.approx(float(want)), what + s
                    continue
                mine = _host(opt.state[i][s])
                if s.endswith("__absmax"):
                    np.testing.assert_allclose(mine, want, rtol=1e-5, atol=0, err_msg=what + s)
                elif want.dtype == np.uint8:
                    _compare_codes(mine, want, fmt, f"{what} {s}")
                else:
                    _compare_float_state(mine, np.asarray(want), f"{what} {s}", fmt == "bf16sr")
            if quantized:   # the next step starts from the reference's state
                tensors.copy_into(opt.params[i], "torch", ref.params[i])
                for s, want in ref.state[i].items():
                    if not isinstance(want, np.floating):
                        tensors.copy_into(opt.state[i][s], "torch", want)


@pytest.mark.parametrize("fmt", ["bf16", "bf16sr"])
@pytest.mark.parametrize("name", ["adam", "adamw", "lion", "sgd", "lamb"] if GPU else [])
def test_cuda_bfloat16_parameters_without_master(name, fmt, rng):
    """bfloat16 parameters stepped in place with no float32 master: the parameter is
    rounded (to nearest, or stochastically for bf16sr) like the states."""
    opt, ref, flags = _pair(name, fmt, "bfloat16", False, rng)
    for _ in range(3):
        gs = [rng.standard_normal(s).astype(np.float32).astype(BF16) for s in SHAPES]
        opt.step([_device(g) for g in gs])
        ref.step(gs)
    torch.cuda.synchronize()
    for i, shape in enumerate(SHAPES):
        label = f"{name} {fmt} {flags} w {shape}"
        _compare_float_state(_host(opt.params[i]), np.asarray(ref.params[i]), label,
                             fmt == "bf16sr")


# -- split masters: bfloat16 weights and a 16- or 8-bit correction -----------------------
SPLIT_QMIX = {"m": "q8@128", "v": "q4"}
SPLIT_CASES = [(spec, kw, master, fmt) for spec, kw, fmt in [
    ("adamw", {}, None), ("adam", {}, SPLIT_QMIX), ("lion", {}, "fp8"),
    ("sgd", {"momentum": 0.9}, None), ("lamb", {}, None), ("adamw", {}, "q8")]
    for master in ("split16", "split8")]


@pytest.mark.parametrize("spec,kw,master,fmt", SPLIT_CASES if GPU else [],
                         ids=lambda v: str(v) if not isinstance(v, dict) else
                         ".".join(f"{k}-{x}" for k, x in v.items()) or "default")
def test_cuda_split_master_matches_reference(spec, kw, master, fmt, rng):
    """bfloat16 torch CUDA weights with a split master (the kernel decodes the float32
    master from the weight and its correction, steps, encodes both): three steps against
    the reference on host copies, compared as tests/test_split_master.py does on the
    CPU (masters to float32 round-off, weights within one bfloat16 step)."""
    from test_split_master import assert_matches_reference
    shapes = [(0,), (1,), (255,), (256,), (257,), (4097,), (33, 31)]
    host = [(rng.standard_normal(s) * 0.5).astype(np.float32).astype(BF16) for s in shapes]
    common = dict(lr=1e-2, master_format=master, state_format=fmt, state_format_min_size=0,
                  **kw)
    gpu = optgen.get_artifact(spec, "cuda", state_format=fmt, master_format=master)
    got = optgen.create(gpu, [_device(w) for w in host], **common)
    want = optgen.create(gpu, [w.copy() for w in host], backend="reference", **common)
    for _ in range(3):
        grads = [rng.standard_normal(s).astype(np.float32).astype(BF16) for s in shapes]
        got.step([_device(g) for g in grads])
        want.step(grads)
    torch.cuda.synchronize()
    states = [{n: (v if isinstance(v, (np.ndarray, np.generic, float, int)) else _host(v))
               for n, v in st.items()} for st in got.state]
    assert_matches_reference(spec, master, fmt, [_host(p) for p in got.params], states,
                             want.params, want.state)


# -- torch.compile on CUDA tensors -------------------------------------------------------
def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                               torch.nn.Linear(256, 8)).cuda()


@pytest.mark.parametrize("cls", ["AdamW", "seeds.LAMB", "seeds.Lion"] if GPU else [])
def test_cuda_compiled_train_step_equals_eager(cls):
    """forward, backward, ``opt.step()`` and ``zero_grad`` in one ``fullgraph=True``
    graph on CUDA tensors (the ``optgen::step`` custom op), 30 steps with lr, betas and
    weight decay changed by hand every step: no recompile, equal to the eager run."""
    import optgen.torch as ot
    from torch._dynamo.testing import CompileCounterWithBackend
    make = getattr(ot.seeds, cls.split(".")[1]) if cls.startswith("seeds.") else getattr(ot, cls)
    models = [_mlp(), _mlp()]
    opts = [make(m.parameters(), lr=1e-3) for m in models]

    def train_step(m, o, x, y):
        torch.nn.functional.mse_loss(m(x), y).backward()
        o.step()
        o.zero_grad()

    counter = CompileCounterWithBackend("aot_eager")
    g = torch.Generator(device="cuda").manual_seed(1)
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        compiled = torch.compile(train_step, backend=counter, fullgraph=True)
        for i in range(30):
            x = torch.randn(32, 64, device="cuda", generator=g)
            y = torch.randn(32, 8, device="cuda", generator=g)
            for o in opts:
                o.param_groups[0]["lr"] = 1e-3 / (1 + i)
                if "betas" in o.param_groups[0]:
                    o.param_groups[0]["betas"] = (0.9 - 0.01 * i / 30, 0.999)
            compiled(models[0], opts[0], x, y)
            train_step(models[1], opts[1], x, y)
    torch._dynamo.reset()
    assert counter.frame_count == 1, f"{cls}: {counter.frame_count} compiles (recompiled)"
    for i, (p, q) in enumerate(zip(*(m.parameters() for m in models))):
        assert p.device.type == "cuda"
        np.testing.assert_allclose(p.detach().cpu().numpy(), q.detach().cpu().numpy(),
                                   rtol=1e-5, atol=1e-6, err_msg=f"{cls}: parameter {i}")
    assert any((p != q).any() for p, q in zip(models[0].parameters(), _mlp().parameters()))


# -- the step inside backward on CUDA tensors ----------------------------------------------
@pytest.mark.parametrize("options", [{}, {"state_format": "q8"}] if GPU else [],
                         ids=["fp32", "q8"])
def test_cuda_step_in_backward_equals_the_ordinary_step(options):
    """``step_in_backward=True`` on CUDA tensors (each parameter stepped by its gradient
    hook, on torch's stream) equals ``backward(); step(); zero_grad()`` over 20 steps."""
    import optgen.torch as ot
    models = [_mlp(), _mlp()]
    opts = [ot.AdamW(models[0].parameters(), lr=1e-2, weight_decay=0.01, **options),
            ot.AdamW(models[1].parameters(), lr=1e-2, weight_decay=0.01,
                     step_in_backward=True, **options)]
    g = torch.Generator(device="cuda").manual_seed(3)
    for _ in range(20):
        x = torch.randn(32, 64, device="cuda", generator=g)
        y = torch.randn(32, 8, device="cuda", generator=g)
        torch.nn.functional.mse_loss(models[0](x), y).backward()
        opts[0].step()
        opts[0].zero_grad()
        torch.nn.functional.mse_loss(models[1](x), y).backward()
        assert all(p.grad is None for p in models[1].parameters())   # released in the hooks
    torch.cuda.synchronize()
    for p, q in zip(*(m.parameters() for m in models)):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-6)

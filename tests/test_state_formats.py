"""State formats (runtime/formats.py, docs/state-formats.md): bfloat16 states compiled
into the kernels.

* compiled == reference interpreter for the rules of the issue's list plus LAMB
  (reductions, several passes) and Adafactor (row/column states beside its own float16
  ones), over shapes 0, 1, 15, 16, 17, 4095, 4096, 4097 and a prime, float32 parameters
  and bfloat16 ones under multi_precision, every flag combination;
* an independent oracle written here from the published rules (Adam: Kingma & Ba with
  MXNet's folded bias correction; SGD with momentum; Lion: Chen et al. 2023), with each
  state rounded to bfloat16 (nearest even, ml_dtypes) after every update;
* the size threshold, memory, flat runs, checkpoints (bit-exact resume, converting
  between formats with a warning), the torch drop-ins, the digits example's accuracy,
  CUDA source, and typed errors that change nothing.
"""
import itertools
import warnings

import ml_dtypes
import numpy as np
import pytest

import optgen
from helpers import assert_close, busy_hypers, valid

BF16 = np.dtype(ml_dtypes.bfloat16)
SPECS = ["adam", "adamw", "lion", "sgd", "adagrad", "rmsprop", "adabelief", "lamb", "adafactor"]
SHAPES = [(0,), (1,), (15,), (16,), (17,), (4095,), (4096,), (4097,), (1009,), (33, 31)]


def _art(name):
    return optgen.get_artifact(name, state_format="bf16")


def _flag_sets(art):
    names = list(art.flags)
    for bits in itertools.product([False, True], repeat=len(names)):
        yield dict(zip(names, bits))


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint16) if a.dtype == BF16 else a


@pytest.mark.parametrize("name", SPECS)
def test_bf16_states_compiled_match_reference(name, rng):
    """Every flag combination, every shape, float32 and mixed-precision bfloat16
    parameters: states stored as bfloat16 wherever the kernel dtype held them, and the
    compiled step equal to the interpreter's (states to one bfloat16 rounding)."""
    art = _art(name)
    assert art.state_format and set(art.state_format.values()) == {"bf16"}
    ran = 0
    for flags, pdt in itertools.product(_flag_sets(art), ["float32", "bfloat16"]):
        hyper = busy_hypers(art, flags)
        if not valid(art, hyper):
            continue
        params = [rng.standard_normal(s).astype(np.float32).astype(pdt) for s in SHAPES]
        grads = [[rng.standard_normal(s).astype(np.float32).astype(pdt) for s in SHAPES]
                 for _ in range(3)]
        opts = [optgen.create(art, [p.copy() for p in params], backend=b, state_format="bf16",
                              state_format_min_size=0, multi_precision=pdt == "bfloat16",
                              **hyper) for b in ("compiled", "reference")]
        for gs in grads:
            for o in opts:
                o.step([g.copy() for g in gs])
        label = f"{name} {pdt} flags {flags}"
        for i, s in enumerate(SHAPES):
            for n, v in opts[1].state[i].items():
                mine = opts[0].state[i][n]
                if n == "master" or isinstance(v, np.floating):
                    continue
                want = "float16" if art.kernel_for(pdt, {**flags, **_fixed(opts[0], i)}, True) \
                    .storage.get(n) == "float16" else "bfloat16"
                assert mine.dtype.name == want, f"{label}: state {n} of {s} is {mine.dtype}"
                np.testing.assert_allclose(np.asarray(mine, np.float32),
                                           np.asarray(v, np.float32), rtol=2 ** -7,
                                           atol=1e-30, err_msg=f"{label}: {n} {s}")
            assert_close(np.asarray(opts[0].params[i], np.float32),
                         np.asarray(opts[1].params[i], np.float32), "float32",
                         f"{label}: w {s}")
        ran += 1
    assert ran


def _fixed(opt, i):
    return opt._flags_fixed[i]


def _round(x):
    """float32 -> bfloat16, nearest even (the format's rounding), back as float32."""
    return np.asarray(x, np.float32).astype(BF16).astype(np.float32)


def _oracle(name, w, grads, lr, h):
    """The published rules, float32 arithmetic, states rounded to bfloat16 on store."""
    w = w.astype(np.float32).copy()
    f = np.float32
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        if name == "adam":          # Kingma & Ba; MXNet folds the bias correction into lr
            m = _round(f(h["beta1"]) * m + f(1 - h["beta1"]) * g)
            v = _round(f(h["beta2"]) * v + f(1 - h["beta2"]) * g * g)
            lr_t = f(lr * np.sqrt(1 - h["beta2"] ** t) / (1 - h["beta1"] ** t))
            w = w - lr_t * m / (np.sqrt(v) + f(h["eps"]))
        elif name == "sgd":         # heavy ball: mom = momentum * mom + g (torch form)
            m = _round(g if t == 1 else f(h["momentum"]) * m + g)
            w = w - f(lr) * m
        else:                       # Lion: sign of the interpolation, then the moment
            c = f(h["beta1"]) * m + f(1 - h["beta1"]) * g
            w = w - f(lr) * np.sign(c)
            m = _round(f(h["beta2"]) * m + f(1 - h["beta2"]) * g)
    return w, m, v


@pytest.mark.parametrize("name,hyper", [
    ("adam", {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8}),
    ("sgd", {"momentum": 0.9}),
    ("lion", {"beta1": 0.9, "beta2": 0.99}),
])
def test_bf16_states_match_the_published_rule(name, hyper, rng):
    """100 steps on 4097 elements (one past the threshold's 4096): the kernel's states
    equal the oracle's bfloat16 values (a last-bit difference of the float32 value before
    rounding, e.g. a fused multiply-add, may move a few of them by one bfloat16 step)."""
    n, lr = 4097, 1e-3
    w0 = rng.standard_normal(n).astype(np.float32)
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(100)]
    opt = optgen.create(_art(name), [w0.copy()], lr=lr, state_format="bf16", **hyper)
    for g in grads:
        opt.step([g.copy()])
    w, m, v = _oracle(name, w0, grads, lr, hyper)
    st = opt.state[0]
    first = "momentum_buffer" if name == "sgd" else "m"
    got = np.asarray(st[first], np.float32)
    assert st[first].dtype == BF16
    assert np.mean(got == m) > 0.999, f"{name}: {np.mean(got != m):.2e} of m differ"
    np.testing.assert_allclose(got, m, rtol=2 ** -7, atol=1e-30)
    if name == "adam":
        assert np.mean(np.asarray(st["v"], np.float32) == v) > 0.999
    # (a state one bfloat16 step apart moves w by up to lr * 2**-8 * |m| a step after)
    np.testing.assert_allclose(opt.params[0], w, rtol=1e-3, atol=1e-3)


def test_threshold_memory_and_default_states(rng):
    """Tensors below state_format_min_size keep float32 states; the others hold 2 bytes
    per state element; the same tensors without a format hold 4."""
    big, small = np.zeros(5000, np.float32), np.zeros(4095, np.float32)
    opt = optgen.create("adam", [big, small], state_format="bf16")
    assert {n: a.dtype for n, a in opt.state[0].items()} == {"m": BF16, "v": BF16}
    assert {n: a.dtype.name for n, a in opt.state[1].items()} == {"m": "float32", "v": "float32"}
    assert sum(a.nbytes for a in opt.state[0].values()) == 2 * 2 * 5000
    per = optgen.create("adam", [big], state_format={"v": "bf16"})
    assert per.state[0]["m"].dtype.name == "float32" and per.state[0]["v"].dtype == BF16
    plain = optgen.create("adam", [big])
    assert all(a.dtype.name == "float32" for a in plain.state[0].values())


@pytest.mark.parametrize("name", ["adam", "lamb"])
def test_flat_runs_match_per_tensor(name, rng):
    """Parameters back to back in one buffer (optgen.flatten; LAMB's segmented passes)
    step exactly as the same tensors apart."""
    sizes = [5000, 4096, 7000]
    ws = [rng.standard_normal(s).astype(np.float32) for s in sizes]
    gs = [[rng.standard_normal(s).astype(np.float32) for s in sizes] for _ in range(3)]
    flat = optgen.flatten([w.copy() for w in ws])
    apart = [w.copy() for w in ws]
    a = optgen.create(name, flat, state_format="bf16")
    b = optgen.create(name, apart, state_format="bf16")
    for g in gs:
        a.step(optgen.flatten([x.copy() for x in g]))
        b.step([x.copy() for x in g])
    for i in range(len(sizes)):
        np.testing.assert_array_equal(a.params[i], b.params[i])
        for n in b.state[i]:
            np.testing.assert_array_equal(_bits(a.state[i][n]), _bits(b.state[i][n]))


def test_checkpoint_resume_is_bit_exact_and_formats_convert(tmp_path, rng):
    w = rng.standard_normal(6000).astype(np.float32)
    gs = [rng.standard_normal(6000).astype(np.float32) for _ in range(6)]
    a = optgen.create("adam", [w.copy()], state_format="bf16")
    for g in gs[:3]:
        a.step([g])
    a.save(tmp_path / "ck.npz")
    b = optgen.create("adam", [a.params[0].copy()], state_format="bf16")
    b.load(tmp_path / "ck.npz")
    for g in gs[3:]:
        a.step([g])
        b.step([g])
    np.testing.assert_array_equal(a.params[0], b.params[0])
    assert np.array_equal(_bits(a.state[0]["m"]), _bits(b.state[0]["m"]))
    # full precision -> bf16 rounds (nearest even), bf16 -> full precision widens exactly
    full = optgen.create("adam", [w.copy()])
    full.step([gs[0]])
    into = optgen.create("adam", [w.copy()], state_format="bf16")
    with pytest.warns(UserWarning, match="float32 -> bfloat16"):
        into.load_state_dict(full.state_dict())
    np.testing.assert_array_equal(_bits(into.state[0]["m"]),
                                  _bits(full.state[0]["m"].astype(BF16)))
    back = optgen.create("adam", [w.copy()])
    with pytest.warns(UserWarning, match="bfloat16 -> float32"):
        back.load_state_dict(into.state_dict())
    np.testing.assert_array_equal(back.state[0]["v"], into.state[0]["v"].astype(np.float32))


@pytest.mark.parametrize("bad,error,match", [
    ("q8", ValueError, "not built in this version"),
    ("int7", ValueError, "must be one of 'default', 'bf16'"),
    ({"m": "bf16", "nope": "bf16"}, ValueError, "does not have"),
    ({}, TypeError, "non-empty dict"),
    (3, TypeError, "format name"),
])
def test_bad_formats_are_typed_errors(bad, error, match):
    w = np.ones(5000, np.float32)
    with pytest.raises(error, match=match):
        optgen.create("adam", [w], state_format=bad)
    assert np.all(w == 1)


def test_bad_parameters_for_a_format_change_nothing():
    art = _art("adam")
    w64 = np.ones(5000, np.float64)
    with pytest.raises(TypeError, match="compute in float32.*not float64"):
        optgen.create(art, [w64], state_format="bf16")
    optgen.create(art, [np.ones(100, np.float64)], state_format="bf16")  # below: float64 ok
    with pytest.raises(ValueError, match="state_format_min_size must be an int"):
        optgen.create(art, [np.ones(5000, np.float32)], state_format="bf16",
                      state_format_min_size=-1)
    plain = optgen.get_artifact("adam")
    with pytest.raises(ValueError, match="needs an artifact built with it"):
        optgen.create(plain, [np.ones(5000, np.float32)], state_format="bf16")
    w = np.ones(5000, np.float32)
    with pytest.raises(ValueError, match="'buffer_started', a scalar state"):
        optgen.create("sgd", [w], state_format={"buffer_started": "bf16"})   # (host float64)
    with pytest.raises(optgen.BuildError, match="cannot store"):
        optgen.build("adam", "webgpu", state_format="bf16")
    assert np.all(w == 1)


def test_torch_drop_in_states_are_bf16():
    torch = pytest.importorskip("torch")
    from helpers import torch_mlp, torch_train
    import optgen.torch as ot
    model = torch_mlp()
    opt = ot.AdamW(model.parameters(), lr=1e-2, state_format="bf16", state_format_min_size=0)
    ref = torch_mlp()
    ref_opt = ot.AdamW(ref.parameters(), lr=1e-2)
    torch_train(model, opt, 30)
    torch_train(ref, ref_opt, 30)
    states = [s for p in model.parameters() for s in opt.state[p].values()
              if torch.is_tensor(s) and s.ndim > 0]
    assert states and all(s.dtype == torch.bfloat16 for s in states)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=0.05, atol=2e-3)
    sd = opt.state_dict()
    again = torch_mlp()
    opt2 = ot.AdamW(again.parameters(), lr=1e-2, state_format="bf16", state_format_min_size=0)
    opt2.load_state_dict(sd)
    assert all(s.dtype == torch.bfloat16 for p in again.parameters()
               for s in opt2.state[p].values() if torch.is_tensor(s) and s.ndim > 0)


def test_digits_accuracy_with_bf16_states():
    """examples/train_digits.py: bfloat16 states within 0.5 points of float32 states."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "examples", "train_digits.py")
    spec = importlib.util.spec_from_file_location("train_digits_formats", path)
    digits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(digits)
    data = digits.load_data(0)
    init = digits.init_params(data[0].shape[1], digits.HIDDEN, 10, 0)
    for name in ("adam", "lion"):
        full = digits.train(name, init, data, 10, 32, 0)["test_accuracy"]
        low = digits.train(name, init, data, 10, 32, 0, state_format="bf16")["test_accuracy"]
        assert abs(low - full) <= 0.005 + 1e-9, f"{name}: {low:.4f} vs {full:.4f}"


def test_cuda_source_stores_bf16_states(tmp_path):
    """The CUDA build (source; nvcc compiles it where installed) has the format kernels."""
    import shutil
    from optgen.compiler.pipeline import build
    from optgen.runtime import catalog
    archs = "sm_80" if shutil.which("nvcc") else None
    if archs is None:
        pytest.skip("nvcc is not installed: the CUDA source is not compiled here")
    r = build(catalog.resolve("adam"), "cuda", out=str(tmp_path), arch=archs,
              state_format="bf16")
    art = optgen.Artifact.load(r.path)
    ks = [k for k in art.kernels if k.state_format]
    assert ks and all(k.storage["m"] == "bfloat16" for k in ks)
    assert art.manifest["binaries"], "nvcc produced no binary"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        src = open(f"{r.path}/kernels.cu", encoding="utf-8").read()
    assert "adam_f32_sf_m_bf16_v_bf16" in src

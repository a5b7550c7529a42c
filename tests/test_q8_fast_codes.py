"""The CPU kernel's q8 codes without tables (optgen/core/quant.py fast_codes, used by
templates/kernel_llvm_q8.py.j2 for full blocks) are exactly those of the numpy quantizer.

* fast_codes (numpy, the kernel's arithmetic) against codes_of: where it is sure, equal,
  for float32 values around every midpoint, between decades and at 0 and 1, both signs,
  with and without a fused multiply-add; every 61st float32 in [-1, 1] (every one:
  ``python tests/test_q8_fast_codes.py``, a few minutes);
* through the compiled adam kernel (beta1 = beta2 = 0: its new m is the gradient and its
  new v the gradient squared, in float32): codes and absmax equal to quant.quantize of
  the same values, for values at and around every midpoint of both maps (v: the square
  roots of its values, with the "usqrt" map's rule that a positive value never codes as
  0), in blocks
  with absmax 1 and 3, on the parallel and the serial path;
* decoding: every code of the maps through the compiled kernels (SGD with momentum 1
  and lr 1 from w = 0 with zero gradients writes w = -map[code]; adam with zero
  gradients and beta1 = beta2 = 0.5 halves m and v, so a block holding one code has the
  absmax 0.5 * |map[code]|).
"""

import numpy as np
import pytest

import optgen
from optgen.core import quant

F32 = np.float32
KINDS = ["signed", "usqrt"]     # (the maps kernels code with; "unsigned" is only decoded)


def _around(values: np.ndarray, ulps: int) -> np.ndarray:
    """Every float32 within ``ulps`` steps of each value (both signs), clipped to [-1, 1]."""
    bits = np.abs(np.asarray(values, F32)).view(np.uint32).astype(np.int64)
    steps = np.arange(-ulps, ulps + 1)
    near = (bits[:, None] + steps[None, :]).reshape(-1)
    near = near[(near >= 0) & (near <= F32(1).view(np.uint32))].astype(np.uint32).view(F32)
    return np.unique(np.concatenate([near, -near]))


def _special(kind: str) -> np.ndarray:
    c = quant.fast_constants(kind)
    return np.concatenate([quant.midpoints(kind)[:-1], quant.dynamic_map(kind),
                           c["bounds"], [F32(0), F32(1)]]).astype(F32)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_fast_codes_equal_codes_of_where_sure(kind, fused, rng):
    """Around every midpoint, map value and decade bound (64 float32 steps each way,
    both signs) and over a million random values (uniform, and log-uniform magnitudes
    from 1e-9): sure codes equal codes_of, and few values are unsure."""
    near = _around(_special(kind), 64)
    mags = 10.0 ** rng.uniform(-9, 0, 500_000)
    rand = np.concatenate([rng.uniform(-1, 1, 500_000), mags, -mags]).astype(F32)
    for x in (near, rand):
        code, sure = quant.fast_codes(x, kind, fused)
        want = quant.codes_of(x, kind)
        wrong = np.nonzero(sure & (code != want))[0]
        assert wrong.size == 0, (kind, fused, x[wrong[:5]], code[wrong[:5]], want[wrong[:5]])
    unsure = np.mean(~quant.fast_codes(rand, kind, fused)[1])
    assert unsure < 1e-4, unsure     # the kernel rarely needs its tables


def _window_codes(x: np.ndarray, kind: str, steps: int) -> np.ndarray:
    """codes_of of every float32 within ``steps`` steps of each x (rows)."""
    bits = x.view(np.uint32).astype(np.int64)
    mag, sign = bits & 0x7FFFFFFF, bits & 0x80000000
    near = np.maximum(mag[:, None] + np.arange(-steps, steps + 1)[None, :], 0) | sign[:, None]
    return quant.codes_of(near.astype(np.uint32).view(F32), kind)


@pytest.mark.parametrize("fused", [False, True])
def test_scaled_codes_hold_for_every_x_they_may_stand_for(fused):
    """The kernel codes m from x' = value * (1 / absmax), numpy from x = value / absmax:
    x' is within 6 float32 steps of x (three roundings). Where the scaled test is sure
    of an x' within 64 steps of a midpoint, every float32 within 7 steps of it has the
    code fast_codes gives (farther from every midpoint all of them share x's code, and
    scaled-sure implies sure). The unscaled test is not enough: around the bounds
    between regions it is sure of values a step across."""
    x = _around(quant.midpoints("signed")[:-1], 64)
    window = _window_codes(x, "signed", 7)
    code, sure = quant.fast_codes(x, "signed", fused, scaled=True)
    bad = sure & (window != code[:, None]).any(axis=1)
    assert not bad.any(), x[bad][:5]
    assert sure.mean() > 0.3, sure.mean()
    code, sure = quant.fast_codes(x, "signed", fused)
    assert (sure & (window != code[:, None]).any(axis=1)).any()


def test_scaled_codes_of_values_and_absmax(rng):
    """Random values and block scales: where the scaled test is sure of value * (1 /
    absmax), its code is codes_of(value / absmax); few are unsure."""
    absmax = (10.0 ** rng.uniform(-30, 30, 400_000)).astype(F32)
    q = (absmax * np.where(rng.random(absmax.size) < 0.5,
                           10.0 ** rng.uniform(-8, 0, absmax.size),
                           rng.uniform(-1, 1, absmax.size))).astype(F32)
    x, xs = (q / absmax).astype(F32), (q * (F32(1) / absmax)).astype(F32)
    assert np.any(x != xs)
    for fused in (False, True):
        code, sure = quant.fast_codes(xs, "signed", fused, scaled=True)
        want = quant.codes_of(x, "signed")
        wrong = np.nonzero(sure & (code != want))[0]
        assert wrong.size == 0, (q[wrong[:5]], absmax[wrong[:5]])
        assert np.mean(~sure) < 3e-4, np.mean(~sure)


def _every_float32(kind: str, fused: bool, stride: int) -> None:
    """Every ``stride``-th float32 in [-1, 1] by bit pattern, both signs: sure codes
    equal codes_of. ``stride=1`` is every float32 (minutes: ``python
    tests/test_q8_fast_codes.py``)."""
    top = int(F32(1).view(np.uint32)) + 1
    chunk = stride << 22
    for sign in (0, 1 << 31):
        for start in range(0, top, chunk):
            x = (np.arange(start, min(start + chunk, top), stride, dtype=np.uint32)
                 | np.uint32(sign)).view(F32)
            code, sure = quant.fast_codes(x, kind, fused)
            assert not np.any(sure & (code != quant.codes_of(x, kind))), (kind, fused, start)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_fast_codes_equal_codes_of_over_the_float32_range(kind, fused):
    """Every 61st float32 in [-1, 1] (a prime stride: every exponent, varied low bits)."""
    _every_float32(kind, fused, 61)


def _blocks(g: np.ndarray, scale: float) -> np.ndarray:
    """Full 256-blocks of the float32 values ``g`` (|g| <= scale), each led by ``scale``
    itself, so that every block's absmax is ``scale``."""
    body = quant.BLOCK - 1
    g = np.resize(np.asarray(g, F32), -(-g.size // body) * body).reshape(-1, body)
    return np.concatenate([np.full((len(g), 1), scale, F32), g], axis=1).reshape(-1)


def _sure(g: np.ndarray, scale: float, kind: str) -> np.ndarray:
    """Whether the kernel's arithmetic is sure of g / scale, fused or not (the signed
    map: of g * (1 / scale), by the scaled test)."""
    scaled = kind in quant.SCALED_MAPS
    x = (g * (F32(1) / F32(scale)) if scaled else g / F32(scale)).astype(F32)
    return (quant.fast_codes(x, kind, False, scaled)[1] &
            quant.fast_codes(x, kind, True, scaled)[1])


def _across_bounds(scale: float) -> np.ndarray:
    """Values g near the bounds between the signed map's regions whose g * (1 / scale)
    the unscaled test is sure of (fused and not) while its code is not g / scale's."""
    g = _around(quant.fast_constants("signed")["bounds"] * F32(scale), 64)
    g = g[np.abs(g) <= scale]
    x, xs = (g / F32(scale)).astype(F32), (g * (F32(1) / F32(scale))).astype(F32)
    (c0, s0), (c1, s1) = (quant.fast_codes(xs, "signed", f) for f in (False, True))
    return g[s0 & s1 & (c0 == c1) & (c0 != quant.codes_of(x, "signed"))]


@pytest.mark.parametrize("n_min", [quant.BLOCK * 16, 1 << 16])   # serial, parallel path
@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_kernel_codes_equal_numpy_near_every_midpoint(scale, n_min, rng):
    """Adam with beta1 = beta2 = 0 stores m = g and v = g * g (float32): the compiled
    kernel's codes and absmax equal quant.quantize of those values, for gradients at and
    around every signed midpoint (m), at the square roots of values around every
    unsigned midpoint (v, coded as sqrt(v) with the usqrt map), and random ones; first in blocks of values the arithmetic
    is sure of (codes without tables), then in blocks that mix in values it is not, and
    blocks of values next to the bounds between regions that only the scaled test
    (m: x times 1 / absmax) sends to the tables."""
    near_m = (_around(_special("signed"), 8) * F32(scale)).astype(F32)
    near_v = (np.abs(_around(_special("usqrt"), 8)) * F32(scale)).astype(F32)
    sure_m = near_m[_sure(near_m, scale, "signed")]
    # (v codes sqrt(g * g), which can be a float32 step off |g|, in blocks of absmax scale)
    sure_v = near_v[_sure(np.sqrt((near_v * near_v).astype(F32)), scale, "usqrt")]
    assert sure_m.size > near_m.size // 4 and sure_v.size > near_v.size // 4
    mixed = (rng.uniform(-1, 1, 4096) * scale).astype(F32)
    cross = _across_bounds(scale)      # (blocks the scaled test must send to the tables)
    assert cross.size > 0 or scale == 1.0
    g = np.concatenate([_blocks(sure_m, scale), _blocks(sure_v, scale), _blocks(near_m, scale),
                        _blocks(near_v, scale), _blocks(mixed, scale)] +
                       [_blocks(cross, scale)] * (cross.size > 0))
    g = np.resize(g, max(n_min, g.size))
    w = rng.standard_normal(g.size).astype(F32)
    opt = optgen.create("adam", [w], beta1=0.0, beta2=0.0, state_format="q8",
                        state_format_min_size=0)
    opt.step([g.copy()])
    st = opt.state[0]
    for name, values, kind in (("m", g, "signed"), ("v", (g * g).astype(F32), "usqrt")):
        codes, absmax = quant.quantize(values, kind)
        np.testing.assert_array_equal(st[name + "__absmax"], absmax, err_msg=name)
        bad = np.nonzero(st[name] != codes)[0]
        assert bad.size == 0, (name, values[bad[:5]], st[name][bad[:5]], codes[bad[:5]])


def test_kernel_codes_blocks_whose_inverse_absmax_is_inexact(rng):
    """m's codes (Adam with beta1 = 0: m is the gradient) of blocks whose absmax is
    subnormal or above 2^126 (1 / absmax overflows or loses bits): those of
    quant.quantize, which divides."""
    scales = [1e-39, 2.0 ** -126, 2e38, 3.3e38]
    g = np.concatenate([(rng.uniform(-1, 1, 64 * quant.BLOCK) * s).astype(F32) for s in scales])
    w = np.zeros(g.size, F32)
    opt = optgen.create("adam", [w], beta1=0.0, state_format="q8", state_format_min_size=0)
    opt.step([g])
    codes, absmax = quant.quantize(g, "signed")
    np.testing.assert_array_equal(opt.state[0]["m__absmax"], absmax)
    bad = np.nonzero(opt.state[0]["m"] != codes)[0]
    assert bad.size == 0, (bad.size, g[bad[:5]], opt.state[0]["m"][bad[:5]], codes[bad[:5]])


def test_kernel_decodes_every_code_exactly():
    """Every code of the signed map through SGD (w = -map[code] * absmax, absmax 1 and
    0.75), and of both maps through adam (one code per block: the new absmax is half
    the code's magnitude)."""
    codes = np.arange(256, dtype=np.uint8)
    for absmax in (1.0, 0.75):
        n = 64 * quant.BLOCK
        opt = optgen.create("sgd", [np.zeros(n, F32)], lr=1.0, momentum=1.0,
                            state_format="q8", state_format_min_size=0)
        opt.state[0]["momentum_buffer"][:] = np.resize(codes, n)
        opt.state[0]["momentum_buffer__absmax"][:] = absmax
        opt.step([np.zeros(n, F32)])
        want = -(quant.dynamic_map("signed") * F32(absmax)).astype(F32)
        np.testing.assert_array_equal(opt.params[0], np.resize(want, n))
    n = 256 * quant.BLOCK
    opt = optgen.create("adam", [np.zeros(n, F32)], beta1=0.5, beta2=0.5, state_format="q8",
                        state_format_min_size=0)
    for name, kind in (("m", "signed"), ("v", "usqrt")):
        zero = quant.code_of(0.0, kind)[0]
        blocks = np.full((256, quant.BLOCK), zero, np.uint8)
        blocks[:, 7] = codes
        opt.state[0][name][:] = blocks.reshape(-1)
        opt.state[0][name + "__absmax"][:] = 1.0
    opt.step([np.zeros(n, F32)])
    for name, kind in (("m", "signed"), ("v", "usqrt")):
        want = (np.abs(quant.dynamic_map(kind)) * F32(0.5)).astype(F32)
        if kind == "usqrt":     # v = 0.5 * map**2, coded as its square root
            want = np.sqrt((quant.dynamic_map(kind) * quant.dynamic_map(kind) * F32(0.5))
                           .astype(F32))
        np.testing.assert_array_equal(opt.state[0][name + "__absmax"], want, err_msg=name)


def test_full_blocks_look_up_maps_by_permutes_with_avx512():
    """On a CPU with AVX-512 the full blocks' map lookups are permutes (the decoding
    test above then checks every code through them); elsewhere gathers, nothing to
    check here."""
    from optgen.compiler import schedule_llvm, tvm_backend
    if not tvm_backend.host_has(schedule_llvm.PERMUTE_FEATURE):
        pytest.skip("this CPU has no AVX-512: the kernels gather")
    from optgen import commands
    for fmt, intrinsic in (("q8", schedule_llvm.PERMUTE2), ("q4", schedule_llvm.PERMUTE1)):
        text = commands.stage_text(optgen.get_artifact("adam", "llvm", state_format=fmt),
                                   "tvmscript", "adam_f32_sf_m_" + fmt + "_v_" + fmt)
        assert intrinsic in text, fmt


if __name__ == "__main__":   # the exhaustive check: every float32 in [-1, 1]
    for kind in KINDS:
        for fused in (False, True):
            _every_float32(kind, fused, 1)
            print(f"{kind} fused={fused}: every float32 in [-1, 1] agrees where sure")

"""q8, q4 and fp8 states against an oracle written here, for the issue's seven rules.
(fp8: E4M3 from the OCP spec, tests/test_state_formats_fp8.py, one scale per block.)

The oracle is the paper's block-wise quantizer (Dettmers et al. 2022 for 8 bits, q8's
non-negative states coding their square root with the unsigned map, a positive value
never as 0; Li et al. 2023 for 4 bits: the signed dynamic map with 3 exponent bits and
the zero-free linear map), with its own map construction, nearest-value search and nibble packing,
wrapped around the rules of tests/catalog_oracles.py (written from the papers and the
seed documents, not from the specs): each step dequantizes the states, runs the
published rule in float32, and quantizes the new states. For adam, adamw, lion, sgd with
momentum, adagrad, rmsprop and adabelief, 100 steps on shapes 0, 1, 255, 256, 257, 4095,
4097 (and 1_000_003 for adam), float32 parameters and bfloat16 ones with a float32
master, both the compiled kernel and the reference interpreter must give the oracle's
codes: each code within one of it and more than 99.9 % of them equal (a last-bit float32
difference, e.g. a fused multiply-add, can move a value across a code boundary; every
step continues from optgen's own states, so one such case does not compound), the absmax
to float32 rounding and the parameter to the rule's float32 precision.
"""
import ml_dtypes
import numpy as np
import pytest

import optgen
from catalog_oracles import ORACLES
from test_state_formats_fp8 import POSITIVE, VALUES

RULES = {"adam": {"lr": 1e-2}, "adamw": {"lr": 1e-2, "weight_decay": 0.01},
         "lion": {"lr": 1e-3}, "sgd": {"lr": 1e-2, "momentum": 0.9},
         "adagrad": {"lr": 1e-2}, "rmsprop": {"lr": 1e-3}, "adabelief": {"lr": 1e-2}}
SHAPES = [(0,), (1,), (255,), (256,), (257,), (4095,), (4097,)]
STEPS = 100
BF16 = np.dtype(ml_dtypes.bfloat16)


def dynamic_map(signed: bool, exponent_bits: int, bits: int) -> np.ndarray:
    """Dettmers' dynamic map: for decade 10**(e - exponent_bits + 1), e = 0 ..
    exponent_bits - 1, the midpoints of [0.1, 1] cut into 2**(e + free) equal parts
    (free = bits - 1 - exponent_bits signed, one more unsigned), both signs if signed;
    plus 0 and 1."""
    free = bits - 1 - exponent_bits + (0 if signed else 1)
    vals = [0.0, 1.0]
    for e in range(exponent_bits):
        grid = np.linspace(0.1, 1, 2 ** (e + free) + 1, dtype=np.float32)
        mid = np.float32(10.0 ** (e - exponent_bits + 1)) * ((grid[1:] + grid[:-1])
                                                              / np.float32(2))
        vals += list(mid) + (list(-mid) if signed else [])
    out = np.sort(np.array(vals, np.float32))
    assert out.size == 2 ** bits
    return out


MAPS = {("q8", True): dynamic_map(True, 7, 8), ("q8", False): dynamic_map(False, 7, 8),
        ("q4", True): dynamic_map(True, 3, 4),
        ("q4", False): np.arange(1, 17, dtype=np.float32) / np.float32(16)}   # no zero


def nearest(norm: np.ndarray, qmap: np.ndarray) -> np.ndarray:
    """The index of the map value nearest each value (ties to the smaller value)."""
    hi = np.clip(np.searchsorted(qmap, norm), 1, qmap.size - 1)
    lo = hi - 1
    pick_hi = np.abs(qmap[hi] - norm) < np.abs(norm - qmap[lo])
    return np.where(pick_hi, hi, lo).astype(np.uint8)


def quantize(x: np.ndarray, qmap: np.ndarray, block: int, packed: bool, root: bool = False):
    """``root``: q8's non-negative states code sqrt(x) (the block's absmax is that of the
    square roots), and a positive value never codes as 0 (the map's smallest positive
    value instead)."""
    x = np.asarray(x, np.float32).reshape(-1)
    if root:
        x = np.sqrt(np.maximum(x, np.float32(0)))
    nb = -(-x.size // block)
    pad = np.zeros(nb * block, np.float32)
    pad[:x.size] = x
    absmax = np.abs(pad.reshape(nb, block)).max(axis=1) if nb else np.zeros(0, np.float32)
    scale = np.repeat(absmax, block)[:x.size]
    with np.errstate(divide="ignore", invalid="ignore"):
        norm = np.where(scale > 0, x / scale, np.float32(0)).astype(np.float32)
    codes = nearest(norm, qmap)
    if root:
        codes = np.where((codes == 0) & (norm > 0), np.uint8(1), codes).astype(np.uint8)
    if packed:
        codes = np.append(codes, np.uint8(0)) if codes.size % 2 else codes
        codes = (codes[0::2] * 16 + codes[1::2]).astype(np.uint8)
    return codes, absmax.astype(np.float32)


def dequantize(codes, absmax, qmap, block: int, n: int, packed: bool,
               root: bool = False) -> np.ndarray:
    codes = np.asarray(codes).reshape(-1)
    if packed:
        codes = np.stack([codes // 16, codes % 16], axis=1).reshape(-1)[:n]
    t = qmap[codes] * np.repeat(np.asarray(absmax, np.float32), block)[:n]
    return t * t if root else t


# fp8: E4M3 from the OCP spec (tests/test_state_formats_fp8.py), one scale per block of
# 256 = its largest magnitude / 448 (at least 2**-126 where it is not 0), a code the
# nearest value of x * (1 / scale), ties to the even code. Non-negative states ("sqrt"
# map) code sqrt(x) instead, with the scale of the square roots, and a nonzero value
# never codes as 0 (the smallest subnormal instead); they read back squared.
E4M3 = VALUES.astype(np.float32)


def e4m3_quantize(x: np.ndarray, block: int = 256, root: bool = False):
    x = np.asarray(x, np.float32).reshape(-1)
    nb = -(-x.size // block)
    pad = np.zeros(nb * block, np.float32)
    pad[:x.size] = x
    absmax = np.abs(pad.reshape(nb, block)).max(axis=1) if nb else np.zeros(0, np.float32)
    if root:
        absmax, x = np.sqrt(absmax), np.sqrt(np.abs(x))
    scale = np.where(absmax > 0, np.maximum((absmax / np.float32(448)).astype(np.float32),
                                            np.float32(2.0 ** -126)), 0).astype(np.float32)
    inv = (np.float32(1) / np.where(scale > 0, scale, np.float32(1))).astype(np.float32)
    norm = x * np.repeat(inv, block)[:x.size]
    a = np.minimum(np.abs(norm).astype(np.float64), 448.0)
    hi = np.clip(np.searchsorted(POSITIVE, a), 1, POSITIVE.size - 1)
    lo = hi - 1
    d_hi, d_lo = POSITIVE[hi] - a, a - POSITIVE[lo]
    code = np.where(d_hi < d_lo, hi, np.where(d_lo < d_hi, lo, np.where(lo % 2 == 0, lo, hi)))
    if root:
        code = np.where((code == 0) & (a > 0), 1, code)
    return (code | (np.signbit(norm) << 7)).astype(np.uint8), scale


def e4m3_dequantize(codes, scale, block: int, n: int, root: bool = False) -> np.ndarray:
    t = E4M3[np.asarray(codes).reshape(-1)] * np.repeat(np.asarray(scale, np.float32),
                                                        block)[:n]
    return t * t if root else t


def _compare(got, want, packed, label):
    got, want = np.asarray(got).astype(int).reshape(-1), want.astype(int)
    diff = np.maximum(np.abs(got // 16 - want // 16), np.abs(got % 16 - want % 16)) \
        if packed else np.abs(got - want)
    assert diff.max(initial=0) <= 1, f"{label}: codes {diff.max()} apart"
    return int(np.sum(diff == 0)), diff.size


def _run(fmt, name, pdt, backend, shapes, rng):
    block, packed = (128, True) if fmt == "q4" else (256, False)
    hyper = RULES[name]
    ws = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    opt = optgen.create(name, [w.astype(pdt) for w in ws], backend=backend, state_format=fmt,
                        state_format_min_size=0, multi_precision=pdt == BF16, **hyper)
    stored = opt.artifact.stored
    sign = {s: stored[s].split(":")[1] in ("signed", "signed4", "e4m3") for s in stored}
    root = {s: stored[s] in ("fp8:e4m3sqrt", "q8:usqrt") for s in stored}
    assert fmt == "q4" or root == {s: not sign[s] for s in stored}
    oracles = [ORACLES[name](np.zeros(s, np.float32), dtype=np.float32, **hyper)
               for s in shapes]
    agree = total = 0
    for t in range(1, STEPS + 1):
        gs = [rng.standard_normal(s).astype(np.float32).astype(pdt) for s in shapes]
        masters = [np.asarray(opt.state[i]["master"] if pdt == BF16 else opt.params[i],
                              np.float32).copy() for i in range(len(shapes))]
        before = [{s: (e4m3_dequantize(opt.state[i][s], opt.state[i][s + "__absmax"], block,
                                       masters[i].size, root[s]) if fmt == "fp8" else
                       dequantize(opt.state[i][s], opt.state[i][s + "__absmax"],
                                  MAPS[fmt, sign[s]], block, masters[i].size, packed, root[s]))
                   .reshape(shapes[i]) for s in stored} for i in range(len(shapes))]
        opt.step([g.copy() for g in gs])
        for i, (o, g) in enumerate(zip(oracles, gs)):
            label = f"{fmt} {name} {pdt} {backend} step {t} shape {shapes[i]}"
            o.w, o.s = masters[i], {**o.s, **before[i]}
            o.step(np.asarray(g, np.float32))
            for s in stored:
                codes, absmax = e4m3_quantize(o.s[s], block, root[s]) if fmt == "fp8" else \
                    quantize(o.s[s], MAPS[fmt, sign[s]], block, packed, root[s])
                a, b = _compare(opt.state[i][s], codes, packed, f"{label}: {s}")
                agree, total = agree + a, total + b
                np.testing.assert_allclose(opt.state[i][s + "__absmax"], absmax, rtol=2e-5,
                                           atol=1e-7, err_msg=f"{label}: {s}__absmax")
            now = np.asarray(opt.state[i]["master"] if pdt == BF16 else opt.params[i],
                             np.float32)
            ok = ~o.ambiguous if name == "lion" else np.ones(now.shape, bool)
            np.testing.assert_allclose(now[ok], o.w[ok], rtol=1e-4, atol=1e-6,
                                       err_msg=f"{label}: w")
    return agree, total


@pytest.mark.parametrize("fmt", ["q8", "q4", "fp8"])
@pytest.mark.parametrize("name", list(RULES))
def test_codes_match_the_papers_quantizer(fmt, name, rng):
    agree = total = 0
    for pdt in (np.dtype(np.float32), BF16):
        for backend in ("compiled", "reference"):
            a, b = _run(fmt, name, pdt, backend, SHAPES, rng)
            agree, total = agree + a, total + b
    assert agree / total > 0.999, f"{fmt} {name}: {1 - agree / total:.2e} of the codes differ"


@pytest.mark.parametrize("fmt", ["q8", "q4"])   # (fp8's prime: test_state_formats_fp8.py)
def test_codes_match_the_papers_quantizer_on_a_large_prime(fmt, rng):
    """1_000_003 elements (q4: an odd count, the last byte half padding), the compiled
    kernel, float32 parameters, 100 steps of Adam."""
    agree, total = _run(fmt, "adam", np.dtype(np.float32), "compiled", [(1_000_003,)], rng)
    assert agree / total > 0.999, f"{fmt}: {1 - agree / total:.2e} of the codes differ"


def test_the_oracle_maps_are_the_papers():
    """bitsandbytes' create_dynamic_map(signed, 7, 8) has 1, 2, 4 ... 64 values per decade
    and sign (signed) from 1e-6; the 4-bit one (3 exponent bits) 1, 2, 4 from 1e-2."""
    m8, m4 = MAPS["q8", True], MAPS["q4", True]
    assert m8[127] == 0 and m8[-1] == 1 and np.isclose(m8[128], 0.55e-6)
    assert np.allclose(m4[8:], [0.0055, 0.0325, 0.0775, 0.2125, 0.4375, 0.6625, 0.8875, 1])
    assert 0 not in MAPS["q4", False] and MAPS["q4", False][0] == np.float32(1 / 16)

"""4-bit states ("q4": optgen/core/quant.py, docs/state-formats.md): block-wise codes, two a
byte, one float32 absmax per 128 elements.

* an independent oracle written here from the papers: the signed 4-bit dynamic
  (exponent) map of Dettmers et al. (2022) for states that can be negative, the
  zero-free linear map (k + 1) / 16 of Li et al. (NeurIPS 2023) for non-negative ones,
  the nearest code per element, the element 2k in the high nibble; 100 steps of the
  published rules, code for code;
* compiled == reference interpreter for the issue's rules, every flag combination,
  float32 and bfloat16 (mixed) parameters, shapes around the block size and a large prime;
* memory, checkpoints (bit-exact resume; q4 <-> q8 <-> float32 with a warning), torch
  drop-in, typed errors.
"""
import numpy as np
import pytest

import optgen
from test_state_formats import _stepped_pairs

Q4_SPECS = ["adam", "adamw", "lion", "sgd", "adagrad", "rmsprop", "adabelief"]
Q4_SHAPES = [(0,), (1,), (127,), (128,), (129,), (255,), (256,), (257,), (4095,), (4097,),
             (33, 31)]


def signed_exponent_map():
    """Dettmers' dynamic map with 3 exponent bits and 4 bits in all: for decade
    10**(e - 2), e = 0, 1, 2, the midpoints of [0.1, 1] cut into 2**e equal parts, with
    both signs; plus 0 and 1. (Written from the paper, not from optgen.)"""
    vals = [0.0, 1.0]
    for e in range(3):
        grid = np.linspace(0.1, 1, 2 ** e + 1, dtype=np.float32)
        mid = np.float32(10.0 ** (e - 2)) * ((grid[1:] + grid[:-1]) / np.float32(2))
        vals += list(mid) + list(-mid)
    return np.sort(np.array(vals, np.float32))


def linear_map():
    """Li et al.'s linear map without zero: (k + 1) / 16 for the 16 codes."""
    return np.array([(k + 1) / 16 for k in range(16)], np.float32)


def oracle_quantize(x, qmap, block=128):
    """Per block: absmax, the nearest map value of each x / absmax (ties to the smaller),
    then codes two a byte, the first of a pair in the high nibble (a missing last one: 0)."""
    x = np.asarray(x, np.float32).reshape(-1)
    codes = np.zeros(x.size + x.size % 2, np.uint8)
    absmax = np.zeros(-(-x.size // block), np.float32)
    for b in range(absmax.size):
        chunk = x[b * block:(b + 1) * block]
        absmax[b] = np.max(np.abs(chunk))
        norm = chunk / absmax[b] if absmax[b] > 0 else np.zeros_like(chunk)
        codes[b * block:b * block + chunk.size] = np.argmin(
            np.abs(qmap[None, :] - norm[:, None]), axis=1)
    return (codes[0::2] * 16 + codes[1::2]).astype(np.uint8), absmax


def oracle_dequantize(packed, absmax, qmap, n, block=128):
    codes = np.stack([packed // 16, packed % 16], axis=1).reshape(-1)[:n]
    return qmap[codes] * np.repeat(absmax, block)[:n]


def test_maps_are_the_papers():
    from optgen.core import quant
    np.testing.assert_array_equal(quant.dynamic_map("signed4"), signed_exponent_map())
    np.testing.assert_array_equal(quant.dynamic_map("linear4"), linear_map())
    assert 0.0 not in quant.dynamic_map("linear4")


@pytest.mark.parametrize("name,block", [("adam", 128), ("sgd", 128), ("lion", 128),
                                        ("adagrad", 128), ("adam", 64), ("adam", 256)])
def test_q4_states_match_the_paper(name, block, rng):
    """100 steps of the published rules (Adam with MXNet's folded bias correction, SGD
    with momentum, Lion, Adagrad), each state dequantized before and quantized after
    every update by the oracle above: the kernel's packed codes equal the oracle's but
    where a last-bit float32 difference moves a value across a boundary."""
    hyper = {"adam": {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8}, "sgd": {"momentum": 0.9},
             "lion": {"beta1": 0.9, "beta2": 0.99}, "adagrad": {"eps": 1e-7}}[name]
    lr, f = 1e-3, np.float32
    shapes = [(0,), (1,), (block - 1,), (block,), (block + 1,), (255,), (257,), (4095,),
              (4097,)]
    ws = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    opt = optgen.create(name, [w.copy() for w in ws], lr=lr, state_format=f"q4@{block}",
                        state_format_min_size=0, **hyper)
    smap, lmap = signed_exponent_map(), linear_map()
    first, fmap = {"sgd": ("momentum_buffer", smap), "adagrad": ("accum", lmap)}.get(
        name, ("m", smap))
    init = 0.1 if name == "adagrad" else 0.0         # (Adagrad's initial_accum)
    st = [{"m": oracle_quantize(np.full(w.size, init), fmap, block),
           "v": oracle_quantize(np.zeros(w.size), lmap, block)} for w in ws]
    for i, w in enumerate(ws):
        assert np.array_equal(np.asarray(opt.state[i][first]), st[i]["m"][0]), shapes[i]
    agree = total = 0
    for t in range(1, 101):
        gs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        opt.step([g.copy() for g in gs])
        for i, g in enumerate(gs):
            g, n = g.reshape(-1), g.size
            m = oracle_dequantize(*st[i]["m"], fmap, n, block)
            w = ws[i].reshape(-1)
            if name == "adam":
                m = f(hyper["beta1"]) * m + f(1 - hyper["beta1"]) * g
                v = oracle_dequantize(*st[i]["v"], lmap, n, block)
                v = f(hyper["beta2"]) * v + f(1 - hyper["beta2"]) * g * g
                lr_t = f(lr * np.sqrt(1 - hyper["beta2"] ** t) / (1 - hyper["beta1"] ** t))
                w = w - lr_t * m / (np.sqrt(v) + f(hyper["eps"]))
            elif name == "sgd":
                m = g if t == 1 else f(hyper["momentum"]) * m + g
                w = w - f(lr) * m
            elif name == "lion":
                w = w - f(lr) * np.sign(f(hyper["beta1"]) * m + f(1 - hyper["beta1"]) * g)
                m = f(hyper["beta2"]) * m + f(1 - hyper["beta2"]) * g
            else:
                m = m + g * g
                w = w - f(lr) * g / (np.sqrt(m) + f(hyper["eps"]))
            want = oracle_quantize(m, fmap, block)
            got = np.asarray(opt.state[i][first])
            agree += int(np.sum(got == want[0]))
            total += got.size
            hi = np.abs(got.astype(int) // 16 - want[0].astype(int) // 16)
            lo = np.abs(got.astype(int) % 16 - want[0].astype(int) % 16)
            assert max(hi.max(initial=0), lo.max(initial=0)) <= 1, (name, shapes[i], t)
            np.testing.assert_allclose(opt.state[i][first + "__absmax"], want[1],
                                       rtol=1e-5, atol=1e-7)
            if name == "adam":
                want_v = oracle_quantize(v, lmap, block)
                got_v = np.asarray(opt.state[i]["v"])
                agree += int(np.sum(got_v == want_v[0]))
                total += got_v.size
                np.testing.assert_allclose(opt.state[i]["v__absmax"], want_v[1], rtol=1e-5)
                st[i]["v"] = (got_v.copy(), np.asarray(opt.state[i]["v__absmax"]).copy())
            # continue from the kernel's states: one boundary case does not compound
            st[i]["m"] = (got.copy(), np.asarray(opt.state[i][first + "__absmax"]).copy())
            np.testing.assert_allclose(opt.params[i].reshape(-1), w, rtol=1e-4, atol=1e-5)
            ws[i] = np.asarray(opt.params[i]).copy()
    assert agree / total > 0.999, f"{name}: {1 - agree / total:.2e} of the codes differ"


def _codes_close(got, want, label):
    """Packed codes: each nibble within one code, at most 1 % of the bytes differ."""
    got, want = np.asarray(got).astype(int), np.asarray(want).astype(int)
    assert got.shape == want.shape, label
    diff = np.maximum(np.abs(got // 16 - want // 16), np.abs(got % 16 - want % 16))
    assert diff.max(initial=0) <= 1 and np.sum(diff > 0) <= 0.01 * diff.size + 1, label


@pytest.mark.parametrize("name", Q4_SPECS)
def test_q4_compiled_matches_reference(name, rng):
    """Every flag combination, float32 and bf16 (mixed) parameters: the kernel's packed
    codes equal the interpreter's (a fused multiply-add may move a value across a code
    boundary, rarely), absmax to float32 rounding."""
    art = optgen.get_artifact(name, state_format="q4")
    ran = 0
    for flags, pdt, opts in _stepped_pairs(art, "q4", Q4_SHAPES, rng):
        for i, s in enumerate(Q4_SHAPES):
            n = int(np.prod(s))
            for key, want in opts[1].state[i].items():
                got = opts[0].state[i][key]
                label = f"{name} {pdt} flags {flags}: {key} {s}"
                if isinstance(want, np.floating) or key == "master":
                    continue
                if got.dtype == np.uint8:
                    assert got.shape == ((n + 1) // 2,), label
                    _codes_close(got, want, label)
                else:
                    np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=label)
        ran += 1
    assert ran


def test_q4_large_prime_and_block_sizes(rng):
    """A tensor of 1_000_003 elements (odd: the last byte's low nibble is padding) and
    block sizes 32 and 512, compiled == reference."""
    for fmt, shape in (("q4", (1_000_003,)), ("q4@32", (1001,)), ("q4@512", (1537,))):
        w = rng.standard_normal(shape).astype(np.float32)
        opts = [optgen.create("adam", [w.copy()], state_format=fmt, backend=b,
                              state_format_min_size=0) for b in ("compiled", "reference")]
        for _ in range(3):
            g = rng.standard_normal(shape).astype(np.float32)
            for o in opts:
                o.step([g.copy()])
        block = int(fmt[3:]) if "@" in fmt else 128
        for key in ("m", "v"):
            _codes_close(opts[0].state[0][key], opts[1].state[0][key], f"{fmt} {key}")
            assert opts[0].state[0][key + "__absmax"].shape == (-(-w.size // block),)
        assert opts[0].state[0]["m"][-1] % 16 == 0
        np.testing.assert_allclose(opts[0].params[0], opts[1].params[0], rtol=1e-3, atol=1e-5)


def test_q4_maps_by_sign():
    """Non-negative states (Adam's v, Adagrad's accumulator, AdaBelief's s) get the
    zero-free linear map; the others the signed 4-bit dynamic map."""
    maps = {}
    for name in ("adam", "adagrad", "lion", "sgd", "adabelief", "rmsprop"):
        for k in optgen.get_artifact(name, state_format="q4").kernels:
            maps.update({f"{name}.{n}": m for n, m in k.quant.items()})
    assert maps["adam.m"] == maps["lion.m"] == maps["sgd.momentum_buffer"] == "signed4"
    assert maps["adam.v"] == maps["adagrad.accum"] == maps["adabelief.s"] == "linear4"


def test_q4_memory_and_threshold():
    """Half a byte a code plus 4 bytes per 128: 0.53 bytes per state element."""
    big, small = np.zeros(1 << 20, np.float32), np.zeros(100, np.float32)
    opt = optgen.create("adam", [big, small], state_format="q4")
    per_param = sum(a.nbytes for a in opt.state[0].values()) / big.size
    assert per_param == 2 * (0.5 + 4 / 128)
    assert {a.dtype.name for a in opt.state[1].values()} == {"float32"}


def test_q4_checkpoints_resume_bit_exact_and_convert(tmp_path, rng):
    """A q4 run saved and resumed steps bit for bit like the uninterrupted run; its
    checkpoint loads into float32 (dequantized) and q8 optimizers (re-quantized), each
    with the warning line, and a float32 one into q4 (quantized again: within half a
    step of the map; not always the same codes, since the signed map's most negative
    value is -0.8875, not -1, so a block's absmax can shrink)."""
    from optgen.core import quant
    n = 6001
    w = rng.standard_normal(n).astype(np.float32)
    gs = [rng.standard_normal(n).astype(np.float32) for _ in range(6)]
    a = optgen.create("adamw", [w.copy()], state_format="q4")
    for g in gs[:3]:
        a.step([g.copy()])
    a.save(tmp_path / "q4.npz")
    b = optgen.create("adamw", [a.params[0].copy()], state_format="q4")
    b.load(tmp_path / "q4.npz")
    for g in gs[3:]:
        a.step([g.copy()])
        b.step([g.copy()])
    np.testing.assert_array_equal(a.params[0], b.params[0])
    for key in a.state[0]:
        np.testing.assert_array_equal(np.asarray(a.state[0][key]), np.asarray(b.state[0][key]))
    values = {k: quant.dequantize(a.state[0][k], a.state[0][k + "__absmax"], kind, 128, (n,))
              for k, kind in (("m", "signed4"), ("v", "linear4"))}
    full = optgen.create("adamw", [w.copy()])
    with pytest.warns(UserWarning, match="q4 -> float32"):
        full.load_state_dict(a.state_dict())
    for k, want in values.items():
        np.testing.assert_array_equal(full.state[0][k], want)
    q8 = optgen.create("adamw", [w.copy()], state_format="q8")
    with pytest.warns(UserWarning, match="q4:signed4 -> q8:signed"):
        q8.load_state_dict(a.state_dict())
    got = quant.dequantize(q8.state[0]["m"], q8.state[0]["m__absmax"], "signed")
    np.testing.assert_allclose(got, values["m"], rtol=0.1, atol=1e-3 * np.abs(values["m"]).max())
    back = optgen.create("adamw", [w.copy()], state_format="q4")
    with pytest.warns(UserWarning, match="float32 -> q4"):
        back.load_state_dict(full.state_dict())
    for k, kind in (("m", "signed4"), ("v", "linear4")):   # within half the widest gap
        absmax = back.state[0][k + "__absmax"]              # of the map (0.225, 1/16)
        again = quant.dequantize(back.state[0][k], absmax, kind, 128, (n,))
        assert np.all(np.abs(again - values[k]) <= 0.1125 * np.repeat(absmax, 128)[:n]
                      * (1 + 1e-6)), k


@pytest.mark.parametrize("bad,match", [
    ("q4@48", "q4 block size must be a power of two of at least 32"),
    ("q4@16", "q4 block size must be a power of two of at least 32"),
    ({"m": "q4", "v": "q8"}, "one block size"),
])
def test_q4_bad_requests_are_typed_errors(bad, match):
    w = np.ones(5000, np.float32)
    with pytest.raises(ValueError, match=match):
        optgen.create("adam", [w], state_format=bad)
    assert np.all(w == 1.0)


def test_q4_on_a_rule_with_reductions_is_a_value_error():
    w = np.ones(5000, np.float32)
    with pytest.raises(ValueError, match="state_format 'q4' applies to elementwise rules"):
        optgen.create("lamb", [w], state_format="q4")
    assert np.all(w == 1.0)


def test_q4_torch_drop_in_trains():
    """(Its torch.optim checkpoint: test_state_formats.py, the torch-format test.)"""
    torch = pytest.importorskip("torch", reason="the torch drop-ins need torch")
    from helpers import torch_mlp, torch_train
    import optgen.torch as ot
    model, ref = torch_mlp(), torch_mlp()
    init = [p.detach().clone() for p in model.parameters()]
    opt = ot.Adam(model.parameters(), lr=1e-2, state_format="q4", state_format_min_size=0)
    torch_train(model, opt, 30)
    torch_train(ref, ot.Adam(ref.parameters(), lr=1e-2), 30)
    with torch.no_grad():   # 4-bit states: about 0.3 of the way the float32 run moved
        for p, q, p0 in zip(model.parameters(), ref.parameters(), init):
            assert (p - q).norm() < 0.5 * (q - p0).norm()

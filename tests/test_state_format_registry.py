"""The state-format registry (optgen/core/formats/): request texts parse to typed
Formats and print back unchanged (artifact keys, manifests and checkpoints keep their
texts); stored texts round-trip; each family's numpy encode/decode and allocation agree
with optgen/core/quant.py and with ml_dtypes' bfloat16 rounding."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from optgen.core import formats, quant


@pytest.mark.parametrize("text,name,dtype,block,canonical", [
    ("bf16", "bf16", "bfloat16", None, "bf16"),
    ("bf16sr", "bf16sr", "bfloat16", None, "bf16sr"),
    ("q8", "q8", "uint8", 256, "q8"),
    ("q8@256", "q8", "uint8", 256, "q8"),
    ("q8@64", "q8", "uint8", 64, "q8@64"),
    ("q4", "q4", "uint8", 128, "q4"),
    ("q4@128", "q4", "uint8", 128, "q4"),
    ("q4@512", "q4", "uint8", 512, "q4@512"),
    ("fp8", "fp8", "uint8", 256, "fp8"),
    ("fp8@64", "fp8", "uint8", 64, "fp8@64"),
])
def test_a_request_text_parses_to_a_format_and_prints_back(text, name, dtype, block, canonical):
    fmt = formats.parse("opt", "state_format", text)
    assert (fmt.name, fmt.dtype, fmt.block, str(fmt)) == (name, dtype, block, canonical)
    assert formats.of(str(fmt)) == fmt
    assert fmt.blocked == (block is not None)


@pytest.mark.parametrize("text,err", [
    ("q8@48", "q8 block size must be a power of two of at least 32"),
    ("q4@16", "q4 block size must be a power of two of at least 32"),
    ("q8@", "q8 block size"),
    ("fp8@48", "fp8 block size must be a power of two of at least 32"),
    ("fp4", "must be one of 'default', 'bf16', 'bf16sr', 'q8', 'q4'"),
    (8, "must be one of"),
])
def test_a_bad_request_text_names_the_rule(text, err):
    with pytest.raises(ValueError, match=err):
        formats.parse("opt", "state_format", text)


@pytest.mark.parametrize("stored,fmt,kind,block", [
    ("q8:signed", "q8", "signed", 256), ("q8:unsigned:64", "q8", "unsigned", 64),
    ("q8:usqrt", "q8", "usqrt", 256), ("q8:usqrt:64", "q8", "usqrt", 64),
    ("q4:signed4", "q4", "signed4", 128), ("q4:linear4:32", "q4", "linear4", 32),
    ("fp8:e4m3", "fp8", "e4m3", 256), ("fp8:e4m3:64", "fp8", "e4m3", 64),
    ("fp8:e4m3sqrt", "fp8", "e4m3sqrt", 256), ("fp8:e4m3sqrt:32", "fp8", "e4m3sqrt", 32),
])
def test_a_stored_text_round_trips(stored, fmt, kind, block):
    f = formats.from_stored(stored)
    assert (f.name, f.map, f.block, f.stored) == (fmt, kind, block, stored)
    assert f == formats.of_map(kind, block) == formats.of(fmt if block == f.family.members[fmt].block
                                                           else f"{fmt}@{block}").with_map(kind)


@pytest.mark.parametrize("text", ["bfloat16", "float32", "q8:linear4", "q4:signed", "q8",
                                  "fp8:signed", "q8:e4m3", "q8:e4m3sqrt", "fp8:sqrt",
                                  "q8:signed:x:y", None])
def test_what_is_no_stored_code_format_is_none(text):
    assert formats.from_stored(text) is None


def test_the_maps_are_picked_by_sign():
    assert [formats.of(t).map_for(nn) for t in ("q8", "q4", "fp8") for nn in (False, True)] == \
        ["signed", "usqrt", "signed4", "linear4", "e4m3", "e4m3sqrt"]
    with pytest.raises(TypeError, match="no code maps"):
        formats.of("bf16").map_for(True)


@pytest.mark.parametrize("stored", ["q8:signed:32", "q8:usqrt:32", "q4:linear4:32",
                                    "q4:signed4"])
@pytest.mark.parametrize("shape", [(1,), (33,), (7, 9), (64,)])
def test_block_formats_encode_allocate_and_name_companions_as_quant_does(stored, shape):
    f = formats.from_stored(stored)
    n = int(np.prod(shape))
    x = np.random.default_rng(n).standard_normal(shape).astype(np.float32)
    codes, absmax = f.quantize(x)
    want = quant.quantize(x, f.map, f.block)
    assert np.array_equal(codes, want[0]) and np.array_equal(absmax, want[1])
    assert codes.shape == f.code_shape(shape)
    assert f.companions("m", n) == {"m__absmax": absmax.shape}
    assert np.array_equal(f.dequantize((codes, absmax), shape),
                          quant.dequantize(codes, absmax, f.map, f.block, shape))
    made = f.allocate("m", 0.25, shape, lambda s, v, dt: np.full(s, v, dt))
    init = quant.quantize(np.full(shape, 0.25, np.float32), f.map, f.block)
    assert set(made) == {"m", "m__absmax"}
    assert np.array_equal(made["m"], init[0]) and np.array_equal(made["m__absmax"], init[1])


def test_block_formats_name_their_tables_and_the_registry_makes_them():
    q8, q4 = formats.from_stored("q8:unsigned"), formats.from_stored("q4:signed4")
    assert q8.tables() == ["_qmap_unsigned", "_qmid_unsigned", "_qtab_unsigned"]
    assert q4.tables() == ["_qmap_signed4"]
    assert np.array_equal(formats.table("_qmap_signed4"), quant.dynamic_map("signed4"))
    assert np.array_equal(formats.table("_qtab_unsigned"), quant.code_table("unsigned"))
    with pytest.raises(KeyError):
        formats.table("_qmap_nothing")
    assert q4.midpoints() == [repr(float(m)) for m in quant.midpoints("signed4")[:-1]]
    assert q8.midpoints() is None and q8.fast and not q4.fast


def test_cast_formats_round_as_ml_dtypes_and_bf16_has_a_stochastic_twin():
    x = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    bf16 = formats.of("bf16")
    (stored,) = bf16.quantize(x)
    assert stored.dtype == np.dtype(ml_dtypes.bfloat16)
    assert np.array_equal(stored, x.astype(ml_dtypes.bfloat16))
    assert np.array_equal(bf16.dequantize((stored,), (100,)), stored.astype(np.float32))
    assert str(bf16.rounded()) == "bf16sr" and bf16.rounded().stochastic and not bf16.stochastic
    assert bf16.companions("m", 100) == {} and bf16.tables() == [] and bf16.load("m", "i") is None
    assert formats.rounded("o", "bf16", True) == {"*": "bf16sr", "w": "bf16sr"}
    assert formats.rounded("o", {"m": "q8", "v": "bf16"}, True) == \
        {"m": "q8", "v": "bf16sr", "w": "bf16sr"}

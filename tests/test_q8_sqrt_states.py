"""q8's non-negative states coded as their square roots ("q8:usqrt", optgen/core/quant.py):
the unsigned dynamic map's code of sqrt(v) against the block's largest sqrt(v), a positive
value never coded as 0, read back squared.

* compiled == reference interpreter bit for bit (codes and block scales) for values
  over 12 decades, zeros and tiny values, shapes 0 to a large prime, float32 parameters
  and bfloat16 ones with a float32 master, encoding (Adam with beta2 = 0 stores g * g)
  and decoding (beta2 = 0.5 and zero gradients halve the decoded v);
* a block that crosses two rows whose gradients differ by 1e6 keeps the small row's
  second moments nonzero (coded as v itself, "q8:unsigned", they decode as 0, and
  Adam's step there becomes m / eps), and its weights move as float32 Adam's do;
* checkpoints of the earlier form (v coded as itself: stored "q8:unsigned", or torch
  format values with that form's block scales) load converted, with the warning line,
  and continue within the format's bound of float32 states.
"""
import numpy as np
import pytest

import optgen
from optgen.core import quant

F32 = np.float32
SHAPES = [(0,), (1,), (15,), (16,), (17,), (257,), (100_003,)]


def _gradients(n: int, rng) -> np.ndarray:
    """Gradients whose squares span 12 decades in every block, with zeros and values
    far below the map's floor."""
    g = rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 0, n)
    g[::7] = 0.0
    g[3::11] *= 1e-30
    return g.astype(F32)


def _pair(w: np.ndarray, beta2: float):
    kw = dict(lr=0.0, beta1=0.0, beta2=beta2, state_format="q8", state_format_min_size=0,
              multi_precision=w.dtype != F32)
    a = optgen.create("adam", [w.copy()], **kw)
    return a, optgen.create(a.artifact, [w.copy()], backend="reference", **kw)


@pytest.mark.parametrize("pdt", ["float32", "bfloat16"])
def test_compiled_equals_reference_bit_for_bit(pdt, rng):
    import ml_dtypes
    dt = np.dtype(ml_dtypes.bfloat16) if pdt == "bfloat16" else np.dtype(F32)
    for shape in SHAPES if pdt == "float32" else SHAPES[:-1]:   # (the prime: float32)
        n = int(np.prod(shape))
        g = _gradients(n, rng).astype(dt)
        a, b = _pair(np.zeros(shape, dt), 0.0)
        assert a.artifact.stored["v"] == "q8:usqrt"
        a.step([g.copy()])
        b.step([g.copy()])
        v = (g.astype(F32) * g.astype(F32)).astype(F32)
        codes, scales = quant.quantize(v, "usqrt")
        for opt in (a, b):            # encoding: the numpy quantizer's codes
            np.testing.assert_array_equal(opt.state[0]["v"], codes, err_msg=f"{pdt} {shape}")
            np.testing.assert_array_equal(opt.state[0]["v__absmax"], scales)
        # every code, then decoding: v halved from each code's value (beta2 = 0.5, g = 0)
        a, b = _pair(np.zeros(shape, dt), 0.5)
        for opt in (a, b):
            opt.state[0]["v"][...] = np.resize(np.arange(256, dtype=np.uint8), shape)
            opt.state[0]["v__absmax"][...] = np.resize(np.array([1.0, 3e-3, 7e5], F32),
                                                       opt.state[0]["v__absmax"].shape)
            opt.step([np.zeros(shape, dt)])
        for n_ in ("v", "v__absmax"):
            np.testing.assert_array_equal(a.state[0][n_], b.state[0][n_], err_msg=f"{shape}")
        if n:
            assert np.count_nonzero(a.state[0]["v"]) >= min(n, 255) - 1


def test_float64_parameters_get_no_q8_kernel():
    with pytest.raises(TypeError, match="float64"):
        optgen.create("adam", [np.zeros(5000)], state_format="q8")


def _rows(steps: int, fmt, rng):
    """Adam on a (2, 128) weight (one block of 256 over two rows): row 0's gradients
    N(0, 1), row 1's 1e-6 N(0, 1). The weights' change and the decoded v."""
    w0 = rng.standard_normal((2, 128)).astype(F32) * F32(0.1)
    opt = optgen.create("adam", [w0.copy()], lr=1e-3, state_format=fmt,
                        state_format_min_size=0)
    scale = np.array([[1.0], [1e-6]], F32)
    for _ in range(steps):
        opt.step([(rng.standard_normal((2, 128)) * scale).astype(F32)])
    st = opt.state[0]
    v = quant.dequantize(st["v"], st["v__absmax"], "usqrt") if fmt else st["v"]
    return np.asarray(opt.params[0]) - w0, np.asarray(v, F32).reshape(2, 128), st


def test_a_block_across_rows_a_million_apart_keeps_small_second_moments(rng):
    steps = 10
    seed = int(rng.integers(1 << 30))
    dw, v, st = _rows(steps, "q8", np.random.default_rng(seed))
    dw32, v32, _ = _rows(steps, None, np.random.default_rng(seed))
    assert st["v__absmax"].shape == (1,)        # one block over both rows
    assert np.all(v[1] > 0), "a small second moment decoded as 0"
    # coded as itself (the earlier form), the same v reads back 0 in row 1
    old = quant.quantize(v32.reshape(-1), "unsigned")
    assert np.all(quant.dequantize(*old, "unsigned").reshape(2, 128)[1] == 0)
    # sqrt(v) within the map's steps at its floor (row 1) and near the top (row 0)
    r = np.sqrt(v / v32)
    assert np.all((r[1] > 0.3) & (r[1] < 2.5)) and np.all(np.abs(r[0] - 1) < 0.05), r
    # Adam moves each weight by about lr a step (with v read as 0, row 1 moved by m / eps,
    # a hundred times that); row 1 as float32's (its m is at the signed map's floor)
    assert np.max(np.abs(dw[1])) <= 1.5 * steps * 1e-3
    assert np.corrcoef(dw[1], dw32[1])[0, 1] > 0.6
    assert np.max(np.abs(dw[0] - dw32[0])) <= 0.05 * steps * 1e-3


def _fp32_run(w0, grads):
    opt = optgen.create("adamw", [w0.copy()], lr=1e-2)
    for g in grads:
        opt.step([g.copy()])
    return opt


def test_a_checkpoint_of_the_earlier_form_loads_converted_and_continues(rng, tmp_path):
    """A state_dict as q8 wrote it before the sqrt map ("q8:unsigned" for v: the same
    numpy quantizer the kernels agreed with) loads into q8 converted, with the warning
    line, and 20 more steps stay within q8's bound of float32 states continued from the
    same values; so does one written to a file and a torch-format one of a drop-in."""
    n = 16 * 256
    w0 = rng.standard_normal(n).astype(F32)
    grads = [(rng.standard_normal(n) * np.resize([1.0, 1e-3], n)).astype(F32)
             for _ in range(30)]
    full = _fp32_run(w0, grads[:10])
    sd = full.state_dict()
    m, v = (np.asarray(full.state[0][s], F32) for s in ("m", "v"))
    old = {"m": quant.quantize(m, "signed"), "v": quant.quantize(v, "unsigned")}
    sd["state"] = [{**sd["state"][0], "m": old["m"][0], "m__absmax": old["m"][1],
                    "v": old["v"][0], "v__absmax": old["v"][1]}]
    sd["stored"] = [{"m": "q8:signed", "v": "q8:unsigned"}]
    q8 = optgen.create("adamw", [np.asarray(full.params[0]).copy()], lr=1e-2,
                       state_format="q8")
    with pytest.warns(UserWarning, match="q8:unsigned -> q8:usqrt"):
        q8.load_state_dict(sd)
    decoded_old = quant.dequantize(*old["v"], "unsigned")
    now = quant.dequantize(q8.state[0]["v"], q8.state[0]["v__absmax"], "usqrt")
    tol = (np.max(np.diff(quant.dynamic_map("usqrt"))) + 1e-6) * np.sqrt(old["v"][1][0])
    assert np.all(np.abs(np.sqrt(now) - np.sqrt(decoded_old)) <= tol)
    # continue: 20 steps from the old form's values, q8 against float32 states
    ref = optgen.create("adamw", [np.asarray(full.params[0]).copy()], lr=1e-2)
    ref.load_state_dict({**full.state_dict(), "state": [{
        **full.state_dict()["state"][0], "m": quant.dequantize(*old["m"], "signed"),
        "v": decoded_old}]})
    for g in grads[10:]:
        q8.step([g.copy()])
        ref.step([g.copy()])
    drift = np.abs(np.asarray(q8.params[0]) - np.asarray(ref.params[0]))
    assert np.max(drift) <= 0.2 * 20 * 1e-2, np.max(drift)      # a fifth of lr a step
    assert np.mean(drift) <= 0.02 * 20 * 1e-2
    # through a file, as opt.save wrote it
    path = tmp_path / "old.npz"
    from optgen.runtime import checkpoint
    checkpoint.save(path, sd)
    again = optgen.create("adamw", [w0.copy()], lr=1e-2, state_format="q8")
    with pytest.warns(UserWarning, match="q8:unsigned -> q8:usqrt"):
        again.load(path)
    np.testing.assert_array_equal(again.state[0]["v"], quant.quantize(decoded_old, "usqrt")[0])


def test_a_torch_format_state_dict_of_the_earlier_form_loads_converted(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import optgen.torch as ot
    p = torch.nn.Parameter(torch.randn(4096))
    opt = ot.AdamW([p], lr=1e-3, state_format="q8")
    p.grad = torch.randn(4096) * torch.tensor([1.0, 1e-4]).repeat(2048)
    opt.step()
    sd = opt.state_dict()          # torch's format: values, their block scales beside
    rec = sd["state"][0]
    v = rec["exp_avg_sq"].numpy()
    codes, absmax = quant.quantize(v, "unsigned")      # the earlier form's values and scales
    rec["exp_avg_sq"] = torch.from_numpy(quant.dequantize(codes, absmax, "unsigned"))
    rec["exp_avg_sq__absmax"] = torch.from_numpy(absmax)
    with pytest.warns(UserWarning, match="float32 -> q8"):
        opt.load_state_dict(sd)
    back = opt.state_dict()["state"][0]["exp_avg_sq"].numpy()
    old = rec["exp_avg_sq"].numpy()
    tol = (np.max(np.diff(quant.dynamic_map("usqrt"))) + 1e-6) * np.sqrt(absmax.max())
    assert np.all(np.abs(np.sqrt(back) - np.sqrt(old)) <= tol)
    assert np.all(back[old > 0] > 0)


def test_an_optgen_format_state_dict_names_its_codes_and_converts_the_earlier_form(rng):
    """The drop-in's optgen-format state_dict names the form of its codes ("stored");
    one that names the earlier form loads converted, with the warning line."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import optgen.torch as ot
    p = torch.nn.Parameter(torch.randn(4096))
    opt = ot.AdamW([p], lr=1e-3, state_format="q8")
    p.grad = torch.randn(4096) * torch.tensor([1.0, 1e-4]).repeat(2048)
    opt.step()
    sd = opt.state_dict(format="optgen")
    assert sd["stored"]["exp_avg_sq"] == "q8:usqrt"
    rec = sd["state"][0]
    v = quant.dequantize(rec["exp_avg_sq"].numpy(), rec["exp_avg_sq__absmax"].numpy(), "usqrt")
    codes, absmax = quant.quantize(v, "unsigned")      # as the earlier form held it
    rec["exp_avg_sq"], rec["exp_avg_sq__absmax"] = torch.from_numpy(codes), torch.from_numpy(absmax)
    sd["stored"]["exp_avg_sq"] = "q8:unsigned"
    with pytest.warns(UserWarning, match="q8:unsigned -> q8:usqrt"):
        opt.load_state_dict(sd)
    st = opt.state_dict(format="optgen")["state"][0]
    want = quant.quantize(quant.dequantize(codes, absmax, "unsigned"), "usqrt")
    np.testing.assert_array_equal(st["exp_avg_sq"].numpy(), want[0])
    np.testing.assert_array_equal(st["exp_avg_sq__absmax"].numpy(), want[1])


def test_q8_warns_at_construction_where_blocks_span_rows():
    """q8's case still not safe: a signed state's blocks over parts of several rows."""
    with pytest.warns(UserWarning, match=r"shape \(16, 384\).*q8@128"):
        optgen.create("adam", [np.zeros((16, 384), F32)], state_format="q8")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optgen.create("adam", [np.zeros((16, 512), F32), np.zeros(5000, F32)],
                      state_format="q8")
        optgen.create("adam", [np.zeros((16, 384), F32)], state_format="q8@128")
        optgen.create("adam", [np.zeros((16, 384), F32)], state_format={"v": "q8"})

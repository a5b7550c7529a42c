"""Compiled kernel == reference interpreter, for every spec in specs/.

A new spec file joins these tests by existing: the table is built from the catalog,
its flags and its hyperparameters, with no test edit.
"""
import functools
import itertools
import textwrap
import zlib

import numpy as np
import pytest

import optgen
from optgen.runtime import artifact
from optgen.runtime.tensors import numpy_dtype
from optgen.core import catalog
from optgen.core import reference, scalar_expr, views
from conftest import offset_array
from helpers import (EXHAUSTIVE, TOL, assert_close, assert_states_close, busy_hypers,
                     catalog_params, default_hypers, family_sampled, matrix_specs, pairwise, statistics, valid as _valid)

SHAPES = [0, 1, 15, 16, 17, 1000, 1_000_003, (31, 17), (8, 3, 3, 3), (2, 0, 5)]
DTYPES = ["float32", "float64"]
# SOAP fits its first basis by eigh of one gradient's g g^T and g^T g; for a non-square
# layer one is rank-deficient, and the eigenvectors of its null space follow the last
# bits of the statistic, which compiled and reference kernels round apart (docs/matrix.md,
# "When the basis is not unique"): its matrix shape here is square (and SOAP-NAdam's).
SQUARE_LAYERS = {"soap": (17, 17), "soap_nadam": (17, 17)}
# the one family (helpers.FAMILY_SPECS) every test here takes in a default run: it is
# built once, with all its variants
KEY = "kernel_vs_reference"


def shapes_for(name: str, flags: dict | None = None) -> list:
    shapes = [SQUARE_LAYERS.get(name, s) if isinstance(s, tuple) and len(s) == 2 else s
              for s in SHAPES]
    if (flags or {}).get("precondition_1d"):   # an n x n statistic per vector: n <= 1000
        shapes = [s for s in shapes if isinstance(s, tuple) or s <= 1000]
    return shapes


@functools.lru_cache(maxsize=None)
def built(name: str):
    """The artifact of catalog spec ``name`` with every variant built: the tests here
    step them all, so the first of them builds them together, into one library (cheaper
    than one at a time). Collection reads the manifest only (``optgen.get_artifact``)."""
    art = optgen.get_artifact(name)
    art.ensure(list(art.variants))
    return art


def cases():
    """(spec, flags, hyperparameter setting) for every valid combination; of a spec with
    three flags or more, the flag values outside a pairwise covering (helpers.pairwise:
    every two flags meet in all four combinations) carry the ``exhaustive`` mark."""
    for name in catalog.list_specs():
        art = optgen.get_artifact(name)
        flag_names = list(art.flags)
        keep = set(pairwise([2] * len(flag_names), rotate=zlib.crc32(name.encode())))
        for bits in itertools.product([False, True], repeat=len(flag_names)):
            flags = dict(zip(flag_names, bits))
            marks = (() if tuple(map(int, bits)) in keep else (EXHAUSTIVE,)) or \
                family_sampled(name, KEY)
            for setting, make in (("default", default_hypers), ("busy", busy_hypers)):
                if _valid(art, make(art, flags)):  # e.g. nesterov needs momentum > 0
                    tag = "-".join(f"{k}{int(v)}" for k, v in flags.items())
                    yield pytest.param(name, flags, setting, id=f"{name}-{setting}-{tag}",
                                       marks=marks)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,flags,setting", list(cases()))
def test_compiled_matches_reference(name, flags, setting, dtype, rng):
    art = built(name)
    hyper = (busy_hypers if setting == "busy" else default_hypers)(art, flags)
    for shape in shapes_for(name, flags):
        w0 = rng.standard_normal(shape).astype(dtype)
        w_c, w_r = offset_array(w0, rng), w0.copy()
        comp = optgen.create(art, [w_c], **hyper)
        ref = optgen.create(art, [w_r], backend="reference", **hyper)
        steps = 2 if np.prod(shape) > 100_000 else 5
        for _ in range(steps):
            g = rng.standard_normal(shape).astype(dtype)
            extra = {n: rng.standard_normal(shape).astype(dtype) for n in art.inputs}
            stats = statistics(comp, rng)   # THOR's A and G on the steps that refresh
            comp.step([offset_array(g, rng)], **{n: [offset_array(a, rng)] for n, a in extra.items()},
                      **stats)
            ref.step([g], **{n: [a] for n, a in extra.items()}, **stats)
        if any(getattr(v, "dtype", None) == np.float16 for v in comp.state[0].values()):
            # float16 states one ulp apart on one step feed the next steps' update
            np.testing.assert_allclose(w_c, w_r, rtol=2e-4, atol=2e-4 * np.abs(w_r).max(initial=0),
                                       err_msg=f"{name} w, shape {shape} (float16 states)")
        else:
            assert_close(w_c, w_r, dtype, f"{name} w, shape {shape}")
        assert_states_close(comp, ref, dtype, f"{name} {setting}, shape {shape}")


RAW_SHAPES = [(1009,), (7, 13, 11), (13, 11), (11, 13),   # (matrix rules: tall and wide;
              (3, 10001), (10001, 3)]                      # SOAP: one side over 10000)
KIND = {"brc": "param", "br": "row", "bc": "col", "RC": "param", "RR": "rr", "CC": "cc"}


PROBE_SHAPES = [(), (5,), (5, 7), (7, 5), (3, 5, 7), (2, 3, 5, 7)]   # one of each ndim


def _flag_env(art, shape) -> dict:
    """What a shape flag's rule reads: the shape's sizes and the hyperparameters' defaults
    (Shampoo's max_preconditioner_dim)."""
    return {**{h: info.default for h, info in art.hypers.items() if info.default is not None},
            **views.shape_env(shape)}


def _fits(art, k, shape) -> bool:
    env = _flag_env(art, shape)
    return all(bool(scalar_expr.evaluate(rule, env)) == k.flags[n]
               for n, rule in art.shape_flags.items())


def _raw_shape(art, k):
    """A parameter shape whose shape flags (e.g. "factored") are those of kernel ``k``;
    None for a kernel no shape reaches (shape flags that exclude each other, such as
    Shampoo's ``matrix`` and ``vector``)."""
    for shape in RAW_SHAPES:
        if _fits(art, k, shape):
            return shape
    if not any(_fits(art, k, shape) for shape in PROBE_SHAPES):
        return None
    raise AssertionError(f"no test shape for {k.symbol}")


@pytest.mark.parametrize("name", catalog_params(catalog.list_specs(), KEY))
def test_raw_kernel_on_misaligned_states(name, rng):
    """Call each compiled kernel's launches directly with *every* buffer at a 16-byte
    offset (reduction workspaces included)."""
    art = built(name)
    for k in art.kernels:
        if k.mixed:  # test_mixed_precision_kernels_match_reference
            continue
        shape = _raw_shape(art, k)
        if shape is None:   # no parameter ever gets this kernel
            continue
        d = views.dims(shape)
        arrays = {}
        for b in k.buffers:
            axes = k.buffer_axes[b]
            if b in k.workspaces:
                ext = (art.reduction_buffer_size,) if not axes else views.extents(d, axes)
                dtype = np.float64 if b.startswith("_red") else k.dtype   # matrix temporaries
                arrays[b] = offset_array(np.zeros(ext, dtype), rng)
            else:
                value = rng.standard_normal(views.state_shape(shape, KIND[axes])).astype(
                    k.storage.get(b, k.dtype))
                arrays[b] = offset_array(np.abs(value) if b != "w" and b != "grad" else value, rng)
        scalars = {s: 0.25 for s in k.scalars}
        if "clip_gradient" in scalars:
            scalars["clip_gradient"] = 0.5
        scalars.update({s: 2 for s in k.scalars if s in art.hypers and   # repeat() counts
                        art.hypers[s].type == "int"})
        scalars.update({ln["heads"]: 1 for ln in k.launches   # numbers of heads (head_mean):
                        if isinstance(ln.get("heads"), str)})  # 1 divides every R
        env = {**scalars, **views.shape_env(shape)}
        scalars.update({s: scalar_expr.evaluate(e, env) for s, e in k.host_scalars.items()
                        if scalar_expr.names(e) & {"rows", "cols"}})   # shape scalars
        plain = {b: a for b, a in arrays.items() if b not in k.workspaces}
        expect = reference.evaluate(k.ir, k.dtype, plain, k.buffer_axes, scalars, d)
        scalar_array = offset_array(np.array([scalars[s] for s in k.scalars], k.dtype), rng)
        launches = list(k.launches)
        while launches:
            ln = launches.pop(0)
            if ln["kind"] == "repeat":   # the body runs 'count' times: unroll it here
                body = launches[:ln["length"]]
                launches[:ln["length"]] = body * scalars[ln["count"]]
                continue
            art.function(ln["symbol"])(*(views.as_kernel(arrays[b], k.buffer_axes[b], d,
                                                         ln["view"]) for b in ln["buffers"]),
                                       scalar_array)
        for out, value in expect.items():
            assert_close(arrays[out], value, k.dtype, f"{k.symbol} output {out}")


def lazy_specs():
    for name in catalog.list_specs():
        art = optgen.get_artifact(name)
        if all(k.lazy is not None for k in art.kernels):
            yield name


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", catalog_params(lazy_specs(), KEY))
def test_lazy_rows_match_dense_rows(name, dtype, rng):
    """Every row-wise elementwise spec has a lazy (row-sparse) variant: rows not named
    stay bit-identical, named rows equal the dense update of a parameter made of those
    rows (compiled and reference backends), duplicate indices are summed."""
    art = built(name)
    hyper = busy_hypers(art, {n: h.default for n, h in art.flags.items()})
    shape = (37, 5, 3)
    idx = np.array([4, 0, 36, 4, 17, 9])
    uniq = np.unique(idx)
    w0 = rng.standard_normal(shape).astype(dtype)
    rows = rng.standard_normal((len(idx),) + shape[1:]).astype(dtype)
    summed = np.zeros((len(uniq),) + shape[1:], dtype)
    np.add.at(summed, np.searchsorted(uniq, idx), rows)
    for backend in ("compiled", "reference"):
        w = offset_array(w0, rng)
        opt = optgen.create(art, [w], backend=backend, lazy_update=True, **hyper)
        dense_w = w0[uniq].copy()
        dense = optgen.create(art, [dense_w], backend=backend, **hyper)
        for _ in range(3):
            opt.step([optgen.RowSparse(idx, rows)])
            dense.step([summed])
        others = np.setdiff1d(np.arange(shape[0]), uniq)
        assert np.array_equal(w[others], w0[others]), f"{name}: untouched rows changed"
        np.testing.assert_allclose(w[uniq], dense_w, **TOL[dtype])
        for sname, value in opt.state[0].items():
            if isinstance(value, np.ndarray) and value.ndim:
                init = optgen.create(art, [w0.copy()], **hyper).state[0][sname]
                assert np.array_equal(value[others], init[others]), f"{name}: {sname} rows"
                np.testing.assert_allclose(value[uniq], dense.state[0][sname], **TOL[dtype],
                                           err_msg=f"{name} {backend}: state {sname}")
            else:                         # a scalar state: as the dense update's
                assert_close(value, dense.state[0][sname], dtype,
                             f"{name} {backend}: scalar state {sname}")
        assert sorted(opt.state[0]) == sorted(dense.state[0]), name


# -- mixed precision (multi_precision): float32 master, low-precision parameter copy ------
LOW_DTYPES = ["float16", "bfloat16"]
MIXED_SHAPES = [(0,), (1,), (17,), (31, 17), (1000,), (100_003,), (7, 13, 11)]


def _shape_flags_hold(art, k, shape: tuple) -> bool:
    env = _flag_env(art, shape)
    return all(bool(scalar_expr.evaluate(rule, env)) == k.flags[n]
               for n, rule in art.shape_flags.items())


def mixed_kernels():
    for name in catalog.list_specs():   # (matrix specs: their fallback rule, 1-D shapes;
        for k in optgen.get_artifact(name).kernels:   # the matrix kernels' mixed precision:
            if k.mixed and not k.matrix:              # test_matrix_low_precision.py)
                yield pytest.param(name, k.symbol, id=k.symbol,
                                   marks=family_sampled(name, KEY))


def _mixed_arrays(art, k, shape, rng, scalars, states="random") -> dict[str, np.ndarray]:
    """Every buffer of ``k`` at a random element-size offset (bfloat16 and float16
    arrays start 2 bytes off a 4-byte boundary at times): a float32 master, gradients
    and extra inputs in the low dtype, a w_low holding the master rounded but for one
    element in eight written from outside (there the kernel reads it as the master),
    float64 workspaces, and states in their storage dtype: random positive values, or
    (``states="init"``) their initial values, as on a first step."""
    d = views.dims(shape)
    init = {s.name: s.init for s in art.states}
    arrays = {}
    for b in k.buffers:
        axes = k.buffer_axes[b]
        if b in k.workspaces:
            value = np.zeros((art.reduction_buffer_size,) if not axes else views.extents(d, axes))
        else:
            kind = {"brc": "param", "br": "row", "bc": "col"}[axes]
            value = rng.standard_normal(views.state_shape(shape, kind))
            if b in init and states == "init" and init[b] == "w":   # (a copy of w: below)
                pass
            elif b in init and states == "init":
                value[...] = scalar_expr.evaluate(str(init[b]), scalars)
            elif b in init:
                value = np.abs(value)  # positive, like second moments
            value = value.astype(numpy_dtype(k.storage.get(b, k.dtype)))
        arrays[b] = offset_array(value, rng, unit=value.itemsize)
    for b in arrays:
        if init.get(b) == "w" and states == "init":   # (Prodigy's w0: the master's values)
            arrays[b][...] = arrays["w"]
    if "w_low" in arrays:
        low = arrays["w_low"]
        written = rng.random(low.shape) < 1 / 8
        low[...] = np.where(written, low, arrays["w"].astype(low.dtype))
    return arrays


def _run(art, k, arrays, d, scalar_array) -> None:
    """All launches of ``k``; numpy bfloat16 arrays go through artifact.bfloat16_tensor
    (numpy's DLPack export refuses ml_dtypes' bfloat16)."""
    for ln in k.launches:
        art.function(ln["symbol"])(
            *(artifact.bfloat16_tensor(views.as_kernel(arrays[b], k.buffer_axes[b], d,
                                                       ln["view"])) for b in ln["buffers"]),
            scalar_array)


def _raw_scalars(k) -> dict[str, float]:
    scalars = {s: 0.25 for s in k.scalars}
    if "clip_gradient" in scalars:
        scalars["clip_gradient"] = 0.5
    scalars.update({ln["heads"]: 1 for ln in k.launches if isinstance(ln.get("heads"), str)})
    return scalars


def _assert_bits_equal(actual, expected, msg):
    same = actual.dtype == expected.dtype and \
        np.array_equal(actual.view(np.uint8), expected.view(np.uint8))
    assert same, msg


@pytest.mark.parametrize("name,symbol", list(mixed_kernels()))
def test_mixed_precision_kernels_match_reference(name, symbol, rng):
    """Each mixed-precision kernel (float16 or bfloat16 parameter, float32 master and
    states), called launch by launch on misaligned arrays:

    * the master and the states match the reference interpreter, and are bit-identical
      to what the plain float32 kernel computes from the gradients widened to float32;
    * w_low is exactly the new master rounded to nearest even (numpy's float16 cast,
      ml_dtypes' bfloat16 cast); the gradients are left untouched;
    * where w_low was not the master rounded (written from outside), the master the
      kernel steps is w_low (the float32 kernel given that master agrees).

    The large shape starts from the states' initial values: random states there hit
    elements where a rule cancels (rmsprop centered's ``n - g*g`` near 0) and the
    kernel's and interpreter's float32 roundings drift apart, as with float32 kernels."""
    art = built(name)
    k = next(k for k in art.kernels if k.symbol == symbol)
    plain_k = art.kernel_for("float32", k.flags)
    low = k.param_dtype
    assert k.dtype == "float32" and low in LOW_DTYPES
    grads = ("grad", *art.inputs)
    assert all(k.storage[b] == low for b in ("w_low", *grads))
    shapes = [s for s in MIXED_SHAPES if _shape_flags_hold(art, k, s)]
    assert shapes, f"no test shape for {symbol}"
    for shape in shapes:
        d = views.dims(shape)
        scalars = _raw_scalars(k)
        arrays = _mixed_arrays(art, k, shape, rng, scalars,
                               "init" if np.prod(shape) > 10_000 else "random")
        before = {b: a.copy() for b, a in arrays.items() if b not in k.workspaces}
        expect = reference.evaluate(k.ir, k.dtype, before, k.buffer_axes, scalars, d)
        scalar_array = offset_array(np.array([scalars[s] for s in k.scalars], k.dtype), rng)
        plain = {b: a.astype(np.float32) if b in grads else a.copy()
                 for b, a in arrays.items() if b != "w_low"}
        plain["w"] = reference.adopted(plain["w"], arrays["w_low"], np.float32)
        _run(art, plain_k, plain, d, scalar_array)
        _run(art, k, arrays, d, scalar_array)
        msg = f"{symbol} shape {shape}"
        for b in grads:
            _assert_bits_equal(arrays[b], before[b], f"{msg}: {b} changed")
        _assert_bits_equal(expect["w_low"], expect["w"], f"{msg}: reference w_low != new w")
        for out, value in expect.items():
            if out != "w_low":
                assert_close(arrays[out], value, k.dtype, f"{msg} output {out}")
                _assert_bits_equal(arrays[out], plain[out], f"{msg}: {out} != float32 kernel's")
        _assert_bits_equal(arrays["w_low"], arrays["w"].astype(low),
                           f"{msg}: w_low is not the new master rounded")


@pytest.mark.parametrize("low", LOW_DTYPES)
@pytest.mark.parametrize("name", catalog_params(lazy_specs(), KEY))
def test_mixed_precision_lazy_rows(name, low, rng):
    """The lazy (row-sparse) launch of a mixed kernel: the named rows of the master, its
    states and w_low change as the reference says on those rows (w_low the rounded
    master); the other rows stay bit-identical."""
    art = built(name)
    flags = {n: h.default for n, h in art.flags.items()}
    k = art.kernel_for(low, flags)
    shape, idx = (37, 5, 3), np.array([0, 4, 9, 17, 36])
    others = np.setdiff1d(np.arange(shape[0]), idx)
    scalars = _raw_scalars(k)
    arrays = _mixed_arrays(art, k, shape, rng, scalars)
    before = {b: a.copy() for b, a in arrays.items()}
    rows = offset_array(rng.standard_normal((len(idx), 15)).astype(low), rng, unit=2)
    sub = {"grad": rows.reshape(-1), **{b: a.reshape(shape[0], -1)[idx].reshape(-1)
                                        for b, a in arrays.items() if b != "grad"}}
    expect = reference.evaluate(k.ir, k.dtype, sub, k.buffer_axes, scalars, (1, 1, rows.size))
    args = {**{b: a.reshape(-1) for b, a in arrays.items()}, "grad": rows, "_indices": idx}
    art.function(k.lazy["symbol"])(
        *(artifact.bfloat16_tensor(args[b]) for b in k.lazy["buffers"]),
        np.array([scalars[s] for s in k.scalars], k.dtype))
    row = {b: a.reshape(shape[0], -1) for b, a in arrays.items() if b != "grad"}
    for b, a in row.items():
        _assert_bits_equal(a[others], before[b].reshape(shape[0], -1)[others],
                           f"{name} {low}: untouched rows of {b} changed")
        if b in expect and b != "w_low":
            assert_close(a[idx].reshape(-1), expect[b], k.dtype, f"{name} {low} {b}")
    _assert_bits_equal(row["w_low"][idx], row["w"][idx].astype(low),
                       f"{name} {low}: w_low is not the new master rounded")


@pytest.mark.parametrize("name", catalog_params(sorted(set(catalog.list_specs()) - matrix_specs()),
                                                 KEY))
def test_mixed_precision_manifest(name):
    """Every plain kernel has a float16 and a bfloat16 twin: same flags, float32 compute,
    w_low after w, gradients and w_low stored in the low dtype, the rest unchanged."""
    art = built(name)
    assert art.dtypes == ["float32", "float64"]
    assert art.mixed_dtypes == ["bfloat16", "float16"]
    tags = {"float16": "f16", "bfloat16": "bf16"}
    for k in art.kernels:
        if k.mixed:
            continue
        assert k.param_dtype == k.dtype and art.kernel_for(k.dtype, k.flags) is k
        if k.dtype != "float32":
            continue
        for low in LOW_DTYPES:
            m = art.kernel_for(low, k.flags)
            assert m.mixed and m.dtype == "float32" and m.param_dtype == low
            assert m.symbol == k.symbol.replace("_f32", f"_{tags[low]}", 1)
            assert m.buffers == [x for b in k.buffers for x in ([b, "w_low"] if b == "w" else [b])]
            assert m.buffer_axes == {**k.buffer_axes, "w_low": "brc"}
            low_bufs = ("w_low", "grad", *art.inputs)
            assert m.storage == {**k.storage, **{b: low for b in low_bufs}}
            assert m.ir["outputs"]["w_low"] == m.ir["outputs"]["w"]
            assert m.scalars == k.scalars and len(m.launches) == len(k.launches)
            for ml, kl in zip(m.launches, k.launches):
                assert [b for b in ml["buffers"] if b != "w_low"] == kl["buffers"]
                assert ("w_low" in ml["buffers"]) == ("w" in kl["buffers"])   # (read with w)
                assert ("w_low" in ml.get("outputs", ())) == ("w" in kl.get("outputs", ()))
            assert (m.lazy is None) == (k.lazy is None)
            if m.lazy is not None:
                assert "w_low" in m.lazy["buffers"] and "w_low" in m.lazy["outputs"]


PASS_THROUGH = '''
"""w unchanged while lr == 0 (a select: no arithmetic touches w), else w - lr * grad."""
from optgen.dsl import Spec, where
spec = Spec("passthrough", __doc__)
lr = spec.hyper("lr", 0.0, "lr >= 0", "step")

@spec.update
def rule(w, grad, flags):
    return {w: where(lr > 0, w - lr * grad, w)}
'''


def _float32_edge_values(rng) -> np.ndarray:
    """Every kind of float32 for the rounding: random bit patterns (NaNs with every
    payload, subnormals, infinities included), the exact midpoints between neighbouring
    bfloat16 and float16 values and their float32 neighbours (ties to even), overflow."""
    bits = [rng.integers(0, 2**32, 1 << 18, dtype=np.uint64).astype(np.uint32)]
    bf16 = rng.integers(0, 2**16, 1 << 12, dtype=np.uint64).astype(np.uint32) << 16
    f16 = rng.standard_normal(1 << 12).astype(np.float16).astype(np.float32).view(np.uint32)
    for mid in (bf16 | 0x8000, f16 + (1 << 12)):  # + half an ulp of the low dtype
        bits += [mid - 1, mid, mid + 1]
    special = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF,
               0x00000001, 0x7F7F8000, 0x7F7F7FFF,       # bfloat16: rounds to inf / to max
               0x477FF000, 0x477FEFFF, 0x477FF001,       # float16: 65520 (inf), below, above
               0x33000000, 0x33000001, 0x387FE000,       # float16 subnormal ties, boundary
               0x7F800001, 0x7FBFFFFF, 0xFF800001,       # signaling NaNs
               0x7FC00000, 0x7FFF8000, 0x7FFFFFFF, 0xFFFFFFFF]  # TVM's cast made inf / 0
    return np.concatenate(bits + [np.array(special, np.uint32)]).view(np.float32)


@pytest.mark.parametrize("low", LOW_DTYPES)
def test_mixed_precision_rounding_is_numpys(low, tmp_path_factory, rng):
    """w_low = the master rounded to nearest even, bit-identical to numpy's float16 and
    ml_dtypes' bfloat16 casts for every float32, through the vector loop and the scalar
    tail. bfloat16 NaNs become ml_dtypes' quiet NaN of their sign (lower_bits.narrow). One
    documented difference: float16 quiets a *signaling* NaN (x86 F16C, IEEE 754) where
    numpy keeps it signaling; both are NaN of the same sign (and the kernel, reading
    w_low as numpy rounded it, takes that NaN for its master: a weight it did not
    write)."""
    path = tmp_path_factory.mktemp("spec") / "passthrough.py"
    path.write_text(textwrap.dedent(PASS_THROUGH))
    art = optgen.get_artifact(str(path))
    k = art.kernel_for(low, {})
    master = offset_array(_float32_edge_values(rng), rng, unit=4)
    before = master.copy()
    with np.errstate(invalid="ignore", over="ignore"):
        want = master.astype(low)
    # (w_low is read too: given as numpy rounds, the kernel keeps every master it
    # rounds alike)
    arrays = {"w": master, "w_low": offset_array(want.copy(), rng, unit=2),
              "grad": offset_array(np.ones(master.size, low), rng, unit=2)}
    scalars = {s: 0.0 for s in k.scalars}
    _run(art, k, arrays, views.dims(master.shape), np.array([scalars[s] for s in k.scalars],
                                                             np.float32))
    snan = np.isnan(before) & ((before.view(np.uint32) & 0x00400000) == 0) & (
        low == "float16")
    _assert_bits_equal(master[~snan], before[~snan], "the master changed")
    got_bits, want_bits = arrays["w_low"].view(np.uint16), want.view(np.uint16)
    differ = got_bits != want_bits
    if low == "float16":  # signaling NaN in: quiet NaN of the same sign out
        assert np.all(np.isnan(arrays["w_low"][snan])) and np.all(np.isnan(master[snan]))
        assert np.array_equal(got_bits[snan] >> 15, want_bits[snan] >> 15)
        differ &= ~snan
    assert not differ.any(), [(hex(b), hex(g), hex(w)) for b, g, w in zip(
        master.view(np.uint32)[differ][:5], got_bits[differ][:5], want_bits[differ][:5])]

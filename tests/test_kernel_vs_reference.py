"""Compiled kernel == reference interpreter, for every spec in specs/.

A new spec file joins these tests by existing: the table is built from the catalog,
its flags and its hyperparameters, with no test edit.
"""
import itertools

import numpy as np
import pytest

import optgen
from optgen.runtime import catalog, hyper as hyper_rules, reference, scalar_expr, views
from conftest import offset_array

SHAPES = [0, 1, 15, 16, 17, 1000, 1_000_003, (31, 17), (8, 3, 3, 3), (2, 0, 5)]
DTYPES = ["float32", "float64"]
# float32: ~80 ulps. Kernel and interpreter round differently where LLVM fuses multiply-adds,
# in T.pow against np.power, and in the order of float64 reduction sums; rules that
# subtract nearly equal values (FTRL's accum**p differences) amplify that to ~2.5e-6.
# An element that is the small difference of large terms (FTRL's linear = sum of
# g - sigma * w with |w| ~ 100) carries the round-off of those terms, so atol also
# scales with the array's largest value (SCALE_ATOL * max|expected|).
TOL = {"float32": dict(rtol=1e-5, atol=1e-6), "float64": dict(rtol=1e-12, atol=1e-13),
       "float16": dict(rtol=2.5e-3, atol=1e-6)}
SCALE_ATOL = {"float32": 1e-5, "float64": 1e-12, "float16": 1e-3}


def assert_close(actual, expected, dtype, msg):
    expected = np.asarray(expected)
    if expected.dtype == np.float16:
        # compressed states: kernel and interpreter may round one float16 ulp apart
        # (2**-10 relative) where their float32 values differ in the last bits
        dtype = "float16"
    scale = float(np.max(np.abs(expected[np.isfinite(expected)]), initial=0.0))
    atol = max(TOL[dtype]["atol"], SCALE_ATOL[dtype] * scale)
    np.testing.assert_allclose(actual, expected, rtol=TOL[dtype]["rtol"], atol=atol,
                               err_msg=msg)
CANDIDATES = [0.5, 0.9, 0.1, 0.03, 0.7, 1e-3, 2.0]


def busy_hypers(art, flags):
    """Every numeric hyperparameter moved off its default to a valid value (so momentum,
    weight decay and clipping are exercised), found generically from the constraints."""
    values = {n: h.default for n, h in art.hypers.items()}
    values.update(flags)
    for name, info in art.hypers.items():
        if info.is_flag:
            continue
        for c in CANDIDATES:
            if c == info.default:
                continue
            try:
                values = hyper_rules.resolve(art.name, art.hypers, [], values, {name: c})
                break
            except (TypeError, ValueError):
                continue
    if not _valid(art, values):  # a requirement rejects the mix: undo one change
        for name, info in art.hypers.items():
            trial = {**values, name: info.default}
            if not info.is_flag and _valid(art, trial):
                return trial
    return values


def default_hypers(art, flags):
    return {n: h.default for n, h in art.hypers.items() if not h.is_flag} | flags


def cases():
    """(spec, flags, hyperparameter setting) for every valid combination."""
    for name in catalog.list_specs():
        art = optgen.get_artifact(name)
        flag_names = list(art.flags)
        for bits in itertools.product([False, True], repeat=len(flag_names)):
            flags = dict(zip(flag_names, bits))
            for setting, make in (("default", default_hypers), ("busy", busy_hypers)):
                if _valid(art, make(art, flags)):  # e.g. nesterov needs momentum > 0
                    tag = "-".join(f"{k}{int(v)}" for k, v in flags.items())
                    yield pytest.param(name, flags, setting, id=f"{name}-{setting}-{tag}")


def _valid(art, hyper):
    try:
        hyper_rules.resolve(art.name, art.hypers, art.requirements,
                            {n: h.default for n, h in art.hypers.items()}, hyper)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,flags,setting", list(cases()))
def test_compiled_matches_reference(name, flags, setting, dtype, rng):
    art = optgen.get_artifact(name)
    hyper = (busy_hypers if setting == "busy" else default_hypers)(art, flags)
    for shape in SHAPES:
        w0 = rng.standard_normal(shape).astype(dtype)
        w_c, w_r = offset_array(w0, rng), w0.copy()
        comp = optgen.create(art, [w_c], **hyper)
        ref = optgen.create(art, [w_r], backend="reference", **hyper)
        steps = 2 if np.prod(shape) > 100_000 else 5
        for _ in range(steps):
            g = rng.standard_normal(shape).astype(dtype)
            extra = {n: rng.standard_normal(shape).astype(dtype) for n in art.inputs}
            comp.step([offset_array(g, rng)], **{n: [offset_array(a, rng)] for n, a in extra.items()})
            ref.step([g], **{n: [a] for n, a in extra.items()})
        if any(getattr(v, "dtype", None) == np.float16 for v in comp.state[0].values()):
            # float16 states one ulp apart on one step feed the next steps' update
            np.testing.assert_allclose(w_c, w_r, rtol=2e-4, atol=2e-4 * np.abs(w_r).max(initial=0),
                                       err_msg=f"{name} w, shape {shape} (float16 states)")
        else:
            assert_close(w_c, w_r, dtype, f"{name} w, shape {shape}")
        for sname, value in comp.state[0].items():
            assert_close(value, ref.state[0][sname], dtype, f"{name} state {sname}, shape {shape}")


RAW_SHAPES = [(1009,), (7, 13, 11)]


def _raw_shape(art, k):
    """A parameter shape whose shape flags (e.g. "factored") are those of kernel ``k``."""
    for shape in RAW_SHAPES:
        env = {"ndim": len(shape), "numel": int(np.prod(shape))}
        if all(bool(scalar_expr.evaluate(rule, env)) == k.flags[n]
               for n, rule in art.shape_flags.items()):
            return shape
    raise AssertionError(f"no test shape for {k.symbol}")


@pytest.mark.parametrize("name", list(catalog.list_specs()))
def test_raw_kernel_on_misaligned_states(name, rng):
    """Call each compiled kernel's launches directly with *every* buffer at a 16-byte
    offset (reduction workspaces included)."""
    art = optgen.get_artifact(name)
    for k in art.kernels:
        shape = _raw_shape(art, k)
        d = views.dims(shape)
        arrays = {}
        for b in k.buffers:
            axes = k.buffer_axes[b]
            if b in k.workspaces:
                ext = (art.reduction_buffer_size,) if not axes else views.extents(d, axes)
                arrays[b] = offset_array(np.zeros(ext), rng)
            else:
                kind = {"brc": "param", "br": "row", "bc": "col"}[axes]
                value = rng.standard_normal(views.state_shape(shape, kind)).astype(
                    k.storage.get(b, k.dtype))
                arrays[b] = offset_array(np.abs(value) if b != "w" and b != "grad" else value, rng)
        scalars = {s: 0.25 for s in k.scalars}
        if "clip_gradient" in scalars:
            scalars["clip_gradient"] = 0.5
        plain = {b: a for b, a in arrays.items() if b not in k.workspaces}
        expect = reference.evaluate(k.ir, k.dtype, plain, k.buffer_axes, scalars, d)
        scalar_array = offset_array(np.array([scalars[s] for s in k.scalars], k.dtype), rng)
        for ln in k.launches:
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
@pytest.mark.parametrize("name", list(lazy_specs()))
def test_lazy_rows_match_dense_rows(name, dtype, rng):
    """Every row-wise elementwise spec has a lazy (row-sparse) variant: rows not named
    stay bit-identical, named rows equal the dense update of a parameter made of those
    rows (compiled and reference backends), duplicate indices are summed."""
    art = optgen.get_artifact(name)
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
            if isinstance(value, np.ndarray):
                init = optgen.create(art, [w0.copy()], **hyper).state[0][sname]
                assert np.array_equal(value[others], init[others]), f"{name}: {sname} rows"
                np.testing.assert_allclose(value[uniq], dense.state[0][sname], **TOL[dtype])

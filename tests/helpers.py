"""Helpers shared by the kernel-vs-reference tests of every target (llvm, c, opencl,
cuda): tolerances, and the "busy" hyperparameter setting found from the constraints."""
import functools
import importlib.util
import itertools
import os
import sys
import zlib
from typing import Sequence

import numpy as np
import pytest

from optgen.core.hyper import busy_hypers, valid  # noqa: F401  (shared with optgen check)

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


def assert_states_close(got, want, dtype, msg):
    """Every state of every parameter of optimizer ``got`` (tensor states and host
    scalar states) against ``want``'s, and their step counts: the same state names on
    both sides, each value within ``assert_close``'s tolerance, the state named in the
    message. (The parameters are the caller's to compare.)"""
    assert len(got.state) == len(want.state), f"{msg}: {len(got.state)} != {len(want.state)} parameters"
    for i, (sg, sw) in enumerate(zip(got.state, want.state)):
        where = msg if len(got.state) == 1 else f"{msg}, parameter {i}"
        assert sorted(sg) == sorted(sw), f"{where}: states {sorted(sg)} != {sorted(sw)}"
        for name in sorted(sw):
            kind = "state" if getattr(sw[name], "ndim", 0) else "scalar state"
            assert_close(sg[name], sw[name], dtype, f"{where}: {kind} {name}")
    assert got._steps == want._steps, f"{msg}: step counts {got._steps} != {want._steps}"


def default_hypers(art, flags):
    return {n: h.default for n, h in art.hypers.items() if not h.is_flag} | flags


@functools.lru_cache(maxsize=None)
def matrix_specs() -> frozenset:
    """Catalog specs whose rule multiplies matrices (THOR, Muon): built for llvm only, with
    no mixed-precision variant of their 2-D rule."""
    from optgen.compiler.loader import load_spec
    from optgen.compiler.verify import verify
    from optgen.core import catalog
    return frozenset(n for n, path in catalog.list_specs().items()
                     if any(tr.matrix for tr in verify(load_spec(path))))


def statistics(opt, rng) -> dict:
    """Random statistics (symmetric positive definite, like a^T a) for every 2-D parameter
    when ``opt``'s next step refreshes (THOR); {} otherwise."""
    from optgen.commands import random_statistics
    return random_statistics(opt, rng)


def finite_differences(loss, params: dict, h: float = 1e-6) -> dict:
    """Central differences of ``loss()`` (a float) in every entry of every array of
    ``params``, which it reads; each entry is restored after its two evaluations."""
    out = {}
    for name, p in params.items():
        numeric = np.empty_like(p)
        for idx in np.ndindex(p.shape):
            saved = p[idx]
            p[idx] = saved + h
            up = loss()
            p[idx] = saved - h
            down = loss()
            p[idx] = saved
            numeric[idx] = (up - down) / (2 * h)
        out[name] = numeric
    return out


# -- the torch drop-in tests (torch imported inside: these helpers are shared with tests
# that run without torch) ----------------------------------------------------------------
def torch_mlp(dtype=None, seed: int = 0):
    """The small MLP the drop-in tests train: 8 -> 16 (tanh) -> 4, seeded weights."""
    import torch
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    return model if dtype is None else model.to(dtype)


def torch_train(model, opt, steps: int, seed: int = 1, dtype=None) -> None:
    """``steps`` steps of ``opt`` on ``model``: seeded random batches (32 rows), MSE."""
    import torch
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g)
        if dtype is not None:
            x, y = x.to(dtype), y.to(dtype)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def torch_drop_in(name: str) -> type:
    """optgen.torch's seed-form class of that name (optgen.torch.seeds: the catalog spec's
    rule); "LARS" is LARS on momentum (no class of its own)."""
    import optgen.torch as ot
    return ot.make("lars", base="momentum") if name == "LARS" else getattr(ot.seeds, name)


def load_example(name: str, folder: str = "examples"):
    """examples/<name>.py (or ``folder``/<name>.py: bench) as a module (not a package),
    registered in sys.modules (dataclasses look their module up there)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        folder, f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"{folder.rstrip('s')}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module



def cupy_gpu_count(cp) -> int:
    """The NVIDIA GPUs CuPy sees (0 where CuPy has no driver)."""
    try:
        return cp.cuda.runtime.getDeviceCount()
    except Exception:  # CuPy without a driver
        return 0


def cupy_gpu():
    """CuPy, where it sees an NVIDIA GPU and nvcc can build for it; else the test skips
    with the reason (CI has no GPU)."""
    import shutil
    import pytest
    cp = pytest.importorskip("cupy", reason="the CUDA runs need CuPy (pip install 'optgen[cuda]')")
    if cupy_gpu_count(cp) == 0:
        pytest.skip("needs an NVIDIA GPU (CuPy sees none)")
    if shutil.which("nvcc") is None:
        pytest.skip("building for cuda needs nvcc")
    return cp


# -- sampling large cross-products --------------------------------------------------------
EXHAUSTIVE = pytest.mark.exhaustive


def exhaustive(config) -> bool:
    """Whether this run takes every case (--exhaustive or OPTGEN_EXHAUSTIVE=1)."""
    return bool(config.getoption("--exhaustive") or os.environ.get("OPTGEN_EXHAUSTIVE") == "1")


def covering_variants(art) -> list[str]:
    """A few of an artifact's variants (``art.variants``: name -> its parameter dtype and
    flag values) that hold every parameter dtype and every value of every flag at least
    once: the default variants first, then greedily the one adding the most values not
    held yet (adam: f32, f64-use_nesterov, f16, bf16 of its 8)."""
    def values(name: str) -> set:
        v = art.variants[name]
        return {("dtype", v["param_dtype"]), *v["flags"].items()}
    todo = set().union(*map(values, art.variants))
    out = []
    for name in art.default_variants:
        out.append(name)
        todo -= values(name)
    while todo:
        best = max(art.variants, key=lambda n: len(values(n) & todo))
        out.append(best)
        todo -= values(best)
    return out


def variant_views(art, names) -> list[tuple[str, dict]]:
    """(folder, manifest) of each of those variants of ``art``, built if needed, one by
    one (a variant built with others shares their library: ``Artifact.ensure``): the
    variant's manifest (its library's record merged into the artifact's) with only its
    own kernels, which is what a test of one library's code reads."""
    out = []
    for v in map(art.variant, names):
        kernels = [k for k in v.manifest["kernels"] if k["variant"] == v.name]
        out.append((v.path, {**v.manifest, "kernels": kernels}))
    return out


def pairwise(sizes: Sequence[int], rotate: int = 0) -> list[tuple[int, ...]]:
    """Index tuples over factors of ``sizes`` levels that hold every pair of levels of
    every two factors at least once (a greedy covering array: for 4x2x2x2, 8 tuples of
    32). ``rotate`` changes which tuples win ties, so rows of a larger table (one per
    spec, say) cover different triples while each covers every pair."""
    full = list(itertools.product(*(range(n) for n in sizes)))
    if len(sizes) < 3:
        return full
    k = len(sizes)
    todo = {(a, b, x, y) for a in range(k) for b in range(a + 1, k)
            for x in range(sizes[a]) for y in range(sizes[b])}
    order = full[rotate % len(full):] + full[:rotate % len(full)]
    out = []
    while todo:
        best = max(order, key=lambda t: sum((a, b, t[a], t[b]) in todo
                                            for a in range(k) for b in range(a + 1, k)))
        out.append(best)
        todo -= {(a, b, best[a], best[b]) for a in range(k) for b in range(a + 1, k)}
    return sorted(out)


def flag_combinations(config, names: Sequence[str], extra: Sequence[Sequence] = ()):
    """``(flags, *levels)`` over the boolean flags ``names`` and the ``extra`` factors
    (each a list of levels): every combination in an exhaustive run (``--exhaustive``),
    else a pairwise covering, where every two factors still meet in each pair of their
    values (adafactor's 4 flags x 2 parameter dtypes: 6 of 32)."""
    sizes = [2] * len(names) + [len(e) for e in extra]
    combos = itertools.product(*(range(n) for n in sizes)) if exhaustive(config) \
        else pairwise(sizes)
    for c in combos:
        flags = {n: bool(b) for n, b in zip(names, c)}
        yield (flags, *(e[i] for e, i in zip(extra, c[len(names):])))


def sampled_product(head: Sequence[tuple], factors: Sequence[Sequence], *,
                    head_ids: Sequence[str], factor_ids: Sequence[Sequence[str]]) -> list:
    """``pytest.param``s of head x factors (each head row: a tuple of arguments, followed
    by one value of each factor): every head row runs a pairwise covering of the factors
    (rotated per row), and the other combinations carry the ``exhaustive`` mark (run by
    ``--exhaustive``)."""
    sizes = [len(f) for f in factors]
    out = []
    for r, (row, rid) in enumerate(zip(head, head_ids)):
        keep = set(pairwise(sizes, rotate=zlib.crc32(rid.encode())))
        for combo in itertools.product(*(range(n) for n in sizes)):
            values = tuple(f[i] for f, i in zip(factors, combo))
            ident = "-".join([rid, *(ids[i] for ids, i in zip(factor_ids, combo))])
            out.append(pytest.param(*row, *values, id=ident,
                                    marks=() if combo in keep else (EXHAUSTIVE,)))
    return out


# -- the families join the catalog-wide tests by sampling -----------------------------------
# Each catalog-wide test (kernel vs reference, targets, bad inputs, torch make, ...) builds
# every spec it takes; these (tests/test_families.py, tests/test_lmo_families.py,
# tests/test_adam_mini.py and tests/test_matrix_soap_nadam.py,
# tests/test_psgd_kron.py test each against its paper
# and its authors' package or heavyball) join each such test one at a time, a different
# one per test (chosen by the test's key), the others with the ``exhaustive`` mark
# (--exhaustive).
FAMILY_SPECS = ("adabound", "adam_mini", "adamod", "ademamix", "adopt", "diffgrad", "grams",
                "laprop", "muon_laprop", "ortho_laprop", "padam", "qhadam", "qhm", "scion",
                "sgdw", "yogi", "soap_nadam", "psgd_kron")


def family_sampled(name: str, key: str, keep: int = 1) -> tuple:
    """The marks of catalog spec ``name`` in the catalog-wide test ``key``: () for a spec
    outside FAMILY_SPECS and for the ``keep`` families this key samples, else the
    ``exhaustive`` mark."""
    if name not in FAMILY_SPECS:
        return ()
    start = zlib.crc32(key.encode()) % len(FAMILY_SPECS)
    chosen = {FAMILY_SPECS[(start + i) % len(FAMILY_SPECS)] for i in range(keep)}
    return () if name in chosen else (EXHAUSTIVE,)


def catalog_params(names, key: str, keep: int = 1) -> list:
    """``pytest.param(name, id=name)`` for each of ``names``, the families sampled
    (``family_sampled``)."""
    return [pytest.param(n, id=str(n), marks=family_sampled(n, key, keep)) for n in names]

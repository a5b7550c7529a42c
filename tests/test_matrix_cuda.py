"""The matrix rules (THOR, Muon, Shampoo, SOAP) on the cuda target.

On cuda a matrix rule's products run in the runtime's BLAS (cuBLAS through CuPy or
torch: ``Target.library_matmul``) and its elementwise passes and whole-matrix reductions
are generated CUDA kernels, compiled by nvcc. Without a GPU these tests check the build
(the manifest's library launches and device ABI, nvcc's cubins where nvcc is installed)
and run the same orchestration on CPU arrays: an llvm build with library products
(numpy's BLAS) against the llvm build with generated matmul kernels. The ``cuda`` tests
run the CUDA artifacts on CuPy arrays where CuPy sees a GPU (``pytest <file> -k cuda``)
and skip with the reason elsewhere.
"""
import dataclasses
import os
import shutil

import numpy as np
import pytest

import optgen
from optgen.compiler import pipeline, targets
from optgen.runtime.artifact import Artifact
from helpers import covering_variants, variant_views

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECS = ["thor", "muon", "shampoo", "soap"]
SHAPES = [(12, 7), (5, 9), (6,)]
# SOAP fits its first basis by eigh of one gradient's g g^T and g^T g; for a non-square
# layer one is rank-deficient and the eigenvectors of its null space follow the last bits
# of the statistic, which two BLAS round apart (docs/matrix.md): square layers for it
SQUARE = {"soap": [(12, 12), (5, 5), (6,)]}
HYPER = {"thor": dict(frequency=3), "muon": {}, "shampoo": dict(precondition_frequency=3,
                                                                  epsilon=1e-3),
         "soap": dict(precondition_frequency=3)}


def _problem(name: str, dtype: str, steps: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    shapes = SQUARE.get(name, SHAPES)
    w0 = [rng.standard_normal(s).astype(dtype) for s in shapes]
    grads = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(steps)]
    stats = []
    for _ in range(steps):   # THOR's statistics: SPD, like a^T a
        a = [rng.standard_normal((16, s[-1])) for s in shapes]
        d = [rng.standard_normal((16, s[0])) / 16 for s in shapes]
        stats.append({"A": [x.T @ x if len(s) == 2 else None for x, s in zip(a, shapes)],
                      "G": [x.T @ x if len(s) == 2 else None for x, s in zip(d, shapes)]})
    return w0, grads, stats


def _run(opt, grads, stats, wrap=lambda x: x) -> None:
    for g, st in zip(grads, stats):
        if opt.artifact.statistics and opt.refresh_due:
            opt.step([wrap(x) for x in g], **st)
        else:
            opt.step([wrap(x) for x in g])


@pytest.mark.parametrize("name", SPECS)
def test_builds_for_cuda_with_library_products(name):
    """Products are library launches (no symbol, no device kernel); every other launch
    has device kernels whose parameters all bind; nvcc compiled a cubin per arch."""
    art = optgen.get_artifact(name, "cuda")
    kinds = {"matmul": 0, "update": 0, "reduce": 0}
    for path, m in variant_views(art, covering_variants(art)):
        _check_library_products(path, m, kinds)
    assert kinds["matmul"] and kinds["update"], kinds


def _check_library_products(path: str, m: dict, kinds: dict) -> None:
    abi = m["device_kernels"]
    for k in m["kernels"]:
        for ln in k["launches"]:
            if ln["kind"] == "repeat":
                continue
            kinds[ln["kind"]] += 1
            if ln["kind"] == "matmul":
                assert ln["symbol"] is None and ln["library"] == "matmul", ln
                continue
            dev = abi[ln["symbol"]]
            assert dev["kernels"] and dev["buffers"] == ln["buffers"], ln["symbol"]
            for kern in dev["kernels"]:
                assert all(set(p) & {"buffer", "scalars", "dim"} for p in kern["params"])
    assert not [s for s in abi if "matmul" in s]
    if shutil.which("nvcc"):
        files = os.listdir(path)
        assert any(f.endswith(".cubin") for f in files), files
        source = open(os.path.join(path, "kernels.cu"), encoding="utf-8").read()
        assert "__global__" in source


@pytest.fixture
def library_llvm(monkeypatch, tmp_path):
    """Build a spec for llvm with its products left to the runtime's BLAS, as cuda does."""
    llvm = dataclasses.replace(targets.TARGETS["llvm"], library_matmul=True)
    monkeypatch.setitem(targets.TARGETS, "llvm", llvm)

    def build(name: str) -> Artifact:
        path = os.path.join(ROOT, "specs", f"{name}.py")
        art = Artifact.load(pipeline.build(path, "llvm", out=str(tmp_path), variants=None).path)
        defaults = {f: h.default for f, h in art.flags.items()}
        pipeline.build(path, "llvm", out=str(tmp_path), variants=[   # what the test steps
            n for n, v in art.variants.items()
            if v["param_dtype"] == "float64" and v["flags"] == defaults])
        return art
    return build


@pytest.mark.parametrize("name", ["shampoo", "soap"])
def test_library_products_orchestration_on_cpu(name, library_llvm):
    """The cuda plan's orchestration (library products between compiled passes, loops,
    reductions, refreshes) on numpy arrays equals the llvm plan with generated products."""
    art = library_llvm(name)
    m = art.manifest
    assert any(ln.get("library") == "matmul" for k in m["kernels"] for ln in k["launches"])
    w0, grads, stats = _problem(name, "float64", 8)
    lib = optgen.create(art, [w.copy() for w in w0], **HYPER[name])
    gen = optgen.create(name, [w.copy() for w in w0], **HYPER[name])
    _run(lib, grads, stats)
    _run(gen, grads, stats)
    for a, b in zip(lib.params, gen.params):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert not np.allclose(lib.params[0], w0[0])


# -- on a GPU --------------------------------------------------------------------------
def _gpus() -> int:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:   # no CuPy, or CuPy without a driver
        return 0


needs_gpu = pytest.mark.skipif(_gpus() == 0, reason="needs CuPy and an NVIDIA GPU")


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", SPECS)
def test_cuda_matrix_rule_matches_llvm(name, dtype):
    import cupy
    w0, grads, stats = _problem(name, dtype, 10)
    params = [cupy.asarray(w) for w in w0]
    gpu = optgen.create(name, params, target="cuda", **HYPER[name])
    cpu = optgen.create(name, [w.copy() for w in w0], **HYPER[name])
    _run(gpu, grads, stats, cupy.asarray)
    _run(cpu, grads, stats)
    tol = 1e-4 if dtype == "float32" else 1e-10
    for a, b in zip(params, cpu.params):
        np.testing.assert_allclose(cupy.asnumpy(a), b, rtol=tol, atol=tol * np.abs(b).max())


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", SPECS)
def test_cuda_matrix_rule_matches_reference(name, dtype):
    """The same run against the reference interpreter of the cuda artifact on host
    copies: needs no CPU build (a GPU machine with prebuilt artifacts runs it)."""
    import cupy
    w0, grads, stats = _problem(name, dtype, 10)
    params = [cupy.asarray(w) for w in w0]
    gpu = optgen.create(name, params, target="cuda", **HYPER[name])
    ref = optgen.create(gpu.artifact, [w.copy() for w in w0], backend="reference",
                        **HYPER[name])
    _run(gpu, grads, stats, cupy.asarray)
    _run(ref, grads, stats)
    tol = 1e-4 if dtype == "float32" else 1e-10
    for a, b in zip(params, ref.params):
        np.testing.assert_allclose(cupy.asnumpy(a), b, rtol=tol, atol=tol * np.abs(b).max())

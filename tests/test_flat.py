"""Flat parameter groups (runtime/flat.py): parameters, gradients and states back to back
in one buffer are updated by one kernel call per run, with exactly the per-tensor results;
anything that breaks the layout falls back to per-tensor calls, still exact."""
import numpy as np
import pytest

import optgen
from optgen.runtime import Artifact

SHAPES = [(17,), (0,), (4, 5), (1,), (16,), (1009,), (3, 1, 7)]
ELEMENTWISE = [("adam", {"weight_decay": 0.01}), ("sgd", {"momentum": 0.9}),
               ("lion", {}), ("adagrad", {}), ("rmsprop", {"centered": True}),
               ("ftrl", {}), ("adabelief", {})]


def data(dtype, seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def grads_for(step, dtype, shapes=SHAPES):
    return data(dtype, 100 + step, shapes)


@pytest.fixture
def calls(monkeypatch):
    """How many kernel calls each optimizer makes (counted at the function handles)."""
    count = {"n": 0}
    original = Artifact.function

    def counting(self, symbol):
        fn = original(self, symbol)

        def call(*args):
            count["n"] += 1
            return fn(*args)
        return call
    monkeypatch.setattr(Artifact, "function", counting)
    return count


def test_flatten_copies_into_one_aligned_buffer():
    arrays = data(np.float32)
    views = optgen.flatten(arrays)
    base = views[0].base
    assert all(v.base is base for v in views) and views[0].ctypes.data % 64 == 0
    for a, v in zip(arrays, views):
        assert v.shape == a.shape and v.dtype == a.dtype and v.flags.c_contiguous
        np.testing.assert_array_equal(v, a)
    full = [v for v in views if v.size]       # (an empty view may point anywhere)
    assert [v.ctypes.data for v in full[1:]] == [v.ctypes.data + v.nbytes for v in full[:-1]]
    assert optgen.flatten([]) == []
    assert optgen.flatten(arrays, dtype=np.float64)[2].dtype == np.float64


def test_flatten_rejects_mixed_libraries():
    torch = pytest.importorskip("torch", reason="the torch case needs torch")
    with pytest.raises(TypeError, match="flatten: expected a list of arrays of one library"):
        optgen.flatten([np.zeros(3), torch.zeros(3)])
    with pytest.raises(TypeError, match="flatten: expected a list of arrays"):
        optgen.flatten([np.zeros(3), [1.0]])
    with pytest.raises(TypeError, match="one dtype and device"):
        optgen.flatten([torch.zeros(3), torch.zeros(3, dtype=torch.float64)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,hyper", ELEMENTWISE, ids=[n for n, _ in ELEMENTWISE])
def test_one_call_per_step_and_the_per_tensor_result(name, hyper, dtype, calls):
    """100 steps: the flat optimizer equals the per-tensor one bit for bit (the same
    elements in the same order, one call instead of one per tensor) and the reference
    interpreter within rounding."""
    per_tensor = optgen.create(name, data(dtype), **hyper)
    reference = optgen.create(name, data(dtype), backend="reference", **hyper)
    params, grads = optgen.flatten(data(dtype)), optgen.flatten(grads_for(0, dtype))
    fused = optgen.create(name, params, **hyper)
    for step in range(100):
        g = grads_for(step % 7, dtype)
        for dst, src in zip(grads, g):
            dst[...] = src
        before = calls["n"]
        fused.step(grads)
        assert calls["n"] - before == 1
        per_tensor.step(g)
        reference.step(g)
    for a, b, r in zip(fused.params, per_tensor.params, reference.params):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, r, rtol=1e-5 if dtype == np.float32 else 1e-12,
                                   atol=1e-6 if dtype == np.float32 else 1e-13)
    for sa, sb in zip(fused.state, per_tensor.state):
        assert sa.keys() == sb.keys()
        for n in sa:
            np.testing.assert_array_equal(sa[n], sb[n])


def step_both(a, b, grads_a, grads_b):
    a.step(grads_a)
    b.step(grads_b)
    for x, y in zip(a.params, b.params):
        np.testing.assert_array_equal(x, y)


def test_layouts_that_break_a_run_fall_back_exactly(calls):
    dtype = np.float32
    flat = optgen.create("adam", optgen.flatten(data(dtype)), weight_decay=0.1)
    ref = optgen.create("adam", data(dtype), backend="reference", weight_decay=0.1)

    def agree():
        for x, y in zip(flat.params, ref.params):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)

    fresh = grads_for(0, dtype)                    # separate arrays: per-tensor calls
    before = calls["n"]
    flat.step(fresh)
    ref.step(fresh)
    assert calls["n"] - before == len(SHAPES) - 1   # the empty parameter takes no call
    agree()
    grads = optgen.flatten(grads_for(1, dtype))
    flat.step(grads)
    ref.step(grads)
    agree()
    partial = list(grads)
    partial[3] = None                              # parameter 3 skips a step
    flat.step(partial)
    ref.step(partial)
    agree()
    before = calls["n"]
    flat.step(grads)                               # steps differ now: per tensor
    ref.step(grads)
    assert calls["n"] - before == len(SHAPES) - 1
    agree()
    flat.set_lr_mult({2: 0.5})                     # a multiplier splits the run
    flat.step(grads)
    ref.set_lr_mult({2: 0.5})
    ref.step(grads)
    agree()


def test_names_that_skip_weight_decay_split_the_run(calls):
    shapes = [(8, 3), (3,), (5, 3), (3,)]
    names = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    flat = optgen.create("adamw", dict(zip(names, optgen.flatten(data(np.float64, 1, shapes)))),
                         weight_decay=0.1, multi_tensor=False)   # (runs only: issue 31's
    #                                         multi-tensor launches would take 2 calls)
    ref = optgen.create("adamw", dict(zip(names, data(np.float64, 1, shapes))),
                        weight_decay=0.1, backend="reference")
    grads = optgen.flatten(grads_for(0, np.float64, shapes))
    for _ in range(5):
        before = calls["n"]
        flat.step(grads)
        assert calls["n"] - before == 4        # decay, no decay, decay, no decay
        ref.step(grads)
    for x, y in zip(flat.params, ref.params):
        np.testing.assert_allclose(x, y, rtol=1e-12)
    # groups make the runs: weights in one flat group, biases in another
    ws = optgen.flatten(data(np.float64, 1, shapes[0::2]))
    bs = optgen.flatten(data(np.float64, 1, shapes[1::2]))
    grouped = optgen.create("adamw", [{"params": ws}, {"params": bs, "weight_decay": 0.0}],
                            weight_decay=0.1)
    gw, gb = (optgen.flatten(grads_for(0, np.float64, shapes)[k::2]) for k in (0, 1))
    before = calls["n"]
    grouped.step(gw + gb)
    assert calls["n"] - before == 2


def test_flag_change_and_checkpoint_keep_results_exact(tmp_path):
    dtype = np.float64
    flat = optgen.create("sgd", optgen.flatten(data(dtype)), lr=0.1)
    per = optgen.create("sgd", data(dtype), lr=0.1)
    grads = optgen.flatten(grads_for(0, dtype))
    step_both(flat, per, grads, list(grads))
    flat.set_hyper(momentum=0.9, nesterov=True)   # a state appears: per-parameter arrays
    per.set_hyper(momentum=0.9, nesterov=True)
    for _ in range(3):
        step_both(flat, per, grads, list(grads))
    flat.save(str(tmp_path / "flat.ckpt"))
    again = optgen.create("sgd", optgen.flatten(data(dtype)), lr=0.1, momentum=0.9,
                          nesterov=True)
    again.step(grads)                              # states of its own, back to back
    again.load(str(tmp_path / "flat.ckpt"))
    for x, p in zip(again.params, flat.params):
        x[...] = p
    for _ in range(3):
        step_both(again, per, grads, list(grads))


def test_a_gradient_overlapping_the_run_is_not_fused(calls):
    """Gradients back to back but over other parameters' memory (gradient i is
    parameter i+1): fusing would race on shared memory, so the per-tensor order is
    kept, which the reference interpreter follows too."""
    def layout():
        base = optgen.aligned_full((256,), 0.0, np.float32)
        base[...] = np.random.default_rng(3).standard_normal(256)
        return [base[k:k + 64] for k in (0, 64, 128)], [base[k:k + 64] for k in (64, 128, 192)]
    params, grads = layout()
    flat = optgen.create("sgd", params, lr=0.1)
    ref_params, ref_grads = layout()
    ref = optgen.create("sgd", ref_params, lr=0.1, backend="reference")
    for _ in range(3):
        before = calls["n"]
        flat.step(grads)
        assert calls["n"] - before == 3
        ref.step(ref_grads)
    for x, y in zip(flat.params, ref.params):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)   # FMA vs numpy rounding


@pytest.mark.parametrize("multi_tensor", [True, False], ids=["flat_run", "flat_no_lists"])
def test_step_counts_set_between_steps_are_read(multi_tensor, calls):
    """A run's members take its first member's scalars only while their step counts
    agree: set apart between two steps with the same gradient arrays (whose verdict
    was kept), they step alone, each with its own bias corrections, and fuse again
    once the counts agree."""
    dtype = np.float64
    flat = optgen.create("adam", optgen.flatten(data(dtype)), multi_tensor=multi_tensor)
    ref = optgen.create("adam", data(dtype), backend="reference")
    grads = optgen.flatten(grads_for(0, dtype))

    def step(expected_calls):
        before = calls["n"]
        flat.step(grads)
        ref.step(grads)
        assert calls["n"] - before == expected_calls
        for x, y in zip(flat.params, ref.params):
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-14)

    step(1)
    step(1)
    for opt in (flat, ref):
        opt.set_step_counts({2: 40})
    step(len(SHAPES) - 1)                          # counts differ: per tensor
    for opt in (flat, ref):
        opt.set_step_counts({i: 50 for i in range(len(SHAPES))})
    step(1)


REDUCING = [("lamb", {"weight_decay": 0.01}), ("lamb", {"bias_correction": False}),
            ("lars", {"momentum": 0.9, "weight_decay": 1e-4}),
            ("lars", {"base": "adam", "weight_decay": 1e-4})]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,hyper", REDUCING, ids=["lamb", "lamb-no-bc", "lars", "lars-adam"])
def test_reduction_specs_take_one_call_per_pass_with_per_tensor_norms(name, hyper, dtype,
                                                                       calls):
    """LAMB's and LARS's norms are per tensor: a flat run takes each pass's segmented
    variant (offsets of the tensors, one reduction buffer each), one call per pass, and
    equals the per-tensor optimizer bit for bit over 100 steps (the same chunks in the
    same order per tensor) and the reference within rounding."""
    shapes = SHAPES + [(100_003,), (2, 40_000)]      # some above the parallel threshold
    per_tensor = optgen.create(name, data(dtype, shapes=shapes), **hyper)
    reference = optgen.create(name, data(dtype, shapes=shapes), backend="reference", **hyper)
    fused = optgen.create(name, optgen.flatten(data(dtype, shapes=shapes)), **hyper)
    grads = optgen.flatten(grads_for(0, dtype, shapes))
    passes = len(fused._param_kernel(0).launches)
    for step in range(100):
        for dst, src in zip(grads, grads_for(step % 7, dtype, shapes)):
            dst[...] = src
        before = calls["n"]
        fused.step(grads)
        assert calls["n"] - before == passes
        per_tensor.step(grads)
        reference.step(grads)
    for a, b, r in zip(fused.params, per_tensor.params, reference.params):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, r, rtol=1e-5 if dtype == np.float32 else 1e-12,
                                   atol=1e-6 if dtype == np.float32 else 1e-13)
    for sa, sb in zip(fused.state, per_tensor.state):
        for n in sa:
            np.testing.assert_array_equal(sa[n], sb[n])


def test_segmented_run_falls_back_when_a_gradient_moves(calls):
    fused = optgen.create("lamb", optgen.flatten(data(np.float32)))
    per = optgen.create("lamb", data(np.float32))
    grads = optgen.flatten(grads_for(0, np.float32))
    fused.step(grads)
    per.step(grads)
    grads[2] = grads[2].copy()                     # no longer back to back
    before = calls["n"]
    fused.step(grads)
    assert calls["n"] - before == 2 * (len(SHAPES) - 1)   # per tensor (not the empty one)
    per.step(grads)
    for x, y in zip(fused.params, per.params):
        np.testing.assert_array_equal(x, y)


def test_torch_tensors_flat(calls):
    torch = pytest.importorskip("torch", reason="torch tensors need torch")
    params = optgen.flatten([torch.from_numpy(a) for a in data(np.float32)])
    grads = optgen.flatten([torch.from_numpy(a) for a in grads_for(0, np.float32)])
    flat = optgen.create("adam", params)
    per = optgen.create("adam", data(np.float32))
    for _ in range(10):
        before = calls["n"]
        flat.step(grads)
        assert calls["n"] - before == 1
        per.step([g.numpy() for g in grads])
    grads[0].data = torch.zeros(17)                # a gradient moved: found by address
    before = calls["n"]
    flat.step(grads)
    assert calls["n"] - before == len(SHAPES) - 1
    per.step([g.numpy() for g in grads])
    for x, y in zip(flat.params, per.params):
        np.testing.assert_array_equal(x.numpy(), y)


def test_torch_tensors_flat_lamb_segmented(calls):
    torch = pytest.importorskip("torch", reason="torch tensors need torch")
    shapes = SHAPES + [(100_003,)]
    params = optgen.flatten([torch.from_numpy(a) for a in data(np.float32, shapes=shapes)])
    grads = optgen.flatten([torch.from_numpy(a) for a in grads_for(0, np.float32, shapes)])
    flat = optgen.create("lamb", params, weight_decay=0.01)
    per = optgen.create("lamb", data(np.float32, shapes=shapes), weight_decay=0.01)
    for _ in range(5):
        before = calls["n"]
        flat.step(grads)
        assert calls["n"] - before == 2
        per.step([g.numpy() for g in grads])
    for x, y in zip(flat.params, per.params):
        np.testing.assert_array_equal(x.numpy(), y)


def test_torch_drop_in_flat_adopts_the_model(calls):
    """flat=True: the model's Parameter objects move into one buffer per group (same
    objects, same values), backward accumulates into .grad views of another buffer,
    zero_grad zeroes it in place, and a step is one call per group, bit-identical to
    the per-tensor drop-in; a torch lr scheduler still drives it."""
    torch = pytest.importorskip("torch", reason="the drop-in needs torch")
    import optgen.torch

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                   torch.nn.Linear(16, 3))
    flat_model, plain_model = model(), model()
    before_ids = [id(p) for p in flat_model.parameters()]
    opts = [optgen.torch.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1, flat=f,
                               multi_tensor=f)   # (the plain one per tensor: issue 31's
            for m, f in ((flat_model, True), (plain_model, False))]   # lists take 1)
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=5, gamma=0.5) for o in opts]
    params = list(flat_model.parameters())
    assert [id(p) for p in params] == before_ids
    assert [p.data_ptr() - params[0].data_ptr() for p in params] == [0, 512, 576, 768]
    X, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    for step in range(20):
        for m, o, s in zip((flat_model, plain_model), opts, scheds):
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(X), y).backward()
            before = calls["n"]
            o.step()
            assert calls["n"] - before == (1 if o is opts[0] else 4)
            s.step()
    for p, q in zip(flat_model.parameters(), plain_model.parameters()):
        assert torch.equal(p, q)
    grads = [p.grad for p in params]
    opts[0].zero_grad()                            # set_to_none=True: the views stay
    assert all(p.grad is g and not g.any() for p, g in zip(params, grads))
    params[0].grad = None                          # a user drops a gradient
    opts[0].zero_grad()
    assert params[0].grad is grads[0]
    with pytest.raises(TypeError, match="flat must be True or False"):
        optgen.torch.Adam(model().parameters(), flat="yes")

"""The torch forms (optgen/torch/optim.py) beside the seed forms (optgen/torch/seeds.py):
which class each name gives, optgen's runtime options next to torch's signature, the
refused ``differentiable=True``, and a tensor ``lr`` changed in place under
torch.compile (one compile; the same steps as eager). torch's own tables:
tests/test_torch_optim_db.py."""
import inspect
import pickle

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

import optgen.torch as ot  # noqa: E402


def test_names_give_the_torch_forms_and_the_seeds_stay_reachable():
    assert ot.make("torch_rmsprop") is ot.RMSprop and ot.make("rmsprop") is ot.seeds.RMSprop
    assert ot.LAMB is ot.seeds.LAMB and ot.seeds.Adam is not ot.Adam
    p = [torch.nn.Parameter(torch.zeros(3))]
    assert ot.RMSprop(p).defaults == torch.optim.RMSprop(p).defaults
    assert ot.seeds.RMSprop(p).param_groups[0]["lr"] == 0.1   # MindSpore's default, as before
    assert pickle.loads(pickle.dumps(ot.Adam)) is ot.Adam
    assert pickle.loads(pickle.dumps(ot.seeds.Adam)) is ot.seeds.Adam


def test_runtime_options_go_with_torchs_arguments():
    model = torch.nn.Linear(4, 2)
    opt = ot.AdamW(model.parameters(), lr=1e-2, flat=True, target="llvm")
    assert "flat" not in inspect.signature(ot.AdamW).parameters and opt._flat
    assert opt.param_groups[0].keys() == torch.optim.AdamW(model.parameters()).param_groups[0].keys()
    with pytest.raises(TypeError, match="unexpected keyword argument 'use_nesterov'"):
        ot.Adam(model.parameters(), use_nesterov=True)
    with pytest.raises(ValueError, match=r"Adam: differentiable=True is not supported"):
        ot.Adam(model.parameters(), differentiable=True)
    with pytest.raises(ValueError, match=r"Muon only supports 2D parameters"):
        ot.Muon(model.parameters())


@pytest.mark.parametrize("name, kw", [("Adam", dict(amsgrad=True)),
                                      ("SGD", dict(momentum=0.9)),
                                      ("RMSprop", dict(centered=True)), ("Muon", {})])
def test_tensor_lr_changed_in_place_never_recompiles(name, kw):
    """torch's pattern (a tensor lr, a scheduler's ``fill_``): the compiled step reads no
    group value, so nothing is guarded on and the new lr reaches the kernels."""
    def run(compiled, cls=getattr(ot, name)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 6, bias=False), torch.nn.Tanh(),
                                    torch.nn.Linear(6, 4, bias=False))
        lr = torch.tensor(0.01)
        opt = cls(model.parameters(), lr=lr, **kw)

        def train_step(x, y):
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()

        counter = None
        if compiled:
            torch._dynamo.reset()
            counter = CompileCounterWithBackend("aot_eager")
            train_step = torch.compile(train_step, backend=counter, fullgraph=True)
        g = torch.Generator().manual_seed(1)
        for k in range(12):
            train_step(torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g))
            lr.fill_(0.01 * 0.8 ** (k + 1))
        return model, counter

    with torch._dynamo.config.patch(trace_autograd_ops=True):
        eager, _ = run(False)
        comp, counter = run(True)
    torch._dynamo.reset()
    assert counter.frame_count == 1, f"{name}: {counter.frame_count} compiles"
    for p, q in zip(comp.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    ref, _ = run(False, getattr(torch.optim, name))   # torch reads the changed lr too
    for p, q in zip(eager.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)

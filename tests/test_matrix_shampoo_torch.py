"""Shampoo and SOAP as torch drop-ins (optgen.torch.seeds) and on the digits MLP.

The drop-ins step the same kernels as the numpy runtime, so a model trained by Shampoo's
equals the runtime fed the same gradients bit for bit (SOAP's refresh runs in float32
with torch.linalg on torch tensors and numpy.linalg on numpy arrays: the two agree to
round-off where the eigenbasis is unique, tests/test_matrix_soap.py, which this MLP's
rank-deficient statistics do not make it); a torch checkpoint taken mid-run
(refresh schedule and matrix states included) resumes into the uninterrupted run. The
digits check trains examples/train_mlp_matrix.py's 64-64-10 MLP for 3 epochs: measured
(seed 0) Adam 0.958 test accuracy / train loss 0.124, Shampoo 0.967 / 0.027, SOAP
0.980 / 0.020 (lr 1e-2 both, the rest their defaults).
"""
import importlib.util
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch drop-ins need torch")
import optgen                    # noqa: E402
import optgen.torch as otorch    # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HYPER = {"shampoo": dict(lr=0.01, precondition_frequency=3, epsilon=1e-3),
         "soap": dict(lr=0.01, precondition_frequency=3)}
CLASSES = {"shampoo": "Shampoo", "soap": "SOAP"}


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _batches(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g))
            for _ in range(n)]


def _train(model, opt, batches) -> None:
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


@pytest.mark.parametrize("name", ["shampoo"])
def test_drop_in_matches_the_numpy_runtime(name):
    model = _model(4)
    params = [p.detach().numpy().copy() for p in model.parameters()]
    opt = getattr(otorch.seeds, CLASSES[name])(model.parameters(), **HYPER[name])
    ref = optgen.create(name, params, **HYPER[name])
    for x, y in _batches(8, 5):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grads = [p.grad.numpy().copy() for p in model.parameters()]
        opt.step()
        ref.step(grads)
    for p, q in zip(model.parameters(), ref.params):
        np.testing.assert_array_equal(p.detach().numpy(), q)
    assert set(opt.state[model[0].weight]) >= {"L", "R", "m", "v"}


@pytest.mark.parametrize("name", ["shampoo", "soap"])
def test_torch_checkpoint_resumes_the_run(name, tmp_path):
    cls = getattr(otorch.seeds, CLASSES[name])
    batches = _batches(9, 6)
    whole = _model(1)
    opt = cls(whole.parameters(), **HYPER[name])
    _train(whole, opt, batches)
    first = _model(1)
    opt1 = cls(first.parameters(), **HYPER[name])
    _train(first, opt1, batches[:4])   # Shampoo stops between refreshes (steps 1, 4, 7);
    assert opt1.refresh_due == (name == "soap")   # SOAP's next step refreshes (2, 5, 8)
    torch.save({"model": first.state_dict(), "opt": opt1.state_dict()}, tmp_path / "ck.pt")
    ck = torch.load(tmp_path / "ck.pt", weights_only=False)
    resumed = _model(2)
    resumed.load_state_dict(ck["model"])
    opt2 = cls(resumed.parameters(), **HYPER[name])
    opt2.load_state_dict(ck["opt"])
    assert opt2.refresh_due == opt1.refresh_due
    _train(resumed, opt2, batches[4:])
    for p, q in zip(resumed.parameters(), whole.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


@pytest.fixture(scope="module")
def digits():
    pytest.importorskip("sklearn", reason="the digits example needs scikit-learn")
    path = os.path.join(ROOT, "examples", "train_mlp_matrix.py")
    spec = importlib.util.spec_from_file_location("example_train_mlp_matrix_soap", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module, module.load_data(0)


def _digits_run(ex, data, name: str, hyper: dict, epochs: int = 3):
    X_train, y_train, X_test, y_test = data
    params = ex.init_params(X_train.shape[1], ex.HIDDEN, 10, 0)
    opt = optgen.create(name, params, **hyper)
    rng = np.random.default_rng(0)
    for _ in range(epochs):
        order = rng.permutation(len(X_train))
        for b in range(len(X_train) // 32):
            idx = order[b * 32:(b + 1) * 32]
            opt.step(ex.loss_and_grads(params, X_train[idx], y_train[idx])[1])
    return ex.evaluate(params, X_train, y_train)[0], ex.evaluate(params, X_test, y_test)[1]


def test_digits_shampoo_and_soap_train_at_least_as_well_as_adam(digits):
    ex, data = digits
    adam_loss, adam_acc = _digits_run(ex, data, "adam", dict(lr=3e-3, weight_decay=1e-4))
    assert adam_acc > 0.9
    for name in ("shampoo", "soap"):
        loss, acc = _digits_run(ex, data, name, dict(lr=1e-2))
        assert acc >= 0.95, (name, acc)
        assert loss < adam_loss, (name, loss, adam_loss)

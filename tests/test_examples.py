"""The runnable examples: examples/train_digits.py trains to a useful accuracy, and its
hand-written backprop matches finite differences."""
import importlib.util
import os

import numpy as np
import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def digits():
    return _load_example("train_digits")


def test_digits_backprop_matches_finite_differences(digits):
    """Central differences of the summed cross-entropy, float64, every parameter entry."""
    rng = np.random.default_rng(7)
    params = digits.init_params(5, 4, 3, seed=3, dtype=np.float64)
    for name in ("fc1_bias", "fc2_bias"):   # non-zero biases, so their paths are exercised
        params[name][...] = rng.standard_normal(params[name].shape)
    X = rng.standard_normal((6, 5))
    y = np.array([0, 1, 2, 2, 1, 0])
    _, grads = digits.loss_and_grads(params, X, y)
    assert [g.shape for g in grads] == [p.shape for p in params.values()]
    assert all(g.dtype == np.float64 for g in grads)
    h = 1e-6
    for (name, p), g in zip(params.items(), grads):
        numeric = np.empty_like(p)
        for idx in np.ndindex(p.shape):
            saved = p[idx]
            p[idx] = saved + h
            up, _ = digits.loss_and_grads(params, X, y)
            p[idx] = saved - h
            down, _ = digits.loss_and_grads(params, X, y)
            p[idx] = saved
            numeric[idx] = (up - down) / (2 * h)
        np.testing.assert_allclose(g, numeric, rtol=1e-6, atol=1e-8, err_msg=name)


def test_digits_gradients_keep_float32(digits):
    params = digits.init_params(64, 8, 10, seed=0)
    X = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    _, grads = digits.loss_and_grads(params, X, np.array([1, 2, 3, 4]))
    assert all(g.dtype == np.float32 and g.flags.c_contiguous for g in grads)


def test_digits_adam_and_lamb_reach_90_percent(digits, capsys):
    pytest.importorskip("sklearn", reason="the digits example needs scikit-learn")
    results = digits.main(["--epochs", "5", "--optimizers", "adam,lamb", "--seed", "0"])
    out = capsys.readouterr().out
    assert set(results) == {"adam", "lamb"}
    for name, r in results.items():
        assert r["test_accuracy"] >= 0.9, (name, r)
        assert np.isfinite(r["final_loss"]) and r["final_loss"] < 0.5, (name, r)
        assert name in out
    assert "test acc" in out


def test_digits_rejects_an_unknown_optimizer(digits, capsys):
    with pytest.raises(SystemExit):
        digits.main(["--optimizers", "adam,nope"])
    assert "unknown 'nope'" in capsys.readouterr().err

"""examples/train_mlp_matrix.py in quick mode: Adam, THOR and Muon each learn the digits
(test accuracy well above the 10 % of chance), THOR's statistics are fed only on refresh
steps, and the hand-written backprop and statistics are right."""
import importlib.util
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from helpers import finite_differences

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_mlp_matrix.py")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("example_train_mlp_matrix", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_backprop_matches_finite_differences(example):
    """Central differences of the mean cross-entropy, float64, every parameter entry."""
    rng = np.random.default_rng(7)
    params = example.init_params(5, 4, 3, seed=3, dtype=np.float64)
    for name in ("fc1_bias", "fc2_bias"):
        params[name][...] = rng.standard_normal(params[name].shape)
    X = rng.standard_normal((6, 5))
    y = np.array([0, 1, 2, 2, 1, 0])
    _, grads, A, G = example.loss_and_grads(params, X, y)
    assert A is None and G is None
    assert [g.shape for g in grads] == [p.shape for p in params.values()]
    numeric = finite_differences(lambda: example.loss_and_grads(params, X, y)[0], params)
    for name, g in zip(params, grads):
        np.testing.assert_allclose(g, numeric[name], rtol=1e-6, atol=1e-9, err_msg=name)


def test_thor_statistics(example):
    """A = sum a a^T (C x C), G = sum delta delta^T (R x R) for W [R, C], None for the
    biases, and consistent with the gradient: for one sample g = delta a^T, so
    G = g g^T / |a|^2 and A = g^T g / |delta|^2; for a batch, the sum of the per-sample
    statistics."""
    rng = np.random.default_rng(8)
    params = example.init_params(5, 4, 3, seed=3, dtype=np.float64)
    X = rng.standard_normal((6, 5))
    y = np.array([0, 1, 2, 2, 1, 0])
    names = list(params)
    _, grads, A, G = example.loss_and_grads(params, X, y, statistics=True)
    for n, a, g in zip(names, A, G):
        if "bias" in n:
            assert a is None and g is None, n
        else:
            R, C = params[n].shape
            assert a.shape == (C, C) and g.shape == (R, R), n
            np.testing.assert_allclose(a, a.T, err_msg=n)
            assert np.linalg.eigvalsh(g).min() > -1e-12, n
    sums = [np.zeros_like(a) if a is not None else None for a in A], \
        [np.zeros_like(g) if g is not None else None for g in G]
    for k in range(len(y)):
        _, gk, Ak, Gk = example.loss_and_grads(params, X[k:k + 1], y[k:k + 1], statistics=True)
        for i, n in enumerate(names):
            if Ak[i] is None:
                continue
            # one sample: the gradient of the mean loss is delta a^T
            np.testing.assert_allclose(Gk[i], gk[i] @ gk[i].T / np.trace(Ak[i]), rtol=1e-10,
                                       atol=1e-14, err_msg=n)
            np.testing.assert_allclose(Ak[i], gk[i].T @ gk[i] / np.trace(Gk[i]), rtol=1e-10,
                                       atol=1e-14, err_msg=n)
            sums[0][i] += Ak[i]
            # delta of the batch's mean loss is 1/batch of the one-sample delta
            sums[1][i] += Gk[i] / len(y) ** 2
    for i, n in enumerate(names):
        if A[i] is not None:
            np.testing.assert_allclose(A[i], sums[0][i], rtol=1e-10, err_msg=n)
            np.testing.assert_allclose(G[i], sums[1][i], rtol=1e-10, err_msg=n)


def test_quick_mode_every_optimizer_learns(example, capsys):
    """--quick (3 epochs): adam, thor and muon all reach >= 90 % test accuracy (chance:
    10 %; seed 0 gives adam 95.8 %, thor 96.4 %, muon 97.6 %), from the same initial
    weights; THOR refreshed exactly on steps 1, 1 + frequency, ..."""
    pytest.importorskip("sklearn", reason="the digits example needs scikit-learn")
    results = example.main(["--quick", "--seed", "0"])
    out = capsys.readouterr().out
    assert list(results) == ["adam", "thor", "muon"]
    assert len({r["history"]["train_loss"][0] for r in results.values()}) == 1
    steps = 3 * (1347 // 32)
    for name, r in results.items():
        h = r["history"]
        assert h["epoch"] == [0, 1, 2, 3], name
        assert h["test_accuracy"][0] < 0.3, (name, h["test_accuracy"])
        assert r["test_accuracy"] >= 0.9, (name, r["test_accuracy"])
        assert np.isfinite(r["test_loss"]) and r["test_loss"] < 0.5, (name, r["test_loss"])
        assert h["train_loss"][-1] < 0.2 * h["train_loss"][0], (name, h["train_loss"])
        assert r["steps"] == steps, (name, r["steps"])
        assert re.search(rf"^{name}\s+{steps}\s", out, re.M), f"no table row for {name}:\n{out}"
    freq = example.CONFIGS["thor"]["frequency"]
    assert results["thor"]["refreshes"] == math.ceil(steps / freq)
    assert results["adam"]["refreshes"] == results["muon"]["refreshes"] == 0
    assert "test acc" in out and "test loss" in out and "3 epochs" in out


def test_command_line_writes_the_plot(tmp_path):
    pytest.importorskip("sklearn", reason="the digits example needs scikit-learn")
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib")
    plot = tmp_path / "img" / "mlp_matrix.png"
    proc = subprocess.run([sys.executable, EXAMPLE, "--quick", "--optimizers", "thor,muon",
                           "--plot", str(plot)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    out = proc.stdout
    assert "3 epochs" in out and f"wrote {plot}" in out
    rows = {m.group(1): float(m.group(2)) for m in
            re.finditer(r"^(thor|muon)\s+\d+\s+\S+\s+\S+\s+\S+\s+(\S+)", out, re.M)}
    assert set(rows) == {"thor", "muon"} and min(rows.values()) >= 0.9, out
    data = plot.read_bytes()
    assert data[:8] == PNG_MAGIC and 10_000 < len(data) < 200_000, len(data)


def test_rejects_an_unknown_optimizer(example, capsys):
    with pytest.raises(SystemExit):
        example.main(["--optimizers", "adam,nope"])
    assert "unknown 'nope'" in capsys.readouterr().err

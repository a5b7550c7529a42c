"""The runnable examples in their quick modes (what CI runs): examples/train_digits.py
trains every optimizer it compares to a useful accuracy and its hand-written backprop
matches finite differences; examples/torch_trainer.py's drop-in AdamW follows
torch.optim.AdamW under a torch lr scheduler. Each script also runs once as a command,
writing its plot."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from helpers import finite_differences, load_example

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run_script(name: str, *args: str, env: dict | None = None) -> str:
    """Run examples/<name>.py as a command from the repository root; its stdout. The
    artifact cache (OPTGEN_CACHE_DIR, set by conftest) is inherited, so kernels built by
    the in-process tests are reused."""
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, f"{name}.py"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _assert_png(path) -> None:
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert 10_000 < len(data) < 150_000, f"{path}: {len(data)} bytes"


# -- train_digits.py ------------------------------------------------------------------
@pytest.fixture(scope="module")
def digits():
    return load_example("train_digits")


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
    numeric = finite_differences(lambda: digits.loss_and_grads(params, X, y)[0], params)
    for name, g in zip(params, grads):
        np.testing.assert_allclose(g, numeric[name], rtol=1e-6, atol=1e-8, err_msg=name)


def test_digits_gradients_keep_float32(digits):
    params = digits.init_params(64, 8, 10, seed=0)
    X = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    _, grads = digits.loss_and_grads(params, X, np.array([1, 2, 3, 4]))
    assert all(g.dtype == np.float32 and g.flags.c_contiguous for g in grads)


def test_digits_quick_mode_every_optimizer_learns(digits, capsys):
    """--quick (3 epochs) with every optimizer of CONFIGS: each reaches 90 % test
    accuracy from 11 % at random, with a per-epoch history that starts at the shared
    initial weights."""
    pytest.importorskip("sklearn", reason="the digits example needs scikit-learn")
    assert len(digits.CONFIGS) >= 5
    results = digits.main(["--quick", "--seed", "0"])
    out = capsys.readouterr().out
    assert list(results) == list(digits.CONFIGS)
    first_losses = {r["history"]["train_loss"][0] for r in results.values()}
    assert len(first_losses) == 1, "the optimizers did not start from the same weights"
    for name, r in results.items():
        h = r["history"]
        assert h["epoch"] == [0, 1, 2, 3] and len(h["test_accuracy"]) == 4, name
        assert h["test_accuracy"][0] < 0.3, (name, h)
        assert r["test_accuracy"] >= 0.9 and r["test_accuracy"] == h["test_accuracy"][-1], \
            (name, r["test_accuracy"])
        assert np.isfinite(r["final_loss"]) and r["final_loss"] < 0.5, (name, r["final_loss"])
        assert h["train_loss"][-1] < 0.25 * h["train_loss"][0], (name, h["train_loss"])
        assert r["steps"] == 3 * 43, (name, r["steps"])
        assert re.search(rf"^{name}\s+129\s", out, re.M), f"no table row for {name}:\n{out}"
    assert "test acc" in out and "3 epochs" in out


def test_digits_epochs_and_optimizer_selection(digits, capsys):
    pytest.importorskip("sklearn", reason="the digits example needs scikit-learn")
    results = digits.main(["--epochs", "5", "--optimizers", "adam,lamb", "--seed", "0"])
    capsys.readouterr()
    assert list(results) == ["adam", "lamb"]
    for name, r in results.items():
        assert r["steps"] == 5 * 43 and len(r["history"]["epoch"]) == 6, (name, r["steps"])
        assert r["test_accuracy"] >= 0.9, (name, r["test_accuracy"])


def test_digits_command_line_writes_the_plot(tmp_path):
    pytest.importorskip("sklearn", reason="the digits example needs scikit-learn")
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib")
    plot = tmp_path / "img" / "digits.png"          # the folder does not exist yet
    out = _run_script("train_digits", "--quick", "--optimizers", "sgd,lion", "--plot", str(plot))
    assert "3 epochs" in out and f"wrote {plot}" in out
    rows = {m.group(1): float(m.group(2))
            for m in re.finditer(r"^(sgd|lion)\s+\d+\s+\S+\s+\S+\s+(\S+)", out, re.M)}
    assert set(rows) == {"sgd", "lion"} and min(rows.values()) >= 0.9, out
    _assert_png(plot)


def test_digits_rejects_an_unknown_optimizer(digits, capsys):
    with pytest.raises(SystemExit):
        digits.main(["--optimizers", "adam,nope"])
    assert "unknown 'nope'" in capsys.readouterr().err


# -- torch_trainer.py -----------------------------------------------------------------
# The torch example's model is tiny (batches of 32 x 128): torch's intra-op threads only
# add synchronization, and on a busy 2-core machine they made its runs several times slower.
ONE_TORCH_THREAD = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def trainer():
    torch = pytest.importorskip("torch", reason="the torch example needs torch")
    pytest.importorskip("sklearn", reason="the torch example needs scikit-learn")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_example("torch_trainer")
    torch.set_num_threads(threads)


@pytest.mark.parametrize("scheduler", ["onecycle", "warmup-cosine"])
def test_torch_trainer_drop_in_follows_torch_adamw(trainer, scheduler, capsys):
    """optgen's AdamW is torch's rule: under the same scheduler, from the same weights on
    the same batches, its weights stay within float32 rounding of torch's (a kernel that
    missed the scheduler's lr or beta1 ends about 0.1 away) and both learn."""
    out = trainer.main(["--quick", "--scheduler", scheduler, "--seed", "0"])
    text = capsys.readouterr().out
    mine, ref = out["optgen"], out["torch"]
    assert out["steps"] == 3 * 43 and len(mine["lr"]) == out["steps"]
    assert out["lr_identical"] and mine["lr"] == ref["lr"]
    assert out["beta1_identical"] and mine["beta1"] == ref["beta1"]
    lr = np.array(mine["lr"])
    assert lr.max() == pytest.approx(trainer.LR, rel=1e-3) and lr.max() > 20 * lr.min()
    if scheduler == "onecycle":            # OneCycleLR cycles beta1 too
        assert min(mine["beta1"]) == pytest.approx(0.85, abs=1e-3)
        assert max(mine["beta1"]) == pytest.approx(0.95, abs=1e-3)
    else:
        assert lr[0] == pytest.approx(0.01 * trainer.LR) and set(mine["beta1"]) == {0.9}
    assert out["weight_diff_history"][0] == 0.0
    assert 0 < out["max_weight_diff"] < 1e-4, out["weight_diff_history"]
    for run in (mine, ref):
        assert run["test_accuracy"] >= 0.9 and run["final_loss"] < 0.35, run["test_accuracy"]
    assert abs(mine["test_accuracy"] - ref["test_accuracy"]) <= 2 / 450
    assert "identical in both optimizers' param_groups" in text and "epoch  3" in text


@pytest.mark.parametrize("lr_kind", ["float", "tensor"])
def test_scheduled_lr_reaches_the_drop_in_kernel(lr_kind):
    """The premise of the example, directly: a LambdaLR that sets the lr to 0 for some
    steps freezes the weights bit for bit in exactly those steps (AdamW's decay is
    lr-scaled too), and the updates resume when it brings the lr back. torch.optim takes
    a tensor lr too, which schedulers change in place (``fill_``); the drop-in once kept
    stepping with the tensor's first value."""
    torch = pytest.importorskip("torch", reason="the drop-in needs torch")
    import optgen.torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    lr = torch.tensor(1e-2) if lr_kind == "tensor" else 1e-2
    opt = optgen.torch.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.0 if 2 <= k < 5 else 1.0)
    moved = []
    for _ in range(7):
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()
        moved.append(not all(torch.equal(a, b) for a, b in zip(before, model.parameters())))
    assert moved == [True, True, False, False, False, True, True]
    assert float(opt.state_dict()["state"][0]["step"]) == 7
    assert isinstance(opt.param_groups[0]["lr"], type(lr))     # torch's group is untouched


def test_torch_trainer_command_line_writes_the_plot(tmp_path):
    pytest.importorskip("torch", reason="the torch example needs torch")
    pytest.importorskip("sklearn", reason="the torch example needs scikit-learn")
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib")
    plot = tmp_path / "torch.png"
    out = _run_script("torch_trainer", "--quick", "--plot", str(plot), env=ONE_TORCH_THREAD)
    final = re.search(r"final test accuracy: optgen AdamW ([\d.]+), torch AdamW ([\d.]+); "
                      r"largest weight difference (\S+)", out)
    assert final, out
    assert float(final.group(1)) >= 0.9 and float(final.group(2)) >= 0.9
    assert float(final.group(3)) < 1e-4
    assert "onecycle, 129 steps" in out and "identical in both" in out and f"wrote {plot}" in out
    _assert_png(plot)


# -- examples/README.md ---------------------------------------------------------------
def test_examples_readme_covers_every_example_and_its_plots_exist():
    with open(os.path.join(EXAMPLES, "README.md")) as f:
        readme = f.read()
    for script in sorted(os.listdir(EXAMPLES)):
        if script.endswith(".py"):
            assert f"python examples/{script}" in readme, f"README.md has no command for {script}"
    images = re.findall(r"!\[[^\]]*\]\((\.\./docs/img/[^)]+\.png)\)", readme)
    assert {os.path.basename(p) for p in images} >= {"digits_convergence.png", "torch_trainer.png"}
    for rel in images:
        _assert_png(os.path.join(EXAMPLES, rel))

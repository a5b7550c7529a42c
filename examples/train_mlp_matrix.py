"""Train a small MLP on scikit-learn's digits with Adam and optgen's two matrix optimizers,
THOR and Muon, and compare them.

The model is a 64 -> 64 (tanh) -> 10 (softmax) multilayer perceptron in plain numpy
float32 with hand-written backprop, like examples/train_digits.py (whose ``load_data``
it reuses), but with the weights in torch's layout [out, in] = [R, C], which is the
layout THOR's statistics and Muon's shape rules are written for. The loss is the mean
cross-entropy over the batch. Every optimizer trains the same initial weights on the same
minibatches (the last, incomplete batch of an epoch is dropped: THOR's ``batch_size``
enters its inverses, so every batch has that size).

* ``adam``: the elementwise baseline.
* ``thor`` (MindSpore THOR, Chen et al. 2020): each weight's gradient g is preconditioned
  as G_inv @ g @ A_inv, with A = sum a a^T over the batch of the layer's inputs and
  G = sum delta delta^T of the gradients of the mean loss w.r.t. the layer's outputs,
  both damped and inverted every ``frequency`` steps. The trainer computes A and G only
  on the steps where ``opt.refresh_due`` is True (both come from the forward and backward
  pass it already does) and passes them as ``opt.step(grads, A=[...], G=[...])``, None
  for the biases, which THOR steps with plain momentum.
* ``muon`` (Keller Jordan 2024): the momentum of each weight matrix is orthogonalized by a
  Newton-Schulz iteration; the biases take AdamW steps.

Parameters are passed by name, so the default filter leaves the biases out of weight
decay. After every epoch the run records the training loss, the test loss and the test
accuracy; ``--plot PATH`` draws the loss curves and the test accuracy per epoch.

Run it from the repository root:

    python examples/train_mlp_matrix.py                    # 20 epochs, adam, thor, muon
    python examples/train_mlp_matrix.py --quick            # 3 epochs (what CI runs)
    python examples/train_mlp_matrix.py --plot docs/img/mlp_matrix.png
    python examples/train_mlp_matrix.py --optimizers thor,muon --epochs 5 --seed 1
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

import optgen

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits import finish_plot, load_data  # noqa: E402  (the same data and split)
from train_digits import parse_args as digits_args  # noqa: E402  (the same command line)

# Per-optimizer hyperparameters (constant lr), tuned by hand on this model (seeds 0 and 1,
# 3 and 20 epochs). THOR's batch_size is the trainer's (added in make_optimizer).
CONFIGS = {
    "adam": {"lr": 3e-3, "weight_decay": 1e-4},
    # damping 0.3: the damped G*batch_size of this model has eigenvalues far below 1, and
    # with damping 0.03 (MindSpore's ResNet-50 value) the first steps blow up at any lr
    # that trains in 3 epochs
    "thor": {"lr": 0.01, "damping": 0.3, "momentum": 0.9, "weight_decay": 1e-4,
             "frequency": 10},
    # weight_decay is decoupled here (w *= 1 - lr*wd); without it the test loss rises
    # after ~10 epochs as the training loss reaches 0
    "muon": {"lr": 0.02, "momentum": 0.95, "nesterov": True, "weight_decay": 0.1},
}
HIDDEN = 64
BATCH_SIZE = 32
EPOCHS = 20
QUICK_EPOCHS = 3
LAYERS = (("fc1_weight", "fc1_bias"), ("fc2_weight", "fc2_bias"))


# -- model ----------------------------------------------------------------------------
def init_params(n_in: int, n_hidden: int, n_out: int, seed: int,
                dtype=np.float32) -> dict[str, np.ndarray]:
    """Glorot-uniform weights in torch's layout [out, in] and zero biases, by name."""
    rng = np.random.default_rng(seed)

    def glorot(fan_out: int, fan_in: int) -> np.ndarray:
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, (fan_out, fan_in)).astype(dtype)

    return {"fc1_weight": glorot(n_hidden, n_in), "fc1_bias": np.zeros(n_hidden, dtype),
            "fc2_weight": glorot(n_out, n_hidden), "fc2_bias": np.zeros(n_out, dtype)}


def forward(params: dict[str, np.ndarray], X: np.ndarray):
    """The logits, and the hidden activations the backward pass needs."""
    h = np.tanh(X @ params["fc1_weight"].T + params["fc1_bias"])
    logits = h @ params["fc2_weight"].T + params["fc2_bias"]
    return logits, h


def softmax_cross_entropy(logits: np.ndarray, y: np.ndarray):
    """The mean cross-entropy (a float) and the softmax probabilities."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    total = exp.sum(axis=1, keepdims=True)
    log_probs = shifted - np.log(total)
    loss = -float(log_probs[np.arange(len(y)), y].mean(dtype=np.float64))
    return loss, exp / total


def loss_and_grads(params: dict[str, np.ndarray], X: np.ndarray, y: np.ndarray,
                   statistics: bool = False):
    """The mean cross-entropy over the batch, its gradients in the order of ``params``,
    and with ``statistics`` THOR's per-layer (A, G) lists in the same order (None for the
    biases): A = a^T a over the batch of the layer's inputs a, G = delta^T delta of
    delta = d(mean loss)/d(layer output). Without ``statistics``: (None, None)."""
    logits, h = forward(params, X)
    loss, probs = softmax_cross_entropy(logits, y)
    d_logits = probs
    d_logits[np.arange(len(y)), y] -= 1
    d_logits /= len(y)                                  # d mean loss / d logits
    d_hidden = (d_logits @ params["fc2_weight"]) * (1 - h * h)   # through tanh
    grads = {"fc1_weight": d_hidden.T @ X, "fc1_bias": d_hidden.sum(axis=0),
             "fc2_weight": d_logits.T @ h, "fc2_bias": d_logits.sum(axis=0)}
    A = G = None
    if statistics:
        inputs = {"fc1_weight": (X, d_hidden), "fc2_weight": (h, d_logits)}
        A = [inputs[n][0].T @ inputs[n][0] if n in inputs else None for n in params]
        G = [inputs[n][1].T @ inputs[n][1] if n in inputs else None for n in params]
    return loss, [grads[name] for name in params], A, G


def evaluate(params: dict[str, np.ndarray], X: np.ndarray, y: np.ndarray):
    """(mean cross-entropy, accuracy) over a whole dataset."""
    logits, _ = forward(params, X)
    loss, _ = softmax_cross_entropy(logits, y)
    return loss, float(np.mean(logits.argmax(axis=1) == y))


# -- training -------------------------------------------------------------------------
def make_optimizer(name: str, params: dict[str, np.ndarray], batch_size: int):
    hyper = dict(CONFIGS[name])
    if name == "thor":
        hyper["batch_size"] = batch_size
    return optgen.create(name, params, **hyper)


def train(name: str, init: dict[str, np.ndarray], data, epochs: int, batch_size: int,
          seed: int) -> dict:
    """Train a copy of ``init`` with optimizer ``name``; the results of the run, with the
    training loss, test loss and test accuracy after every epoch (epoch 0: the initial
    weights)."""
    X_train, y_train, X_test, y_test = data
    params = {k: v.copy() for k, v in init.items()}
    steps_per_epoch = len(X_train) // batch_size        # drop the incomplete batch
    opt = make_optimizer(name, params, batch_size)
    history = {"epoch": [], "train_loss": [], "test_loss": [], "test_accuracy": []}

    def record(epoch: int) -> None:
        test_loss, test_acc = evaluate(params, X_test, y_test)
        history["epoch"].append(epoch)
        history["train_loss"].append(evaluate(params, X_train, y_train)[0])
        history["test_loss"].append(test_loss)
        history["test_accuracy"].append(test_acc)

    record(0)
    order_rng = np.random.default_rng(seed)      # same batches for every optimizer
    opt_ms, refreshes = [], 0
    for epoch in range(1, epochs + 1):
        order = order_rng.permutation(len(X_train))
        for b in range(steps_per_epoch):
            idx = order[b * batch_size:(b + 1) * batch_size]
            refresh = bool(getattr(opt, "refresh_due", False))
            _, grads, A, G = loss_and_grads(params, X_train[idx], y_train[idx], refresh)
            t0 = time.perf_counter()
            if refresh:
                opt.step(grads, A=A, G=G)
                refreshes += 1
            else:
                opt.step(grads)
            opt_ms.append(1e3 * (time.perf_counter() - t0))
        record(epoch)

    train_loss, train_acc = evaluate(params, X_train, y_train)
    test_loss, test_acc = evaluate(params, X_test, y_test)
    return {"train_loss": train_loss, "train_accuracy": train_acc, "test_loss": test_loss,
            "test_accuracy": test_acc, "steps": epochs * steps_per_epoch,
            "refreshes": refreshes, "opt_step_ms": float(np.median(opt_ms)),
            "history": history}


# -- output ---------------------------------------------------------------------------
def print_table(results: dict[str, dict]) -> None:
    header = (f"{'optimizer':<9} {'steps':>6} {'train loss':>10} {'test loss':>9} "
              f"{'train acc':>9} {'test acc':>8} {'refreshes':>9} {'opt.step ms':>11}")
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        refreshes = str(r["refreshes"]) if r["refreshes"] else "-"
        print(f"{name:<9} {r['steps']:>6} {r['train_loss']:>10.4f} {r['test_loss']:>9.4f} "
              f"{r['train_accuracy']:>9.3f} {r['test_accuracy']:>8.3f} {refreshes:>9} "
              f"{r['opt_step_ms']:>11.3f}")
    print("(losses: mean cross-entropy; refreshes: THOR steps that recomputed A_inv and "
          "G_inv; opt.step ms: median of the optimizer update alone)")


def plot(results: dict[str, dict], path: str, title: str) -> None:
    """Training loss (solid) and test loss (dashed), log scale, and test accuracy against
    the epoch, one colour per optimizer, as a PNG at ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax_loss, ax_acc = fig.subplots(1, 2)
    for k, (name, r) in enumerate(results.items()):
        h, color = r["history"], f"C{k}"
        ax_loss.plot(h["epoch"], h["train_loss"], color=color, linewidth=1.6,
                     label=f"{name} train")
        ax_loss.plot(h["epoch"], h["test_loss"], color=color, linewidth=1.2, linestyle="--",
                     label=f"{name} test")
        ax_acc.plot(h["epoch"], h["test_accuracy"], color=color, linewidth=1.6, label=name)
    ax_loss.set(yscale="log", xlabel="epoch", ylabel="mean cross-entropy", title="loss")
    finish_plot(fig, ax_loss, ax_acc, results, title, path)


# -- command line ---------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    return digits_args(argv, doc=__doc__, configs=CONFIGS, epochs=EPOCHS,
                       quick_epochs=QUICK_EPOCHS, batch_size=BATCH_SIZE,
                       plot_help="the loss curves")

def main(argv=None) -> dict[str, dict]:
    """Train each optimizer from the same initial weights; print and return the results
    ``{optimizer: {"test_accuracy": ..., "test_loss": ..., "history": {...}, ...}}``."""
    args = parse_args(argv)
    data = load_data(args.seed)
    X_train, y_train, X_test, _ = data
    model = f"MLP {X_train.shape[1]}-{HIDDEN}-10 (tanh)"
    print(f"digits: {len(X_train)} train / {len(X_test)} test samples, {model}, "
          f"batch {args.batch_size}, {args.epochs} epochs")
    init = init_params(X_train.shape[1], HIDDEN, int(y_train.max()) + 1, args.seed)
    results = {}
    for name in args.optimizers:
        start = time.perf_counter()
        results[name] = r = train(name, init, data, args.epochs, args.batch_size, args.seed)
        print(f"{name}: test accuracy {r['test_accuracy']:.3f}, test loss "
              f"{r['test_loss']:.4f} ({time.perf_counter() - start:.1f} s)")
    print()
    print_table(results)
    if args.plot:
        plot(results, args.plot, f"scikit-learn digits, {model}, batch {args.batch_size}, "
                                 f"{args.epochs} epochs, same initial weights and batches")
        print(f"wrote {args.plot}")
    return results


if __name__ == "__main__":
    main()

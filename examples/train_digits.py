"""Train a small MLP on scikit-learn's digits with six of optgen's optimizers and compare
how they converge.

The digits dataset (1797 8x8 images of handwritten digits, 10 classes) ships inside
scikit-learn, so this runs offline. The model is a 64 -> 64 (tanh) -> 10 (softmax)
multilayer perceptron written in plain numpy float32 with hand-written backprop; no deep
learning framework is involved. Every optimizer trains the same initial weights on the
same minibatches, using what a real trainer uses from optgen's runtime:

* parameters passed by name (``{"fc1_weight": W1, "fc1_bias": b1, ...}``), so the default
  name filter leaves biases (names containing bias, beta or gamma) out of weight decay;
* a learning-rate schedule from ``optgen.schedules`` (linear warm-up, then cosine decay)
  passed as ``lr=``;
* ``weight_decay=``: coupled L2 (added to the gradient) for sgd, adam and adabelief,
  decoupled for adamw, lion and lamb (see docs/catalog.md), so the values differ;
* ``clip_global_norm=1.0``: all gradients scaled together when their global norm
  exceeds 1;
* ``rescale_grad=1/batch_size``: the backprop sums the per-sample gradients and the
  kernel averages them (the global norm is taken after this rescaling).

CONFIGS holds each optimizer's peak learning rate, weight decay and any other
hyperparameter of its spec (SGD's momentum), tuned by hand for this model. After every
epoch the run records the training loss (mean cross-entropy over the whole training
set) and the test accuracy; ``--plot PATH`` draws both against the epoch, one line per
optimizer (docs/img/digits_convergence.png is the default run's plot).

It prints one line per optimizer as it finishes, then a table: the final training loss,
train and test accuracy, the first epoch with a test accuracy of at least 95 %, and the
median time per step (``opt.step`` alone and the whole forward/backward/update step).

Run it from the repository root:

    pip install -e ".[examples]"
    python examples/train_digits.py                   # all six optimizers, 30 epochs
    python examples/train_digits.py --plot docs/img/digits_convergence.png
    python examples/train_digits.py --quick           # 3 epochs (what CI runs)
    python examples/train_digits.py --epochs 5 --optimizers adam,lamb --seed 1
"""
from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

import optgen

# Per-optimizer hyperparameters: "lr" is the schedule's peak, the rest go to the spec.
# Tuned on this model (seeds 0 and 1, 3 and 30 epochs). Lion follows its paper's rule of
# thumb against AdamW: a 5x smaller lr and a 10x larger (decoupled) weight decay.
CONFIGS = {
    "sgd": {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4},
    "adam": {"lr": 1e-2, "weight_decay": 1e-4},
    "adamw": {"lr": 1e-2, "weight_decay": 1e-1},
    "adabelief": {"lr": 1e-2, "weight_decay": 1e-4},
    "lion": {"lr": 2e-3, "weight_decay": 1.0},
    "lamb": {"lr": 1e-2, "weight_decay": 1e-1},
}
HIDDEN = 64
BATCH_SIZE = 32
EPOCHS = 30
QUICK_EPOCHS = 3
WARMUP_FRACTION = 0.05
TARGET_ACCURACY = 0.95


# -- data -----------------------------------------------------------------------------
def load_data(seed: int, test_size: float = 0.25):
    """Digits as float32 features standardized with the training set's statistics, and
    int labels: (X_train, y_train, X_test, y_test), a stratified split fixed by ``seed``."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=test_size, random_state=seed, stratify=y)
    mean = X_train.mean(axis=0)
    std = X_train.std(axis=0)
    std[std == 0] = 1.0          # a few border pixels are always 0
    X_train = ((X_train - mean) / std).astype(np.float32)
    X_test = ((X_test - mean) / std).astype(np.float32)
    return X_train, y_train.astype(np.int64), X_test, y_test.astype(np.int64)


# -- model ----------------------------------------------------------------------------
def init_params(n_in: int, n_hidden: int, n_out: int, seed: int,
                dtype=np.float32) -> dict[str, np.ndarray]:
    """Glorot-uniform weights (stored as (fan_in, fan_out)) and zero biases, by name."""
    rng = np.random.default_rng(seed)

    def glorot(fan_in: int, fan_out: int) -> np.ndarray:
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, (fan_in, fan_out)).astype(dtype)

    return {"fc1_weight": glorot(n_in, n_hidden), "fc1_bias": np.zeros(n_hidden, dtype),
            "fc2_weight": glorot(n_hidden, n_out), "fc2_bias": np.zeros(n_out, dtype)}


def forward(params: dict[str, np.ndarray], X: np.ndarray):
    """The logits, and the hidden activations the backward pass needs."""
    h = np.tanh(X @ params["fc1_weight"] + params["fc1_bias"])
    logits = h @ params["fc2_weight"] + params["fc2_bias"]
    return logits, h


def softmax_cross_entropy(logits: np.ndarray, y: np.ndarray):
    """The summed cross-entropy (a float) and the softmax probabilities."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    total = exp.sum(axis=1, keepdims=True)
    log_probs = shifted - np.log(total)
    loss = -float(log_probs[np.arange(len(y)), y].sum(dtype=np.float64))
    return loss, exp / total


def loss_and_grads(params: dict[str, np.ndarray], X: np.ndarray, y: np.ndarray):
    """The cross-entropy summed over the batch and its gradients, in the order of
    ``params`` (dtype and shape of each parameter)."""
    logits, h = forward(params, X)
    loss, probs = softmax_cross_entropy(logits, y)
    d_logits = probs
    d_logits[np.arange(len(y)), y] -= 1          # d loss / d logits
    d_hidden = (d_logits @ params["fc2_weight"].T) * (1 - h * h)   # through tanh
    grads = {"fc1_weight": X.T @ d_hidden, "fc1_bias": d_hidden.sum(axis=0),
             "fc2_weight": h.T @ d_logits, "fc2_bias": d_logits.sum(axis=0)}
    return loss, [grads[name] for name in params]


def evaluate(params: dict[str, np.ndarray], X: np.ndarray, y: np.ndarray):
    """(mean cross-entropy, accuracy) over a whole dataset."""
    logits, _ = forward(params, X)
    loss, _ = softmax_cross_entropy(logits, y)
    return loss / len(y), float(np.mean(logits.argmax(axis=1) == y))


# -- training -------------------------------------------------------------------------
def make_optimizer(name: str, params: dict[str, np.ndarray], max_steps: int,
                   batch_size: int, state_format: str | None = None) -> optgen.Optimizer:
    """optgen's ``name`` over the named params: warm-up + cosine lr, weight decay (not on
    biases, by the default name filter), global-norm clipping, batch-mean gradients.
    ``state_format`` ("bf16") stores every tensor's states in that format (this model's
    tensors are all below the default size threshold, so it is set to 0)."""
    formats = {} if state_format is None else \
        {"state_format": state_format, "state_format_min_size": 0}
    hyper = dict(CONFIGS[name])
    peak = hyper.pop("lr")
    warmup = max(1, int(WARMUP_FRACTION * max_steps))
    lr = optgen.schedules.cosine(peak, max_steps, final_lr=0.01 * peak, warmup_steps=warmup)
    return optgen.create(name, params, lr=lr, clip_global_norm=1.0,
                         rescale_grad=1.0 / batch_size, **formats, **hyper)


def train(name: str, init: dict[str, np.ndarray], data, epochs: int, batch_size: int,
          seed: int, state_format: str | None = None) -> dict:
    """Train a copy of ``init`` with optimizer ``name``; the results of the run, with the
    training loss and test accuracy after every epoch (epoch 0: the initial weights)."""
    X_train, y_train, X_test, y_test = data
    params = {k: v.copy() for k, v in init.items()}
    steps_per_epoch = math.ceil(len(X_train) / batch_size)
    max_steps = epochs * steps_per_epoch
    start = time.perf_counter()
    opt = make_optimizer(name, params, max_steps, batch_size, state_format)
    ready_s = time.perf_counter() - start

    history = {"epoch": [], "train_loss": [], "test_accuracy": []}

    def record(epoch: int) -> None:
        history["epoch"].append(epoch)
        history["train_loss"].append(evaluate(params, X_train, y_train)[0])
        history["test_accuracy"].append(evaluate(params, X_test, y_test)[1])

    record(0)
    order_rng = np.random.default_rng(seed)      # same batches for every optimizer
    opt_ms, step_ms = [], []
    for epoch in range(1, epochs + 1):
        order = order_rng.permutation(len(X_train))
        for b in range(steps_per_epoch):
            idx = order[b * batch_size:(b + 1) * batch_size]
            t0 = time.perf_counter()
            _, grads = loss_and_grads(params, X_train[idx], y_train[idx])
            t1 = time.perf_counter()
            applied = opt.step(grads)
            t2 = time.perf_counter()
            assert applied, f"{name}: step {opt.t} was skipped"
            opt_ms.append(1e3 * (t2 - t1))
            step_ms.append(1e3 * (t2 - t0))
        record(epoch)

    train_loss, train_acc = evaluate(params, X_train, y_train)
    reached = [e for e, a in zip(history["epoch"], history["test_accuracy"])
               if a >= TARGET_ACCURACY]
    # Medians: when the kernels come from the cache, the first step of a process also
    # loads the TVM runtime (seconds), which would swamp a mean of sub-millisecond steps.
    return {"final_loss": train_loss, "train_accuracy": train_acc,
            "test_accuracy": history["test_accuracy"][-1], "steps": max_steps,
            "epochs_to_target": reached[0] if reached else None,
            "opt_step_ms": float(np.median(opt_ms)), "train_step_ms": float(np.median(step_ms)),
            "first_step_ms": opt_ms[0], "kernels_ready_s": ready_s, "history": history}


# -- output ---------------------------------------------------------------------------
def print_table(results: dict[str, dict]) -> None:
    header = (f"{'optimizer':<9} {'steps':>6} {'train loss':>10} {'train acc':>9} "
              f"{'test acc':>8} {f'{TARGET_ACCURACY:.0%} at':>8} {'opt.step ms':>11} "
              f"{'step ms':>8}")
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        reached = "-" if r["epochs_to_target"] is None else f"ep {r['epochs_to_target']}"
        print(f"{name:<9} {r['steps']:>6} {r['final_loss']:>10.3g} {r['train_accuracy']:>9.3f} "
              f"{r['test_accuracy']:>8.3f} {reached:>8} {r['opt_step_ms']:>11.3f} "
              f"{r['train_step_ms']:>8.3f}")
    print(f"({TARGET_ACCURACY:.0%} at: the first epoch with that test accuracy; medians over "
          "the steps; opt.step ms: the optimizer update alone, step ms: forward, backward "
          "and update)")


def plot(results: dict[str, dict], path: str, title: str) -> None:
    """Training loss (log scale) and test accuracy against the epoch, one line per
    optimizer, as a PNG at ``path``. matplotlib is imported here, and only here."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax_loss, ax_acc = fig.subplots(1, 2)
    for name, r in results.items():
        h = r["history"]
        ax_loss.plot(h["epoch"], h["train_loss"], label=name, linewidth=1.6)
        ax_acc.plot(h["epoch"], h["test_accuracy"], label=name, linewidth=1.6)
    ax_loss.set(yscale="log", xlabel="epoch", ylabel="training loss (mean cross-entropy)",
                title="training loss")
    finish_plot(fig, ax_loss, ax_acc, results, title, path)


def finish_plot(fig, ax_loss, ax_acc, results: dict[str, dict], title: str,
                path: str) -> None:
    """The accuracy panel zoomed on the end of training (the first epochs come in from
    below), grids and legends, the title; then the PNG at ``path``."""
    worst = min(r["test_accuracy"] for r in results.values())
    ax_acc.set(ylim=(max(0.0, math.floor(20 * worst) / 20 - 0.1), 1.0), xlabel="epoch",
               ylabel="test accuracy", title="test accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=9)
    save_figure(fig, title, path)


def save_figure(fig, title: str, path: str) -> None:
    fig.suptitle(title)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)


# -- command line ---------------------------------------------------------------------
def parse_args(argv=None, *, doc: str = __doc__, configs: dict | None = CONFIGS,
               epochs: int = EPOCHS, quick_epochs: int = QUICK_EPOCHS,
               batch_size: int = BATCH_SIZE, plot_help: str = "the convergence plot",
               extra=None) -> argparse.Namespace:
    """The digits trainers' command line (this script, train_mlp_matrix.py and
    torch_trainer.py): --epochs, --quick, --seed, --batch-size, --plot, and --optimizers
    when ``configs`` names the choices; ``extra(parser)`` adds a script's own options."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=None,
                        help=f"passes over the training set (default {epochs})")
    parser.add_argument("--quick", action="store_true",
                        help=f"{quick_epochs} epochs, unless --epochs is given (for CI)")
    if configs is not None:
        parser.add_argument("--optimizers", default=",".join(configs),
                            help=f"comma-separated, from {', '.join(configs)} (default: all)")
    if extra is not None:
        extra(parser)
    parser.add_argument("--seed", type=int, default=0,
                        help="fixes the split, the initial weights and the batch order")
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--plot", metavar="PATH",
                        help=f"write {plot_help} (PNG) there; needs matplotlib")
    args = parser.parse_args(argv)
    if args.epochs is None:
        args.epochs = quick_epochs if args.quick else epochs
    if configs is not None:
        args.optimizers = [s.strip() for s in args.optimizers.split(",") if s.strip()]
        unknown = [s for s in args.optimizers if s not in configs]
        if unknown or not args.optimizers:
            parser.error(f"--optimizers: unknown {unknown[0]!r}; choose from "
                         f"{', '.join(configs)}" if unknown
                         else "--optimizers: name at least one optimizer")
        if len(set(args.optimizers)) != len(args.optimizers):
            parser.error("--optimizers: a name is given twice")
    if args.epochs < 1:
        parser.error("--epochs must be >= 1")
    if args.batch_size < 1:
        parser.error("--batch-size must be >= 1")
    return args

def main(argv=None) -> dict[str, dict]:
    """Train each optimizer from the same initial weights; print and return the results
    ``{optimizer: {"test_accuracy": ..., "final_loss": ..., "history": {...}, ...}}``."""
    args = parse_args(argv, extra=lambda p: p.add_argument(
        "--state-format", help="store the optimizer states as bf16, q8 or q4 (q8, q4: elementwise "
        "rules only, not lamb; docs/state-formats.md)"))
    data = load_data(args.seed)
    X_train, y_train, X_test, _ = data
    model = f"MLP {X_train.shape[1]}-{HIDDEN}-10 (tanh)"
    print(f"digits: {len(X_train)} train / {len(X_test)} test samples, "
          f"{X_train.shape[1]} features, {model}, batch {args.batch_size}, "
          f"{args.epochs} epochs")
    init = init_params(X_train.shape[1], HIDDEN, int(y_train.max()) + 1, args.seed)
    results = {}
    for name in args.optimizers:
        results[name] = train(name, init, data, args.epochs, args.batch_size, args.seed,
                              args.state_format)
        r = results[name]
        print(f"{name}: kernels ready in {r['kernels_ready_s']:.2f} s (built on first use, "
              f"then cached), first step {r['first_step_ms']:.1f} ms, "
              f"test accuracy {r['test_accuracy']:.3f}")
    print()
    print_table(results)
    if args.plot:
        plot(results, args.plot, f"scikit-learn digits, {model}, batch {args.batch_size}, "
                                 f"{args.epochs} epochs, same initial weights and batches")
        print(f"wrote {args.plot}")
    return results


if __name__ == "__main__":
    main()

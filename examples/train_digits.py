"""Train a small MLP on scikit-learn's digits with optgen's Adam and LAMB.

The digits dataset (1797 8x8 images of handwritten digits, 10 classes) ships inside
scikit-learn, so this runs offline. The model is a 64 -> 64 (tanh) -> 10 (softmax)
multilayer perceptron written in plain numpy float32 with hand-written backprop; no deep
learning framework is involved. Each optimizer trains the same initial weights on the
same minibatches, using what a real trainer uses from optgen's runtime:

* parameters passed by name (``{"fc1_weight": W1, "fc1_bias": b1, ...}``), so the default
  name filter leaves biases (names containing bias, beta or gamma) out of weight decay;
* a learning-rate schedule from ``optgen.schedules`` (linear warm-up, then cosine decay)
  passed as ``lr=``;
* ``weight_decay=`` (coupled L2 for Adam, decoupled for LAMB: see docs/catalog.md);
* ``clip_global_norm=1.0``: all gradients scaled together when their global norm
  exceeds 1;
* ``rescale_grad=1/batch_size``: the backprop sums the per-sample gradients and the
  kernel averages them (the global norm is taken after this rescaling).

It prints, per optimizer, the final training loss, the train and test accuracy and the
median time per step (``opt.step`` alone and the whole forward/backward/update
step).

Run it from the repository root:

    pip install -e ".[examples]"
    python examples/train_digits.py                        # adam and lamb, 20 epochs
    python examples/train_digits.py --epochs 5 --optimizers lamb --seed 1
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np

import optgen

# Per-optimizer hyperparameters (the schedule's peak lr and the weight decay).
CONFIGS = {
    "adam": {"lr": 1e-2, "weight_decay": 1e-4},
    "lamb": {"lr": 2e-2, "weight_decay": 1e-2},
}
HIDDEN = 64
BATCH_SIZE = 32
WARMUP_FRACTION = 0.05


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
                   batch_size: int) -> optgen.Optimizer:
    """optgen's ``name`` over the named params: warm-up + cosine lr, weight decay (not on
    biases, by the default name filter), global-norm clipping, batch-mean gradients."""
    config = CONFIGS[name]
    warmup = max(1, int(WARMUP_FRACTION * max_steps))
    lr = optgen.schedules.cosine(config["lr"], max_steps, final_lr=0.01 * config["lr"],
                                 warmup_steps=warmup)
    return optgen.create(name, params, lr=lr, weight_decay=config["weight_decay"],
                         clip_global_norm=1.0, rescale_grad=1.0 / batch_size)


def train(name: str, init: dict[str, np.ndarray], data, epochs: int, batch_size: int,
          seed: int) -> dict[str, float]:
    """Train a copy of ``init`` with optimizer ``name``; the results of the run."""
    X_train, y_train, X_test, y_test = data
    params = {k: v.copy() for k, v in init.items()}
    steps_per_epoch = math.ceil(len(X_train) / batch_size)
    max_steps = epochs * steps_per_epoch
    start = time.perf_counter()
    opt = make_optimizer(name, params, max_steps, batch_size)
    ready_s = time.perf_counter() - start

    order_rng = np.random.default_rng(seed)      # same batches for every optimizer
    opt_ms, step_ms = [], []
    for _ in range(epochs):
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

    train_loss, train_acc = evaluate(params, X_train, y_train)
    _, test_acc = evaluate(params, X_test, y_test)
    # Medians: when the kernels come from the cache, the first step of a process also
    # loads the TVM runtime (seconds), which would swamp a mean of sub-millisecond steps.
    return {"final_loss": train_loss, "train_accuracy": train_acc, "test_accuracy": test_acc,
            "steps": max_steps, "opt_step_ms": float(np.median(opt_ms)),
            "train_step_ms": float(np.median(step_ms)), "first_step_ms": opt_ms[0],
            "kernels_ready_s": ready_s}


def print_table(results: dict[str, dict[str, float]]) -> None:
    header = (f"{'optimizer':<9} {'steps':>6} {'train loss':>10} {'train acc':>9} "
              f"{'test acc':>8} {'opt.step ms':>11} {'step ms':>8}")
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        print(f"{name:<9} {r['steps']:>6} {r['final_loss']:>10.4f} {r['train_accuracy']:>9.3f} "
              f"{r['test_accuracy']:>8.3f} {r['opt_step_ms']:>11.3f} {r['train_step_ms']:>8.3f}")
    print("(medians over the steps; opt.step ms: the optimizer update alone, "
          "step ms: forward, backward and update)")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20, help="passes over the training set")
    parser.add_argument("--optimizers", default="adam,lamb",
                        help=f"comma-separated, from {', '.join(CONFIGS)}")
    parser.add_argument("--seed", type=int, default=0,
                        help="fixes the split, the initial weights and the batch order")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    args = parser.parse_args(argv)
    args.optimizers = [s.strip() for s in args.optimizers.split(",") if s.strip()]
    unknown = [s for s in args.optimizers if s not in CONFIGS]
    if unknown or not args.optimizers:
        parser.error(f"--optimizers: unknown {unknown[0]!r}; choose from {', '.join(CONFIGS)}"
                     if unknown else "--optimizers: name at least one optimizer")
    if args.epochs < 1:
        parser.error("--epochs must be >= 1")
    if args.batch_size < 1:
        parser.error("--batch-size must be >= 1")
    return args


def main(argv=None) -> dict[str, dict[str, float]]:
    """Train each optimizer from the same initial weights; print and return the results
    ``{optimizer: {"test_accuracy": ..., "final_loss": ..., ...}}``."""
    args = parse_args(argv)
    data = load_data(args.seed)
    X_train, y_train, X_test, _ = data
    print(f"digits: {len(X_train)} train / {len(X_test)} test samples, "
          f"{X_train.shape[1]} features, MLP {X_train.shape[1]}-{HIDDEN}-10, "
          f"batch {args.batch_size}, {args.epochs} epochs")
    init = init_params(X_train.shape[1], HIDDEN, int(y_train.max()) + 1, args.seed)
    results = {}
    for name in args.optimizers:
        results[name] = train(name, init, data, args.epochs, args.batch_size, args.seed)
        r = results[name]
        print(f"{name}: kernels ready in {r['kernels_ready_s']:.2f} s (built on first use, "
              f"then cached), first step {r['first_step_ms']:.1f} ms, "
              f"test accuracy {r['test_accuracy']:.3f}")
    print()
    print_table(results)
    return results


if __name__ == "__main__":
    main()

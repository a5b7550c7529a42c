"""optgen.torch.SOAP beside the SOAP authors' own class (github.com/nikhilvyas/SOAP,
soap.py), both in float32 from the same weights on the same data.

1. Unique basis: a batch-averaged least-squares regression (4x more samples than inputs)
   on two square layers, a bias and a layer 10001 x 2 (its long side is not
   preconditioned): every statistic is full rank with distinct eigenvalues at the first
   fit, so the two runs must follow each other; prints the largest difference of the
   weights over the steps, relative to max|w|.
2. Basis not unique: a 64-32-10 tanh MLP on scikit-learn's digits with batch size 1
   (every first fit is of a rank-1 g g^T, whose null-space eigenvectors each
   implementation picks its own way): the training loss of both over several seeds
   (mean and spread), and a plot.

The authors' code is not part of optgen: pass the path of their soap.py (fetched there
when missing and the network allows):

    python bench/soap_vs_authors.py --authors /tmp/soap.py
    python bench/soap_vs_authors.py --authors /tmp/soap.py --seeds 5 --plot docs/img/soap_vs_authors.png
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
import urllib.request

import numpy as np
import torch

import optgen.torch

URL = "https://raw.githubusercontent.com/nikhilvyas/SOAP/main/soap.py"
UNIQUE_SHAPES = [(16, 16), (32, 32), (16,), (10001, 2)]


def authors_class(path: str) -> type:
    if not os.path.exists(path):
        try:
            urllib.request.urlretrieve(URL, path)
        except OSError as e:
            sys.exit(f"{path} is missing and {URL} could not be fetched ({e}); download "
                     "the authors' soap.py and pass its path with --authors")
    spec = importlib.util.spec_from_file_location("authors_soap", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SOAP


# -- 1. a regression whose eigenbases are unique ---------------------------------------
def regression_data(seed: int, steps: int, shapes=UNIQUE_SHAPES, dtype: str = "float32"):
    """Initial weights and per step each layer's batch (x, y): y = A x + 0.1 noise with
    A = W0 + U S V^T (S = 1..2), 4 C samples of x ~ N(0, I) (8 for a layer over 100
    wide); a bias's batch is (None, a + 0.3 noise). Every statistic SOAP gathers is full
    rank, with eigenvalues apart, when the layers are square or one side is over 10000.
    (tests/test_matrix_soap.py runs its oracle on this problem.)"""
    rng = np.random.default_rng(seed)
    w0, targets = [], []
    for s in shapes:
        w = 0.3 * rng.standard_normal(s)
        w0.append(w.astype(dtype))
        if len(s) == 1:
            targets.append(rng.standard_normal(s))
            continue
        k = min(s)
        u = np.linalg.qr(rng.standard_normal((s[0], k)))[0]
        v = np.linalg.qr(rng.standard_normal((s[1], k)))[0]
        targets.append(w + u @ np.diag(np.linspace(1, 2, k)) @ v.T)
    batches = []
    for _ in range(steps):
        step = []
        for s, a in zip(shapes, targets):
            if len(s) == 1:
                step.append((None, a + 0.3 * rng.standard_normal(s)))
                continue
            n = 4 * s[1] if s[1] < 100 else 8
            x = rng.standard_normal((s[1], n))
            step.append((x, a @ x + 0.1 * rng.standard_normal((s[0], n))))
        batches.append(step)
    return w0, batches


def gradient(w: np.ndarray, batch) -> np.ndarray:
    """The gradient of 0.5 mean ||W x - y||^2 (a bias: of 0.5 ||b - y||^2), float64."""
    x, y = batch
    w = np.asarray(w, np.float64)
    return w - y if x is None else (w @ x - y) @ x.T / x.shape[1]


def regression_grads(params, step) -> None:
    for p, batch in zip(params, step):
        p.grad = torch.from_numpy(gradient(p.detach().numpy(), batch).astype(np.float32))


def unique_basis(cls: type, seed: int, steps: int) -> list[float]:
    """Per layer, the largest |w_optgen - w_authors| / max|w_authors| over the steps."""
    w0, batches = regression_data(seed, steps)
    runs = []
    for make in (optgen.torch.SOAP, cls):
        params = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in w0]
        runs.append((params, make(params)))
    worst = [0.0] * len(w0)
    for step in batches:
        for params, opt in runs:
            regression_grads(params, step)
            opt.step()
        for i, (a, b) in enumerate(zip(runs[0][0], runs[1][0])):
            a, b = a.detach().double(), b.detach().double()
            worst[i] = max(worst[i], float((a - b).abs().max() / b.abs().max()))
    return worst


# -- 2. batch size 1: bases that are not unique ----------------------------------------
def digits():
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = torch.tensor(x[order] / 16.0, dtype=torch.float32), torch.tensor(y[order])
    return x[:1347], y[:1347]


def mlp_run(cls: type, seed: int, data, steps: int, every: int) -> list[float]:
    """The full training loss every ``every`` steps of batch-size-1 training."""
    x, y = data
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 10))
    opt = cls(model.parameters())
    order = np.random.default_rng(seed).integers(0, len(x), steps)
    loss_fn = torch.nn.functional.cross_entropy
    curve = []
    for t, i in enumerate(order):
        if t % every == 0:
            with torch.no_grad():
                curve.append(float(loss_fn(model(x), y)))
        opt.zero_grad()
        loss_fn(model(x[i:i + 1]), y[i:i + 1]).backward()
        opt.step()
    with torch.no_grad():
        curve.append(float(loss_fn(model(x), y)))
    return curve


def plot(path: str, xs, curves: dict) -> None:
    """Left: every run's loss and each optimizer's mean; right: per seed, the gap between
    optgen's and the authors' run, beside the seed-to-seed spread of either."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, gap) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=100)
    for (name, c), color, style in zip(curves.items(), ("tab:blue", "tab:orange"),
                                       ("-", "--")):
        c = np.array(c)
        for run in c:
            ax.plot(xs, run, color=color, alpha=0.3, lw=0.8, ls=style)
        ax.plot(xs, c.mean(0), color=color, lw=2, ls=style,
                label=f"{name} (mean of {len(c)} seeds)")
        gap.plot(xs[1:], c.std(0)[1:], color=color, lw=2, ls=style,
                 label=f"{name}: std over seeds")
    o, a = (np.array(c) for c in curves.values())
    for j, d in enumerate(np.abs(o - a)):
        gap.plot(xs[1:], d[1:], color="tab:green", alpha=0.6, lw=0.8,
                 label="|optgen - authors|, same seed" if j == 0 else None)
    ax.set_yscale("log")
    ax.set_xlabel("step (batch size 1)")
    ax.set_ylabel("training loss")
    ax.set_title("SOAP on digits, 64-32-10 MLP")
    ax.legend(fontsize=8)
    gap.set_yscale("log")
    gap.set_xlabel("step")
    gap.set_title("difference vs seed-to-seed spread")
    gap.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--authors", default="/tmp/soap.py", help="path of the authors' soap.py")
    ap.add_argument("--steps", type=int, default=100, help="steps of the regression")
    ap.add_argument("--seeds", type=int, default=5, help="seeds of the MLP runs")
    ap.add_argument("--mlp-steps", type=int, default=1000)
    ap.add_argument("--plot", help="write the MLP's loss curves to this PNG")
    args = ap.parse_args(argv)
    cls = authors_class(args.authors)
    torch.set_num_threads(1)

    print(f"1. unique basis: regression, float32, {args.steps} steps, authors' defaults")
    for seed in range(3):
        worst = unique_basis(cls, seed, args.steps)
        print(f"   seed {seed}: max |w_optgen - w_authors| / max|w| per layer "
              + ", ".join(f"{s}: {e:.1e}" for s, e in zip(UNIQUE_SHAPES, worst)))

    print(f"2. batch size 1 (first fits of rank 1): digits MLP 64-32-10, {args.mlp_steps} "
          f"steps, {args.seeds} seeds, training loss (mean +- std over seeds)")
    data, every = digits(), 50
    curves = {"optgen": [], "authors": []}
    start = time.perf_counter()
    for seed in range(args.seeds):
        curves["optgen"].append(mlp_run(optgen.torch.SOAP, seed, data, args.mlp_steps, every))
        curves["authors"].append(mlp_run(cls, seed, data, args.mlp_steps, every))
    xs = list(range(0, args.mlp_steps + 1, every))
    o, a = np.array(curves["optgen"]), np.array(curves["authors"])
    print("   step   optgen            authors           |mean diff| / seed std")
    for j in range(0, len(xs), 4):
        spread = max(o[:, j].std(), a[:, j].std())
        print(f"   {xs[j]:5d}  {o[:, j].mean():.4f} +- {o[:, j].std():.4f}  "
              f"{a[:, j].mean():.4f} +- {a[:, j].std():.4f}  "
              f"{abs(o[:, j].mean() - a[:, j].mean()) / spread:.2f}")
    print(f"   same seed, |optgen - authors| at the end: median "
          f"{np.median(np.abs(o[:, -1] - a[:, -1])):.4f}, seed-to-seed std of the final "
          f"loss: optgen {o[:, -1].std():.4f}, authors {a[:, -1].std():.4f} "
          f"({time.perf_counter() - start:.0f} s)")
    if args.plot:
        plot(args.plot, xs, curves)
        print(f"   plot: {args.plot}")


if __name__ == "__main__":
    main()

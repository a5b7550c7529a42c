"""Train a PyTorch MLP on scikit-learn's digits with optgen's drop-in AdamW under a torch
learning-rate scheduler, side by side with torch.optim.AdamW.

``optgen.torch.AdamW`` is a ``torch.optim.Optimizer`` whose step runs optgen's fused
AdamW kernel (specs/adamw.py) on the parameters' memory. torch keeps its
``param_groups``, so a torch scheduler drives it as it drives torch's own optimizers: the
lr (and, for OneCycleLR, beta1) that the scheduler writes into ``param_groups`` before a
step is validated and passed to the kernel as an argument, never recompiling anything.

The two runs start from the same initial weights (one ``torch.nn`` model, deep-copied)
and see the same minibatches in the same order; each has its own scheduler of the same
kind. Per epoch the script prints the lr, both runs' training loss (mean cross-entropy
over the whole training set) and test accuracy, and the largest weight difference
between them; at the end, the final accuracies, the median ``opt.step`` time of each,
and the lr trajectory check: the lr (and beta1) read from the two optimizers'
``param_groups`` before every step are the same numbers.

Identical or just close? optgen's adamw spec is torch's AdamW rule: decoupled decay
``w *= 1 - lr * weight_decay``, eps added to the bias-corrected ``sqrt(v)``, the same
defaults. optgen's Adam would not be: it follows MXNet, eps added to the uncorrected
``sqrt(v)`` (README, "Conventions chosen"). So the two AdamW trajectories follow the same
arithmetic, but not bit for bit: the kernel computes each update in one fused float32
expression with its scalars (bias corrections, ``lr / (1 - beta1**t)``) computed in
float64 on the host, while torch runs a sequence of float32 tensor operations, so the
last bits differ. On this model the weights stay within a few 1e-6 of each other
through a run and the accuracies agree. That agreement is also what shows that the
kernel used the scheduled values: the lr changes at every step, by orders of magnitude
over a run, and with either the lr or beta1 held at its initial value the weights end
about 0.1 away from torch's.

Run it from the repository root (torch is in the test extra: ``pip install -e ".[test]"``):

    python examples/torch_trainer.py                      # OneCycleLR, 20 epochs
    python examples/torch_trainer.py --plot docs/img/torch_trainer.png
    python examples/torch_trainer.py --scheduler warmup-cosine --quick
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch

import optgen.torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # the sibling example
import train_digits  # noqa: E402

LR = 3e-3                # the schedule's peak
WEIGHT_DECAY = 0.05
HIDDEN = 128
BATCH_SIZE = 32
EPOCHS = 20
QUICK_EPOCHS = 3
WARMUP_FRACTION = 0.1    # warmup-cosine: linear warm-up over this share of the steps
SCHEDULERS = ("onecycle", "warmup-cosine")


# -- data and model -------------------------------------------------------------------
def load_data(seed: int, test_size: float = 0.25):
    """train_digits.py's split and standardization (the same data, bit for bit) as
    tensors: float32 features and int64 labels, (X_train, y_train, X_test, y_test)."""
    return tuple(torch.from_numpy(a) for a in train_digits.load_data(seed, test_size))


def make_model(n_in: int, n_out: int, seed: int) -> torch.nn.Module:
    """64 -> 128 (ReLU) -> 10, torch's default initialization under ``seed``."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(n_in, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, n_out))


@torch.no_grad()
def evaluate(model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor):
    """(mean cross-entropy, accuracy) over a whole dataset."""
    logits = model(X)
    loss = torch.nn.functional.cross_entropy(logits, y).item()
    return loss, (logits.argmax(dim=1) == y).double().mean().item()


# -- optimizers and schedulers --------------------------------------------------------
def make_scheduler(kind: str, opt: torch.optim.Optimizer, total_steps: int):
    """A torch lr scheduler stepped once per batch: OneCycleLR (which also cycles beta1
    between 0.95 and 0.85), or a linear warm-up then cosine decay through SequentialLR."""
    sched = torch.optim.lr_scheduler
    if kind == "onecycle":
        return sched.OneCycleLR(opt, max_lr=LR, total_steps=total_steps, pct_start=0.3)
    warmup = max(1, int(WARMUP_FRACTION * total_steps))
    return sched.SequentialLR(opt, [
        sched.LinearLR(opt, start_factor=0.01, total_iters=warmup),
        sched.CosineAnnealingLR(opt, T_max=max(1, total_steps - warmup), eta_min=LR / 100),
    ], milestones=[warmup])


@dataclass
class Run:
    """One optimizer's model, optimizer, scheduler and records."""
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    sched: object
    lr: list = field(default_factory=list)        # param_groups' lr before each step
    beta1: list = field(default_factory=list)
    step_ms: list = field(default_factory=list)
    history: dict = field(default_factory=lambda: {"epoch": [], "train_loss": [],
                                                   "test_accuracy": []})

    def train_step(self, X: torch.Tensor, y: torch.Tensor) -> None:
        group = self.opt.param_groups[0]
        self.lr.append(float(group["lr"]))
        self.beta1.append(float(group["betas"][0]))
        self.opt.zero_grad()
        torch.nn.functional.cross_entropy(self.model(X), y).backward()
        start = time.perf_counter()
        self.opt.step()
        self.step_ms.append(1e3 * (time.perf_counter() - start))
        self.sched.step()

    def record(self, epoch: int, data) -> None:
        X_train, y_train, X_test, y_test = data
        self.history["epoch"].append(epoch)
        self.history["train_loss"].append(evaluate(self.model, X_train, y_train)[0])
        self.history["test_accuracy"].append(evaluate(self.model, X_test, y_test)[1])


def max_weight_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


# -- training -------------------------------------------------------------------------
def train(args: argparse.Namespace, data) -> tuple[dict[str, Run], list[float]]:
    """Both runs in lockstep, batch by batch; the runs and the weight difference after
    every epoch (epoch 0: the shared initial weights)."""
    X_train, y_train = data[0], data[1]
    init = make_model(X_train.shape[1], int(y_train.max()) + 1, args.seed)
    steps_per_epoch = math.ceil(len(X_train) / args.batch_size)
    total = args.epochs * steps_per_epoch
    runs = {}
    for name, cls in (("optgen", optgen.torch.AdamW), ("torch", torch.optim.AdamW)):
        model = copy.deepcopy(init)
        opt = cls(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
        runs[name] = Run(model, opt, make_scheduler(args.scheduler, opt, total))
    diffs = []
    order = torch.Generator().manual_seed(args.seed)   # same batches for both runs
    for epoch in range(args.epochs + 1):
        if epoch > 0:
            perm = torch.randperm(len(X_train), generator=order)
            for b in range(steps_per_epoch):
                idx = perm[b * args.batch_size:(b + 1) * args.batch_size]
                for run in runs.values():
                    run.train_step(X_train[idx], y_train[idx])
        for run in runs.values():
            run.record(epoch, data)
        diffs.append(max_weight_diff(runs["optgen"].model, runs["torch"].model))
        print_epoch(epoch, runs, diffs[-1])
    return runs, diffs


def print_epoch(epoch: int, runs: dict[str, Run], diff: float) -> None:
    cols = []
    for name, run in runs.items():
        h = run.history
        cols.append(f"{name} loss {h['train_loss'][-1]:.4f} acc {h['test_accuracy'][-1]:.3f}")
    lr = f"lr {runs['optgen'].lr[-1]:.2e}" if runs["optgen"].lr else "lr -       "
    print(f"epoch {epoch:2d}  {lr}  {'  |  '.join(cols)}  |  max |w_optgen - w_torch| "
          f"{diff:.1e}")


def summarize(runs: dict[str, Run], diffs: list[float], scheduler: str) -> dict:
    """The results dict main returns, and its printout."""
    mine, ref = runs["optgen"], runs["torch"]
    out = {"scheduler": scheduler, "steps": len(mine.lr), "max_weight_diff": diffs[-1],
           "weight_diff_history": diffs,
           "lr_identical": mine.lr == ref.lr, "beta1_identical": mine.beta1 == ref.beta1}
    for name, run in runs.items():
        out[name] = {"test_accuracy": run.history["test_accuracy"][-1],
                     "final_loss": run.history["train_loss"][-1], "history": run.history,
                     "lr": run.lr, "beta1": run.beta1,
                     "opt_step_ms": float(np.median(run.step_ms))}
    print(f"\nfinal test accuracy: optgen AdamW {out['optgen']['test_accuracy']:.3f}, "
          f"torch AdamW {out['torch']['test_accuracy']:.3f}; largest weight difference "
          f"{diffs[-1]:.1e}")
    print(f"median opt.step: optgen {out['optgen']['opt_step_ms']:.3f} ms, "
          f"torch {out['torch']['opt_step_ms']:.3f} ms")
    lr = np.array(mine.lr)
    same = "identical" if out["lr_identical"] and out["beta1_identical"] else "DIFFERENT"
    print(f"lr trajectory ({scheduler}, {len(lr)} steps): {lr[0]:.2e} -> peak {lr.max():.2e} "
          f"at step {int(lr.argmax())} -> {lr[-1]:.2e}; beta1 {min(mine.beta1):.3f}.."
          f"{max(mine.beta1):.3f}; {same} in both optimizers' param_groups before every "
          f"step, and optgen's kernel followed it (weights within {max(diffs):.1e} of "
          "torch's throughout)")
    return out


def plot(out: dict, path: str, title: str) -> None:
    """Training loss of both runs against the epoch, and the lr (and beta1) the
    scheduler set at every step, as a PNG at ``path``. matplotlib is imported here."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax_loss, ax_lr = fig.subplots(1, 2)
    for name, style in (("optgen", dict(linewidth=3, alpha=0.6)),
                        ("torch", dict(linewidth=1.4, linestyle="--", color="black"))):
        h = out[name]["history"]
        ax_loss.plot(h["epoch"], h["train_loss"], label=f"{name} AdamW "
                     f"(test acc {out[name]['test_accuracy']:.3f})", **style)
    ax_loss.set(yscale="log", xlabel="epoch", ylabel="training loss (mean cross-entropy)",
                title=f"training loss (weights within {max(out['weight_diff_history']):.1e})")
    steps = np.arange(out["steps"])
    ax_lr.plot(steps, out["optgen"]["lr"], label="lr, optgen", linewidth=3, alpha=0.6)
    ax_lr.plot(steps, out["torch"]["lr"], label="lr, torch", linewidth=1.4,
               linestyle="--", color="black")
    ax_lr.set(xlabel="step", ylabel="learning rate", title=f"{out['scheduler']} schedule")
    if min(out["optgen"]["beta1"]) != max(out["optgen"]["beta1"]):
        ax_beta = ax_lr.twinx()
        ax_beta.plot(steps, out["optgen"]["beta1"], color="tab:green", linewidth=1,
                     label="beta1 (right axis)")
        ax_beta.set_ylabel("beta1")
        ax_beta.legend(loc="upper right", fontsize=9)
    for ax in (ax_loss, ax_lr):
        ax.grid(True, which="both", alpha=0.3)
    ax_loss.legend(fontsize=9)
    ax_lr.legend(loc="center right", fontsize=9)
    train_digits.save_figure(fig, title, path)


# -- command line ---------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    return train_digits.parse_args(
        argv, doc=__doc__, configs=None, epochs=EPOCHS, quick_epochs=QUICK_EPOCHS,
        batch_size=BATCH_SIZE, plot_help="the loss and lr plot",
        extra=lambda p: p.add_argument("--scheduler", choices=SCHEDULERS, default="onecycle"))

def main(argv=None) -> dict:
    """Train both runs; print and return ``{"optgen": {...}, "torch": {...},
    "lr_identical": ..., "max_weight_diff": ..., ...}``."""
    args = parse_args(argv)
    data = load_data(args.seed)
    X_train, _, X_test, _ = data
    model = f"MLP {X_train.shape[1]}-{HIDDEN}-10 (ReLU)"
    print(f"digits: {len(X_train)} train / {len(X_test)} test samples, torch.nn {model}, "
          f"batch {args.batch_size}, {args.epochs} epochs, AdamW lr {LR} (peak) weight "
          f"decay {WEIGHT_DECAY}, {args.scheduler} scheduler")
    runs, diffs = train(args, data)
    out = summarize(runs, diffs, args.scheduler)
    if args.plot:
        plot(out, args.plot, f"scikit-learn digits, torch.nn {model}, {args.epochs} epochs: "
                             "optgen.torch.AdamW vs torch.optim.AdamW, same scheduler")
        print(f"wrote {args.plot}")
    return out


if __name__ == "__main__":
    main()

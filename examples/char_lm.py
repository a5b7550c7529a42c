"""A character-level language model trained with optgen's AdamW, with the optimizer states
in float32, bf16 or q8 (docs/state-formats.md).

    python examples/char_lm.py                   # 300 steps per format, prints the losses
    python examples/char_lm.py --plot lm.png     # also plots the loss curves (matplotlib)

The model reads the next character of this repository's README.md from the 16 before it:
an embedding (24 per character), an MLP (384 -> 256, tanh) and the vocabulary's logits,
about 125k parameters. Every run starts from the same weights and sees the same batches
(fixed seeds, one torch thread), so the curves differ only by the state format.
"""
from __future__ import annotations

import argparse
import os

import torch

import optgen.torch as ot

CONTEXT = 16
FORMATS = (None, "bf16", "q8", "q4")


def load_text() -> str:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md"),
              encoding="utf-8") as f:
        return f.read()


def load_data() -> tuple[list[str], torch.Tensor]:
    """The vocabulary (README.md's characters, sorted) and the text as their indices."""
    text = load_text()
    vocab = sorted(set(text))
    return vocab, torch.tensor([vocab.index(c) for c in text])


def build_model(vocab_size: int) -> torch.nn.Module:
    """The embedding, MLP and logits (about 125k parameters with README.md's vocabulary)."""
    return torch.nn.Sequential(torch.nn.Embedding(vocab_size, 24), torch.nn.Flatten(),
                               torch.nn.Linear(CONTEXT * 24, 256), torch.nn.Tanh(),
                               torch.nn.Linear(256, vocab_size))


def sample_batch(data: torch.Tensor, g: torch.Generator, size: int = 64,
                 context: int = CONTEXT) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` random windows of ``context`` characters and the character after each."""
    at = torch.randint(0, len(data) - context - 1, (size,), generator=g)
    return torch.stack([data[a:a + context] for a in at.tolist()]), data[at + context]


def train(state_format: str | None, steps: int = 300, seed: int = 0) -> list[float]:
    """The training loss of every step with AdamW and states in ``state_format``."""
    vocab, data = load_data()
    torch.manual_seed(seed)
    model = build_model(len(vocab))
    kw = {} if state_format is None else {"state_format": state_format}
    opt = ot.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, **kw)
    g = torch.Generator().manual_seed(seed + 1)
    losses = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            x, y = sample_batch(data, g)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    finally:
        torch.set_num_threads(threads)
    return losses


def main(argv=None) -> dict[str, list[float]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--plot", metavar="PATH", help="write the loss curves (PNG; matplotlib)")
    a = ap.parse_args(argv)
    runs = {fmt or "fp32": train(fmt, a.steps) for fmt in FORMATS}
    for name, losses in runs.items():
        tail = sum(losses[-30:]) / min(30, len(losses))
        print(f"{name:>5} states: loss {losses[0]:.3f} -> {tail:.4f} (mean of the last 30 steps)")
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        for name, losses in runs.items():
            smooth = [sum(losses[max(0, i - 9):i + 1]) / len(losses[max(0, i - 9):i + 1])
                      for i in range(len(losses))]
            ax.plot(smooth, label=f"{name} states")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (10-step mean)")
        ax.set_title("char-level LM on README.md, optgen AdamW")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=100)
        print(f"wrote {a.plot}")
    return runs


if __name__ == "__main__":
    main()

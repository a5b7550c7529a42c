"""optgen under the Hugging Face Trainer: a tiny randomly initialised BERT classifier
(built from a config, nothing downloaded) trained on generated data with
``optgen.torch.AdamW`` and a linear warmup schedule, then resumed from a checkpoint the
Trainer wrote.

    python examples/hf_trainer.py              # 300 steps, prints the loss curve
    python examples/hf_trainer.py --steps 60

The task: a sequence of random tokens is labelled 1 when token 3 occurs in it more often
than token 4. The Trainer calls ``optimizer.step()``, ``zero_grad()``, the scheduler, and
saves ``optimizer.state_dict()`` in each checkpoint (optimizer.pt); resuming loads it
with ``load_state_dict``: all of it the torch.optim interface the drop-ins implement.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch

import optgen.torch as ot

VOCAB, LENGTH = 32, 16


class Counting(torch.utils.data.Dataset):
    """``n`` generated sequences (seeded), labelled by comparing two token counts."""

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(5, VOCAB, (n, LENGTH), generator=g)
        marks = torch.randint(0, 4, (n, LENGTH), generator=g)   # ~1/4 of places get 3 or 4
        picks = torch.where(torch.rand(n, LENGTH, generator=g) < 0.5, 3, 4)
        self.ids = torch.where(marks == 0, picks, self.ids)
        self.labels = ((self.ids == 3).sum(1) > (self.ids == 4).sum(1)).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(LENGTH, dtype=torch.long),
                "labels": self.labels[i]}


def model():
    """A 2-layer BERT with hidden size 64, random weights, no dropout (runs repeat)."""
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=128,
                        max_position_embeddings=LENGTH, num_labels=2,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config)


def trainer(net, out_dir: str, steps: int, save_steps: int | None = None):
    """A Trainer driving optgen's AdamW with transformers' linear warmup schedule."""
    from transformers import Trainer, TrainingArguments, get_linear_schedule_with_warmup
    opt = ot.AdamW(net.parameters(), lr=3e-3, weight_decay=0.01)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=steps // 10,
                                            num_training_steps=steps)
    args = TrainingArguments(output_dir=out_dir, max_steps=steps, per_device_train_batch_size=32,
                             logging_steps=max(steps // 10, 1), report_to=[], use_cpu=True,
                             save_strategy="steps" if save_steps else "no",
                             save_steps=save_steps or steps, seed=0,
                             dataloader_num_workers=0, disable_tqdm=True)
    return Trainer(model=net, args=args, train_dataset=Counting(4096, seed=1),
                   optimizers=(opt, sched))


def accuracy(net, n: int = 1024) -> float:
    data = Counting(n, seed=2)
    with torch.no_grad():
        logits = net(input_ids=data.ids, attention_mask=torch.ones_like(data.ids)).logits
    return float((logits.argmax(1) == data.labels).float().mean())


def losses(t) -> list[float]:
    return [rec["loss"] for rec in t.state.log_history if "loss" in rec]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        net = model()
        before = accuracy(net)
        t = trainer(net, out, a.steps, save_steps=a.steps // 2)
        t.train()
        print("loss every", max(a.steps // 10, 1), "steps:",
              " ".join(f"{x:.3f}" for x in losses(t)))
        print(f"held-out accuracy {before:.3f} -> {accuracy(net):.3f}")
        half = os.path.join(out, f"checkpoint-{a.steps // 2}")
        again = model()
        trainer(again, out, a.steps, save_steps=a.steps // 2).train(resume_from_checkpoint=half)
        gap = max(float((p - q).abs().max()) for p, q in zip(net.state_dict().values(),
                                                             again.state_dict().values()))
        print(f"resumed from {os.path.basename(half)}: largest parameter difference "
              f"to the uninterrupted run {gap:.2e}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Does training with the memory-saving configurations reach the loss of float32 AdamW?
Two tasks, each configuration over several seeds, final training loss against the
reference's seed-to-seed spread.

    python bench/convergence_memory.py                      # every config, 3 seeds
    python bench/convergence_memory.py --configs "adamw/q8,adamw/torch" --seeds 2
    python bench/convergence_memory.py --report-only        # table and plot from the JSON

Tasks (the text is README.md's characters, examples/char_lm.py's data and batches,
trained on its first nine tenths):
  charlm  examples/char_lm.py's model (an embedding, an MLP, the logits: 125k
          parameters), 16 characters of context, batches of 64
  gpt2    transformers' GPT2LMHeadModel built from a config (no download): 4 layers of
          width 192, 32 characters of context, batches of 8 (1.8M parameters)
Configurations, "<rule>/<options joined by +>": ``adamw/torch`` is torch.optim.AdamW with
float32 weights and states, the reference of every ``adamw/...``; ``lion/fp32`` (optgen's
``lion`` spec, float32) is the reference of every ``lion/...``. Options: ``q8``, ``q4``,
``fp8`` (state_format), ``bf16`` (the model in bfloat16), ``split16``/``split8``
(master_format), ``fp32m`` (multi_precision=True: a float32 master), ``sib``
(step_in_backward=True). A configuration whose options are not built prints
"not available" and is left out.

Every run of a seed starts from the same weights and sees the same batches (one torch
thread, one TVM thread), so configurations differ only in the optimizer's storage. The
final loss is the mean cross-entropy, after the last step, on 512 fixed windows of the
training text (what the optimizer minimizes; the models overfit this small text, so the
loss on 512 held-out windows, also recorded as "held_out", rises late in a run). A
configuration is "within" when the mean of its seeds' final losses lies within twice
the reference's seed-to-seed standard deviation of the reference's mean.
Results go to bench/results/convergence_memory.json (merged: runs already there are
skipped unless --force), the plot to docs/img/convergence_memory.png.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("TVM_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import char_lm  # noqa: E402

JSON = os.path.join(ROOT, "bench", "results", "convergence_memory.json")
PLOT = os.path.join(ROOT, "docs", "img", "convergence_memory.png")
REFERENCE = {"adamw": "adamw/torch", "lion": "lion/fp32"}
CONFIGS = ("adamw/torch", "adamw/q8", "adamw/q4", "adamw/fp8",
           "adamw/bf16+split16+q8", "adamw/bf16+split8+q8",
           "adamw/bf16+split8+q8+sib", "adamw/bf16+split8+q4+sib", "adamw/bf16+split8+fp8+sib",
           "lion/fp32", "lion/q8", "lion/q4", "lion/fp8", "lion/bf16+split8+q8+sib")


@dataclass(frozen=True)
class Task:
    name: str
    lr: dict            # rule -> learning rate
    weight_decay: dict  # rule -> decoupled weight decay
    batch: int
    context: int
    steps: int          # the default number of steps


TASKS = {"charlm": Task("charlm", {"adamw": 3e-3, "lion": 3e-4}, {"adamw": 0.01, "lion": 0.1},
                        64, char_lm.CONTEXT, 2000),
         "gpt2": Task("gpt2", {"adamw": 3e-4, "lion": 1e-4}, {"adamw": 0.01, "lion": 0.1},
                      8, 32, 400)}


class NotAvailable(Exception):
    """The configuration's options are not built."""


# -- one run -------------------------------------------------------------------------------
def build(task: Task, vocab: int) -> torch.nn.Module:
    if task.name == "charlm":
        return char_lm.build_model(vocab)
    import transformers
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=task.context, n_embd=192,
                                  n_layer=4, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def loss_of(task: Task, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if task.name == "charlm":
        return torch.nn.functional.cross_entropy(model(x).float(), y)
    logits = model(input_ids=x).logits.float()   # predict each next character of the window
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             x[:, 1:].reshape(-1))


def optimizer(config: str, task: Task, params: list) -> Any:
    rule, _, opts = config.partition("/")
    opts_ = set(opts.split("+"))
    lr, wd = task.lr[rule], task.weight_decay[rule]
    if config == "adamw/torch":
        return torch.optim.AdamW(params, lr=lr, weight_decay=wd)
    kw: dict[str, Any] = {}
    for fmt in ("q8", "q4", "fp8"):
        if fmt in opts_:
            kw["state_format"] = fmt
    for m in ("split16", "split8"):
        if m in opts_:
            kw["master_format"] = m
    if "fp32m" in opts_:
        kw["multi_precision"] = True
    if "sib" in opts_:
        kw["step_in_backward"] = True
    import optgen.torch as ot
    cls = ot.AdamW if rule == "adamw" else ot.Lion
    try:
        return cls(params, lr=lr, weight_decay=wd, **kw)
    except (TypeError, ValueError) as e:
        raise NotAvailable(f"{type(e).__name__}: {e}".splitlines()[0]) from e


def train(config: str, task: Task, seed: int, steps: int, log_every: int = 10) -> dict:
    """One run: the training loss every ``log_every`` steps (their mean) and the final
    training loss on fixed windows (and the held-out one)."""
    vocab, data = char_lm.load_data()
    split = len(data) * 9 // 10
    train_data, held = data[:split], data[split:]
    torch.manual_seed(seed)
    model = build(task, len(vocab))
    if "bf16" in config.split("/")[1].split("+"):
        model = model.to(torch.bfloat16)
    opt = optimizer(config, task, list(model.parameters()))
    g = torch.Generator().manual_seed(seed + 1)
    curve, acc, t0 = [], 0.0, time.process_time()
    for step in range(1, steps + 1):
        x, y = char_lm.sample_batch(train_data, g, task.batch, task.context)
        opt.zero_grad()
        loss = loss_of(task, model, x, y)
        loss.backward()
        opt.step()
        acc += float(loss.detach())
        if step % log_every == 0:
            curve.append(acc / log_every)
            acc = 0.0
    return {"curve": curve, "log_every": log_every, "final": evaluate(task, model, train_data),
            "held_out": evaluate(task, model, held), "cpu_s": time.process_time() - t0}


@torch.no_grad()
def evaluate(task: Task, model: torch.nn.Module, data: torch.Tensor, windows: int = 512) -> float:
    """The mean loss over fixed windows of ``data`` (the same windows for every run)."""
    g = torch.Generator().manual_seed(1234)
    x, y = char_lm.sample_batch(data, g, windows, task.context)
    return float(loss_of(task, model, x, y))


# -- the sweep -------------------------------------------------------------------------------
def load(path: str) -> dict:
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    return {"runs": {}}


def save(path: str, results: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=0)
    os.replace(tmp, path)


def sweep(results: dict, tasks: list[str], configs: list[str], seeds: int,
          steps: dict[str, int], force: bool, path: str) -> None:
    runs = results["runs"]
    for tname in tasks:
        for config in configs:
            for seed in range(seeds):
                key = f"{tname}|{config}|{seed}"
                if key in runs and runs[key]["steps"] == steps[tname] and not force:
                    continue
                try:
                    r = train(config, TASKS[tname], seed, steps[tname])
                except NotAvailable as e:
                    print(f"{tname} {config}: not available: {e}", flush=True)
                    break
                runs[key] = {"task": tname, "config": config, "seed": seed,
                             "steps": steps[tname], **r}
                save(path, results)
                print(f"{tname} {config} seed {seed}: final {r['final']:.4f} "
                      f"({r['cpu_s']:.1f} s)", flush=True)


# -- report ----------------------------------------------------------------------------------
def summary(results: dict, steps: dict[str, int]) -> list[dict]:
    """One row per (task, config): final losses over seeds and the verdict."""
    import numpy as np
    finals: dict[tuple[str, str], list[float]] = {}
    for r in results["runs"].values():
        if r["steps"] == steps.get(r["task"]):
            finals.setdefault((r["task"], r["config"]), []).append(r["final"])
    rows = []
    for (tname, config), vals in sorted(finals.items(), key=lambda kv: (
            kv[0][0], CONFIGS.index(kv[0][1]) if kv[0][1] in CONFIGS else 99)):
        ref = finals.get((tname, REFERENCE[config.split("/")[0]]), [])
        mean, std = float(np.mean(vals)), float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
        rmean = float(np.mean(ref)) if ref else None
        rstd = float(np.std(ref, ddof=1)) if len(ref) > 1 else None
        within = None if rstd is None else abs(mean - rmean) <= 2 * rstd
        rows.append({"task": tname, "config": config, "seeds": len(vals), "mean": mean,
                     "std": std, "ref_mean": rmean, "ref_std": rstd,
                     "delta": None if rmean is None else mean - rmean, "within": within})
    return rows


def print_table(rows: list[dict]) -> None:
    print("| task | configuration | seeds | final loss (mean ± std) | Δ vs reference | "
          "reference ± 2 std | verdict |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ref = "-" if r["ref_std"] is None else f"{r['ref_mean']:.4f} ± {2 * r['ref_std']:.4f}"
        delta = "-" if r["delta"] is None else f"{r['delta']:+.4f}"
        is_ref = r["config"] in REFERENCE.values()
        verdict = "reference" if is_ref else {True: "within", False: "outside",
                                             None: "-"}[r["within"]]
        print(f"| {r['task']} | {r['config']} | {r['seeds']} | {r['mean']:.4f} ± "
              f"{r['std']:.4f} | {delta} | {ref} | {verdict} |")


def plot(rows: list[dict], results: dict, steps: dict[str, int], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks = sorted({r["task"] for r in rows})
    fig, axes = plt.subplots(len(tasks), 1, figsize=(9, 3.4 * len(tasks)), squeeze=False)
    for ax, tname in zip(axes[:, 0], tasks):
        trows = [r for r in rows if r["task"] == tname]
        for i, r in enumerate(trows):
            vals = [x["final"] for x in results["runs"].values()
                    if x["task"] == tname and x["config"] == r["config"] and x["steps"] == steps[tname]]
            ax.scatter([i] * len(vals), vals, s=12, color="0.4", zorder=3)
            ax.errorbar(i, r["mean"], yerr=r["std"], fmt="o", color="C1"
                        if r["within"] is False else "C0", zorder=4)
        for rule, ref in REFERENCE.items():
            idx = [i for i, r in enumerate(trows) if r["config"].startswith(rule + "/")]
            ref_row = next((r for r in trows if r["config"] == ref), None)
            if idx and ref_row and ref_row["ref_std"] is not None:
                lo = ref_row["ref_mean"] - 2 * ref_row["ref_std"]
                hi = ref_row["ref_mean"] + 2 * ref_row["ref_std"]
                ax.fill_between([min(idx) - 0.4, max(idx) + 0.4], lo, hi,
                                color="C2" if rule == "adamw" else "C4",
                                alpha=0.2, label=f"{ref}: mean ± 2 std over seeds")
        ax.set_xticks(range(len(trows)))
        ax.set_xticklabels([r["config"] for r in trows], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("final training loss")
        ax.set_title(f"{tname}: final loss after {steps[tname]} steps (dots: seeds; "
                     "marker: mean ± std)", fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="charlm,gpt2")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, help="steps of every task (default: charlm "
                    f"{TASKS['charlm'].steps}, gpt2 {TASKS['gpt2'].steps})")
    ap.add_argument("--json", default=JSON)
    ap.add_argument("--plot", default=PLOT)
    ap.add_argument("--force", action="store_true", help="rerun runs already in the JSON")
    ap.add_argument("--report-only", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = load(a.json)
    steps = {t.name: a.steps or t.steps for t in TASKS.values()}
    if not a.report_only:
        sweep(results, a.tasks.split(","), a.configs.split(","), a.seeds, steps, a.force,
              a.json)
    rows = summary(results, steps)
    print_table(rows)
    if a.plot and rows:
        plot(rows, results, steps, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Do q8 states hold on a small GPT-2? Fine-tunes transformers' GPT2LMHeadModel (a
4-layer GPT-2 config: width 128, 4 heads, 834k parameters) on README.md's characters
and reports, per configuration, the final training loss and the largest |w| of layer
0's query weights (the first ``n_embd`` columns of ``h.0.attn.c_attn.weight``), where
q8 states that code Adam's ``v`` as itself let small second moments decode as 0 and
those weights run away.

    python bench/q8_gpt2_bench.py                         # every config, 300 steps
    python bench/q8_gpt2_bench.py --configs torch,q8 --accum 4 --steps 300

Configurations (AdamW, lr 1e-3, weight decay 0.01):
  torch        torch.optim.AdamW, float32 weights and states (the reference)
  split8       bfloat16 weights, master_format="split8", float32 states, step_in_backward
  q8           bfloat16 weights, split8, state_format="q8", step_in_backward
  q8-old       the same with q8's earlier form (``v`` coded as itself: bench/q8_legacy.py)
  fp32+q8      float32 weights, q8 states;  fp32+q8-old: the earlier form
  fp32+q8@64   q8 at 64 elements a block; fp32+m-bf16.v-q8: exp_avg in bf16, exp_avg_sq q8
  sim:<switches>  bench/q8_variants.py's torch model of AdamW with q8's parts as switches
               (float32 weights): sim:q8, sim:sr, sim:v-fp32, sim:rows.b128, sim:vdirect ...
  ao8, bnb8    torchao's / bitsandbytes' AdamW8bit (float32 weights; where installed)
``--accum k`` accumulates k micro-batches a step (``opt.accumulating()`` for the first
k - 1 with step_in_backward). Every configuration starts from the same weights and sees
the same batches (one torch thread, one TVM thread). A script, not a test: minutes of
CPU.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TVM_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, ROOT)
import char_lm  # noqa: E402
from bench.q8_legacy import legacy_q8  # noqa: E402

CONFIGS = ("torch", "split8", "q8", "q8-old", "fp32+q8", "fp32+q8-old")
WIDTH, LR = 128, 1e-3


def build(vocab: int) -> torch.nn.Module:
    import transformers
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=224, n_embd=WIDTH, n_layer=4,
                                  n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def loss_of(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=x).logits.float()
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             x[:, 1:].reshape(-1))


def optimizer(config: str, params: list):
    if config == "torch":
        return torch.optim.AdamW(params, lr=LR, weight_decay=0.01)
    if config.startswith("sim:"):
        from bench.q8_variants import SimAdamW
        return SimAdamW(params, config[4:], lr=LR, weight_decay=0.01)
    if config == "ao8":               # torchao's 8-bit AdamW (blocks of 256)
        from torchao.optim import AdamW8bit
        return AdamW8bit(params, lr=LR, weight_decay=0.01)
    if config == "bnb8":              # bitsandbytes' 8-bit AdamW (blocks of 256)
        import bitsandbytes as bnb
        return bnb.optim.AdamW8bit(params, lr=LR, weight_decay=0.01)
    import optgen.torch as ot
    fmt = config.split("+")[-1].removesuffix("-old")
    kw = {"state_format": "q8"} if fmt == "q8" else {}
    if fmt.startswith("q8@"):
        kw = {"state_format": fmt}
    elif fmt.startswith("m-"):        # "m-bf16.v-q8": exp_avg in one format, exp_avg_sq in another
        m, v = (x.split("-")[1] for x in fmt.split("."))
        kw = {"state_format": {"exp_avg": m, "exp_avg_sq": v}}
    if not config.startswith("fp32"):
        kw.update(master_format="split8", step_in_backward=True)
    return ot.AdamW(params, lr=LR, weight_decay=0.01, **kw)


def run(config: str, steps: int, accum: int, seed: int, cache: str, batch: int = 16,
        context: int = 64) -> dict:
    vocab, data = char_lm.load_data()
    torch.manual_seed(seed)
    model = build(len(vocab))
    full = config.startswith(("torch", "fp32", "sim:", "ao8", "bnb8"))    # float32 weights
    if not full:
        model = model.to(torch.bfloat16)
    g = torch.Generator().manual_seed(seed + 1)
    t0 = time.process_time()
    legacy = config.endswith("-old")
    sib = not full                                      # (step_in_backward)
    with legacy_q8(cache) if legacy else contextlib.nullcontext():
        opt = optimizer(config, list(model.parameters()))
        for step in range(steps):
            opt.zero_grad()
            for k in range(accum):
                x, _ = char_lm.sample_batch(data, g, batch, context)
                if sib and k < accum - 1:
                    with opt.accumulating():
                        (loss_of(model, x) / accum).backward()
                else:
                    (loss_of(model, x) / accum).backward()
            if not sib:
                opt.step()
    q = model.transformer.h[0].attn.c_attn.weight[:, :WIDTH].detach().float()
    with torch.no_grad():
        ev = torch.Generator().manual_seed(1234)
        x, _ = char_lm.sample_batch(data, ev, 256, context)
        final = float(loss_of(model, x))
    return {"config": config, "final_loss": final, "max_abs_query0": float(q.abs().max()),
            "query0_above_0.14": int((q.abs() > 0.14).sum()),
            "params": sum(p.numel() for p in model.parameters()),
            "cpu_s": time.process_time() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=16, help="windows a micro-batch")
    ap.add_argument("--context", type=int, default=64, help="characters a window")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="optgen-q8-legacy-") as cache:
        for config in a.configs.split(","):
            r = run(config, a.steps, a.accum, a.seed, cache, a.batch, a.context)
            rows.append(r)
            print(f"{config:<12} final loss {r['final_loss']:.4f}   max|w| layer-0 query "
                  f"{r['max_abs_query0']:.4f} ({r['query0_above_0.14']} above 0.14)   "
                  f"{r['cpu_s']:.0f} s   [{r['params']:,} parameters, {a.steps} steps, "
                  f"accum {a.accum}, batch {a.batch}x{a.context}, seed {a.seed}]", flush=True)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"steps": a.steps, "accum": a.accum, "seed": a.seed, "batch": a.batch,
                       "context": a.context, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()

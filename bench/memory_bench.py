#!/usr/bin/env python
"""Bytes per parameter at the peak of a training step, for torch's AdamW, torchao's and
bitsandbytes' 8-bit (and 4-bit) AdamW, and optgen's AdamW with each combination of
weight dtype, master copy, state format and step-in-backward.

    python bench/memory_bench.py                       # GPT-2 shape, 5.3M parameters
    python bench/memory_bench.py --model mlp --rows "optgen"
    python bench/memory_bench.py --rows "split8" --names    # bytes by state name too
    python bench/memory_bench.py --json bench/results/memory.json

How the bytes are counted (bench/memory_count.py has the details): at every instant of
one training step that can be a peak (each parameter's post-accumulate-grad hook during
backward, before and after ``opt.step()``), the census sums every distinct storage
(views, tied weights and shared memory counted once) behind the parameters ("weights"),
their ``.grad`` ("grads"), and every tensor or numpy array reachable from the optimizer
object ("master" where its name says master copy or correction, else "states"); "other"
is memory that appeared after the optimizer was built, lives through the step, and no
walk reached (a sweep of ``gc.get_objects()``): it should read 0. Activations and the
batch are never counted. The columns are the census with the largest total, over the
parameter count; "steady" is the total after ``opt.zero_grad(set_to_none=True)``: what
lives between steps.

Rows whose options are not built yet print "not available: <the error>". A script,
not a test: tests/test_memory_bench.py checks the counter on a known case.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_count import KINDS, measure  # noqa: E402

LR = 1e-3
STATE_FORMATS = (None, "q8", "q4", "fp8")
MASTERS = ("fp32", "split16", "split8")
# the goals: AdamW, bf16 weights, an 8-bit correction of the master, steps in backward,
# and q8 (<= 5 B/param) or q4/fp8 (<= 4 B/param) states
GOALS = (("optgen AdamW bf16 + split8 + q8 + in-backward", 5.0),
         ("optgen AdamW bf16 + split8 + q4 + in-backward", 4.0),
         ("optgen AdamW bf16 + split8 + fp8 + in-backward", 4.0))


# -- models --------------------------------------------------------------------------
@dataclass
class ModelSpec:
    kind: str = "gpt2"      # "gpt2": transformers' GPT2LMHeadModel; "mlp": nn.Linear stack
    width: int = 256
    layers: int = 6
    vocab: int = 2048
    context: int = 64
    batch: int = 4


def build_model(ms: ModelSpec, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if ms.kind == "gpt2":
        import transformers
        cfg = transformers.GPT2Config(vocab_size=ms.vocab, n_positions=max(128, ms.context),
                                      n_embd=ms.width, n_layer=ms.layers,
                                      n_head=max(1, ms.width // 64), resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        mods: list[torch.nn.Module] = []
        for _ in range(ms.layers):
            mods += [torch.nn.Linear(ms.width, ms.width), torch.nn.GELU()]
        model = torch.nn.Sequential(*mods[:-1])
    return model.to(dtype)


def train_step(ms: ModelSpec) -> Callable[[torch.nn.Module], torch.Tensor]:
    g = torch.Generator().manual_seed(1)

    def step(model: torch.nn.Module) -> torch.Tensor:
        if ms.kind == "gpt2":
            x = torch.randint(0, ms.vocab, (ms.batch, ms.context), generator=g)
            return model(input_ids=x, labels=x).loss
        p = next(model.parameters())
        x = torch.randn(ms.batch * ms.context, ms.width, generator=g).to(p.dtype)
        return model(x).float().pow(2).mean()
    return step


# -- optimizers --------------------------------------------------------------------------
@dataclass
class Row:
    name: str
    dtype: torch.dtype
    make: Callable[[list], Any]


class InBackward:
    """torch's optimizer-in-backward recipe: one torch.optim.AdamW per parameter, stepped
    by the parameter's post-accumulate-grad hook, which then frees the gradient."""

    def __init__(self, params: list, **kw: Any) -> None:
        self.opts = {p: torch.optim.AdamW([p], lr=LR, **kw) for p in params}

        def hook(p: torch.Tensor) -> None:
            self.opts[p].step()
            p.grad = None
        self.handles = [p.register_post_accumulate_grad_hook(hook) for p in params]

    def step(self) -> None:
        pass

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass


def third_party(name: str) -> Callable[[list], Any]:
    def make(params: list) -> Any:
        if name.startswith("torchao"):
            from torchao import optim as tao
            return getattr(tao, name.split()[1])(params, lr=LR)
        import bitsandbytes as bnb
        return getattr(bnb.optim, name.split()[1])(params, lr=LR)
    return make


def optgen_adamw(**options: Any) -> Callable[[list], Any]:
    def make(params: list) -> Any:
        import optgen.torch as ot
        return ot.AdamW(params, lr=LR, **options)
    return make


def optgen_name(dtype: str, master: str | None, fmt: str | None, sib: bool) -> str:
    """"optgen AdamW bf16 + split8 + q8 + in-backward": weights, master, states, where."""
    parts = [dtype] + ([master] if master else []) + ([fmt] if fmt else []) + \
        (["in-backward"] if sib else [])
    return "optgen AdamW " + " + ".join(parts)


def rows() -> list[Row]:
    f32, bf16 = torch.float32, torch.bfloat16
    out = [Row("torch AdamW fp32 (foreach)", f32,
               lambda p: torch.optim.AdamW(p, lr=LR, foreach=True)),
           Row("torch AdamW fp32 (fused)", f32, lambda p: torch.optim.AdamW(p, lr=LR, fused=True)),
           Row("torch AdamW fp32 + in-backward (per-param)", f32,
               lambda p: InBackward(p, fused=True)),
           Row("torch AdamW bf16 (no master)", bf16,
               lambda p: torch.optim.AdamW(p, lr=LR, fused=True)),
           Row("torch AdamW bf16 + in-backward (no master)", bf16,
               lambda p: InBackward(p, fused=True))]
    for name in ("torchao AdamW8bit", "torchao AdamW4bit", "torchao AdamWFp8",
                 "bitsandbytes Adam8bit", "bitsandbytes AdamW8bit"):
        out.append(Row(name + " fp32", f32, third_party(name)))
    out.append(Row("torchao AdamW8bit bf16 (no master)", bf16, third_party("torchao AdamW8bit")))
    for sib in (False, True):
        extra = {"step_in_backward": True} if sib else {}
        for fmt in STATE_FORMATS:
            sf = {"state_format": fmt} if fmt else {}
            out.append(Row(optgen_name("fp32", None, fmt, sib), f32, optgen_adamw(**sf, **extra)))
        out.append(Row(optgen_name("bf16", "stochastic rounding", None, sib), bf16,
                       optgen_adamw(stochastic_rounding=True, **extra)))
        for master in MASTERS:
            mo = {"multi_precision": True} if master == "fp32" else {"master_format": master}
            for fmt in STATE_FORMATS:
                sf = {"state_format": fmt} if fmt else {}
                label = "fp32 master" if master == "fp32" else master
                out.append(Row(optgen_name("bf16", label, fmt, sib), bf16,
                               optgen_adamw(**mo, **sf, **extra)))
    return out


# -- report ------------------------------------------------------------------------------
def run_row(row: Row, ms: ModelSpec) -> dict:
    model = build_model(ms, row.dtype)
    try:
        peak = measure(model, row.make, train_step(ms))
    except (TypeError, ValueError, RuntimeError, ImportError, NotImplementedError,
            AttributeError) as e:
        return {"config": row.name, "error": f"{type(e).__name__}: {e}".splitlines()[0]}
    pp = peak.per_param()
    return {"config": row.name, "params": peak.n_params, "peak_at": peak.peak.where,
            **{k: pp[k] for k in (*KINDS, "total")},
            "steady": peak.per_param(peak.steady)["total"],
            "names": {k: v / peak.n_params for k, v in sorted(peak.peak.names.items())},
            "other_storages": [f"{type(x).__name__} {tuple(getattr(x, 'shape', ()))} "
                               f"{getattr(x, 'dtype', '')}" for x in peak.other.values()]}


def print_table(results: list[dict], names: bool) -> None:
    head = (f"{'config':<50} {'weights':>7} {'master':>6} {'grads':>6} {'states':>6} "
            f"{'other':>6} {'total':>6} {'steady':>6}  peak at")
    print(head)
    print("-" * len(head))
    for r in results:
        if "error" in r:
            print(f"{r['config']:<50} not available: {r['error'][:150]}")
            continue
        print(f"{r['config']:<50} {r['weights']:7.3f} {r['master']:6.3f} {r['grads']:6.3f} "
              f"{r['states']:6.3f} {r['other']:6.3f} {r['total']:6.3f} {r['steady']:6.3f}  "
              f"{r['peak_at']}")
        if names and r["names"]:
            print("    " + ", ".join(f"{k} {v:.3f}" for k, v in r["names"].items()))
        for s in r["other_storages"]:
            print(f"    other: {s}")


def print_goals(results: list[dict]) -> None:
    by = {r["config"]: r for r in results}
    for name, target in GOALS:
        r = by.get(name)
        if r is None or "error" in r:
            print(f"goal: {name} <= {target:g} B/param: not run")
            continue
        verdict = "MET" if r["total"] <= target else "MISSED"
        print(f"goal: {name} <= {target:g} B/param: {r['total']:.3f} at the peak "
              f"({r['total'] - r['grads']:.3f} without the gradients alive then): {verdict}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("gpt2", "mlp"), default="gpt2")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=2048, help="gpt2: vocabulary size")
    ap.add_argument("--rows", default="", help="a regular expression: rows whose name matches")
    ap.add_argument("--names", action="store_true", help="also bytes per parameter by state name")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    a = ap.parse_args(argv)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    ms = ModelSpec(a.model, a.width, a.layers, a.vocab)
    chosen = [r for r in rows() if re.search(a.rows, r.name)]
    results = []
    for row in chosen:
        results.append(run_row(row, ms))
        print(f"  measured {row.name}", file=sys.stderr, flush=True)
    n = next((r["params"] for r in results if "params" in r), 0)
    shape = (f"GPT2LMHeadModel(n_embd={ms.width}, n_layer={ms.layers}, vocab={ms.vocab}), "
             f"batch {ms.batch}x{ms.context}" if ms.kind == "gpt2"
             else f"{ms.layers} x Linear({ms.width}, {ms.width})")
    print(f"model: {shape}, {n:,} parameters; torch {torch.__version__}, python "
          f"{platform.python_version()}; bytes per parameter at the peak of a step\n")
    print_table(results, a.names)
    print("\nq8 and fp8 states: 1 B per element and state plus a float32 scale per 256 "
          "elements (4/256 = 0.016 B per element and state: 0.031 B/param for Adam's two); "
          "q4: 0.5 B plus 4/128 = 0.031 B per element and state. Tensors under 4096 "
          "elements keep float32 states (optgen's state_format_min_size, bitsandbytes' "
          "min_8bit_size, torchao's threshold).")
    print_goals(results)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"model": vars(ms), "torch": torch.__version__, "results": results},
                      f, indent=1)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

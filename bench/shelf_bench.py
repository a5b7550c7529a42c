#!/usr/bin/env python
"""Step time of the recent optimizers: optgen's torch class against the pip packages.

    python bench/shelf_bench.py                       # a 3.1M-parameter MLP, 30 reps
    python bench/shelf_bench.py --width 512 --reps 50 --json out.json
    python bench/shelf_bench.py --spinning-pools      # idle thread pools keep spinning

One model, an MLP of three width x width layers with biases (2-D weights and 1-D
biases: both of MARS's branches), in one process; every row steps its own copy of it
with its own fixed gradients (optimizer.step() only: no forward or backward). After one
warm-up step each, the reps are interleaved (optgen.benchmark: rep r starts at row r
mod k), so the machine's drift hits all rows alike. Idle thread pools sleep at once
(optgen.benchmark.quiet_pools, the suite's default: torch's OpenMP pool and TVM's
would otherwise spin into each other's steps). Printed: each row's median and best
step time, and its median and best over the first row's of the same optimizer (optgen's;
torch fused for the anchor). Read medians and ratios, never one run: a shared VM is
noisy (on a busy one the best times are the steadier figure).

Rows: Schedule-Free AdamW (optgen.torch.AdamWScheduleFree; schedulefree's
AdamWScheduleFree, foreach and per-tensor loop), MARS-AdamW (optgen.torch.MARS;
pytorch_optimizer.MARS, foreach and loop), Cautious AdamW (optgen.torch.CAdamW;
pytorch-optimizer's cautious mask on AdEMAMix with alpha 0, foreach and loop: its only
cautious AdamW), and torch.optim.AdamW (fused, foreach) as the plain AdamW anchor. The
authors' MARS and C-AdamW code is not a package, so it has no row; the package rows
differ from the authors' rules where docs/catalog.md says (tests/test_recent_optimizers.py
checks every rule). This is a script, not a test: it asserts no timings.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from optgen.benchmark import Contender, cpu_model, interleave, quiet_pools, thread_env  # noqa: E402


def model(torch, width: int, depth: int, seed: int):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(width, width) for _ in range(depth)]
    net = torch.nn.Sequential(*layers)
    g = torch.Generator().manual_seed(seed + 1)
    for p in net.parameters():
        p.requires_grad_(True)
        p.grad = torch.randn(p.shape, generator=g) * 1e-2
    return net


def rows(torch, width: int, depth: int) -> list[tuple[str, str, callable]]:
    """(optimizer, row name, maker of its optimizer over a fresh model's parameters)."""
    import optgen.torch as otorch
    import pytorch_optimizer as po
    import schedulefree as sf

    sfh = dict(lr=2.5e-3, betas=(0.9, 0.999), weight_decay=0.01, warmup_steps=10)
    mars = dict(lr=3e-3, betas=(0.95, 0.99), gamma=0.025, weight_decay=0.01)
    caut = dict(lr=1e-3, weight_decay=0.01)
    return [
        ("Schedule-Free AdamW", "optgen AdamWScheduleFree",
         lambda ps: _train(otorch.AdamWScheduleFree(ps, **sfh))),
        ("Schedule-Free AdamW", "schedulefree foreach",
         lambda ps: _train(sf.AdamWScheduleFree(ps, foreach=True, **sfh))),
        ("Schedule-Free AdamW", "schedulefree loop",
         lambda ps: _train(sf.AdamWScheduleFree(ps, foreach=False, **sfh))),
        ("MARS-AdamW", "optgen MARS", lambda ps: otorch.MARS(ps, **mars)),
        ("MARS-AdamW", "pytorch_optimizer MARS foreach",
         lambda ps: po.MARS(ps, foreach=True, **mars)),
        ("MARS-AdamW", "pytorch_optimizer MARS loop",
         lambda ps: po.MARS(ps, foreach=False, **mars)),
        ("Cautious AdamW", "optgen CAdamW", lambda ps: otorch.CAdamW(ps, **caut)),
        ("Cautious AdamW", "pytorch_optimizer cautious foreach",
         lambda ps: po.AdEMAMix(ps, betas=(0.9, 0.999, 0.9999), alpha=0.0,
                                weight_decouple=True, cautious=True, foreach=True, **caut)),
        ("Cautious AdamW", "pytorch_optimizer cautious loop",
         lambda ps: po.AdEMAMix(ps, betas=(0.9, 0.999, 0.9999), alpha=0.0,
                                weight_decouple=True, cautious=True, foreach=False, **caut)),
        ("AdamW (anchor)", "torch.optim.AdamW fused",
         lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True)),
        ("AdamW (anchor)", "torch.optim.AdamW foreach",
         lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True)),
    ]


def _train(opt):
    opt.train()
    return opt


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--spinning-pools", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    pools = "spinning" if args.spinning_pools else "quiet"
    if pools == "quiet":
        quiet_pools()
    import torch

    contenders, groups = [], {}
    for opt_name, row, make in rows(torch, args.width, args.depth):
        net = model(torch, args.width, args.depth, seed=0)
        opt = make(list(net.parameters()))
        contenders.append(Contender(row, opt.step, kind=opt_name))
        groups.setdefault(opt_name, []).append(contenders[-1])
    n = sum(p.numel() for p in model(torch, args.width, args.depth, 0).parameters())
    interleave(contenders, args.reps, warmup=1)
    with open("/proc/loadavg", encoding="utf-8") as f:
        load = f.read().split()[:3]
    info = {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
            "affinity": len(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
            "env": thread_env(), "python": platform.python_version(),
            "torch": torch.__version__, "load_after": load, "parameters": n,
            "width": args.width, "depth": args.depth, "reps": args.reps, "pools": pools}
    print(f"{n / 1e6:.2f}M float32 parameters ({args.depth} x Linear({args.width}, "
          f"{args.width})), {args.reps} interleaved reps; {info['cpu_model']}, "
          f"{info['affinity']} cores, torch {info['torch']} ({info['torch_threads']} "
          f"threads), {pools} pools; load average after: {' '.join(load)}")
    print("| optimizer | row | median ms | best ms | median / first row | best / first row |")
    print("|---|---|---|---|---|---|")
    table = []
    for opt_name, cs in groups.items():
        for c in cs:
            rec = {"optimizer": opt_name, "row": c.name, "median_ms": c.median * 1e3,
                   "best_ms": c.best * 1e3, "x_first_row": c.median / cs[0].median,
                   "best_x_first_row": c.best / cs[0].best}
            table.append(rec)
            print(f"| {opt_name} | {c.name} | {rec['median_ms']:.2f} | {rec['best_ms']:.2f} | "
                  f"{rec['x_first_row']:.2f} | {rec['best_x_first_row']:.2f} |")
    out = {"machine": info, "rows": table}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""GPU Adam and LAMB, side by side: optgen's CUDA kernels against torch's fused CUDA Adam
and a device-to-device copy (the bandwidth anchor).

    python bench/cuda_bench.py                   # 10^7 and 10^8 fp32 parameters, 20 reps
    python bench/cuda_bench.py --sizes 10000000 --reps 50 --json gpu.json
    python bench/cuda_bench.py --bert            # + BERT-base's 199 tensors: flat vs torch fused
    python bench/cuda_bench.py --q8 --muon       # + 8-bit Adam vs bitsandbytes/torchao, Muon

Needs an NVIDIA GPU, CuPy (pip install 'optgen[cuda]'), nvcc for the build, and a CUDA
build of torch for the torch row (skipped without one). Each contender updates its own
copy of the same parameters; repetitions are interleaved and timed with CUDA events
around one step each; medians are reported. Bytes moved per parameter: Adam 28 (read w,
g, m, v; write w, m, v); LAMB 48 (pass 1 reads w for ||w||, pass 2 reads w, g, m, v for
||update||, pass 3 is Adam's 28); copy 8 (read 4, write 4).
This is a script, not a test: it asserts no timings.

Run on an H100 on 2026-11-25: docs/performance.md has the table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from optgen.benchmark import Contender, Sampler, interleave, median  # noqa: E402
from params import bert_base_shapes  # noqa: E402


def event_sampler(cp) -> Sampler:
    """Seconds per call between two CUDA events around ``inner`` calls."""
    def sample(step, inner: int) -> float:
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(inner):
            step()
        end.record()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) * 1e-3 / inner
    return sample


def timed(contenders: list[Contender], reps: int, sync, sample: Sampler) -> dict[str, list[float]]:
    """Warm every contender up (modules loaded, states allocated), then interleave;
    the samples in ms by contender."""
    for c in contenders:
        c.step()
    sync()
    interleave(contenders, reps, warmup=0, sample=sample)
    return {c.name: [t * 1e3 for t in c.times] for c in contenders}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000000,100000000")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--bert", action="store_true",
                    help="also BERT-base's tensor list: optgen flat (one launch) vs torch fused")
    ap.add_argument("--q8", action="store_true",
                    help="also Adam with 8-bit states vs bitsandbytes Adam8bit and torchao")
    ap.add_argument("--muon", action="store_true",
                    help="also Muon on 768x3072 and 4096x4096 vs torch.optim.Muon")
    args = ap.parse_args()
    import cupy as cp
    import optgen

    sample = event_sampler(cp)
    try:
        import torch
        have_torch = torch.cuda.is_available()
    except ImportError:
        have_torch = False
    results = []
    for n in (int(s) for s in args.sizes.split(",")):
        rng = np.random.default_rng(0)
        w0 = rng.standard_normal(n, dtype=np.float32)
        g0 = rng.standard_normal(n, dtype=np.float32)
        contenders = {}
        for name in ("adam", "lamb"):
            w, g = cp.asarray(w0), cp.asarray(g0)
            opt = optgen.create(name, [w], target="cuda", lr=1e-3)
            contenders[f"optgen {name}"] = (lambda opt=opt, g=g: opt.step([g]),
                                            28 if name == "adam" else 48)
        src, dst = cp.asarray(w0), cp.empty(n, cp.float32)
        contenders["copy d2d"] = (lambda: dst.__setitem__(Ellipsis, src), 8)
        if have_torch:
            p = torch.tensor(w0, device="cuda", requires_grad=True)
            p.grad = torch.tensor(g0, device="cuda")
            topt = torch.optim.Adam([p], lr=1e-3, fused=True)
            contenders["torch fused adam"] = (topt.step, 28)
        names = list(contenders)
        rows = timed([Contender(k, fn) for k, (fn, _) in contenders.items()], args.reps,
                     cp.cuda.Device().synchronize, sample)
        copy_bw = contenders["copy d2d"][1] * n / (median(rows["copy d2d"]) * 1e-3)
        print(f"n = {n:,}")
        print(f"  {'contender':18} {'median ms':>10} {'GB/s':>8} {'x copy bw':>10} {'x torch':>8}")
        torch_ms = median(rows["torch fused adam"]) if have_torch else None
        for k in names:
            ms = median(rows[k])
            bw = contenders[k][1] * n / (ms * 1e-3)
            ratio = f"{ms / torch_ms:8.2f}" if torch_ms else "       -"
            print(f"  {k:18} {ms:10.3f} {bw / 1e9:8.1f} {bw / copy_bw:10.2f} {ratio}")
            results.append({"n": n, "contender": k, "median_ms": ms, "samples_ms": rows[k],
                            "bytes_per_param": contenders[k][1]})
    if args.bert:
        results += bert(sample, args.reps)
    if args.q8:
        results += eight_bit(sample, args.reps, [int(s) for s in args.sizes.split(",")])
    if args.muon:
        results += muon(sample, args.reps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def bert(sample: Sampler, reps: int) -> list[dict]:
    """AdamW over BERT-base's tensors: optgen on one flat buffer (one kernel call) and
    on the loose tensors (one call each), torch fused AdamW (multi_tensor_apply)."""
    import torch
    import optgen
    shapes = [shape for _, shape in bert_base_shapes()]     # 199 tensors
    n = sum(int(np.prod(s)) for s in shapes)
    rng = np.random.default_rng(0)
    init = [torch.from_numpy(rng.standard_normal(s, dtype=np.float32)).cuda() for s in shapes]
    grads = [torch.from_numpy(rng.standard_normal(s, dtype=np.float32)).cuda() for s in shapes]
    flat_w = optgen.flatten([x.clone() for x in init])
    flat_g = optgen.flatten([g.clone() for g in grads])
    loose_w = [x.clone() for x in init]
    a = optgen.create("adamw", flat_w, target="cuda", lr=1e-3, weight_decay=0.01)
    b = optgen.create("adamw", loose_w, target="cuda", lr=1e-3, weight_decay=0.01)
    ps = [torch.nn.Parameter(x.clone()) for x in init]
    for p, g in zip(ps, grads):
        p.grad = g.clone()
    t = torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, fused=True)
    contenders = {"optgen adamw flat": lambda: a.step(flat_g),
                  "optgen adamw loose": lambda: b.step(grads),
                  "torch fused adamw": t.step}
    try:                        # the loose step captured in a CUDA graph: stage + replay
        contenders["optgen adamw graph"] = _captured(
            lambda: optgen.create("adamw", [x.clone() for x in init], target="cuda",
                                  lr=1e-3, weight_decay=0.01, capturable=True), grads)
    except Exception as e:  # noqa: BLE001 (reported as the row)
        print(f"  optgen adamw graph: {type(e).__name__}: {str(e)[:300]}")
    src, dst = (torch.empty(n, device="cuda") for _ in "ab")
    contenders["copy d2d"] = lambda: dst.copy_(src)
    names = list(contenders)
    rows = timed([Contender(k, fn) for k, fn in contenders.items()], reps,
                 torch.cuda.synchronize, sample)
    torch_ms = median(rows["torch fused adamw"])
    copy_bw = 8 * n / (median(rows["copy d2d"]) * 1e-3)
    print(f"BERT-base AdamW: {len(shapes)} tensors, {n:,} parameters, 28 B/param moved")
    print(f"  {'contender':20} {'median ms':>10} {'GB/s':>8} {'x copy bw':>9} {'x torch':>8}")
    out = []
    for k in names:
        ms = median(rows[k])
        bw = (8 if k == "copy d2d" else 28) * n / (ms * 1e-3)
        print(f"  {k:20} {ms:10.3f} {bw / 1e9:8.1f} {bw / copy_bw:9.2f} {ms / torch_ms:8.2f}")
        out.append({"n": n, "tensors": len(shapes), "contender": k, "median_ms": ms,
                    "samples_ms": rows[k], "bytes_per_param": 28})
    return out


def _captured(make, grads):
    """A step of ``make()`` captured in a torch CUDA graph after two eager warm-up steps
    on a side stream; each call stages the host half and replays the graph."""
    import torch
    opt = make()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            opt.step(grads)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step(grads)

    def step():
        opt.stage(grads)
        graph.replay()
    return step


class _tf32:
    """An optimizer whose float32 products may run on TF32 tensor cores during its step
    (``torch.set_float32_matmul_precision("high")``, the setting optgen's products
    follow on torch CUDA tensors)."""

    def __init__(self, opt):
        self.opt = opt

    def step(self):
        import torch
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high")
        try:
            self.opt.step()
        finally:
            torch.set_float32_matmul_precision(before)


def _state_bytes(opt) -> int:
    """Bytes of every tensor in a torch optimizer's state (steps included)."""
    import torch
    total = 0
    for rec in opt.state.values():
        for v in rec.values():
            if hasattr(v, "__tensor_flatten__"):     # torchao's subclass states: their parts
                names, _ = v.__tensor_flatten__()
                total += sum(getattr(v, k).numel() * getattr(v, k).element_size()
                             for k in names)
            elif isinstance(v, torch.Tensor):
                total += v.numel() * v.element_size()
    return total


def _third_party_8bit():
    """The 8-bit (and fp8) Adams that install here, by name: a failed import or build is
    reported and skipped."""
    makers = {}
    try:
        import bitsandbytes as bnb
        makers["bnb Adam8bit"] = lambda ps: bnb.optim.Adam8bit(ps, lr=1e-3)
    except Exception as e:  # noqa: BLE001 (reported, not hidden)
        print(f"  (bitsandbytes: {type(e).__name__}: {e})")
    try:
        from torchao.optim import AdamW8bit, AdamWFp8
        makers["torchao AdamW8bit"] = lambda ps: AdamW8bit(ps, lr=1e-3, weight_decay=0.0)
        makers["torchao AdamWFp8"] = lambda ps: AdamWFp8(ps, lr=1e-3, weight_decay=0.0)
    except Exception as e:  # noqa: BLE001
        print(f"  (torchao: {type(e).__name__}: {e})")
    return makers


def eight_bit(sample: Sampler, reps: int, sizes: list[int]) -> list[dict]:
    """Adam with 8-bit (q8, q4) states on one flat tensor: optgen vs bitsandbytes'
    Adam8bit, torchao's AdamW8bit/AdamWFp8 and torch fused fp32 Adam; bytes of state per
    parameter from the states each one allocated."""
    import torch
    import optgen
    out = []
    for n in sizes:
        rng = np.random.default_rng(0)
        w0 = torch.from_numpy(rng.standard_normal(n, dtype=np.float32)).cuda()
        g0 = torch.from_numpy(rng.standard_normal(n, dtype=np.float32)).cuda()
        steps, nbytes = {}, {}
        for fmt in ("q8", "q4", "fp8"):
            w = w0.clone()
            opt = optgen.create("adam", [w], target="cuda", lr=1e-3, state_format=fmt)
            steps[f"optgen adam {fmt}"] = lambda opt=opt: opt.step([g0])
            opt.step([g0])
            nbytes[f"optgen adam {fmt}"] = sum(      # (torch or CuPy arrays: both have nbytes)
                int(v.nbytes) for v in opt.state[0].values() if hasattr(v, "nbytes"))
        for name, make in [("torch fused adam fp32",
                            lambda ps: torch.optim.Adam(ps, lr=1e-3, fused=True)),
                           *_third_party_8bit().items()]:
            p = torch.nn.Parameter(w0.clone())
            p.grad = g0.clone()
            try:
                topt = make([p])
                topt.step()
            except Exception as e:  # noqa: BLE001 (reported)
                print(f"  {name}: {type(e).__name__}: {str(e)[:200]}")
                continue
            steps[name] = topt.step
            nbytes[name] = _state_bytes(topt)
        src, dst = w0.clone(), torch.empty_like(w0)
        steps["copy d2d"], nbytes["copy d2d"] = (lambda: dst.copy_(src)), 0
        torch.cuda.synchronize()
        rows = timed([Contender(k, fn) for k, fn in steps.items()], reps,
                     torch.cuda.synchronize, sample)
        base = [median(rows[k]) for k in rows if k.startswith(("bnb", "torchao"))]
        best = min(base) if base else None
        fp32 = median(rows["torch fused adam fp32"]) if "torch fused adam fp32" in rows else None
        copy_bw = 8 * n / (median(rows["copy d2d"]) * 1e-3)
        print(f"Adam with 8-bit states, n = {n:,}")
        print(f"  {'contender':22} {'median ms':>10} {'state B/p':>9} {'moved B/p':>9} "
              f"{'x copy bw':>9} {'x torch fp32':>12} {'x best 3rd-party':>17}")
        for k in steps:
            ms = median(rows[k])
            # bytes moved per parameter: w and g read, w written (12) plus the states read
            # and written; the copy reads and writes 4
            moved = 8 if k == "copy d2d" else 12 + 2 * nbytes[k] / n
            ratio = f"{ms / best:17.2f}" if best else "                -"
            vs = f"{ms / fp32:12.2f}" if fp32 else "           -"
            print(f"  {k:22} {ms:10.3f} {nbytes[k] / n:9.3f} {moved:9.2f} "
                  f"{moved * n / (ms * 1e-3) / copy_bw:9.2f} {vs} {ratio}")
            out.append({"n": n, "contender": k, "median_ms": ms, "samples_ms": rows[k],
                        "state_bytes_per_param": nbytes[k] / n, "bytes_moved_per_param": moved})
    return out


def muon(sample: Sampler, reps: int) -> list[dict]:
    """One Muon step on a 768x3072 and a 4096x4096 matrix: torch.optim.Muon,
    optgen.torch.Muon (bfloat16 Newton-Schulz, torch's cuBLAS calls) and the seed form
    (float32 Newton-Schulz, TF32 products) on CUDA tensors (an error is reported as the
    row)."""
    import torch
    import optgen.torch as ot
    out = []
    for shape in [(768, 3072), (4096, 4096), (2048, 2048)]:
        g = torch.Generator(device="cuda").manual_seed(0)
        w0 = torch.randn(shape, device="cuda", generator=g)
        g0 = torch.randn(shape, device="cuda", generator=g)
        steps = {}
        makers = [("torch Muon", lambda ps: torch.optim.Muon(ps, lr=0.02)),
                  ("optgen Muon", lambda ps: ot.Muon(ps, lr=0.02)),
                  # the seed form: float32 Newton-Schulz, TF32 products
                  ("optgen seeds.Muon tf32", lambda ps: _tf32(ot.seeds.Muon(ps, lr=0.02)))]
        if shape == (2048, 2048):
            makers = [("optgen Shampoo", lambda ps: ot.make("shampoo")(ps, lr=1e-3)),
                      ("optgen SOAP", lambda ps: ot.SOAP(ps, lr=1e-3))]
        for name, make in makers:
            p = torch.nn.Parameter(w0.clone())
            p.grad = g0.clone()
            try:
                opt = make([p])
                opt.step()
            except Exception as e:  # noqa: BLE001 (reported as the row)
                print(f"  {name} {shape}: {type(e).__name__}: {str(e)[:300]}")
                continue
            steps[name] = opt.step
        if not steps:
            continue
        rows = timed([Contender(k, fn) for k, fn in steps.items()], reps,
                     torch.cuda.synchronize, sample)
        print(f"{' / '.join(steps)} step, {shape[0]}x{shape[1]}")
        for k in steps:
            ms = median(rows[k])
            print(f"  {k:22} {ms:10.3f} ms")
            out.append({"shape": list(shape), "contender": k, "median_ms": ms,
                        "samples_ms": rows[k]})
    return out


if __name__ == "__main__":
    main()

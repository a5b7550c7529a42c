"""The cost of telling weights written from outside by content (docs/performance.md,
"Writes from outside"): AdamW on 10M bfloat16 parameters (4 tensors of 2.5M), llvm, numpy
arrays, this tree's kernels against kernels built by another compiler (the one before the
check), stepped interleaved (ABAB...) in one process; and offload="cpu" with CPU tensors
as the device, the p.data fingerprint on against off.

    # with a checkout of the compiler to compare against on PYTHONPATH:
    optgen build adamw --all-variants --out BEFORE/fp32
    optgen build adamw --master-format split16 --all-variants --out BEFORE/split16
    optgen build adamw --master-format split8 --all-variants --out BEFORE/split8
    python bench/outside_writes_bench.py BEFORE
"""
import glob
import statistics
import sys
import time

import ml_dtypes
import numpy as np

import optgen

N, REPS = [2_500_000] * 4, 41


def interleaved(a, b) -> tuple[float, float]:
    """Medians of ``REPS`` timed calls of ``a`` and ``b``, alternating which goes first."""
    t = ([], [])
    for r in range(REPS):
        for i in ((0, 1) if r % 2 else (1, 0)):
            s = time.perf_counter()
            (a, b)[i]()
            t[i].append(time.perf_counter() - s)
    return statistics.median(t[0]), statistics.median(t[1])


def kernels(before: str) -> None:
    rng = np.random.default_rng(1)
    grads = [(rng.standard_normal(n) * 1e-2).astype(ml_dtypes.bfloat16) for n in N]

    def params():
        r = np.random.default_rng(0)
        return [r.standard_normal(n).astype(np.float32).astype(ml_dtypes.bfloat16) for n in N]
    for name, kw in [("fp32", dict(multi_precision=True)),
                     ("split16", dict(master_format="split16")),
                     ("split8", dict(master_format="split8"))]:
        old = optgen.create(optgen.load(glob.glob(f"{before}/{name}/adamw*")[0]), params(),
                            lr=1e-3, **kw)
        new = optgen.create("adamw", params(), lr=1e-3, **kw)
        for _ in range(3):
            old.step(grads), new.step(grads)
        a, b = interleaved(lambda: old.step(grads), lambda: new.step(grads))
        print(f"{name}: {a * 1e3:.1f} ms before, {b * 1e3:.1f} ms with the check "
              f"({(b / a - 1) * 100:+.1f} %)", flush=True)


def offload() -> None:
    import torch
    import optgen.torch as ot
    from optgen.torch import offload as off
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(n)) for n in N]
    opt = ot.AdamW(ps, lr=1e-3, offload="cpu")
    for p in ps:
        p.grad = torch.randn_like(p) * 1e-2
    real, zero = off._seen, torch.zeros((), dtype=torch.int64)

    def step(fingerprint: bool):
        off._seen = real if fingerprint else (lambda p: (p._version, zero))
        opt.step()                   # (fingerprints taken in this mode; the next is timed)
        s = time.perf_counter()
        opt.step()
        return time.perf_counter() - s
    t = ([], [])
    for r in range(REPS):
        for i in ((0, 1) if r % 2 else (1, 0)):
            t[i].append(step(bool(i)))
    off._seen = real
    a, b = statistics.median(t[0]), statistics.median(t[1])
    print(f"offload (float32, CPU device): {a * 1e3:.1f} ms without, {b * 1e3:.1f} ms with "
          f"the fingerprint ({(b / a - 1) * 100:+.1f} %)")


if __name__ == "__main__":
    kernels(sys.argv[1])
    offload()

"""Host overhead of a step over many small tensors: BERT-base's 199 tensors (names and
ranks kept, every dimension divided by ``--shrink``), so that the kernels are short and
the step's Python work (checks, caches, host scalars, launches) is what is timed.

    python bench/host_overhead.py                  # 300 interleaved reps, shrink 32
    python bench/host_overhead.py --reps 500 --shrink 64
    python bench/host_overhead.py --clock thread --threads 1   # on a busy machine

``--clock thread`` times each step by the stepping thread's CPU time, which time spent
descheduled does not count; with ``--threads 1`` (optgen's kernels and torch's ops on
the calling thread) that is the whole step's work, so runs on a shared machine compare.
``--calls`` counts instead what one step runs in Python (``sys.setprofile``): function
calls, and the files of optgen they are in (a machine-independent measure).

Rows: ``optgen.torch.AdamW`` (the default multi-tensor launch), the same with
``multi_tensor=False`` and with ``flat=True``, ``optgen.create("adam")`` on numpy arrays,
and ``torch.optim.AdamW(foreach=True)`` for scale. Each sample is one ``step()``;
medians in microseconds. A script, not a test: it asserts no timing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from params import bert_base_shapes  # noqa: E402


def rows(shrink: int) -> dict:
    import torch
    import optgen
    import optgen.torch as ot
    shapes = [tuple(max(1, d // shrink) for d in s) for _, s in bert_base_shapes(12, 30522)]
    rng = np.random.default_rng(0)

    def tensors():
        ps = [torch.nn.Parameter(torch.from_numpy(rng.standard_normal(s, dtype=np.float32)))
              for s in shapes]
        for p in ps:
            p.grad = torch.from_numpy(rng.standard_normal(p.shape, dtype=np.float32))
        return ps

    out = {}
    for name, kw in (("optgen.torch AdamW (multi-tensor)", {}),
                     ("optgen.torch AdamW (per tensor)", {"multi_tensor": False}),
                     ("optgen.torch AdamW (flat=True)", {"flat": True})):
        opt = ot.AdamW(tensors(), lr=1e-4, **kw)
        out[name] = opt.step
    ws = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
    gs = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
    numpy_opt = optgen.create("adam", ws, lr=1e-4)
    out["optgen.create adam (numpy)"] = lambda: numpy_opt.step(gs)
    out["torch AdamW foreach"] = torch.optim.AdamW(tensors(), lr=1e-4, foreach=True).step
    return out


def calls(fn) -> tuple[int, int]:
    """Python function calls in one call of ``fn``, and how many of optgen's files
    (optgen/, runtime/) they run in."""
    count, files = [0], set()

    def profile(frame, event, arg):
        if event == "call":
            count[0] += 1
            files.add(frame.f_code.co_filename)
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    ours = {f for f in files if f"{os.sep}optgen{os.sep}" in f or f"{os.sep}runtime{os.sep}" in f}
    return count[0], len(ours)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--shrink", type=int, default=32)
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall",
                    help="wall time, or the stepping thread's CPU time")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads of optgen's CPU kernels and of torch (default: theirs)")
    ap.add_argument("--calls", action="store_true",
                    help="count one step's Python calls instead of timing steps")
    args = ap.parse_args()
    if args.threads is not None:
        import optgen
        import torch
        optgen.set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    fns = rows(args.shrink)
    names = list(fns)
    for fn in fns.values():            # warm up: kernels, tables, caches
        for _ in range(5):
            fn()
    if args.calls:
        print("199 BERT-shaped tensors: Python calls in one step (files of optgen)")
        for n in names:
            c, f = calls(fns[n])
            print(f"  {n:36s} {c:9d} ({f})")
        return
    times = {n: [] for n in names}
    for r in range(args.reps):         # interleaved, starting at row r mod k
        for j in range(len(names)):
            n = names[(r + j) % len(names)]
            t = clock()
            fns[n]()
            times[n].append(clock() - t)
    print(f"199 BERT-shaped tensors (dims / {args.shrink}), median us per step "
          f"({args.clock} clock), {args.reps} reps")
    for n in names:
        print(f"  {n:36s} {statistics.median(times[n]) * 1e6:9.1f}")


if __name__ == "__main__":
    main()

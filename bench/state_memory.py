#!/usr/bin/env python
"""State memory of each state format, from the arrays and as peak RSS: Adam on one
tensor of N fp32 parameters (default 100M), each format in a fresh process.

    python bench/state_memory.py                 # 100M parameters: about 2.5 GB per process
    python bench/state_memory.py --n 10000000

A process (children.state_memory) loads the kernels (a small optimizer's step),
allocates the parameter and its gradient, reads its peak RSS, creates the optimizer
and takes two steps, and reads its peak RSS again: the difference is what the
optimizer added (states, workspaces). Bytes per parameter are that difference over N;
the "arrays" column is the sum of the state arrays' sizes over N. A script, not a test.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from children import spawn  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000_000)
    a = ap.parse_args()
    print(f"Adam, {a.n:,} fp32 parameters in one tensor; bytes per parameter")
    print(f"{'format':<10} {'arrays':>8} {'peak RSS added':>15}")
    for fmt in ("default", "bf16", "q8", "q4", "fp8"):
        _, r = spawn("state-memory", str(a.n), fmt)     # children.state_memory
        print(f"{r['format']:<10} {r['arrays'] / a.n:8.3f} {r['rss_added'] / a.n:15.3f}")


if __name__ == "__main__":
    main()

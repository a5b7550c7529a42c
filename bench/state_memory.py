#!/usr/bin/env python
"""State memory of each state format, from the arrays and as peak RSS: Adam on one
tensor of N fp32 parameters (default 100M), each format in a fresh process.

    python bench/state_memory.py                 # 100M parameters: about 2.5 GB per process
    python bench/state_memory.py --n 10000000

A process loads the kernels (a small optimizer's step), allocates the parameter and its
gradient, reads its peak RSS, creates the optimizer and takes two steps, and reads its
peak RSS again: the difference is what the optimizer added (states, workspaces). Bytes per parameter are that difference over N; the "arrays" column is the
sum of the state arrays' sizes over N. A script, not a test.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys
import numpy as np
import optgen
n, fmt = int(sys.argv[1]), (None if sys.argv[2] == "default" else sys.argv[2])
art = optgen.get_artifact("adam", state_format=fmt)    # built or cached before measuring
fmt_kw = {} if fmt is None else {"state_format": fmt}
small = [np.ones(1 << 16, np.float32)]                 # loads the kernel library first
optgen.create(art, small, **fmt_kw).step([np.ones(1 << 16, np.float32)])
w = np.zeros(n, np.float32); w += 1.0
g = np.full(n, 0.5, np.float32)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
opt = optgen.create(art, [w], **fmt_kw)
for _ in range(2):
    opt.step([g])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
arrays = sum(a.nbytes for a in opt.state[0].values() if hasattr(a, "nbytes"))
print(json.dumps({"format": fmt or "default", "rss_added": after - before, "arrays": arrays}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000_000)
    a = ap.parse_args()
    print(f"Adam, {a.n:,} fp32 parameters in one tensor; bytes per parameter")
    print(f"{'format':<10} {'arrays':>8} {'peak RSS added':>15}")
    for fmt in ("default", "bf16", "q8", "q4"):
        out = subprocess.run([sys.executable, "-c", CHILD, str(a.n), fmt], check=True,
                             capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"{r['format']:<10} {r['arrays'] / a.n:8.3f} {r['rss_added'] / a.n:15.3f}")


if __name__ == "__main__":
    main()

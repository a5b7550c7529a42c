#!/usr/bin/env python
"""The programs the benchmarks run in new processes, where a measurement needs a fresh
interpreter (a cold build, the first import, peak RSS). Each is a function here;
``spawn`` runs one as ``python bench/children.py NAME ARGS...`` and reads the JSON
object the child prints as its last line.

- ``optgen-build``: import optgen, optgen.build("adam"), create and one step on 1M
  parameters, each timed (the cold build: with an empty OPTGEN_CACHE_DIR);
- ``torch-compile``: torch.compile of a function calling torch.optim.Adam.step, its
  first and second call;
- ``memory CONTENDER N``: peak extra RSS of a suite contender's first and later step;
- ``state-memory N FORMAT``: optgen Adam's state bytes and peak RSS added (state_memory.py).

Module level imports only the standard library: the build child times ``import optgen``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))


def optgen_build() -> dict:
    t0 = time.perf_counter()
    import optgen
    t1 = time.perf_counter()
    r = optgen.build("adam")
    t2 = time.perf_counter()
    import numpy as np
    w, g = np.zeros(1_000_000, np.float32), np.full(1_000_000, 0.5, np.float32)
    opt = optgen.create("adam", [w])
    opt.step([g])
    t3 = time.perf_counter()
    return {"import_s": t1 - t0, "build_s": t2 - t1, "cache_hit": r.cache_hit,
            "create_step_s": t3 - t2}


def torch_compile() -> dict:
    t0 = time.perf_counter()
    import torch
    t1 = time.perf_counter()
    p = torch.nn.Parameter(torch.randn(1_000_000))
    p.grad = torch.randn(1_000_000)
    opt = torch.optim.Adam([p], lr=1e-3)

    @torch.compile(fullgraph=False)
    def step():
        opt.step()
    t2 = time.perf_counter()
    step()
    t3 = time.perf_counter()
    step()
    t4 = time.perf_counter()
    return {"import_s": t1 - t0, "first_call_s": t3 - t2, "second_call_s": t4 - t3}


def _status_kb(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def _peak_around(fn: Callable[[], object]) -> int:
    """Peak RSS during ``fn`` minus RSS before it, bytes (VmHWM reset via clear_refs)."""
    import gc
    gc.collect()
    before = _status_kb("VmRSS")
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")                             # reset VmHWM to the current RSS
    fn()
    return (_status_kb("VmHWM") - before) * 1024


def memory(contender: str, n: str) -> dict:
    """One step that allocates the states (torch's; optgen's are made at construction),
    then one measured step."""
    import torch
    from params import WD, flat_params
    from workloads import ROWS
    torch.set_num_threads(os.cpu_count())
    ps = flat_params(int(n), wd=WD if "lamb" in contender.lower() else 0.0)
    c = ROWS[contender](torch, ps)
    del ps
    first = _peak_around(c.step)
    steady = _peak_around(c.step)
    return {"first_step_bytes": first, "step_bytes": steady,
            "rss_bytes": _status_kb("VmRSS") * 1024}


def state_memory(n: str, fmt: str) -> dict:
    """Kernels loaded first (a small optimizer's step), then the parameter and gradient,
    then peak RSS before and after creating the optimizer and two steps."""
    import resource
    import numpy as np
    import optgen
    n_, fmt_ = int(n), (None if fmt == "default" else fmt)
    art = optgen.get_artifact("adam", state_format=fmt_)   # built or cached before measuring
    fmt_kw = {} if fmt_ is None else {"state_format": fmt_}
    small = [np.ones(1 << 16, np.float32)]                 # loads the kernel library first
    optgen.create(art, small, **fmt_kw).step([np.ones(1 << 16, np.float32)])
    w = np.zeros(n_, np.float32)
    w += 1.0
    g = np.full(n_, 0.5, np.float32)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    opt = optgen.create(art, [w], **fmt_kw)
    for _ in range(2):
        opt.step([g])
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    arrays = sum(a.nbytes for a in opt.state[0].values() if hasattr(a, "nbytes"))
    return {"format": fmt, "rss_added": after - before, "arrays": arrays}


CHILDREN: dict[str, Callable[..., dict]] = {
    "optgen-build": optgen_build, "torch-compile": torch_compile, "memory": memory,
    "state-memory": state_memory}


class ChildError(RuntimeError):
    """A child program exited with an error; the message ends with its stderr's last line."""


def spawn(name: str, *args: str, env: dict | None = None) -> tuple[float, dict]:
    """Run child ``name`` in a new Python process: (its wall seconds, its JSON result)."""
    import subprocess
    if name not in CHILDREN:
        raise ValueError(f"no child program {name!r}; known: {', '.join(CHILDREN)}")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, os.path.abspath(__file__), name, *args], env=env,
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise ChildError(f"child {name} {' '.join(args)}: exit {p.returncode}: "
                         f"{p.stderr.strip().splitlines()[-1:]}")
    return wall, json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in CHILDREN:
        print(f"usage: children.py {{{','.join(CHILDREN)}}} ARGS...", file=sys.stderr)
        return 2
    print(json.dumps(CHILDREN[argv[0]](*argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

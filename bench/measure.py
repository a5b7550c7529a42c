"""Runs one workload record (workloads.py) and returns its raw results: every sample of
every row, the weight check against the reference, the load average around it. Nothing
here prints a table or judges a goal (report.py does).

- ``run_timed``: the contenders in this process, interleaved by optgen.benchmark;
- ``run_build``: cold and cached optgen builds and torch.compile, in new processes;
- ``run_memory``: peak extra RSS of a step, a new process per contender;
- ``run_trainer``: bench/trainer_bench.py in a new process with no thread-pool variable
  set (what a user gets), which reruns itself with quiet pools.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from optgen.benchmark import THREAD_ENV, Contender, interleave
from bandwidth import make_anchors
from children import spawn
from contenders import ADAM_B
from lamb_rows import Unavailable
from workloads import ROWS, Sizes, Workload

# A fixed mmap threshold turns off glibc's adaptive one: every large block is mapped
# and unmapped again, so a step's temporaries show in its peak RSS even when an earlier
# step freed blocks of the same size (which malloc would otherwise reuse unseen).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def run(wl: Workload, torch, sz: Sizes) -> dict:
    """The workload's results, by its runner."""
    runners = {"timed": lambda: run_timed(wl, torch, sz), "build": lambda: run_build(wl, sz),
               "memory": lambda: run_memory(wl, sz), "trainer": lambda: run_trainer(wl, sz)}
    return runners[wl.runner]()


def title(wl: Workload, n: int, tensors: int = 1) -> str:
    return wl.title.format(m=n / 1e6, tensors=tensors, size=n // tensors)


def build_contenders(wl: Workload, torch, sz: Sizes) -> tuple[list[Contender], int, int, list[str]]:
    """(contenders, parameters, tensors, notes) of a timed workload; each contender
    allocates its own arrays."""
    notes = [wl.note] if wl.note else []
    rows: list[Contender] = []
    if wl.params is None:
        n, tensors = getattr(sz, wl.n), 1
    else:
        ps = wl.params(sz)
        n, tensors = ps.n, len(ps.ws)
        for name in wl.rows:
            try:
                c = ROWS[name](torch, ps)
            except Unavailable as e:
                notes.append(str(e))
                continue
            if c is not None:
                rows.append(c)
    inner = getattr(sz, wl.inner) if wl.inner else 1
    for c in rows:
        c.inner = inner
    return rows + make_anchors(torch, n, wl.anchors), n, tensors, notes


def _load() -> float:
    return os.getloadavg()[0]


def run_timed(wl: Workload, torch, sz: Sizes) -> dict:
    """Build, time and check one workload; its arrays are freed on return."""
    load0 = _load()
    contenders, n, tensors, notes = build_contenders(wl, torch, sz)
    interleave(contenders, sz.reps, warmup=sz.warmup)
    ref = next((c for c in contenders if c.name == wl.reference), None)
    ref_w = ref.weights() if ref is not None and ref.weights else None
    rows = []
    for c in contenders:
        diff = None
        if c.weights is not None and ref_w is not None:
            diff = float(np.max(np.abs(c.weights() - ref_w)))
        rows.append({"contender": c.name, "kind": c.kind, "bytes": c.bytes,
                     "times_s": c.times, "max_abs_diff": diff, "note": c.note})
    inner = contenders[0].inner if contenders else 1
    out = {"name": wl.name, "title": title(wl, n, tensors), "params": n, "tensors": tensors,
           "bytes_per_param": 0 if wl.params is None else ADAM_B, "reference": wl.reference,
           "bandwidth": wl.bandwidth, "reps": sz.reps, "warmup": sz.warmup, "inner": inner,
           "steps_each": sz.warmup + sz.reps * inner, "note": "; ".join(notes),
           "loadavg_1min": [load0, _load()], "rows": rows}
    del contenders, ref, ref_w
    gc.collect()
    return out


def _row(name: str, times: list[float], note: str) -> dict:
    return {"contender": name, "kind": "build", "bytes": 0, "times_s": times,
            "max_abs_diff": None, "note": note}


def run_build(wl: Workload, sz: Sizes) -> dict:
    """Cold optgen build of adam in a new process with an empty OPTGEN_CACHE_DIR; then
    cache hits in new processes; torch.compile of a torch Adam step, cold (empty
    TORCHINDUCTOR_CACHE_DIR) and with its cache warm."""
    load0 = _load()
    cold = {"wall": [], "import": [], "build": []}
    hit = {"wall": [], "build": [], "create": []}
    notes = []
    with tempfile.TemporaryDirectory(prefix="optgen-suite-") as tmp:
        for r in range(sz.build_reps):
            env = dict(os.environ, OPTGEN_CACHE_DIR=os.path.join(tmp, f"cold{r}"))
            wall, out = spawn("optgen-build", env=env)
            assert not out["cache_hit"], "a fresh cache dir gave a cache hit"
            cold["wall"].append(wall)
            cold["import"].append(out["import_s"])
            cold["build"].append(out["build_s"])
        for _ in range(sz.build_reps):
            wall, out = spawn("optgen-build", env=env)
            assert out["cache_hit"], "the second build of a cache dir was no cache hit"
            hit["wall"].append(wall)
            hit["build"].append(out["build_s"])
            hit["create"].append(out["create_step_s"])
    rows = [_row("optgen cold: process wall", cold["wall"],
                 "bench/children.py optgen-build: import optgen; optgen.build(\"adam\") + "
                 "create/step 1M; empty OPTGEN_CACHE_DIR; all 8 dtype x flag kernels"),
            _row("optgen cold: build() call", cold["build"], "optgen.build('adam') alone"),
            _row("optgen hit: process wall", hit["wall"], "same, cache warm"),
            _row("optgen hit: build() call", hit["build"],
                 "optgen.build('adam') after import (hash check, no compile)"),
            _row("optgen hit: create+1st step", hit["create"],
                 "optgen.create + first step on 1M params: artifact load, and import "
                 "tvm_ffi, which imports torch when it is installed")]
    tc = {"first": [], "wall": [], "warm": []}
    try:
        with tempfile.TemporaryDirectory(prefix="inductor-suite-") as tmp:
            for r in range(sz.compile_reps):
                env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, f"c{r}"))
                wall, out = spawn("torch-compile", env=env)
                tc["wall"].append(wall)
                tc["first"].append(out["first_call_s"])
                tc["warm"].append(spawn("torch-compile", env=env)[1]["first_call_s"])
        rows += [_row("torch.compile cold: 1st call", tc["first"],
                      "torch.compile(fn calling Adam.step), 1M params, empty inductor cache"),
                 _row("torch.compile cold: process wall", tc["wall"], "with import torch"),
                 _row("torch.compile warm: 1st call", tc["warm"], "inductor cache warm")]
    except RuntimeError as e:
        notes.append(f"torch.compile skipped: {e}")
    return {"name": wl.name, "title": wl.title, "params": 0, "tensors": 1,
            "bytes_per_param": 0, "bandwidth": False,
            "reference": "torch.compile cold: 1st call" if tc["first"] else None,
            "reps": sz.build_reps, "compile_reps": sz.compile_reps, "warmup": 0, "inner": 1,
            "note": "; ".join(notes), "loadavg_1min": [load0, _load()], "rows": rows}


def run_memory(wl: Workload, sz: Sizes) -> dict:
    load0 = _load()
    n = getattr(sz, wl.n)
    rows = []
    for name in wl.rows:
        _, out = spawn("memory", name, str(n), env=dict(os.environ, **MALLOC_ENV))
        rows.append({"contender": name, "kind": "memory", "param_bytes": 4 * n, **out})
    return {"name": wl.name, "title": title(wl, n), "params": n,
            "loadavg_1min": [load0, _load()], "rows": rows,
            "note": "new process per contender, MALLOC_MMAP_THRESHOLD_=65536; VmHWM after "
                    "a step minus VmRSS before it"}


def run_trainer(wl: Workload, sz: Sizes) -> dict:
    """One trainer_bench.py workload, default pools then quiet ones (rows "[quiet]")."""
    load0 = _load()
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV}
    quick = sz.adam_small < 10_000_000
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "trainer.json")
        subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__),
                                                     "trainer_bench.py"),
                        "--workloads", wl.trainer, "--reps", str(max(sz.reps, 3)),
                        "--json", out] + (["--quick"] if quick else []),
                       env=env, check=True, stdout=subprocess.DEVNULL)
        with open(out, encoding="utf-8") as f:
            runs = json.load(f)["runs"]
    rows, first = [], runs[0]["workloads"][0]
    for run in runs:
        for r in run["workloads"][0]["rows"]:
            rows.append({"contender": r["contender"], "kind": "step", "bytes": 0,
                         "times_s": r["times_s"], "max_abs_diff": r["max_abs_diff"],
                         "note": f"pools {run['pools']}, cpu pool {run['cpu_pool']}"})
    return {"name": wl.name, "title": f"{wl.title} ({first['params'] / 1e6:.1f}M, "
                                      f"{first['tensors']} tensors)",
            "params": first["params"], "tensors": first["tensors"], "bytes_per_param": 0,
            "reference": wl.reference, "bandwidth": False, "reps": first["reps"],
            "warmup": 3, "inner": 1, "note": "only opt.step() timed; [quiet]: "
            "OMP_WAIT_POLICY=passive TVM_THREAD_POOL_SPIN_COUNT=0 in a new process",
            "loadavg_1min": [load0, _load()], "rows": rows}

"""optgen's sharded ``opt.save``/``opt.load`` under torch.distributed (gloo, FSDP2 on a
CPU mesh), for tests/test_distributed_checkpoint.py, which runs this file in ``world``
processes:

    python tests/distributed_ckpt_run.py MODE WORLD RANK PORT OUT.npz
    # MODE: fail | save | load, save:NAME | load:NAME (an optimizer of distributed_run.py)

``fail``: saves that fail on one rank (rank 1's file write; rank 0's index.json), each
rank's error and how long it took, under a short process-group timeout so that a rank
left waiting shows as a failure, not a hang; then whether the previous checkpoint in
that folder still loads whole, and that a good save and load still run on every rank.
``save``: a few steps of FSDP2 Adam, saved to ``<out folder>/ckpt``; ``load``: loaded at
this world size, with the files each rank opened and the states it loaded.
"""
from __future__ import annotations

import datetime
import os
import sys
import time

import numpy as np
import torch

import distributed_run
from optgen.core import filelocks
from optgen.runtime import checkpoint

TIMEOUT_S = 30     # the process group's: an old-style barrier hang ends in this


def _model(name: str = "adam"):
    model, net, opt, x, y = distributed_run.setup(name, "fsdp")
    return net, opt, x, y


def _attempt(fn) -> tuple[str, float]:
    start = time.perf_counter()
    try:
        fn()
        raised = ""
    except Exception as e:     # noqa: BLE001 (the test reads what was raised)
        raised = f"{type(e).__name__}: {e}"
    return raised, time.perf_counter() - start


def _states(opt) -> dict[str, np.ndarray]:
    out = {}
    for i, st in enumerate(opt._core.state):
        for n, v in st.items():
            out[f"{i}/{n}"] = np.asarray(v.numpy() if hasattr(v, "numpy") else v).copy()
    return out


def fail(folder: str) -> dict[str, np.ndarray]:
    rank = torch.distributed.get_rank()
    net, opt, x, y = _model()
    out = {}
    distributed_run.run_steps(net, opt, x, y, 2)
    where = os.path.join(folder, "run")
    opt.save(where)                                     # the previous checkpoint
    kept = _states(opt)
    distributed_run.run_steps(net, opt, x, y, 2)
    save = checkpoint.save
    if rank == 1:                                       # rank 1's write fails
        def full(path, sd):
            raise OSError(28, "No space left on device", path)
        checkpoint.save = full
    out["write/raised"], out["write/seconds"] = _attempt(lambda: opt.save(where))
    checkpoint.save = save
    # the previous checkpoint still loads whole (into a fresh optimizer)
    net2, opt2, _, _ = _model()
    out["previous/raised"], _ = _attempt(lambda: opt2.load(where))
    out["previous/equal"] = np.array(all(np.array_equal(v, _states(opt2).get(k))
                                         for k, v in kept.items()))
    # rank 0's index.json cannot be written (a folder is in its way)
    other = os.path.join(folder, "index-blocked")
    if rank == 0:
        os.makedirs(os.path.join(other, "index.json"))
    torch.distributed.barrier()
    out["index/raised"], out["index/seconds"] = _attempt(lambda: opt.save(other))
    # and then a good save and load run on every rank; it removes what a killed save
    # left (a temporary file of an earlier save's name, no writer holding it)
    good = os.path.join(folder, "good")
    left = os.path.join(good, f"rank-1-0badf00d.npz.tmp-k{filelocks.kernel_tag()}-abcdefgh")
    if rank == 0:
        os.makedirs(good)
        open(left, "wb").close()
    out["good/raised"], _ = _attempt(lambda: (opt.save(good), opt.load(good)))
    out["good/left"] = np.array(os.path.exists(left))
    return {k: np.array(v) for k, v in out.items()}


def save(folder: str, name: str = "adam") -> dict[str, np.ndarray]:
    net, opt, x, y = _model(name)
    distributed_run.run_steps(net, opt, x, y, 3)
    opt.save(os.path.join(folder, "ckpt"))
    return {}


def load(folder: str, name: str = "adam") -> dict[str, np.ndarray]:
    net, opt, x, y = _model(name)
    opened, read = [], checkpoint.load

    def counted(path):
        opened.append(os.path.basename(path))
        return read(path)
    checkpoint.load = counted
    opt.load(os.path.join(folder, "ckpt"))
    checkpoint.load = read
    return {"opened": np.array(sorted(opened)),
            **{f"state/{k}": v for k, v in _states(opt).items()}}


def main() -> None:
    mode, world, rank, port, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        sys.argv[4], sys.argv[5]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.distributed.init_process_group(
        "gloo", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=TIMEOUT_S))
    folder = os.path.join(os.path.dirname(out), "ckpt")
    try:
        verb, _, name = mode.partition(":")   # ("save:adam-q8": distributed_run's name)
        results = {"fail": fail, "save": save, "load": load}[verb](folder, *[name][:bool(name)])
        np.savez(out, **results)
    finally:
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)    # (as distributed_run.py: gloo's threads at interpreter exit)


if __name__ == "__main__":
    main()

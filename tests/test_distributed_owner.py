"""Shampoo and SOAP on FSDP2 shards (gloo, processes on this machine): each split
matrix's whole-matrix states (statistics, roots, eigenbases) and its other states live
on one owner rank (runtime/owned.py); the gradient's and weight's rows reach it by one
all-to-all, the new weight's rows go back by another (tests/distributed_owner_run.py).

Each rank trains on its own part of every batch; a (32, 16) weight and a 3-row (3, 32)
one (uneven shards; at world size 4 one rank holds none of its rows). Checked against
one process: Shampoo on the whole batches to 1e-5 of max|w| (float32) over 20 steps
with five refreshes of its roots; both rules on the very gradients FSDP2 averaged
(gathered each step and replayed in one process), which isolates the optimizer from the
gradients' rounding. SOAP is not compared on the whole batches: its first eigenbasis
is fit to a statistic of rank at most 3 (the 3-row layer's g^T g, 32 x 32), whose null
space has no preferred basis, so float32 rounding of the averaged gradient picks
another one and Adam's per-coordinate v then differs (measured: 13 % of max|w|).
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the distributed tests need torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch has no torch.distributed with the gloo backend",
                allow_module_level=True)

import distributed_owner_run as run  # noqa: E402  (tests/ is on sys.path)
from helpers import EXHAUSTIVE  # noqa: E402
from test_distributed import launch  # noqa: E402

SHAPES = [(32, 16), (32,), (3, 32), (3,)]


def _rows(n: int, world: int, r: int) -> int:
    size = -(-n // world)
    return max(0, min(n, (r + 1) * size) - min(n, r * size))


def _owners(world: int) -> list[int]:
    """The exchange's greedy choice by flops (R * C * min(R, C)), largest first: the
    (32, 16) weight to rank 0, the (3, 32) one to rank 1 (at world size 1: none split)."""
    return [0, -1, 1, -1] if world > 1 else [-1] * 4


def _moved(world: int) -> int:
    """Bytes all ranks send to others per step: each weight's rows not on its owner, of
    the gradient and the weight to the owner, and of the new weight back (4 B each)."""
    return 3 * 4 * sum((r - _rows(r, world, o)) * c
                       for (r, c), o in zip([SHAPES[0], SHAPES[2]], [0, 1]))


def _close(have, want, where):
    tol = 1e-5 * max(float(np.max(np.abs(w))) for w in want)
    for i, (h, w) in enumerate(zip(have, want)):
        diff = float(np.max(np.abs(h - w)))
        assert diff <= tol, f"{where}, parameter {i}: max |diff| {diff} > {tol}"


@pytest.fixture(scope="module")
def whole_batch():
    return {name: run.single(name) for name in run.RULES}


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=EXHAUSTIVE)])
def test_owner_held_states_equal_one_process(world, whole_batch, tmp_path):
    ckpt = tmp_path / "ckpt"
    for name in run.RULES:   # the first half in one process, for the ranks to load
        run.single(name, steps=range(run.STEPS // 2), save=str(ckpt / f"{name}-w1"))
    ranks = launch("distributed_owner_run.py", "owner", world, tmp_path, timeout=240)
    for name in run.RULES:
        # DCP across world sizes, every rank on the whole batches: world -> 1 (the
        # ranks' first half, the second half here) and 1 -> world (the other way)
        back = run.single(name, steps=range(run.STEPS // 2, run.STEPS),
                          load=str(ckpt / f"{name}-w{world}"))
        _close(back, whole_batch[name], f"{name}: DCP checkpoint of world size {world} "
               "loaded in one process")
        for r, got in enumerate(ranks):
            _close([got[f"{name}/dcp/{i}"] for i in range(4)], whole_batch[name],
                   f"{name}: a one-process DCP checkpoint loaded at world size {world}, "
                   f"rank {r}")
        grads = [[ranks[0][f"{name}/grad/{t}/{i}"] for i in range(4)]
                 for t in range(run.STEPS)]
        replayed = run.single(name, grads)
        moved = np.array([got[f"{name}/moved"] for got in ranks])
        for r, got in enumerate(ranks):
            where = f"{name}, world size {world}, rank {r}"
            have = [got[f"{name}/{i}"] for i in range(4)]
            _close(have, replayed, where + " (the averaged gradients replayed)")
            if name == "shampoo":   # (SOAP: see the module's docstring)
                _close(have, whole_batch[name], where + " (one process, whole batches)")
            # resumed from state_dict() at step 10 at the same world size: the same run
            for i in range(4):
                assert np.array_equal(got[f"{name}/resumed/{i}"], have[i]), \
                    f"{where}: the resumed run differs at parameter {i}"
            assert got[f"{name}/owners"].tolist() == _owners(world), got[f"{name}/owners"]
            for i in (0, 2):   # held whole on the owner, absent elsewhere
                (rows, cols), mine = SHAPES[i], _owners(world)[i] == r
                for n, want in (("m", (rows, cols)), ("L", (rows, rows)), ("R", (cols, cols))):
                    key = f"{name}/shape/{i}/{n}"
                    assert (tuple(got[key].tolist()) if key in got else None) == \
                        (want if mine else None), (where, i, n)
            assert got[f"{name}/sent"].tolist() == [5] * run.STEPS   # the agreement only
        # two all-to-alls per step; the bytes of the gradient and weight rows
        assert moved.shape == (world, 2 * run.STEPS), moved.shape
        per_step = moved.sum(axis=0).reshape(-1, 2).sum(axis=1)
        assert set(per_step.tolist()) == {_moved(world)}, (name, per_step[:3])
    if world == 2:   # optgen's opt.save folders of world size 2, loaded at 1
        for r, got in enumerate(launch("distributed_owner_run.py", "optgen-load", 1,
                                       tmp_path, timeout=240)):
            for name in run.RULES:
                _close([got[f"{name}/optgen/{i}"] for i in range(4)], whole_batch[name],
                       f"{name}: opt.save at world size 2, opt.load at 1")

"""The step inside backward on FSDP2 (``fully_shard``), for tests/test_step_in_backward_fsdp.py:
each rank runs every case twice, the ordinary FSDP2 step (backward, then step()) and the
step inside backward (each shard stepped by the hook FSDP2 calls after its
reduce-scatter), on its own half of every batch, and saves the whole weights of both.

    python tests/in_backward_fsdp_run.py MODE WORLD RANK PORT OUT.npz   # MODE: fsdp-ib

Also saved: whether every ``.grad`` was None after each in-backward backward, the steps
each parameter took, for each part stepped its size and whether FSDP2's reduce-scatter
called it (not the end of backward: a bucket per ``fully_shard``-ed layer, though the
default buckets would hold the 6 small tensors together), and what the bad
cases raised (``bad/<case>``) with whether the weights stayed as they were; after them a
good step runs on every rank (no rank waits on another).
"""
from __future__ import annotations

import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import distributed_run  # noqa: E402

import optgen.torch as ot  # noqa: E402
from optgen.torch import in_backward, in_backward_hooks  # noqa: E402

STEPS = 4
PARTS: list[tuple[int, bool]] = []   # per part stepped: its size, whether FSDP2's
# reduce-scatter called its hook


def _recorded(step_part):
    def recorded(self, params, grads):
        frame, reduce = sys._getframe(1), in_backward_hooks._fsdp_reduce()
        while frame is not None and frame.f_code is not reduce:
            frame = frame.f_back
        PARTS.append((len(params), frame is not None))
        return step_part(self, params, grads)
    return recorded
# name -> (optimizer, its options, the model's dtype)
CASES = {
    "adamw": ("AdamW", dict(lr=1e-2, weight_decay=0.1), torch.float32),
    # a whole-tensor reduction (the trust ratio's norms): its float64 partial sums are
    # all-reduced between the passes, per part
    "lamb": ("LAMB", dict(lr=1e-2, weight_decay=0.01), torch.float32),
    # bf16 weights, a split8 master, q8 states (per-shard blocks): 5 bytes a parameter
    "adamw-5byte": ("AdamW", dict(lr=1e-2, weight_decay=0.1, master_format="split8",
                                  state_format="q8", state_format_min_size=0), torch.bfloat16),
    # a matrix rule: each weight whole on one owner rank for Newton-Schulz (all-to-all)
    "muon": ("Muon", dict(lr=0.02, momentum=0.95, weight_decay=0.01), torch.float32),
    # whole-matrix states (its eigenbases) on each matrix's owner rank, refreshed at step 3
    "soap": ("SOAP", dict(lr=1e-2, precondition_frequency=2), torch.float32),
}


def model(dtype: torch.dtype) -> torch.nn.Module:
    """Three layers, each ``fully_shard``-ed, then the model; the last layer's 5 rows
    split 3 and 2 at world size 2."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                              torch.nn.Tanh(), torch.nn.Linear(32, 5)).to(dtype)
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    for layer in (net[0], net[2], net[4], net):
        fully_shard(layer, mesh=mesh)
    return net


def batch(i: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's half of global batch ``i``."""
    g = torch.Generator().manual_seed(100 + i)
    x, y = torch.randn(16, 16, generator=g), torch.randn(16, 5, generator=g)
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    return x.chunk(world)[rank].to(dtype), y.chunk(world)[rank]


def loss_of(net, i: int, dtype: torch.dtype) -> torch.Tensor:
    x, y = batch(i, dtype)
    return torch.nn.functional.mse_loss(net(x).float(), y)


def whole(net) -> list[np.ndarray]:
    return [p.full_tensor().detach().float().numpy().copy() for p in net.parameters()]


def train(name: str, in_backward: bool) -> dict[str, np.ndarray]:
    """``STEPS`` steps of case ``name``: the whole weights after them; in backward also
    whether every gradient was released by each backward, and the step counts."""
    cls, kw, dtype = CASES[name]
    net = model(dtype)
    opt = getattr(ot.seeds, cls, None) or getattr(ot, cls)
    opt = opt(net.parameters(), step_in_backward=in_backward, **kw)
    released = []
    del PARTS[:]
    for i in range(STEPS):
        loss_of(net, i, dtype).backward()
        released.append(all(p.grad is None for p in net.parameters()))
        opt.step()
        opt.zero_grad()
    out = {str(i): w for i, w in enumerate(whole(net))}
    if in_backward:
        out["released"] = np.array(released)
        out["steps"] = np.array([float(opt.state[p]["step"]) for p in net.parameters()])
        out["parts"] = np.array(PARTS)
    return out


def accumulated(in_backward: bool) -> list[np.ndarray]:
    """AdamW with two micro-batches a step: FSDP2's own way (no reduce-scatter before
    the last: ``set_requires_gradient_sync(False)``), then optgen's ``accumulating()``
    (each micro-batch reduce-scattered and added up, the next backward steps the sums)."""
    net = model(torch.float32)
    opt = ot.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1, step_in_backward=in_backward)
    for i in range(STEPS):
        how = "fsdp" if i < STEPS // 2 else "optgen"
        for k in range(2):
            last = k == 1
            if how == "fsdp":
                net.set_requires_gradient_sync(last)
            held = in_backward and how == "optgen" and not last
            with opt.accumulating() if held else _nothing():
                (loss_of(net, 10 * i + k, torch.float32) / 2).backward()
        net.set_requires_gradient_sync(True)
        opt.step()
        opt.zero_grad()
    return whole(net)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def bad() -> dict[str, np.ndarray]:
    """What each rank raised: refusals at construction (every rank, before any
    collective); a non-finite gradient under ``nonfinite="raise"`` (FSDP2's average
    carries it to every rank); one rank's checks failing inside a hook (LAMB), and an lr
    set on one rank only (AdamW: an elementwise rule, no collective of its own): every
    rank raises, instead of waiting in a collective the other left. After each, FSDP2's
    ``reset_iter_state()``; then a good backward steps on every rank."""
    out = {}
    net = model(torch.float32)
    for case, make in (
            ("offload", lambda: ot.AdamW(net.parameters(), offload="cpu", step_in_backward=True)),
            ("flat", lambda: ot.AdamW(net.parameters(), flat=True, step_in_backward=True)),
            ("clip", lambda: ot.AdamW(net.parameters(), clip_global_norm=1.0,
                                      step_in_backward=True))):
        try:
            make()
            out[f"bad/{case}"] = np.array("")
        except (TypeError, ValueError) as e:
            out[f"bad/{case}"] = np.array(f"{type(e).__name__}: {e}")
    opt = ot.LAMB(net.parameters(), lr=1e-2, nonfinite="raise", step_in_backward=True)
    rank = torch.distributed.get_rank()
    real = opt._core.check_part
    adamw = None
    for case in ("nan", "one-rank", "one-rank-lr", "good"):
        before = [p._local_tensor.clone() for p in net.parameters()]
        if case == "one-rank" and rank == 1:
            def failing(grads):
                raise ValueError("a check that fails on rank 1 only")
            opt._core.check_part = failing
        if case == "one-rank-lr":   # (a newer optimizer owns the parameters' hooks)
            adamw = ot.AdamW(net.parameters(), lr=1e-2, step_in_backward=True)
            adamw.param_groups[0]["lr"] = -1.0 if rank == 1 else 1e-2
        if case == "good" and adamw is not None:
            adamw.param_groups[0]["lr"] = 1e-2
        loss = loss_of(net, 0, torch.float32)
        if case == "nan":
            loss = loss * float("nan")
        try:
            loss.backward()
            out[f"bad/{case}"] = np.array("")
        except Exception as e:   # noqa: BLE001 (the test reads what was raised)
            out[f"bad/{case}"] = np.array(f"{type(e).__name__}: {e}")
        opt._core.check_part = real
        if out[f"bad/{case}"]:   # (torch's recovery after a backward that raised)
            net.reset_iter_state()
        out[f"bad/{case}/unchanged"] = np.array(all(
            torch.equal(a, p._local_tensor) for a, p in zip(before, net.parameters())))
        opt.zero_grad()
    return out


def results_of(mode: str, world: int, folder: str) -> dict[str, np.ndarray]:
    out = {}
    for name in CASES:
        for ib in (False, True):
            out.update((f"{name}/{ib}/{k}", v) for k, v in train(name, ib).items())
    for ib in (False, True):
        out.update((f"accumulated/{ib}/{i}", w) for i, w in enumerate(accumulated(ib)))
    out.update(bad())
    return out


if __name__ == "__main__":
    in_backward.StepInBackward._step_part = _recorded(in_backward.StepInBackward._step_part)
    distributed_run.serve(results_of)

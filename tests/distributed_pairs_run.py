"""The composition table's pairs with a distributed item, run in one gloo group, for
tests/test_composition_pairs_distributed.py: each rank runs every pair it is given (the
optgen side of tests/test_composition_pairs.py's scenario, with the distributed item
on) and saves the weights after the steps, or what the run raised and the weights then;
the test compares them with the one-process plain path.

    python tests/distributed_pairs_run.py PAIRS WORLD RANK PORT OUT.npz
    # PAIRS: the pairs as "a+b", comma-separated

Every rank trains on the same data, so DDP's average equals each rank's gradient and
ZeRO-1's partitions see the one-process gradients: a pair that composes gives the
one-process result. A pair's failure is its result: the next pair runs in the same group.
"""
from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import distributed_run  # noqa: E402
import test_composition_pairs as pairs  # noqa: E402
from optgen.runtime import composition  # noqa: E402

DISTRIBUTED = ("ddp", "attach_ddp", "zero1", "agree", "fsdp2")


def _ddp(s: pairs.Scenario) -> None:
    frozen = any(getattr(f, "__qualname__", "").startswith("_freeze") for f in s.between)

    def wrap(net):   # (a parameter frozen after wrapping: DDP's find_unused_parameters)
        return torch.nn.parallel.DistributedDataParallel(
            net, find_unused_parameters=frozen and s.after is None)
    if s.wrap is None:
        s.wrap = wrap
        # without attach a backward outside accumulating() is refused: every micro-batch
        # inside it, opt.step() steps the sums (DDP's ordinary loop)
        s.hold_all = s.hold_first and s.after is None


def _attach(s: pairs.Scenario) -> None:
    s.kw["step_in_backward"] = True
    s.after = lambda opt, model: opt.attach(model)
    _ddp(s)


class _Zero(ZeroRedundancyOptimizer):
    """ZeRO-1 whose state_dict is every rank's (consolidated on rank 0, then sent)."""

    def state_dict(self):
        self.consolidate_state_dict(to=0)
        sd = [super().state_dict() if torch.distributed.get_rank() == 0 else None]
        torch.distributed.broadcast_object_list(sd, src=0)
        return sd[0]


def _zero1(s: pairs.Scenario) -> None:
    s.make = lambda cls, params, **kw: _Zero(params, optimizer_class=cls, **kw)


def _agree(s: pairs.Scenario) -> None:
    s.kw["agree"] = torch.distributed.group.WORLD


def _fsdp2(s: pairs.Scenario) -> None:
    def wrap(net):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
        for layer in (net.a, net.h, net.b, net):
            fully_shard(layer, mesh=mesh)
        return net
    s.wrap = wrap


APPLY = {"ddp": _ddp, "attach_ddp": _attach, "zero1": _zero1, "agree": _agree,
         "fsdp2": _fsdp2}


ORDER = {"attach_ddp": 1, "ddp": 2}


def scenario(pair: tuple[str, ...]) -> pairs.Scenario:
    """The one-process scenario of the pair's other items, the distributed ones on top
    (DDP's wrap last: attach_ddp's own wins)."""
    s = pairs.scenario([i for i in pair if i not in APPLY])
    for item in sorted((i for i in pair if i in APPLY), key=lambda i: ORDER.get(i, 0)):
        APPLY[item](s)
    return s


def _whole(t: torch.Tensor) -> np.ndarray:
    t = t.full_tensor() if type(t).__name__ == "DTensor" else t
    return t.detach().float().numpy().copy()


def twin(pair: tuple[str, ...]) -> pairs.Scenario | None:
    """A pair of DDP, ZeRO-1 or FSDP2 with a torch feature, torch.optim.AdamW in place
    of optgen's: where torch's own run under it differs from one process (FSDP2 does not
    see ``p.data = new``), optgen's must match that run."""
    d = [i for i in pair if i in APPLY]
    if d not in (["ddp"], ["zero1"], ["fsdp2"]) or not all(
            i in composition.FEATURES for i in pair if i not in APPLY):
        return None
    s = scenario(pair)
    s.kw.clear()
    s.make = (lambda cls, params, **kw: _Zero(params, optimizer_class=torch.optim.AdamW, **kw)) \
        if d == ["zero1"] else (lambda cls, params, **kw: torch.optim.AdamW(params, **kw))
    return s


def run_pair(pair: tuple[str, ...], s: pairs.Scenario | None = None) -> dict[str, np.ndarray]:
    """The pair's weights after the steps, or what it raised (and the weights then), and
    the warnings it gave; ``twin/``: the same of its torch twin."""
    if s is None:
        t = twin(pair)
        out = {} if t is None else {f"twin/{k}": v for k, v in run_pair(pair, t).items()}
        return {**out, **run_pair(pair, scenario(pair))}
    nets = []
    wrap = s.wrap

    def kept(net):   # (the weights as they are when something raises)
        nets.append(net)
        return wrap(net) if wrap is not None else net
    s.wrap = kept
    out = {}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            weights = pairs.run(s, "optgen")
            out["error"] = np.array("")
        except Exception as e:   # noqa: BLE001 (a pair's failure is its result)
            out["error"] = np.array(f"{type(e).__name__}: {e}")
            weights = list(nets[0].parameters()) if nets else []
    out["warnings"] = np.array("\n".join(str(w.message) for w in seen))
    out.update((str(i), _whole(w)) for i, w in enumerate(weights))
    return out


def results_of(spec: str, world: int, folder: str) -> dict[str, np.ndarray]:
    results = {}
    for name in spec.split(","):
        for k, v in run_pair(tuple(name.split("+"))).items():
            results[f"{name}/{k}"] = v
    return results


if __name__ == "__main__":
    distributed_run.serve(results_of)

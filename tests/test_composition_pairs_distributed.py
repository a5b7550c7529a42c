"""The composition table's pairs with a distributed item (DDP, opt.attach(ddp_model),
ZeRO-1, agree=<group>, FSDP2) run: one gloo job of 2 ranks on this machine runs every
pair (tests/distributed_pairs_run.py: the optgen side of tests/test_composition_pairs.py's
scenario with the distributed item on, every rank on the same data); a pair that
composes gives, on every rank, the one-process plain path of its other item within that
item's bound; a refused pair raises the table's text on every rank (at construction:
with the weights unchanged; at the first step: or warns it, or ends where the plain path
does, as in the one-process test). CI runs a fixed covering (every distributed item with
a few others, every refusal, the distributed items with each other); ``--exhaustive``
runs every pair. Checkpoints at another world size (reshard_checkpoint) need two jobs:
tests/test_distributed*.py run them.
"""
from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch has no torch.distributed with the gloo backend",
                allow_module_level=True)

import test_composition_pairs as pairs  # noqa: E402  (tests/ is on sys.path)
from distributed_pairs_run import DISTRIBUTED  # noqa: E402
from helpers import EXHAUSTIVE  # noqa: E402
from test_distributed import launch  # noqa: E402

from optgen.runtime import composition  # noqa: E402

WORLD = 2
IMPLIES = {"attach_ddp": ("step_in_backward", "ddp")}   # (attach is for step_in_backward)


def _runnable(item: str) -> bool:
    return item in DISTRIBUTED or item not in pairs.NOT_HERE


PAIRS = [p for p in pairs.PAIRS if any(i in DISTRIBUTED for i in p) and all(map(_runnable, p))]
# pairs whose run differs from their cell (each named in the table's cell or its code's
# fix): in the covering so that it shows them
DIFFER = {("attach_ddp", "freeze_unfreeze"), ("fsdp2", "torch_compile"),
          ("zero1", "torch_state_dict"), ("zero1", "named_parameters")}
# CI: a fixed covering: every third pair of each distributed item, every refusal, the
# distributed items with each other
SAMPLED = {p for d in DISTRIBUTED for j, p in enumerate(q for q in PAIRS if d in q)
           if j % 3 == 0 or all(i in DISTRIBUTED for i in p) or p in DIFFER
           or not composition.verdict(*p).composes}


@pytest.fixture(scope="module")
def ranks(request, tmp_path_factory):
    """What each rank saved: one job runs the pairs this session selected."""
    chosen = [item.callspec.params["pair"] for item in request.session.items
              if getattr(item, "originalname", None) == "test_distributed_pair"]
    return launch("distributed_pairs_run.py", ",".join("+".join(p) for p in chosen), WORLD,
                  tmp_path_factory.mktemp("pairs"), timeout=600, tag="pairs")


def _plain(pair) -> tuple[list[torch.Tensor], float]:
    s = pairs.scenario([i for i in pair if i not in DISTRIBUTED])
    return pairs.run(s, "plain" if s.cls == "AdamW" else "reference"), s.tol


def _said(error: str, refusals) -> bool:
    """The table's refusal, or torch's own error quoted by the table's text (ZeRO-1's
    constructor refuses (name, parameter) pairs before optgen sees them)."""
    said = error.split(" is refused: ", 1)[-1]
    if " is refused: " in error:
        return any(said in composition.verdict(*r).text for r in refusals)
    theirs = error.split(": ", 1)[-1]
    return bool(theirs) and any(theirs in composition.verdict(*r).text for r in refusals)


@pytest.mark.parametrize("pair", [
    pytest.param(p, marks=() if p in SAMPLED else EXHAUSTIVE, id="+".join(p)) for p in PAIRS])
def test_distributed_pair(pair, ranks):
    name = "+".join(pair)
    on = sorted({*pair, *(j for i in pair for j in IMPLIES.get(i, ()))})
    refusals = sorted((p for p in itertools.combinations(on, 2)
                       if (p[0] in pair or p[1] in pair) and not composition.verdict(*p).composes),
                      key=lambda p: composition.verdict(*p).when != "construction")
    want, tol = _plain(pair)
    for rank, got in enumerate(ranks):
        error = str(got[f"{name}/error"])
        weights = [torch.from_numpy(got[f"{name}/{i}"]) for i in range(len(want))
                   if f"{name}/{i}" in got]
        if refusals and composition.verdict(*refusals[0]).when == "construction":
            assert _said(error, refusals), (pair, rank, error)
            s = pairs.scenario([i for i in pair if i not in DISTRIBUTED])
            start = [p.detach().float() for p in pairs.Net(s.tied, None).to(s.dtype).parameters()]
            assert all(torch.equal(w, p) for w, p in zip(weights, start)), (pair, rank)
            continue
        if refusals:   # (first step: raised, or warned, or the plain path's result)
            if _said(error, refusals) or any(
                    composition.verdict(*r).text in str(got[f"{name}/warnings"])
                    for r in refusals):
                continue
        assert not error, (pair, rank, error)
        assert len(weights) == len(want), (pair, rank)
        torch_run = [torch.from_numpy(got[f"{name}/twin/{i}"]) for i in range(len(want))
                     if f"{name}/twin/{i}" in got]
        for i, (g, w) in enumerate(zip(weights, want)):
            err = (g - w).abs().max().item()
            if err > tol and torch_run:   # (torch's own run under the item differs too:
                # optgen's must be torch's)
                theirs = (torch_run[i] - w).abs().max().item()
                mine = (g - torch_run[i]).abs().max().item()
                assert theirs > tol and mine <= tol, (
                    f"{pair} rank {rank}: parameter {i} is {err:.3g} from the plain path "
                    f"and {mine:.3g} from torch.optim.AdamW's run under the same item "
                    f"(which is {theirs:.3g} from the plain path; bound {tol})")
                continue
            assert err <= tol, f"{pair} rank {rank}: parameter {i} is {err:.3g} from the " \
                               f"plain path (bound {tol})"

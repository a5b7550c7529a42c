"""The step inside backward on FSDP2 (``fully_shard``, gloo, 2 processes on this
machine: tests/in_backward_fsdp_run.py): FSDP2 calls each sharded parameter's
post-accumulate-grad hook once its reduce-scatter is done, and the hook steps the
rank's shard there. Equal, bit for bit, to the ordinary FSDP2 step (backward, then
step()) on every rank: AdamW, LAMB (whole-tensor norms summed across the mesh per part),
Muon (each weight whole on its owner rank), SOAP (whole-matrix states on the owner rank),
AdamW with bf16 weights, a split8 master and q8 states; with accumulation (FSDP2's ``set_requires_gradient_sync(False)`` and
optgen's ``accumulating()``). Each fully_shard-ed layer's shards were one part, stepped
inside its reduce-scatter, and every gradient was released by the backward. Bad cases
raise typed errors on every rank (one rank's failure: the same DistributedStepError on
both), with nothing changed, and the next backward steps on every rank."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the distributed tests need torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch has no torch.distributed with the gloo backend",
                allow_module_level=True)

import in_backward_fsdp_run as run  # noqa: E402  (tests/ is on sys.path)
from test_distributed import launch  # noqa: E402


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return launch("in_backward_fsdp_run.py", "fsdp-ib", 2, tmp_path_factory.mktemp("ib"),
                  timeout=240)


@pytest.mark.parametrize("case", [*run.CASES, "accumulated"])
def test_equal_to_the_ordinary_fsdp2_step(case, ranks):
    n = 6   # (3 layers: weight and bias each)
    for rank, got in enumerate(ranks):
        for i in range(n):
            plain, inside = got[f"{case}/False/{i}"], got[f"{case}/True/{i}"]
            assert np.array_equal(plain, inside), (case, rank, i, np.abs(plain - inside).max())
            # (and the run moved them: the ranks' whole weights agree)
            assert np.array_equal(inside, ranks[0][f"{case}/True/{i}"]), (case, rank, i)
        if case == "accumulated":
            continue
        assert got[f"{case}/True/released"].all(), (case, rank)
        assert (got[f"{case}/True/steps"] == run.STEPS).all(), (case, rank)
        # a part per fully_shard-ed layer (weight and bias), inside its reduce-scatter
        parts = got[f"{case}/True/parts"].tolist()
        assert parts == [[2, 1]] * 3 * run.STEPS, (case, rank, parts)


def test_bad_cases_raise_on_every_rank(ranks):
    for rank, got in enumerate(ranks):
        for case, text in (("offload", "step_in_backward with offload is refused"),
                           ("flat", "step_in_backward with flat is refused"),
                           ("clip", "step_in_backward with clip_global_norm is refused")):
            assert str(got[f"bad/{case}"]).startswith("ValueError: ") and \
                text in str(got[f"bad/{case}"]), (case, rank)
        assert str(got["bad/nan"]).startswith("FloatingPointError: "), rank
        # (the agreement: every rank raises the same error, naming the rank that failed)
        one = str(got["bad/one-rank"])
        assert one == ("DistributedStepError: lamb: the step failed on 1 of 2 rank(s): rank "
                       "1: ValueError: a check that fails on rank 1 only; nothing was "
                       "changed on any rank"), (rank, one)
        lr = str(got["bad/one-rank-lr"])
        assert lr.startswith("DistributedStepError: torch_adamw: the step failed on 1 of 2 "
                             "rank(s): rank 1: ValueError: ") and "lr" in lr, (rank, lr)
        for case in ("nan", "one-rank", "one-rank-lr"):
            assert got[f"bad/{case}/unchanged"], (case, rank)
        assert str(got["bad/good"]) == "" and not got["bad/good/unchanged"], rank

"""A bad input on one rank of a distributed step (tests/distributed_bad_run.py: gloo,
two processes on this machine, a 20 s process-group timeout): under DDP (LAMB with a
global-norm clip), ZeRO-1 (LAMB, each rank stepping its partition, then broadcasts) and
FSDP2 (LAMB with the clip, summed across shards), rank 1 alone sets lr = -1, then has a
float64 gradient, then a NaN gradient with ``nonfinite="raise"``. Every rank raises the
same error naming rank 1 and its cause within seconds (no rank waits in a collective for
a rank that left), no rank's parameters or states change, and one more good step makes
every rank's parameters those of the single-process run."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the distributed tests need torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch has no torch.distributed with the gloo backend",
                allow_module_level=True)

import distributed_bad_run  # noqa: E402  (tests/ is on sys.path)
from test_distributed import launch  # noqa: E402

WORLD = 2
# what rank 1's bad input raises there, as the other ranks name it
CAUSES = {"hyper": "ValueError: lamb: invalid lr=-1.0",
          "dtype": "TypeError: lamb: gradient 0 has dtype float64",
          "nan": "FloatingPointError: lamb: gradient 0"}


def _launch(modes: str, tmp_path) -> list[dict[str, np.ndarray]]:
    return launch("distributed_bad_run.py", modes, WORLD, tmp_path, timeout=150)


MODES = ("ddp", "zero", "fsdp")


@pytest.fixture(scope="module")
def single():
    return distributed_bad_run.single()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every mode's results, from one process group (modes one after another)."""
    return _launch(",".join(MODES), tmp_path_factory.mktemp("bad"))


@pytest.mark.parametrize("mode", MODES)
def test_a_bad_input_on_one_rank_raises_on_every_rank_at_once(mode, single, runs):
    ranks = [{k[len(mode) + 1:]: v for k, v in got.items() if k.startswith(f"{mode}/")}
             for got in runs]
    for case in distributed_bad_run.CASES:
        said = [str(got[f"{case}/raised"]) for got in ranks]
        if mode == "fsdp" and case == "nan":
            # the non-finite flag rides with the global norm's sum across the shards
            # (after the agreement): a FloatingPointError on every rank
            assert all(s.startswith("FloatingPointError: lamb: ") for s in said), said
            assert CAUSES["nan"] in said[1] and "a gradient on another rank" in said[0], said
        else:
            assert len(set(said)) == 1, f"{mode} {case}: the ranks raised {said}"
            assert said[0].startswith("DistributedStepError: lamb: the step failed on 1 of 2 "
                                      f"rank(s): rank 1: {CAUSES[case]}"), said[0]
            assert said[0].endswith("nothing was changed on any rank"), said[0]
        for r, got in enumerate(ranks):
            assert float(got[f"{case}/seconds"]) < 10, \
                f"{mode} {case}: rank {r} took {float(got[f'{case}/seconds']):.1f} s"
            assert bool(got[f"{case}/unchanged"]), f"{mode} {case}: rank {r} changed"
    for r, got in enumerate(ranks):
        assert str(got["good/raised"]) == "", f"{mode} rank {r}: {got['good/raised']}"
        if mode == "ddp":   # whole parameters: the default agree sends nothing
            assert not bool(got["default-agrees"]), f"rank {r}: a default DDP step agreed"
        for i, want in enumerate(single):
            have = got[f"good/{i}"]
            if mode == "fsdp":   # (sums across shards: float32 rounding)
                np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{mode} rank {r} parameter {i}")
            else:
                assert np.array_equal(have, want), f"{mode} rank {r} parameter {i}"


def test_agree_option_and_one_process():
    """``agree`` is "auto", None or a ProcessGroup (a TypeError naming the rule
    otherwise); without a process group a step agrees with nobody and sends nothing."""
    import optgen.torch as ot
    params = [torch.nn.Parameter(torch.ones(3))]
    with pytest.raises(TypeError, match=r"torch_adamw: agree must be 'auto', None or a "
                                        r"torch.distributed ProcessGroup, got 'world'"):
        ot.AdamW(params, agree="world")
    for agree in ("auto", None):
        opt = ot.AdamW(params, lr=0.1, agree=agree)
        assert opt._agreement is None
        params[0].grad = torch.ones(3)
        opt.step()
    assert not torch.distributed.is_initialized()

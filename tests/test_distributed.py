"""The torch drop-ins under torch.distributed (gloo, processes on this machine):
DistributedDataParallel and ZeRO-1 (``ZeroRedundancyOptimizer(optimizer_class=...)``)
at world sizes 1, 2 and 4, against the single-process run (tests/distributed_run.py).

Every rank trains on the same data: DDP's averaged gradient then equals each rank's own,
and the drop-ins must give the single-process parameters bit for bit; ZeRO-1 partitions
whole tensors, so even LAMB's and LARS's per-tensor norms are complete on the rank that
steps a tensor, and the result is bitwise too. FSDP2 (``fully_shard``, DTensor
parameters): each rank steps its shards; elementwise rules are bitwise equal to the
single-process run; rules that reduce over whole tensors (LAMB, LARS, Adafactor, a user
spec with nested means, the global-norm clip) sum their float64 partial sums across
ranks (runtime/shards.py) and match it to float32 rounding (measured: bitwise), with
one all-reduce per reduction level per step; taking that all-reduce out makes LAMB on
a tensor with skewed shards differ (the test can fail). Muon's weights are whole on one
owner rank for Newton-Schulz (two all-to-alls per step, their bytes counted); q8 and q4
states keep per-shard blocks (checked against the paper's quantizer per shard).
"""
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the distributed tests need torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch has no torch.distributed with the gloo backend",
                allow_module_level=True)

import distributed_run  # noqa: E402  (tests/ is on sys.path)
from helpers import EXHAUSTIVE  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.fixture(scope="module")
def single():
    return {name: distributed_run.train(name) for name in distributed_run.OPTIMIZERS}


def launch(script: str, mode: str, world: int, tmp_path, timeout: int = 300,
           tag: str | None = None) -> list[dict[str, np.ndarray]]:
    """Run ``script`` (tests/<script>: argv mode, world, rank, port, output file) as
    ``world`` processes of one gloo group and read what each rank saved (in files
    named after ``tag``, by default the mode)."""
    port = _free_port()
    outs = [str(tmp_path / f"{tag or mode}-{world}-{r}.npz") for r in range(world)]
    env = dict(os.environ, OMP_NUM_THREADS="1", TVM_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-X", "faulthandler",
                               os.path.join(HERE, script),
                               mode, str(world), str(r), port, outs[r]], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{tag or mode} at world size {world}: a rank hung past {timeout} s")
    for r, p in enumerate(procs):
        assert p.returncode == 0, \
            f"{tag or mode} rank {r} of {world} failed:\n{logs[r][-3000:]}"
    results = []
    for o in outs:
        with np.load(o) as z:
            results.append({k: z[k] for k in z.files})
    return results


def _launch(mode: str, world: int, tmp_path) -> list[dict[str, np.ndarray]]:
    # (dcp-save/dcp-load keep their checkpoint in tmp_path/dcp)
    return launch("distributed_run.py", mode, world, tmp_path)


# values per all-reduce in one step of the 2-layer MLP (4 tensors, all split at world
# sizes 2 and 4): the step's agreement (5: failed and skipping ranks, the rank count, the
# fingerprint and its square; every rule, elementwise ones too), then one bucket per
# reduction level
PER_STEP = {"lamb": [5, 8], "lars": [5, 8], "lamb-skewed": [5, 8],   # ||w||, ||r|| each
            "centered-nsgd": [5, 4, 4],      # mean(g), then rms(g - mean(g)): two levels
            "adamw-clip": [5, 2],            # the global norm and the non-finite flag
            # column means of the (32, 16) and (3, 32) weights (16 + 32), their row
            # statistics' means (1 + 1), the biases' RMS of w and of the update (2 + 2);
            # then the weights' RMS of w and of the update (2 + 2)
            "adafactor": [5, 54, 4],
            # Muon: ||u|| of the two weights before Newton-Schulz (the biases: AdamW)
            "muon": [5, 2]}


def _muon_moved(world: int) -> int:
    """Bytes all ranks send to others per step for Muon's two weights, (32, 16) and
    (3, 32): each weight's rows not on its owner go there and come back (4 B each).
    Owners by flops: the (32, 16) weight rank 0's, the (3, 32) one rank 1's."""
    def rows(n: int, r: int) -> int:
        size = -(-n // world)
        return max(0, min(n, (r + 1) * size) - min(n, r * size))
    return 2 * 4 * ((32 - rows(32, 0)) * 16 + (3 - rows(3, 1)) * 32)


def _near_float32(got: dict, name: str, one: list, f32: list, where: str) -> None:
    """q8/q4 states in per-shard blocks (``name``'s parameters in ``got``) are not one
    process's codes, but the sharded run is an 8-bit (4-bit) Adam as much as the
    one-process run ``one`` is: at most 3 times as far from float32 Adam (``f32``) as
    it (measured: 1.1 times at world size 4, 2.0 at 2)."""
    off = max(np.max(np.abs(got[f"{name}/{i}"] - w)) for i, w in enumerate(f32))
    ref = max(np.max(np.abs(w - v)) for w, v in zip(one, f32))
    assert off <= 3 * ref, f"{where}: {name} is {off} from float32 Adam (one process: {ref})"


def _rel(a, b) -> float:
    return float(np.max(np.abs(a - b) / (np.abs(b) + 1e-3)))


# sampled: each mode at world 2, FSDP2 and ZeRO-1 (uneven partitions) at 4, FSDP2 at 1;
# --exhaustive adds DDP and ZeRO-1 at world 1 (the one-process run itself) and DDP at 4
@pytest.mark.parametrize("mode,world", [
    ("ddp", 2), ("zero", 2), ("fsdp", 2), ("zero", 4), ("fsdp", 4), ("fsdp", 1),
    *(pytest.param(m, w, marks=EXHAUSTIVE) for m, w in [("ddp", 1), ("zero", 1), ("ddp", 4)])])
def test_matches_single_process(mode, world, single, tmp_path):
    ranks = _launch(mode, world, tmp_path)
    split = mode == "fsdp" and world > 1
    for r, got in enumerate(ranks):
        for name, params in single.items():
            if split and name.endswith(("-q8", "-q4")):
                # per-shard blocks: not the one-process codes, but as close to float32
                # Adam as the one-process q8/q4 run is (the per-shard oracle: below)
                assert f"{name}/error" not in got, got.get(f"{name}/error")
                _near_float32(got, name, params, single["adam"], f"fsdp rank {r}")
                continue
            where = f"{mode}, world size {world}, rank {r}: {name}"
            if mode == "fsdp" and name.endswith("-offload"):   # DTensors, even whole ones
                assert str(got[f"{name}/error"]).endswith(
                    "offload with fsdp2 is refused: DTensor parameters with offload are not "
                    "built"), where
                continue
            if mode == "zero" and name == "adamw-clip":   # ZeRO-1 gives each rank's
                # optimizer its partition only: its global norm would be the partition's
                assert "clip_global_norm with zero1 is refused" in \
                    str(got[f"{name}/error"]), where
                continue
            if split and name.endswith("-unsummed"):   # per-shard norms: far off
                assert max(_rel(got[f"{name}/{i}"], w) for i, w in enumerate(params)) > 0.1, \
                    f"{where}: LAMB without the cross-shard sums matched the whole-tensor run"
                continue
            for i, want in enumerate(params):
                have = got[f"{name}/{i}"]
                if split and name in distributed_run.REDUCING:
                    np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6,
                                               err_msg=f"{where} parameter {i}")
                else:
                    assert np.array_equal(have, want), \
                        f"{where} parameter {i} differs from the single-process run " \
                        f"(max |diff| {np.max(np.abs(have - want))})"
            if split and name in ("adam", "adamw", "sgd", "lion", "adamw-bf16"):
                # issue 31: elementwise rules step the local shards in multi-tensor lists
                assert "MultiTensor" in str(got[f"{name}/launches"]), \
                    f"{where}: launches {got[f'{name}/launches']}"
            if split:
                sent = got[f"{name}/sent"].tolist()
                assert sent == PER_STEP.get(name, [5]) * distributed_run.STEPS, \
                    f"{where}: values per all-reduce {sent[:8]}..."
    if split:   # Muon: two all-to-alls per step, each weight moved once each way
        moved = np.array([got["muon/moved"] for got in ranks])
        assert moved.shape == (world, 2 * distributed_run.STEPS), moved.shape
        assert moved.sum() == _muon_moved(world) * distributed_run.STEPS, moved[:, :2]
        steps = moved.sum(axis=0).reshape(-1, 2).sum(axis=1)
        assert set(steps.tolist()) == {_muon_moved(world)}, steps


@pytest.mark.parametrize("world", [pytest.param(2, marks=EXHAUSTIVE), 4])
def test_fsdp2_as_documented(world, single, tmp_path):
    """torch's FSDP2 snippet as written (``fully_shard(layer)`` per layer, then
    ``fully_shard(model)``, no mesh: every call makes its own, equal mesh), one optimizer
    per drop-in family, each rank on its own part of the batch: equal to the
    single-process run on the whole batch to float32 rounding (the gradients are
    averaged by reduce-scatter, in another order); q8 states (per-shard blocks) as close
    to float32 Adam as one process's q8 states."""
    for r, got in enumerate(_launch("fsdp-docs", world, tmp_path)):
        for name in distributed_run.DOCS:
            where = f"fsdp-docs, world size {world}, rank {r}: {name}"
            if name.endswith("-q8"):   # per-shard blocks: as close as one process's q8
                _near_float32(got, name, single[name], single["adam"], where)
                continue
            assert f"{name}/error" not in got, f"{where}: {got.get(f'{name}/error')}"
            for i, want in enumerate(single[name]):
                np.testing.assert_allclose(got[f"{name}/{i}"], want, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{where} parameter {i}")


def test_a_bad_step_on_one_rank_stops_every_rank(tmp_path):
    """Rank 1 alone has a NaN gradient, then a float64 one, then none for a parameter
    the other rank steps: every rank raises (the NaN: a FloatingPointError, rank 0's
    saying another rank has it; the float64 gradient: the same DistributedStepError
    naming rank 1's TypeError; the last a ValueError on both), nobody hangs, no
    parameter changes, and the next good step runs everywhere. Parameters of two meshes in one
    optimizer are a ValueError on every rank."""
    ranks = _launch("fsdp-bad", 2, tmp_path)
    for r, got in enumerate(ranks):
        nan, dtype = str(got["nan/raised"]), str(got["dtype/raised"])
        assert nan.startswith("FloatingPointError: lamb: ")
        assert ("gradient 0 has NaN" if r == 1 else "a gradient on another rank") in nan
        assert dtype.startswith("DistributedStepError: lamb: the step failed on 1 of 2 "
                                "rank(s): rank 1: TypeError: lamb: gradient 0 has dtype "
                                "float64"), dtype
        assert str(got["layout/raised"]).startswith(
            "ValueError: lamb: the ranks would step different parameters")
        assert got["nan/unchanged"] and got["dtype/unchanged"] and got["layout/unchanged"], \
            f"rank {r} changed parameters"
        assert str(got["good/raised"]) == "" and not got["good/unchanged"]
        assert "are DTensors on different device meshes (a cpu mesh of ranks [0, 1] and " \
            "a cpu mesh of ranks [1, 0])" in str(got["meshes/raised"])
        assert str(got["equal-meshes/raised"]) == "", got["equal-meshes/raised"]
        assert "keeps whole-matrix states and refreshes from statistics the trainer passes " \
            "(A, G), which are not summed across ranks" in str(got["thor/raised"])
        assert str(got["offload/raised"]) == \
            "ValueError: torch_adamw: offload with fsdp2 is refused: DTensor parameters with " \
            "offload are not built"
        assert str(got["flat/raised"]) == \
            "ValueError: torch_adamw: flat with fsdp2 is refused: DTensor parameters with " \
            "flat=True are not built"


# sampled: both ways to 1 rank, optgen's 2 -> 4 and DCP's 4 -> 2 (--exhaustive: the others)
@pytest.mark.parametrize("saved,loaded,how", [
    (2, 1, "dcp"), (2, 1, "optgen"), (2, 4, "optgen"), (4, 2, "dcp"),
    pytest.param(2, 4, "dcp", marks=EXHAUSTIVE), pytest.param(4, 2, "optgen", marks=EXHAUSTIVE)])
def test_checkpoint_reshards(how, saved, loaded, tmp_path):
    """Half the run under FSDP2 at one world size, saved, loaded at another world size,
    the other half: every rank's parameters equal the uninterrupted single-process run.
    ``dcp``: torch.distributed.checkpoint (get_state_dict: the states are DTensors,
    Adafactor's row statistics split like the rows and its column statistics whole),
    set_state_dict. ``optgen``: ``opt.save(folder)`` (a file per rank with the rows it
    holds) and ``opt.load(folder)``, which takes each rank's rows from those files."""
    _launch(f"{how}-save", saved, tmp_path)
    for r, got in enumerate(_launch(f"{how}-load", loaded, tmp_path)):
        for name in distributed_run.resharded_names(how):
            if name.endswith("-q8"):   # per-shard blocks, re-quantized where they moved
                _near_float32(got, name, distributed_run.train(name),
                              distributed_run.train("adam"),
                              f"{how}: saved at {saved}, loaded at {loaded}, rank {r}")
                continue
            for i, want in enumerate(distributed_run.train(name)):
                have = got[f"{name}/{i}"]
                np.testing.assert_allclose(
                    have, want, rtol=1e-5, atol=1e-6,
                    err_msg=f"{how}: {name} saved at {saved}, loaded at {loaded}, rank {r}, "
                            f"parameter {i}")


def test_q8_q4_states_on_shards_are_the_papers_quantizer_per_shard(tmp_path):
    """Adam with q8 and q4 states on a (1001, 5) parameter split on 4 ranks (251, 251,
    251 and 248 rows): formatted on every rank, as the whole parameter's 5005 elements
    ask (each shard has fewer than the 4096-element minimum), with blocks that start at
    each shard. Oracle: the paper's block-wise quantizer (tests/test_state_formats_oracle)
    around the published Adam, applied to each rank's rows alone, step by step: codes
    within one of it and more than 99.9 % equal, block scales and rows to float32
    rounding. state_dict (and so torch.distributed.checkpoint) refuses such states."""
    import test_state_formats_oracle as q
    from catalog_oracles import ORACLES
    from optgen.runtime import exchange, get_artifact
    world = 4
    ranks = _launch("fsdp-q", world, tmp_path)
    whole, grads = distributed_run.q_data()
    for fmt in ("q8", "q4"):
        block, packed = (256, False) if fmt == "q8" else (128, True)
        stored = get_artifact(distributed_run.ot.seeds.Adam.spec, "llvm",
                              state_format=fmt).stored
        sign = {s: stored[s].split(":")[1] in ("signed", "signed4") for s in stored}
        root = {s: stored[s] == "q8:usqrt" for s in stored}   # (sqrt(v) coded)
        agree = total = 0
        for r, got in enumerate(ranks):
            assert got["formatted"].tolist() == [True, False], f"rank {r}"
            assert "per-shard blocks" in str(got[f"{fmt}/state_dict"])
            a, b = exchange.rows_of(1001, world, r)
            w = whole[0].numpy()[a:b].copy()
            o = ORACLES["adam"](w.copy(), dtype=np.float32, lr=1e-2)
            for t in range(distributed_run.Q_STEPS):
                label = f"{fmt} rank {r} step {t}"
                if t:
                    o.w = got[f"{fmt}/{t - 1}/w"].copy()
                    o.s = {**o.s, **{s: q.dequantize(
                        got[f"{fmt}/{t - 1}/{s}"], got[f"{fmt}/{t - 1}/{s}__absmax"],
                        q.MAPS[fmt, sign[s]], block, w.size, packed, root[s]).reshape(w.shape)
                        for s in stored}}
                o.step(grads[t][0].numpy()[a:b])
                for s in stored:
                    scales = got[f"{fmt}/{t}/{s}__absmax"]
                    assert scales.shape == (-(-w.size // block),), f"{label}: {s} blocks"
                    codes, absmax = q.quantize(o.s[s], q.MAPS[fmt, sign[s]], block, packed,
                                               root[s])
                    n_agree, n = q._compare(got[f"{fmt}/{t}/{s}"], codes, packed,
                                            f"{label}: {s}")
                    agree, total = agree + n_agree, total + n
                    np.testing.assert_allclose(scales, absmax, rtol=2e-5, atol=1e-7,
                                               err_msg=f"{label}: {s}__absmax")
                np.testing.assert_allclose(got[f"{fmt}/{t}/w"], o.w, rtol=1e-4, atol=1e-6,
                                           err_msg=f"{label}: w")
        assert agree / total > 0.999, f"{fmt}: {1 - agree / total:.2e} of the codes differ"


def test_split8_master_on_shards_equals_the_single_process_run(tmp_path):
    """AdamW with a split8 master (bfloat16 weight + int8 correction) on a (1001, 5)
    bfloat16 parameter split on 2 ranks: each rank's rows of the weight and of its
    correction (a state shaped like the parameter, sharded like it) are the one-process
    run's rows, bit for bit (an elementwise rule)."""
    from optgen.runtime import exchange
    want = distributed_run.split_shards()
    for r, got in enumerate(_launch("fsdp-split", 2, tmp_path)):
        a, b = exchange.rows_of(1001, 2, r)
        for name in ("split8/w", "split8/corr"):
            assert np.array_equal(got[name], want[name][a:b]), f"rank {r}: {name}"

"""optgen's sharded checkpoints (``opt.save(folder)``/``opt.load(folder)`` on FSDP2
shards) when a rank fails, and what each rank reads (tests/distributed_ckpt_run.py,
gloo processes on this machine).

A save whose file write fails on one rank, or whose index.json cannot be written on
rank 0, raises the same ShardedCheckpointError on every rank, naming the failing rank
and its cause, well within the process group's timeout (30 s here: a rank left waiting
in a barrier would show as a timeout error or a hang, not as that error); the folder's
previous checkpoint stays whole; good saves run after it (and remove the temporary
files killed saves left). ``load`` opens only the files
holding rows the rank holds: its own file at the same world size, two of four files
when four ranks' shards are loaded on two; a folder of the earlier layout loads too.
"""
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the distributed tests need torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch has no torch.distributed with the gloo backend",
                allow_module_level=True)

from test_distributed import launch  # noqa: E402  (tests/ is on sys.path)



def _launch(mode: str, world: int, tmp_path) -> list[dict[str, np.ndarray]]:
    return launch("distributed_ckpt_run.py", mode, world, tmp_path)


def test_a_save_failing_on_one_rank_raises_on_every_rank_at_once(tmp_path):
    ranks = _launch("fail", 2, tmp_path)
    for case, rank, cause in (("write", 1, "No space left on device"),
                              ("index", 0, "IsADirectoryError")):
        said = {str(got[f"{case}/raised"]) for got in ranks}
        assert len(said) == 1, f"{case}: the ranks raised different errors: {said}"
        (said,) = said
        assert said.startswith("ShardedCheckpointError: adam: opt.save("), f"{case}: {said}"
        assert f"failed on 1 of 2 rank(s): rank {rank}: " in said and cause in said, said
        for r, got in enumerate(ranks):
            assert float(got[f"{case}/seconds"]) < 15, \
                f"{case}: rank {r} took {float(got[f'{case}/seconds']):.1f} s"
    for r, got in enumerate(ranks):
        assert str(got["previous/raised"]) == "", f"rank {r}: {got['previous/raised']}"
        assert bool(got["previous/equal"]), f"rank {r}: the previous checkpoint changed"
        assert str(got["good/raised"]) == "", f"rank {r}: {got['good/raised']}"
    assert not ranks[0]["good/left"], "a killed save's temporary file stayed"


@pytest.mark.parametrize("saved,loaded", [(2, 2), (4, 2)])
def test_load_opens_only_the_files_a_rank_needs(saved, loaded, tmp_path):
    _launch("save", saved, tmp_path)
    ranks = _launch("load", loaded, tmp_path)
    per = saved // loaded       # each loading rank's rows lie in these saved ranks' files
    for r, got in enumerate(ranks):
        opened = [str(n).split("-")[1].split(".")[0] for n in got["opened"]]
        assert sorted(map(int, opened)) == list(range(r * per, (r + 1) * per)), \
            f"saved at {saved}, loaded at {loaded}: rank {r} opened {got['opened']}"
    if saved != loaded:
        return
    # a folder of the earlier layout (rank-<r>.npz, an index of the world size only:
    # the rows are in the files) loads the same states
    folder = tmp_path / "ckpt" / "ckpt"
    for n in os.listdir(folder):
        if n.startswith("rank-"):
            os.rename(folder / n, folder / f"{n.split('-')[0]}-{n.split('-')[1]}.npz")
    (folder / "index.json").write_text(json.dumps({"world": saved, "format": 1}))
    for r, (now, then) in enumerate(zip(_launch("load", loaded, tmp_path), ranks)):
        assert sorted(now) == sorted(then), f"rank {r}"
        for k in then:
            if k.startswith("state/"):
                np.testing.assert_array_equal(now[k], then[k], err_msg=f"rank {r} {k}")



@pytest.mark.parametrize("name", ["adam", pytest.param("adam-q8", marks=pytest.mark.exhaustive)])
def test_fsdp2_save_loads_in_one_plain_process(name, tmp_path):
    """A folder that two FSDP2 ranks saved loads into one process without a process group
    (plain tensors, every row its own): its states are the rows of the ranks' files
    put together (q8: the values of the files' per-shard blocks, quantized again in this
    process's blocks: within a quantization step)."""
    import distributed_run
    from optgen.core import formats
    from optgen.runtime import checkpoint
    _launch(f"save:{name}", 2, tmp_path)
    folder = tmp_path / "ckpt" / "ckpt"
    files = [checkpoint.load(str(folder / n))
             for n in json.loads((folder / "index.json").read_text())["files"]]
    _, _, opt, _, _ = distributed_run.setup(name, "single")
    opt.load(str(folder))
    for i, (p, st) in enumerate(zip(opt._params, opt._core.state)):
        assert float(opt.state[p]["step"]) == 3
        for n, v in st.items():
            if n.endswith(formats.ABSMAX) or not isinstance(v, torch.Tensor):
                continue
            got, parts = v.numpy(), [f["state"][i][n] for f in files]
            if n + formats.ABSMAX in st:      # codes: compare the values they read
                fmt = formats.from_stored(opt._artifact.stored[n])
                got = fmt.dequantize((got, st[n + formats.ABSMAX].numpy()), tuple(p.shape))
                parts = [formats.from_stored(f["stored"][i][n]).dequantize(
                    (c, f["state"][i][n + formats.ABSMAX]), c.shape) for c, f in zip(parts, files)]
            want = np.concatenate(parts)
            assert got.shape == want.shape == tuple(p.shape), f"{i}.{n}"
            if n + formats.ABSMAX in st:
                np.testing.assert_allclose(got, want, rtol=0, atol=0.02 * np.abs(want).max(),
                                           err_msg=f"{i}.{n}")
            else:
                np.testing.assert_array_equal(got, want, err_msg=f"{i}.{n}")

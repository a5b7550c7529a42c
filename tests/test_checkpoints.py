"""Checkpoints: save -> load -> continue equals the uninterrupted run bit for bit, the file
is npz + json (no pickle), and a checkpoint of another layout is a clear error."""
import json
import os
import subprocess
import sys
import textwrap
import time

import zipfile

import numpy as np
import pytest

import optgen
from optgen import schedules
from optgen.runtime import checkpoint

SHAPES = [(12, 9), (31,), (3, 4, 5)]

CASES = {  # spec -> (params builder kwargs, optimizer kwargs)
    "adam": dict(lr=schedules.cosine(0.01, 20, warmup_steps=3), weight_decay=0.01,
                 clip_global_norm=2.0),
    "lamb": dict(lr=0.01, weight_decay=0.01, nonfinite="skip"),
    "adafactor": dict(),
    "sgd": dict(lr=0.05, momentum=0.9, nesterov=True),
    "rmsprop": dict(lr=0.01, centered=True, momentum=0.5),
    "ftrl": dict(lr=0.1, l1=0.01),
}


def _params(rng, dtype=np.float32):
    return {f"p{k}": np.asarray(rng.standard_normal(s), dtype) for k, s in enumerate(SHAPES)}


def _groups(params):
    names = list(params)
    return [{"params": {n: params[n] for n in names[:2]}},
            {"params": {names[2]: params[names[2]]}, "lr": 0.003}]


def _grads(rng, steps, dtype=np.float32):
    return [[np.asarray(rng.standard_normal(s), dtype) for s in SHAPES] for _ in range(steps)]


@pytest.mark.parametrize("spec", CASES)
@pytest.mark.parametrize("via", ["file", "state_dict"])
def test_resume_is_bitwise_identical(spec, via, tmp_path, rng):
    init = _params(rng)
    grads = _grads(rng, 10)
    grads[6][1][3] = np.nan   # a skipped step after the resume (lamb: nonfinite="skip")
    if spec != "lamb":
        grads[6][1][3] = 0.5
    kw = CASES[spec]
    full = {n: a.copy() for n, a in init.items()}
    a = optgen.create(spec, _groups(full), **kw)
    for g in grads:
        a.step(g)
    half = {n: v.copy() for n, v in init.items()}
    b = optgen.create(spec, _groups(half), **kw)
    for g in grads[:5]:
        b.step(g)
    resumed = {n: v.copy() for n, v in half.items()}   # the trainer saves its weights itself
    c = optgen.create(spec, _groups(resumed), **kw)
    if via == "file":
        path = tmp_path / "opt.ckpt"
        b.save(path)
        c.load(path)
    else:
        c.load_state_dict(b.state_dict())
    assert c.t == b.t == 5
    for g in grads[5:]:
        c.step(g)
    assert c.t == a.t and c.skipped_steps == a.skipped_steps
    for n in init:
        assert full[n].tobytes() == resumed[n].tobytes(), n
    for sa, sc in zip(a.state, c.state):
        for k in sa:
            assert np.asarray(sa[k]).tobytes() == np.asarray(sc[k]).tobytes(), k


def test_file_is_npz_and_json_without_pickle(tmp_path, rng):
    params = _params(rng)
    opt = optgen.create("adafactor", _groups(params))
    opt.step(_grads(rng, 1)[0])
    path = tmp_path / "x.npz"
    opt.save(path)
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(z["meta.json"].tobytes())
        arrays = {k: z[k] for k in z.files if k != "meta.json"}
    assert meta["optimizer"] == "adafactor" and meta["t"] == 1 and meta["format"] == 1
    assert meta["spec_hash"] == checkpoint.spec_hash(opt.artifact)
    assert [g["params"] for g in meta["groups"]] == [[0, 1], [2]]
    assert meta["groups"][1]["hyper"]["lr"] == 0.003
    assert all(a.dtype != object for a in arrays.values())
    assert os.listdir(tmp_path) == ["x.npz"]   # no temporary file left behind


def _mismatches(rng):
    """(what, build the other optimizer, message)."""
    def other_shapes():
        p = _params(rng)
        p["p1"] = np.zeros(30, np.float32)
        return optgen.create("adam", _groups(p))

    def other_dtype():
        return optgen.create("adam", _groups(_params(rng, np.float64)))

    def other_spec():
        return optgen.create("adamw", _groups(_params(rng)))

    def other_layout():
        return optgen.create("adam", _params(rng))

    def other_flags_state():
        return optgen.create("adam", _groups(_params(rng)), use_nesterov=True)

    return [
        ("shape", other_shapes, r"adam: state_dict parameter 1 is float32\[31\], this "
                                r"optimizer's parameter 1 is float32\[30\]"),
        ("dtype", other_dtype, r"state_dict parameter 0 is float32\[12, 9\], this optimizer's "
                               r"parameter 0 is float64\[12, 9\]"),
        ("spec", other_spec, r"adamw: state_dict is for optimizer 'adam'"),
        ("layout", other_layout, r"adam: state_dict has the group layout \[\[0, 1\], \[2\]\], "
                                 r"this optimizer has \[\[0, 1, 2\]\]"),
    ]


@pytest.mark.parametrize("case", ["shape", "dtype", "spec", "layout"])
def test_load_mismatch_is_clear_and_changes_nothing(case, tmp_path, rng):
    src = optgen.create("adam", _groups(_params(rng)))
    src.step(_grads(rng, 1)[0])
    path = tmp_path / "a.ckpt"
    src.save(path)
    _, make, pattern = next(m for m in _mismatches(rng) if m[0] == case)
    other = make()
    other.step([np.ones(p.shape, p.dtype) for p in other.params])
    snap = [np.array(p, copy=True) for p in other.params], \
        [{k: np.array(v, copy=True) for k, v in st.items()} for st in other.state]
    with pytest.raises(ValueError, match=pattern):
        other.load(path)
    for p, q in zip(other.params, snap[0]):
        assert p.tobytes() == q.tobytes()
    for st, sq in zip(other.state, snap[1]):
        for k in st:
            assert np.asarray(st[k]).tobytes() == sq[k].tobytes()
    assert other.t == 1


def test_spec_edit_and_corrupt_files(tmp_path, rng):
    opt = optgen.create("adam", _groups(_params(rng)))
    sd = opt.state_dict()
    sd["spec_hash"] = "0" * 16
    with pytest.raises(ValueError, match=r"state_dict comes from another version of the spec adam"):
        opt.load_state_dict(sd)
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"not an optgen checkpoint"):
        opt.load(bad)
    opt.save(tmp_path / "ok.ckpt")
    data = (tmp_path / "ok.ckpt").read_bytes()
    (tmp_path / "cut.ckpt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"not an optgen checkpoint"):
        opt.load(tmp_path / "cut.ckpt")
    np.savez(tmp_path / "plain.npz", x=np.zeros(3))
    with pytest.raises(ValueError, match=r"no meta\.json"):
        opt.load(tmp_path / "plain.npz")
    with pytest.raises(TypeError, match=r"state_dict must be a dict"):
        opt.load_state_dict([1, 2])


def test_schedule_groups_keep_their_schedule(rng):
    sched = schedules.factor(0.1, 2, 0.5)
    a = optgen.create("sgd", [{"params": [np.zeros(3)], "lr": sched}])
    for _ in range(3):
        a.step([np.ones(3)])
    sd = a.state_dict()
    assert sd["groups"][0]["lr_schedule"] is True
    b = optgen.create("sgd", [{"params": [np.zeros(3)], "lr": sched}])
    b.load_state_dict(sd)
    assert b.learning_rate == sched(3) == a.learning_rate
    c = optgen.create("sgd", [{"params": [np.zeros(3)], "lr": 0.7}])
    c.load_state_dict(sd)   # no constant was recorded: c keeps its own
    assert c.param_groups[0]["lr"] == 0.7
    d = optgen.create("sgd", [{"params": [np.zeros(3)], "lr": 0.2}])
    d.step([np.ones(3)])
    c.load_state_dict(d.state_dict())   # a recorded constant is restored
    assert c.param_groups[0]["lr"] == 0.2 and c.t == 1


def _stepped(rng):
    opt = optgen.create("adam", _groups(_params(rng)))
    opt.step(_grads(rng, 1)[0])
    return opt


def test_a_failure_mid_save_keeps_the_previous_checkpoint(tmp_path, rng, monkeypatch):
    opt = _stepped(rng)
    path = tmp_path / "run.ckpt"
    opt.save(path)
    good = path.read_bytes()
    opt.step(_grads(rng, 1)[0])

    def dies_halfway(f, **arrays):      # writes part of a zip, then the disk "fills up"
        f.write(b"PK\x03\x04" + b"\0" * 100)
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(np, "savez", dies_halfway)
    with pytest.raises(OSError, match="No space left"):
        opt.save(path)
    assert path.read_bytes() == good and os.listdir(tmp_path) == ["run.ckpt"]


def test_a_killed_save_keeps_the_previous_checkpoint(tmp_path):
    """SIGKILL while a large checkpoint is being written: the file at the path is still
    the previous, complete checkpoint (at most a stray temporary file remains)."""
    script = textwrap.dedent(f"""
        import os, sys, numpy as np, optgen
        w = [np.zeros(4_000_000, np.float32) for _ in range(4)]
        opt = optgen.create("adam", w)
        opt.step([np.ones_like(x) for x in w])
        opt.save({str(tmp_path / "run.ckpt")!r})
        print("saved", flush=True)
        opt.step([np.ones_like(x) for x in w])
        while True:                                    # save until killed
            opt.save({str(tmp_path / "run.ckpt")!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "saved"
        for _ in range(200):                           # kill it while a temp file exists
            if any(".tmp-" in n for n in os.listdir(tmp_path)):
                break
            time.sleep(0.01)
        proc.kill()
    finally:
        proc.wait(timeout=60)
    w = [np.zeros(4_000_000, np.float32) for _ in range(4)]
    opt = optgen.create("adam", w)
    opt.load(tmp_path / "run.ckpt")                    # complete: loads and validates
    assert opt.t in (1, 2)


def test_truncated_anywhere_is_a_clear_error(tmp_path, rng):
    opt = _stepped(rng)
    opt.save(tmp_path / "ok.ckpt")
    data = (tmp_path / "ok.ckpt").read_bytes()
    other = _stepped(rng)
    before = [p.tobytes() for p in other.params]
    for cut in sorted({1, 30, 100, *range(0, len(data), max(1, len(data) // 12))} - {0}):
        (tmp_path / "cut.ckpt").write_bytes(data[:cut])
        with pytest.raises(ValueError, match=r"not an optgen checkpoint|missing|unreadable"):
            other.load(tmp_path / "cut.ckpt")
    flipped = bytearray(data)
    first = zipfile.ZipFile(tmp_path / "ok.ckpt").infolist()[0]   # (a fixed offset can land
    at = first.header_offset + 30 + len(first.filename) + len(first.extra)  # in a header field
    flipped[at + first.compress_size - 5] ^= 0xFF   # nothing checks): inside an array's bytes,
                                                    # the zip CRC catches it
    (tmp_path / "flip.ckpt").write_bytes(bytes(flipped))
    with pytest.raises(ValueError):
        other.load(tmp_path / "flip.ckpt")
    assert [p.tobytes() for p in other.params] == before and other.t == 1


def test_loading_never_unpickles(tmp_path, rng):
    """A checkpoint carrying a pickled object array (which would run code when
    unpickled) is refused; the code never runs."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))
    opt = _stepped(rng)
    opt.save(tmp_path / "ok.ckpt")
    with np.load(tmp_path / "ok.ckpt", allow_pickle=False) as z:
        files = {k: z[k] for k in z.files}
    files["state.0.m"] = np.array([Evil()], dtype=object)
    with open(tmp_path / "evil.ckpt", "wb") as f:
        np.savez(f, **files)
    with pytest.raises(ValueError, match=r"not an optgen checkpoint"):
        opt.load(tmp_path / "evil.ckpt")
    assert not marker.exists()
    meta = json.loads(files["meta.json"].tobytes())
    meta["t"] = "1; import os"          # wrong types in the JSON are validated too
    files["state.0.m"] = np.zeros(1)
    files["meta.json"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    with open(tmp_path / "badmeta.ckpt", "wb") as f:
        np.savez(f, **files)
    with pytest.raises((TypeError, ValueError), match=r"adam: "):
        opt.load(tmp_path / "badmeta.ckpt")

"""Artifacts fail loudly and heal: a corrupted, truncated, mismatched or foreign artifact
is detected at load, or its variant's library at first use (ArtifactError naming the
file, the problem and the rebuild command), a cached one is reported (ArtifactWarning)
and rebuilt, concurrent builders publish one complete artifact and variant, and loading
a built artifact runs no spec code."""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import optgen
from optgen.compiler import pipeline
from optgen.runtime import Artifact, ArtifactError, ArtifactWarning
from optgen.core import cache

# a one-line rule: the smallest build (about 1.3 s on two cores once TVM is imported)
TINY = '''"""Plain gradient descent: w = w - lr * grad."""
from optgen.dsl import Spec

spec = Spec("tiny", __doc__)
lr = spec.hyper("lr", 0.01, "lr >= 0", "learning rate")


@spec.update
def tiny(w, grad, flags):
    return {w: w - lr * grad}
'''


def _replace(path, data: bytes):
    """Rewrite a file through a new inode: a library some process has mapped is never
    modified in place (that could crash it)."""
    tmp = str(path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _edit_manifest(change):
    def edit(folder, name="manifest.json"):
        mpath = os.path.join(folder, name)
        with open(mpath, encoding="utf-8") as f:
            m = json.load(f)
        change(m)
        _replace(mpath, json.dumps(m).encode())
    return edit


def _edit_record(change):
    """Edit the record of the artifact's float32 variant (its library's manifest)."""
    return lambda folder: _edit_manifest(change)(os.path.join(folder, "f32"), "variant.json")


def _edit_library(change):
    def edit(folder):
        path = os.path.join(folder, "f32", "kernels.so")
        with open(path, "rb") as f:
            data = bytearray(f.read())
        _replace(path, bytes(change(data)))
    return edit


def _flip(data):
    data[len(data) // 2] ^= 0x40
    return data


def _remove(name):
    return lambda folder: os.remove(os.path.join(folder, name))


def _del_kernel_symbol(m):
    del m["kernels"][0]["symbol"]


# case -> (how to break the artifact, what the ArtifactError says); the library and its
# record are the float32 variant's (f32/: VARIANT), checked when it is first used
BROKEN = {
    "truncated-library": (_edit_library(lambda d: d[:len(d) // 2]),
                          r"kernels\.so: \d+ bytes, the manifest records \d+ \(truncated"),
    "flipped-byte": (_edit_library(_flip),
                     r"kernels\.so: sha256 [0-9a-f]{16}\.\.\., the manifest records "
                     r"[0-9a-f]{16}\.\.\. \(corrupted"),
    "manifest-hash": (_edit_record(lambda m: m["files"]["kernels.so"].update(sha256="0" * 64)),
                      r"kernels\.so: sha256 .*, the manifest records 0000000000000000"),
    "optgen-version": (_edit_manifest(lambda m: m.update(optgen_version="0.0.1")),
                       r"manifest\.json: built by optgen 0\.0\.1, this is optgen "
                       + re.escape(optgen.__version__)),
    "tvm-version": (_edit_manifest(lambda m: m.update(tvm_version="0.9.0")),
                    r"manifest\.json: built with TVM 0\.9\.0, this is TVM 0\.27"),
    "old-format": (_edit_manifest(lambda m: m.update(format=4)),
                   rf"manifest\.json: manifest format 4, this optgen reads format {cache.FORMAT}"),
    "missing-library": (_remove("f32/kernels.so"), r"kernels\.so: missing"),
    "missing-spec-copy": (_remove("spec.py"), r"spec\.py: missing"),
    "missing-manifest": (_remove("manifest.json"), r"manifest\.json: missing \(not a complete"),
    "invalid-json": (lambda f: _replace(os.path.join(f, "manifest.json"), b'{"format": 5,'),
                     r"manifest\.json: unreadable manifest \("),
    "manifest-not-object": (lambda f: _replace(os.path.join(f, "manifest.json"), b"[]"),
                            r"manifest\.json: the manifest is a JSON list, not an object"),
    "missing-key": (_edit_manifest(lambda m: m.pop("kernels")),
                    r"manifest\.json: the manifest lacks 'kernels'"),
    "missing-files": (_edit_manifest(lambda m: m.pop("files")),
                      r"manifest\.json: the manifest lacks 'files'"),
    "missing-nested-key": (_edit_manifest(_del_kernel_symbol),
                           r"manifest\.json: malformed manifest \(KeyError: 'symbol'\)"),
    "library-outside": (_edit_record(lambda m: m.update(library="../kernels.so")),
                        r"variant\.json: the manifest records no size and sha256 for "
                        r"'\.\./kernels\.so'"),
    "missing-record": (_remove("f32/variant.json"),
                       r"f32/variant\.json: missing \(not a complete variant\)"),
    "record-of-another-build": (_edit_record(lambda m: m.update(key="e" * 64)),
                                r"variant\.json: it records 'f32' for 'llvm' with the key "
                                r"eeeeeeeeeeeeeeee\.\.\., not 'f32' .*\(from another build\)"),
}
VARIANT = {"truncated-library", "flipped-byte", "manifest-hash", "missing-library",
           "library-outside", "missing-record", "record-of-another-build"}
# the cases the rebuild test runs (each rebuilds, ~1.3 s): one per kind of damage
REBUILT = ["truncated-library", "flipped-byte", "manifest-hash", "optgen-version",
           "tvm-version", "missing-library", "missing-manifest", "invalid-json", "missing-key",
           "missing-record"]


@pytest.fixture(scope="module")
def tiny_spec(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec") / "tiny.py"
    path.write_text(TINY)
    return str(path)


@pytest.fixture(scope="module")
def prebuilt(tiny_spec, tmp_path_factory):
    """tiny built once: an ``--out`` artifact, and a cache holding it (copied per test)."""
    out = tmp_path_factory.mktemp("out")
    cache_root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPTGEN_CACHE_DIR", str(cache_root))
        cached = pipeline.build(tiny_spec).path
    shutil.copytree(cached, out / os.path.basename(cached)[:-17])  # tiny-llvm, as --out names it
    return {"out": str(out / "tiny-llvm"), "cache": str(cache_root),
            "cached": os.path.basename(cached)}


@pytest.fixture
def fresh_cache(prebuilt, tmp_path, monkeypatch):
    """A private cache holding a verified copy of the tiny artifact; returns its path."""
    root = tmp_path / "cache"
    shutil.copytree(prebuilt["cache"], root)
    monkeypatch.setenv("OPTGEN_CACHE_DIR", str(root))
    return str(root / prebuilt["cached"])


def _use(art):
    """The first use of the artifact's float32 variant: its library is verified (and,
    where the artifact has a builder, built or rebuilt) here."""
    return art.variant("f32")


def _step_checks(art):
    w = np.ones(5, np.float32)
    optgen.create(art, [w], lr=0.5).step([np.ones(5, np.float32)])
    np.testing.assert_array_equal(w, np.full(5, 0.5, np.float32))


def _no_leftovers(folder):
    left = [n for n in os.listdir(folder) if n.startswith((".build-", ".old-"))
            or n.endswith(".lock")]
    assert left == []


def test_manifest_records_what_the_runtime_reads(prebuilt):
    with open(os.path.join(prebuilt["out"], "manifest.json"), encoding="utf-8") as f:
        m = json.load(f)
    assert sorted(m["files"]) == ["spec.py"]
    assert m["files"]["spec.py"] == cache.file_record(os.path.join(prebuilt["out"], "spec.py"))
    assert m["format"] == cache.FORMAT and m["tvm_version"] == cache.tvm_version()
    assert m["optgen_version"] == optgen.__version__ and m["base"] is None
    assert m["default_variants"] == ["f32"] and {"f32", "f64", "bf16"} <= set(m["variants"])
    with open(os.path.join(prebuilt["out"], "f32", "variant.json"), encoding="utf-8") as f:
        r = json.load(f)
    assert sorted(r["files"]) == ["kernels.so"] and (r["key"], r["variant"]) == (m["key"], "f32")
    lib = os.path.join(prebuilt["out"], "f32", "kernels.so")
    assert r["files"]["kernels.so"] == cache.file_record(lib)
    assert r["files"]["kernels.so"]["size"] == os.path.getsize(lib)


@pytest.mark.parametrize("case", BROKEN)
def test_broken_prebuilt_artifact_is_a_clear_error(case, prebuilt, tmp_path):
    folder = tmp_path / "tiny-llvm"
    shutil.copytree(prebuilt["out"], folder)
    assert _use(optgen.load(folder)).name == "f32"
    breaks, pattern = BROKEN[case]
    breaks(str(folder))
    with pytest.raises(ArtifactError, match=pattern) as err:
        _use(optgen.load(folder))
    fix = f"optgen build tiny.py --target llvm --out {tmp_path}" + (
        " --variant f32" if case in VARIANT else "")
    assert fix in str(err.value)           # the command that rebuilds it: no rebuild here
    assert ("holds no copy of the spec" if case == "missing-spec-copy"
            else f"{folder}/spec.py is a copy of tiny.py") in str(err.value)
    assert not any(n.startswith(".build-") for n in os.listdir(tmp_path))


def test_rebuild_hints(tmp_path, monkeypatch):
    from optgen.runtime.artifact import rebuild_hint
    monkeypatch.setenv("OPTGEN_CACHE_DIR", str(tmp_path / "cache"))
    assert rebuild_hint("/x/sgd-llvm").endswith("`optgen build sgd --target llvm --out /x`")
    assert "`optgen build lars --target c --base adam --out /x`" in rebuild_hint("/x/lars+adam-c")
    cached = str(tmp_path / "cache" / "adam-llvm-0123456789abcdef")
    assert "`optgen build adam --target llvm` (optgen.get_artifact" in rebuild_hint(cached)
    with pytest.raises(ArtifactError, match=r"/nowhere/sgd-llvm: no such artifact directory"):
        optgen.load("/nowhere/sgd-llvm")


@pytest.mark.parametrize("case", BROKEN)
def test_broken_cached_artifact_without_build_is_an_error(case, tiny_spec, fresh_cache):
    BROKEN[case][0](fresh_cache)
    with pytest.raises(ArtifactError, match=BROKEN[case][1]) as err:
        _use(optgen.get_artifact(tiny_spec, build=False))
    assert ("--variant f32` (optgen.get_artifact rebuilds it" if case in VARIANT
            else "or pass build=True") in str(err.value)


@pytest.mark.parametrize("case", REBUILT)
def test_broken_cached_artifact_is_reported_and_rebuilt(case, tiny_spec, fresh_cache):
    breaks, pattern = BROKEN[case]
    breaks(fresh_cache)
    builds = pipeline.BUILD_COUNT
    with pytest.warns(ArtifactWarning, match="rebuilding the broken artifact .*" + pattern) as rec:
        art = optgen.get_artifact(tiny_spec)
        _use(art)                            # (a broken variant: found and rebuilt here)
    assert len(rec) == 1 and rec[0].filename == __file__   # reported once, at the caller
    assert "optgen build" not in str(rec[0].message)        # it is being rebuilt
    # a variant: its library rebuilt; the artifact: it, then its variant on first use
    assert pipeline.BUILD_COUNT == builds + (1 if case in VARIANT else 2)
    assert art.path == fresh_cache
    Artifact.load(fresh_cache)             # verifies
    _step_checks(art)
    _no_leftovers(os.path.dirname(fresh_cache))


def test_wrong_key_in_the_cache_is_rebuilt(tiny_spec, fresh_cache):
    _edit_manifest(lambda m: m.update(key="f" * 64))(fresh_cache)
    with pytest.raises(ArtifactError, match=r"its manifest's key ffffffffffffffff\.\.\. is "
                                            r"not the spec's key"):
        optgen.get_artifact(tiny_spec, build=False)
    with pytest.warns(ArtifactWarning, match=r"key ffffffffffffffff\.\.\. is not"):
        art = optgen.get_artifact(tiny_spec)
    assert art.key != "f" * 64


def test_leftovers_of_killed_builds_are_removed(tiny_spec, fresh_cache):
    """A killed build leaves its temporary folder and its lock file: the next build of
    that artifact removes both, and any other artifact's temporary folder whose lock
    it can take (no build of it runs), however recent; the folder of a live build (its
    lock held by another process) stays, however old."""
    root, name = os.path.split(fresh_cache)
    own = os.path.join(root, f".build-{name}.ab_cd123")
    dead = os.path.join(root, ".build-other-llvm-0123456789abcdef.zzzzzzzz")
    live = os.path.join(root, ".old-busy-llvm-0123456789abcdef.yyyyyyyy")
    for d in (own, dead, live):
        os.makedirs(os.path.join(d, "x"))
    hours_ago = time.time() - 7200
    os.utime(live, (hours_ago, hours_ago))
    # a build of "busy" that runs: it holds busy's lock
    holder = _hold_lock(os.path.join(root, "busy-llvm-0123456789abcdef.lock"))
    try:
        open(fresh_cache + ".lock", "w").close()
        assert optgen.build(tiny_spec).cache_hit            # a cache hit: nothing swept
        assert os.path.isdir(own) and not os.path.exists(fresh_cache + ".lock")
        open(fresh_cache + ".lock", "w").close()
        r = optgen.build(tiny_spec, force=True)
        assert os.path.isdir(live), "a live build's folder was removed"
        assert not r.cache_hit and not os.path.exists(own) and not os.path.exists(dead)
    finally:
        holder.communicate("", timeout=60)
    assert not os.path.exists(os.path.join(root, "busy-llvm-0123456789abcdef.lock"))
    optgen.build(tiny_spec, force=True)                  # now nobody builds "busy"
    _no_leftovers(root)
    # a killed build of a variant leaves its folder inside the artifact: the next build
    # of a variant of that artifact removes it
    inner = os.path.join(fresh_cache, ".build-f64.ab_cd123")
    os.makedirs(os.path.join(inner, "x"))
    assert optgen.build(tiny_spec, variants=["f64"]).built == ["f64"]
    assert not os.path.exists(inner)
    _no_leftovers(fresh_cache)
    _step_checks(Artifact.load(r.path))


def _hold_lock(path):
    """A process holding build lock ``path`` (a running build) until its stdin closes."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from optgen.compiler import pipeline\n"
         "with pipeline._locked(sys.argv[1]):\n print('locked', flush=True); sys.stdin.read()",
         path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_cache_clean_keeps_what_a_running_build_writes(fresh_cache):
    """``optgen cache clean`` removes the artifacts and killed builds' folders, and
    keeps the temporary folder of a build that runs (its lock held elsewhere)."""
    from optgen import commands
    root = os.path.dirname(fresh_cache)
    live = os.path.join(root, ".build-busy-llvm-0123456789abcdef.yyyyyyyy")
    dead = os.path.join(root, ".build-other-llvm-0123456789abcdef.zzzzzzzz")
    for d in (live, dead):
        os.makedirs(os.path.join(d, "x"))
    holder = _hold_lock(os.path.join(root, "busy-llvm-0123456789abcdef.lock"))
    try:
        count, freed, busy = commands.clean_cache()
        assert (count, busy) == (2, 1) and freed > 0
        assert os.path.isdir(live) and not os.path.exists(dead)
        assert not os.path.exists(fresh_cache)
    finally:
        holder.communicate("", timeout=60)
    assert commands.clean_cache()[:2] == (1, 0) and os.listdir(root) == []


def test_readers_never_see_a_partial_artifact(tiny_spec, fresh_cache):
    """While a builder rebuilds and replaces the artifact (--force) and builds its variant,
    loads without the lock always verify: the folder is swapped whole, never half
    written, and its variant is absent or complete. (The builder is a thread to save
    starting TVM again: readers see the same file system either way.)"""
    failed = []

    loads, errors, folders, variants = 0, [], {}, 0

    def rebuild_twice():
        try:
            for generation in (1, 2):
                # each rebuild starts once the readers have loaded the folder it replaces
                # (a starved reader thread would otherwise miss a whole generation)
                deadline = time.monotonic() + 120
                while len(folders) < generation and time.monotonic() < deadline:
                    time.sleep(0.001)
                optgen.build(tiny_spec, force=True)
        except BaseException as e:  # noqa: BLE001 — reported by the test below
            failed.append(e)
    builder = threading.Thread(target=rebuild_twice)
    builder.start()
    while builder.is_alive():
        try:
            _pin(fresh_cache, folders)
            art = Artifact.load(fresh_cache)
            loads += 1
            try:
                _use(art)
                variants += 1
            except optgen.VariantNotBuilt:       # (not built yet in the new folder)
                pass
        except (ArtifactError, FileNotFoundError) as e:
            errors.append(str(e))
        time.sleep(0.0005)                   # leave the builder a core
    assert failed == []
    assert errors == [] and loads > 0 and variants > 0   # RENAME_EXCHANGE: never absent
    _pin(fresh_cache, folders)
    for fd in folders.values():
        os.close(fd)
    assert len(folders) == 3                  # the two swaps happened
    _no_leftovers(os.path.dirname(fresh_cache))


def _pin(path: str, seen: dict) -> None:
    """Note the folder at ``path`` by its inode, kept open so that a removed folder's
    inode is not reused by a later one."""
    fd = os.open(path, os.O_RDONLY)
    ino = os.fstat(fd).st_ino
    if ino in seen:
        os.close(fd)
    else:
        seen[ino] = fd


@pytest.mark.parametrize("exchange", [True, False])
def test_publish_replaces_a_folder_whole(exchange, tmp_path, monkeypatch):
    """Publishing over an existing artifact: swapped in one rename (Linux), else the old
    one renamed aside first; either way no temporary folder stays behind."""
    if not exchange:
        monkeypatch.setattr(pipeline, "_exchange", lambda a, b: False)
    dest, tmp = tmp_path / "tiny-llvm", tmp_path / ".build-tiny-llvm.abcdefgh"
    for folder, text in ((dest, "old"), (tmp, "new")):
        folder.mkdir()
        (folder / "manifest.json").write_text(text)
    pipeline._publish(str(tmp), str(dest))
    assert (dest / "manifest.json").read_text() == "new"
    assert os.listdir(tmp_path) == ["tiny-llvm"]


CONCURRENT = textwrap.dedent("""
    import json, os, sys, time
    import optgen
    from optgen.compiler import pipeline     # (imports no TVM: the builder does, later)
    spec, go = sys.argv[1], sys.argv[2]
    open(go + "." + sys.argv[3], "w").close()
    give_up = time.time() + 600              # (the test failed before it said go)
    while not os.path.exists(go):
        if time.time() > give_up:
            sys.exit(3)
        time.sleep(0.001)
    art = optgen.get_artifact(spec)
    art.variant("f32")                       # its library: built on first use
    print(json.dumps({"path": art.path, "builds": pipeline.BUILD_COUNT}))
""")


def test_four_processes_build_the_same_spec_at_once(tiny_spec, tmp_path):
    root = tmp_path / "cache"
    env = {**os.environ, "OPTGEN_CACHE_DIR": str(root)}
    go = str(tmp_path / "go")
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, tiny_spec, go, str(i)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(4)]
    deadline = time.time() + 300
    try:
        while not all(os.path.exists(f"{go}.{i}") for i in range(4)):
            assert time.time() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.01)
        open(go, "w").close()                # all four start together
        results = []
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:                      # none is left waiting when the test fails
            if p.poll() is None:
                p.kill()
    assert len({r["path"] for r in results}) == 1
    # the artifact and its variant were each built once, three processes waited
    assert sum(r["builds"] for r in results) == 2
    art = Artifact.load(results[0]["path"])
    _step_checks(art)
    assert os.path.dirname(art.path) == str(root)
    _no_leftovers(root)
    assert os.listdir(root) == [os.path.basename(art.path)]


MARKED = TINY.replace('from optgen.dsl import Spec\n', 'import os\n\nfrom optgen.dsl import Spec\n'
                      'with open(os.environ["OPTGEN_TEST_MARKER"], "a") as f:\n'
                      '    f.write("the spec ran\\n")\n')

LOAD_AND_STEP = textwrap.dedent("""
    import sys
    import numpy as np
    import optgen
    art = optgen.load(sys.argv[1])
    w = np.ones(5, np.float32)
    optgen.create(art, [w], lr=0.5).step([np.ones(5, np.float32)])
    assert w[0] == 0.5, w
    print(sorted(m for m in sys.modules if m.startswith(("optgen.compiler", "optgen.dsl",
                                                         "optgen_spec", "tvm."))
                 or m == "tvm"))
""")


def test_loading_a_built_artifact_runs_no_spec_code(tmp_path, monkeypatch):
    spec = tmp_path / "marked.py"
    spec.write_text(MARKED)
    marker = tmp_path / "marker"
    monkeypatch.setenv("OPTGEN_TEST_MARKER", str(marker))
    monkeypatch.setenv("OPTGEN_CACHE_DIR", str(tmp_path / "cache"))
    r = optgen.build(str(spec), out=str(tmp_path / "out"))
    assert marker.read_text() == "the spec ran\n"           # building runs the spec
    marker.unlink()
    spec.unlink()                                            # not needed to load
    p = subprocess.run([sys.executable, "-c", LOAD_AND_STEP, r.path], capture_output=True,
                       text=True, timeout=120, env={**os.environ}, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"          # no compiler, no DSL, no spec module, no tvm
    assert not marker.exists()               # the artifact's spec.py was hashed, not run


def test_cli_reports_a_rebuild_in_one_line(tiny_spec, fresh_cache, capsys):
    """`optgen build` over a broken cached artifact: a one-line notice, exit 0, and the
    published folder is readable as the umask allows (not mkdtemp's 0700)."""
    from optgen import cli
    _edit_library(_flip)(fresh_cache)
    assert cli.main(["build", tiny_spec]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("built: tiny for llvm")
    assert re.fullmatch(r"optgen: rebuilding the broken artifact .*kernels\.so.*\n", err)
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(fresh_cache).st_mode & 0o777 == 0o777 & ~umask
    assert os.stat(os.path.join(fresh_cache, "f32")).st_mode & 0o777 == 0o777 & ~umask


def test_a_lock_file_removed_between_two_looks_is_retried(tmp_path, monkeypatch):
    """The holder before us unlinks its lock file on release, at any moment: a waiter that
    finds it gone after taking the flock retries on a new file instead of failing. (Found
    on a 14-process test run on an H200: os.path.exists saw the file, os.stat did not.)"""
    path = str(tmp_path / "a.lock")
    real_stat, real_exists, calls = os.stat, os.path.exists, []

    def stat(p, *a, **kw):
        if p == path and not calls:
            calls.append(p)
            os.unlink(p)                  # the previous holder releases right here
        return real_stat(p, *a, **kw)
    monkeypatch.setattr(pipeline.os.path, "exists", lambda p: p == path or real_exists(p))
    monkeypatch.setattr(pipeline.os, "stat", stat)
    with pipeline._locked(path):
        assert real_exists(path)
    assert calls == [path] and not real_exists(path)

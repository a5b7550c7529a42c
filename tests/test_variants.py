"""Each variant of an artifact (a parameter dtype and flag values) is a library of its
own, built the first time a step needs it: ``optgen build`` makes the default one (or
every one: --all-variants), a step with a flag set on by set_hyper or load_state_dict, or
with a parameter of another dtype, builds that one, and what cannot be built here (a
prebuilt artifact loaded with optgen.load) is a VariantNotBuilt error naming the variant
and the command that builds it, with nothing changed. Two processes that want the same
variant at once build it once (tests/test_artifact_integrity.py: four processes)."""
import json
import os
import shutil

import numpy as np
import pytest

import optgen
from optgen.compiler import pipeline

# the smallest rule with a flag: four variants (float32, float64, and float16/bfloat16
# with a float32 master) times the flag's two values
TWICE = '''"""Gradient descent, optionally with twice the step."""
from optgen.dsl import Spec

spec = Spec("twice", __doc__)
lr = spec.hyper("lr", 0.1, "lr >= 0", "learning rate")
spec.flag("double", False, "step twice as far")


@spec.update
def twice(w, grad, flags):
    return {w: w - (2.0 if flags.double else 1.0) * lr * grad}
'''
VARIANTS = ["f32", "f64", "f16", "bf16", "f32-double", "f64-double", "f16-double",
            "bf16-double"]


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("spec") / "twice.py"
    path.write_text(TWICE)
    return str(path)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> str:
    root = str(tmp_path / "cache")
    monkeypatch.setenv("OPTGEN_CACHE_DIR", root)
    return root


def _built(art) -> list[str]:
    return sorted(v for v in art.variants if os.path.isdir(os.path.join(art.path, v)))


def _twins(art, w, **hyper):
    """The compiled optimizer and the reference interpreter on copies of ``w``."""
    return [optgen.create(art, [w.copy()], backend=b, **hyper)
            for b in ("compiled", "reference")]


def _step(opts, g) -> None:
    for opt in opts:
        opt.step([g.copy()])
    np.testing.assert_array_equal(opts[0].params[0], opts[1].params[0])


def test_a_step_builds_the_variant_its_settings_need(spec, cache):
    art = optgen.get_artifact(spec)
    assert list(art.variants) == VARIANTS and art.default_variants == ["f32"]
    assert _built(art) == []                 # the manifest lists every kernel, no library
    assert {k.variant for k in art.kernels} == set(VARIANTS)
    w, g = np.linspace(-1, 1, 33, dtype=np.float32), np.full(33, 0.5, np.float32)
    opts = _twins(art, w)
    builds = pipeline.BUILD_COUNT
    _step(opts, g)
    assert _built(art) == ["f32"] and pipeline.BUILD_COUNT == builds + 1
    for opt in opts:                          # a flag flipped: that variant, on first use
        opt.set_hyper(double=True)
    _step(opts, g)
    assert _built(art) == ["f32", "f32-double"] and pipeline.BUILD_COUNT == builds + 2
    np.testing.assert_allclose(opts[0].params[0], w - 0.1 * g - 0.2 * g, rtol=1e-6)
    for opt in opts:                          # back: built already, nothing more
        opt.set_hyper(double=False)
    _step(opts, g)
    assert pipeline.BUILD_COUNT == builds + 2
    # a checkpoint with the flag on builds nothing more: that variant is there now
    fresh = _twins(art, opts[0].params[0])
    fresh[0].load_state_dict({**opts[0].state_dict(), "hyper": {"lr": 0.1, "double": True}})
    fresh[1].load_state_dict({**opts[1].state_dict(), "hyper": {"lr": 0.1, "double": True}})
    _step(fresh, g)
    assert pipeline.BUILD_COUNT == builds + 2
    w64 = w.astype(np.float64)                # a parameter of another dtype
    _step(_twins(art, w64), g.astype(np.float64))
    assert _built(art) == ["f32", "f32-double", "f64"]


def test_a_prebuilt_artifact_lacking_a_variant_is_a_typed_error(spec, cache, tmp_path):
    """optgen.load builds nothing (it runs no spec code): a step that needs a variant it
    lacks raises VariantNotBuilt, naming it and the command that builds it, before
    anything changes; a read-only copy behaves the same."""
    r = optgen.build(spec, out=str(tmp_path / "out"))
    assert r.built == ["f32"] and r.have == ["f32"] and len(r.variants) == 8
    folder = tmp_path / "ro" / "twice-llvm"
    shutil.copytree(r.path, folder)
    for p in [folder, *folder.rglob("*")]:
        p.chmod(p.stat().st_mode & ~0o222)
    try:
        art = optgen.load(folder)
        w, g = np.ones(8, np.float32), np.ones(8, np.float32)
        opt = optgen.create(art, [w], lr=0.5)
        opt.step([g])
        assert w[0] == 0.5
        opt.set_hyper(double=True)
        before = opt.state_dict()
        with pytest.raises(optgen.VariantNotBuilt) as err:
            opt.step([g])
        e = err.value
        assert isinstance(e, optgen.ArtifactError) and e.variant == "f32-double"
        assert "the variant f32-double (float32 parameters, double=True) of twice for " \
               "llvm is not built" in str(e)
        assert e.command == (f"optgen build twice.py --target llvm --out {folder.parent} "
                             "--variant f32-double")
        assert f"`{e.command}`" in str(e) and "--all-variants`" in str(e)
        assert w[0] == 0.5 and opt.state_dict()["t"] == before["t"] == 1   # untouched
        with pytest.raises(optgen.VariantNotBuilt, match=r"variant f64 \(float64"):
            optgen.create(art, [np.ones(3)]).step([np.ones(3)])
    finally:
        for p in [folder, *folder.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)
    # get_artifact(build=False) builds nothing either
    optgen.get_artifact(spec)                 # (the artifact, in the cache: no variant)
    cached = optgen.get_artifact(spec, build=False)
    with pytest.raises(optgen.VariantNotBuilt, match=r"`optgen build .*twice\.py --target "
                       r"llvm --variant f32`"):
        cached.variant("f32")


def test_cli_builds_the_default_variant_or_every_one(spec, cache, capsys):
    from optgen import cli
    assert cli.main(["build", spec]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1] == ("  variants: f32; 7 more build on first use "
                                   "(--all-variants: now)")
    assert cli.main(["build", spec, "--variant", "bf16-double,f64"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == \
        "  variants: f32, f64, bf16-double; 5 more build on first use (--all-variants: now)"
    assert cli.main(["build", spec, "--all-variants"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("built: twice for llvm") and \
        out.splitlines()[1] == f"  variants: {', '.join(VARIANTS)}"
    art = optgen.get_artifact(spec, build=False)
    assert _built(art) == sorted(VARIANTS)
    for v in VARIANTS:                        # each verified, its own library
        with open(os.path.join(art.path, v, "variant.json"), encoding="utf-8") as f:
            record = json.load(f)
        assert record["variant"] == v and record["key"] == art.key
        assert art.variant(v).manifest["files"]["kernels.so"]["size"] > 0
    assert cli.main(["build", spec, "--all-variants"]) == 0
    assert capsys.readouterr().out.startswith("cache hit: twice for llvm")
    assert cli.main(["build", spec, "--variant", "f128"]) == 2
    assert "twice for llvm has no variant 'f128'; its variants: f32, f64" in \
        capsys.readouterr().err

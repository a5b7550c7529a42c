"""`optgen show`, `check`, `bench`, `cache`, `list`, `build` and the help, run as a user
runs them (subprocesses with their own cache), error paths included."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from optgen import cli, commands

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cli-cache"))


def run(*args, cache_dir):
    env = {**os.environ, "OPTGEN_CACHE_DIR": cache_dir}
    return subprocess.run([sys.executable, "-m", "optgen.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def one_error_line(r, pattern):
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert pattern in lines[0], lines[0]


def test_help_lists_the_commands(cache_dir):
    r = run("--help", cache_dir=cache_dir)
    assert r.returncode == 0
    for command in ("build", "list", "targets", "show", "check", "bench", "cache"):
        assert command in r.stdout
    assert "optgen check specs/adam.py" in r.stdout


@pytest.mark.parametrize("command", list(cli._parser()._subparsers._group_actions[0].choices))
def test_every_command_has_help_with_its_own_examples(command, cache_dir):
    r = run(command, "--help", cache_dir=cache_dir)
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.startswith(f"usage: optgen {command}")
    examples = r.stdout.split("examples:\n", 1)[1].splitlines()
    commands_shown = [ln.split()[1] for ln in examples if ln.startswith("  optgen ")]
    assert commands_shown and set(commands_shown) == {command}


def test_check_passes_and_prints_every_combination(cache_dir):
    r = run("check", "sgd", cache_dir=cache_dir)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    # 2 dtypes x 2 nesterov values x default/busy; nesterov needs a momentum: the default
    # setting (momentum 0) skips it, the busy one (momentum 0.5) runs it
    assert len(lines) == 8
    ran = [ln for ln in lines if ln.endswith(": ok")]
    assert len(ran) == 6 and all("max error" in ln for ln in ran)
    assert "sgd float32 busy nesterov=True: max error" in r.stdout
    assert "sgd float64 default nesterov=True: skipped (sgd: invalid hyperparameters" in r.stdout


def test_check_reports_a_mismatch_with_exit_1(monkeypatch, capsys):
    """A kernel that disagrees with the reference is an optgen bug: exit 1, said so."""
    def disagreeing(art, seed=0):
        return [commands.CheckResult("float32", "default", {}, 0.5, 0.5)]
    monkeypatch.setattr(commands, "check_each", disagreeing)   # (what the CLI prints)
    assert cli.main(["check", "sgd"]) == 1
    out, err = capsys.readouterr()
    assert "max error 5.00e-01 in the parameters" in out
    assert "FAILED (tolerance 1e-05 exceeded in the parameters)" in out
    assert err.startswith("optgen: check failed: 1 kernel(s) differ from the reference")


@pytest.mark.parametrize("args,code,pattern", [
    (("check", "no_such_optimizer"), 2, "unknown optimizer 'no_such_optimizer'"),
    (("check", "lars", "--base", "nope"), 2, "unknown optimizer 'nope'"),
    (("show", "sgd", "--stage", "assembly"), 2, "unknown stage 'assembly'; stages: spec, ir"),
    (("show", "sgd", "--kernel", "sgd_f128"), 2, "sgd has no kernel 'sgd_f128'; kernels: sgd_f32"),
    (("show", "sgd", "--target", "quantum"), 2, "unknown target 'quantum'"),
    (("cache", "wipe"), 2, "invalid choice: 'wipe'"),
])
def test_error_paths_are_one_line(args, code, pattern, cache_dir):
    r = run(*args, cache_dir=cache_dir)
    assert r.returncode == code
    assert pattern in r.stderr and "Traceback" not in r.stderr


def test_show_spec_error_exits_2(tmp_path, cache_dir):
    bad = tmp_path / "bad.py"
    bad.write_text("from optgen.dsl import Spec\nspec = Spec('bad')\nx = undefined\n")
    r = run("show", str(bad), cache_dir=cache_dir)
    assert r.returncode == 2
    one_error_line(r, f"optgen: spec error: {bad}:3: undefined name")


def test_show_every_stage(tmp_path):
    # its own cache: `check` builds the variants it compares together, in one library
    cache_dir = str(tmp_path)
    spec = run("show", "sgd", "--stage", "spec", cache_dir=cache_dir)
    assert spec.returncode == 0 and spec.stdout.startswith('"""SGD')
    with open(os.path.join(ROOT, "specs", "sgd.py"), encoding="utf-8") as f:
        assert spec.stdout.strip() == f.read().strip()
    ir = run("show", "sgd", "--stage", "ir", "--kernel", "sgd_f32", cache_dir=cache_dir)
    assert ir.returncode == 0
    node = json.loads(ir.stdout)
    assert node["symbol"] == "sgd_f32" and node["ir"]["nodes"]
    script = run("show", "sgd", "--kernel", "sgd_f64_nesterov", cache_dir=cache_dir)
    assert script.returncode == 0 and "def sgd_f64_nesterov(" in script.stdout
    assert "def sgd_f32(" not in script.stdout and "T.parallel" in script.stdout
    source = run("show", "sgd", "--stage", "source", cache_dir=cache_dir)
    assert source.returncode == 0 and source.stdout.startswith("; ModuleID")
    c = run("show", "sgd", "--stage", "source", "--target", "c", cache_dir=cache_dir)
    assert c.returncode == 0 and "sgd_f32" in c.stdout and "#include" in c.stdout
    one = run("show", "sgd", "--stage", "source", "--kernel", "sgd_f32", cache_dir=cache_dir)
    assert one.returncode == 0
    defined = re.findall(r"^define .*?@([\w.]+)\(", one.stdout, flags=re.M)
    assert defined == ["__tvm_ffi_sgd_f32", "__tvm_ffi_sgd_f32_lazy", "sgd_f32_compute_",
                       "sgd_f32_lazy_compute_"]
    assert one.stdout.rstrip().endswith("}") and len(one.stdout) < len(source.stdout)
    assert "sgd_f64" not in source.stdout      # the default variant's (float32) source
    c1 = run("show", "sgd", "--stage", "source", "--target", "c", "--kernel",
             "sgd_f64_nesterov", cache_dir=cache_dir)
    assert c1.returncode == 0 and "__tvm_ffi_sgd_f64_nesterov(" in c1.stdout
    assert "sgd_f32" not in c1.stdout and "#include" not in c1.stdout


def test_cache_lists_and_cleans(tmp_path):
    cache = str(tmp_path / "cache")
    empty = run("cache", cache_dir=cache)
    assert empty.returncode == 0
    assert empty.stdout.strip() == f"cache: {cache}: 0 artifact(s), 0 B"
    assert run("build", "sgd", cache_dir=cache).returncode == 0
    listed = run("cache", "list", cache_dir=cache)
    assert listed.returncode == 0
    head, entry = listed.stdout.strip().splitlines()
    assert head.startswith(f"cache: {cache}: 1 artifact(s), ") and head.endswith(("KiB", "MiB"))
    assert entry.strip().startswith("sgd-llvm-") and "sgd for llvm" in entry
    cleaned = run("cache", "clean", cache_dir=cache)
    assert cleaned.returncode == 0
    assert cleaned.stdout.startswith("removed 1 artifact(s), ") and cache in cleaned.stdout
    assert [n for n in os.listdir(cache) if not n.endswith(".lock")] == []
    assert run("cache", cache_dir=cache).stdout.startswith(f"cache: {cache}: 0 artifact(s)")


def test_build_several_targets_with_a_summary(tmp_path):
    cache = str(tmp_path / "cache")
    r = run("build", "sgd", "--target", "llvm,c", cache_dir=cache)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("built: sgd for llvm in ")
    assert lines[1] == lines[3] == "  variants: f32; 7 more build on first use (--all-variants: now)"
    assert lines[2].startswith("built: sgd for c in ") and lines[4].startswith("  files: f32/")
    assert lines[5].startswith("summary: 2 artifacts (1 spec(s) x 2 target(s)): 2 built, "
                               "0 cache hit(s), ")
    again = run("build", "sgd", "--target", "c,llvm", cache_dir=cache)
    assert again.returncode == 0 and "0 built, 2 cache hit(s)" in again.stdout
    listed = run("list", cache_dir=cache)
    assert listed.returncode == 0
    assert listed.stdout.strip().splitlines()[-1] == f"built in the cache ({cache}): sgd for c, llvm"
    assert "adam: " in listed.stdout and "beta1 (float, default 0.9; 0 <= beta1 < 1)" in listed.stdout


@pytest.mark.parametrize("args,pattern", [
    (("build", "sgd", "--target", "llvm,quantum"), "unknown target 'quantum'; targets: llvm"),
    (("build", "sgd", "--target", ","), "--target names no target"),
    (("build", "sgd", "--target", "llvm,c", "--arch", "sm_90"), "--arch applies to the cuda target only"),
])
def test_build_target_errors_before_building_anything(args, pattern, tmp_path):
    cache = str(tmp_path / "cache")
    r = run(*args, cache_dir=cache)
    assert r.returncode == 2 and r.stdout == ""
    one_error_line(r, pattern)
    assert not os.path.exists(cache) or os.listdir(cache) == []


# -- bench ------------------------------------------------------------------------------
def test_bench_prints_the_step_and_the_anchors(tmp_path, cache_dir):
    out = tmp_path / "bench.json"
    r = run("bench", "sgd", "--n", "100003", "--tensors", "3", "--reps", "4",
            "--set", "momentum=0.9", "--json", str(out), cache_dir=cache_dir)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("sgd float32: 100,003 parameters in 3 tensor(s), ")
    rows = {ln.split()[0]: ln for ln in lines[1:5]}
    assert set(rows) == {"sgd", "copy", "triad", "axpy"}
    # momentum: read w, g, buf; write w, buf: 20 bytes per float32 parameter
    assert "(20 B/parameter)" in rows["sgd"] and "(12 B/element)" in rows["triad"]
    assert lines[5].startswith("limit: ") and lines[-1] == f"wrote {out}"
    data = json.loads(out.read_text())
    assert data["sizes"] == [33335, 33334, 33334] and data["hyper"] == {"momentum": "0.9"}
    assert data["timings"]["sgd step"]["bytes"] == 20 * 100003
    assert data["timings"]["copy"]["bytes"] == 8 * 100003
    assert all(len(t["seconds"]) == 4 and min(t["seconds"]) > 0
               for t in data["timings"].values())
    assert 0 < data["fraction_of_limit"]


@pytest.mark.parametrize("args,pattern", [
    (("bench", "sgd", "--set", "momentum"), "--set 'momentum': expected NAME=VALUE"),
    (("bench", "sgd", "--set", "nope=1"), "--set: sgd: unknown hyperparameter 'nope'"),
    (("bench", "sgd", "--set", "momentum=-1"), "--set: sgd: invalid momentum=-1"),
    (("bench", "sgd", "--dtype", "float16"), "bench: dtype 'float16' is not one of float32, float64"),
    (("bench", "sgd", "--n", "0"), "bench: need n >= tensors >= 1"),
    (("bench", "sgd", "--n", "5", "--tensors", "6"), "bench: need n >= tensors >= 1"),
    (("bench", "no_such_optimizer"), "unknown optimizer 'no_such_optimizer'"),
])
def test_bench_errors_are_one_line_exit_2(args, pattern, cache_dir):
    r = run(*args, cache_dir=cache_dir)
    assert r.returncode == 2 and r.stdout == ""
    one_error_line(r, pattern)


def test_bandwidth_anchors_compute_what_they_are_named_for():
    """The anchors are what `optgen bench` measures the step by: a kernel that skipped
    its work would make every step look slow. Lengths with and without a vector tail."""
    from optgen.compiler import anchors
    rng = np.random.default_rng(0)
    for dtype in anchors.DTYPES:
        fns = anchors.functions(dtype)
        for n in (1, 37, 4096, 100003):   # bench needs n >= 1
            b, c = (rng.standard_normal(n).astype(dtype) for _ in range(2))
            s = np.array([0.25], dtype=dtype)
            a = np.full(n, 7.0, dtype=dtype)
            fns["copy"](a, b, s)
            np.testing.assert_array_equal(a, b)
            fns["triad"](a, b, c, s)
            np.testing.assert_allclose(a, b + s[0] * c, rtol=1e-6)
            before = a.copy()
            fns["axpy"](a, c, s)
            np.testing.assert_allclose(a, before + s[0] * c, rtol=1e-6)


def test_check_warns_when_the_reference_itself_gives_nan(tmp_path, cache_dir):
    """Kernel and reference agree (both NaN), but a spec that makes NaN out of random
    data is probably wrong: `check` passes and says so on every line."""
    spec = tmp_path / "nanny.py"
    spec.write_text("from optgen.dsl import Spec, sqrt\n"
                    "spec = Spec('nanny')\n"
                    "lr = spec.hyper('lr', 0.1, 'lr >= 0')\n"
                    "@spec.update\n"
                    "def nanny(w, grad, flags):\n"
                    "    return {w: sqrt(-1.0 - w * w) - lr * grad}\n")
    r = run("check", str(spec), cache_dir=cache_dir)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 4 and all(": ok (warning: the reference interpreter itself gives "
                                   in ln and "NaN/inf values" in ln for ln in lines)


@pytest.mark.parametrize("args,pattern", [
    ((), "the following arguments are required: command"),
    (("list", "extra"), "unrecognized arguments: extra"),
    (("targets", "--nope"), "unrecognized arguments: --nope"),
    (("frobnicate",), "invalid choice: 'frobnicate'"),
    (("build",), "the following arguments are required: specs"),
    (("build", "sgd", "--master-format", "split4"),
     "argument --master-format: invalid choice: 'split4' (choose from 'fp32', 'split16', "
     "'split8')"),
])
def test_usage_errors_exit_2_with_usage(args, pattern, cache_dir):
    r = run(*args, cache_dir=cache_dir)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.startswith("usage: optgen") and pattern in r.stderr


def test_build_master_format_is_what_get_artifact_finds(tmp_path, monkeypatch):
    """`optgen build sgd --master-format split16` builds the artifact that
    get_artifact(..., master_format="split16", build=False) then loads (a cache hit);
    the plain artifact is another one, not built."""
    import optgen
    cache = str(tmp_path / "cache")
    r = run("build", "sgd", "--master-format", "split16", cache_dir=cache)
    assert r.returncode == 0 and r.stdout.startswith("built: sgd"), r.stderr
    monkeypatch.setenv("OPTGEN_CACHE_DIR", cache)
    art = optgen.get_artifact("sgd", master_format="split16", build=False)
    assert "split16" in os.path.basename(art.path)
    with pytest.raises(optgen.ArtifactError, match="sgd.py is not built for llvm"):
        optgen.get_artifact("sgd", build=False)
    with pytest.raises(optgen.ArtifactError, match="--master-format split8"):
        optgen.get_artifact("sgd", master_format="split8", build=False)

"""Progress lines of `optgen build` and `optgen check` (optgen/core/progress.py): nothing
for a command that finishes within OPTGEN_PROGRESS_AFTER seconds, then one line per
stage (or task) change on stderr, printed while a long stage runs; `check` builds each
variant when its first line needs it and prints every line as it is done."""
import io
import re
import sys
import time

import pytest

from optgen import cli
from optgen.compiler import tvm_backend
from optgen.core import progress

@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One cache for the build and the check below: check finds sgd's f32 variant built."""
    return str(tmp_path_factory.mktemp("progress-cache"))


LINE = re.compile(r"optgen: \[\d+\.\d s\] (.*)")


def shown(text: str) -> list[str]:
    """The progress lines of ``text``, without their times."""
    return [m.group(1) for m in map(LINE.fullmatch, text.splitlines()) if m]


def test_a_line_per_change_once_due_and_none_before():
    out = io.StringIO()
    p = progress.Progress(after=60, stream=out)
    p.task("adam for llvm")
    for name in ("trace", "lower", "compile"):
        p.stage(name)
    assert out.getvalue() == ""                # not due: a fast command prints nothing
    p._wake()                                  # (what the timer does after 60 s)
    p.stage("compile", "variant f32")
    p.stage("compile", "variant f32")          # the same stage again: no new line
    p.task("check adam, variant f32 (1 of 2)")
    p.stage("compile", "variant f32")          # (the task names the variant already)
    p.stage("verify")
    p.close()
    assert shown(out.getvalue()) == [
        "adam for llvm: compile", "adam for llvm: compile (variant f32)",
        "check adam, variant f32 (1 of 2): compile", "check adam, variant f32 (1 of 2): verify"]


@pytest.mark.parametrize("text", ["soon", "-1", "nan"])
def test_a_bad_threshold_is_a_usage_error(monkeypatch, capsys, text, tmp_path):
    monkeypatch.setenv("OPTGEN_PROGRESS_AFTER", text)
    monkeypatch.setenv("OPTGEN_CACHE_DIR", str(tmp_path))
    assert cli.main(["build", "sgd"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"optgen: error: OPTGEN_PROGRESS_AFTER={text!r}: expected a number "
                          "of seconds >= 0") and len(err.splitlines()) == 1
    assert not list(tmp_path.iterdir())        # (refused before anything was built)


def test_a_slow_build_says_what_it_does_and_a_fast_one_nothing(monkeypatch, capsys, cache):
    monkeypatch.setenv("OPTGEN_CACHE_DIR", cache)
    monkeypatch.setenv("OPTGEN_PROGRESS_AFTER", "0.3")
    during = []
    build_library = tvm_backend.build_library

    def slow(*args, **kw):                     # TVM's build made slow, deterministically
        time.sleep(0.6)
        during.append(capsys.readouterr().err)  # printed while the stage still runs
        return build_library(*args, **kw)
    monkeypatch.setattr(tvm_backend, "build_library", slow)
    assert cli.main(["build", "sgd"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("built: sgd for llvm")
    lines = shown(during[0] + err)
    assert "sgd for llvm: compile (variant f32)" in shown(during[0])
    assert lines[-2:] == ["sgd for llvm: compile (variant f32)", "sgd for llvm: link (variant f32)"]
    assert len(lines) == len(set(lines)) and set(lines) <= {
        f"sgd for llvm: {s}" for s in ("trace", "lower")} | set(lines[-2:])

    monkeypatch.delenv("OPTGEN_PROGRESS_AFTER")   # the default threshold, 2 s
    assert cli.main(["build", "sgd"]) == 0        # (current: a cache hit, milliseconds)
    out, err = capsys.readouterr()
    assert out.startswith("cache hit: sgd for llvm") and err == ""


def test_check_prints_each_line_as_it_is_done_building_variants_when_needed(
        monkeypatch, capsys, cache):
    monkeypatch.setenv("OPTGEN_CACHE_DIR", cache)
    monkeypatch.setenv("OPTGEN_PROGRESS_AFTER", "0")
    monkeypatch.setattr(sys, "stderr", sys.stdout)   # one stream: the order is observable
    assert cli.main(["check", "sgd"]) == 0
    lines = capsys.readouterr().out.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("sgd float32 default"))
    last_build = next(i for i, ln in enumerate(lines)
                      if ln.endswith("check sgd, variant f64-nesterov (4 of 4): compile"))
    assert first < last_build
    results = [ln for ln in lines if ln.startswith("sgd ")]
    assert len(results) == 8 and lines[-1] == results[-1]
    steps = shown("\n".join(lines))
    assert len(steps) == len(set(steps))              # a line per change, never repeated
    assert [s for s in steps if s.endswith(": verify")] == [
        f"check sgd, variant {v} ({k} of 4): verify"
        for k, v in enumerate(["f32", "f32-nesterov", "f64", "f64-nesterov"], 1)]

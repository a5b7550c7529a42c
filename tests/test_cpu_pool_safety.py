"""The OpenMP trampoline (runtime/backends/omp_pool.py, omp_build.py) is safe to load:
what it compiles with, what it loads, what it does when a build fails, and forked
children. Each case runs in a new process with its own cache folder (no TVM kernel
is built: ``set_cpu_pool("openmp")`` is what builds and loads the trampoline), except
the fork test, which steps an optimizer."""
import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")   # the trampoline is only built where libgomp is loaded
if not sys.platform.startswith("linux"):
    pytest.skip("the OpenMP trampoline is Linux-only", allow_module_level=True)

REAL_CC = next(filter(None, map(shutil.which, ("cc", "gcc", "clang"))), None)
needs_cc = pytest.mark.skipif(REAL_CC is None, reason="no C compiler (cc, gcc or clang) "
                              "on PATH: the OpenMP trampoline cannot be built here")

PROBE = """
import json, warnings, torch, optgen
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got = optgen.set_cpu_pool("openmp")
    again = optgen.set_cpu_pool("openmp")
    info = optgen.cpu_pool()
print(json.dumps({"got": got, "again": again, "why": info["why"],
                  "warnings": [str(w.message) for w in caught if "optgen" in str(w.message)]}))
"""


def _env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CC", "OPTGEN_CC", "OPTGEN_CPU_POOL")}
    env["OPTGEN_CACHE_DIR"] = str(tmp_path / "cache")
    env.update(extra)
    return env


def _probe(env: dict, marker=None) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                         text=True, timeout=120)
    assert marker is None or not marker.exists(), f"{marker.name}: {out.stderr[-2000:]}"
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _libraries(tmp_path) -> list[str]:
    return sorted(glob.glob(str(tmp_path / "cache" / "pools" / "*.so")))


def _script(path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


@needs_cc
def test_tampered_cached_library_is_never_loaded(tmp_path):
    env = _env(tmp_path)
    assert _probe(env)["got"] == "openmp"
    (cached,) = _libraries(tmp_path)
    # same owner, same name, other bytes: a library whose constructor leaves a mark
    marker = tmp_path / "hostile-code-ran"
    src = tmp_path / "hostile.c"
    src.write_text('#include <stdio.h>\n__attribute__((constructor)) static void run(void) '
                   f'{{ FILE* f = fopen("{marker}", "w"); if (f) fclose(f); }}\n'
                   'int optgen_launch(void) { return 0; }\n')
    subprocess.run([REAL_CC, "-shared", "-fPIC", str(src), "-o", cached], check=True)
    hostile = open(cached, "rb").read()
    second = _probe(env, marker)              # (the mark: the tampered library was loaded)
    assert second["got"] == "openmp"                         # rebuilt, then loaded
    assert any("does not match the sha256" in w for w in second["warnings"]), second
    assert open(cached, "rb").read() != hostile


@needs_cc
def test_folder_writable_by_others_is_not_loaded_from(tmp_path):
    env = _env(tmp_path)
    assert _probe(env)["got"] == "openmp"
    folder = tmp_path / "cache" / "pools"
    folder.chmod(0o777)
    try:
        got = _probe(env)
    finally:
        folder.chmod(0o700)
    assert got["got"] == "tvm" and "writable by others" in got["why"], got
    assert len(got["warnings"]) == 1 and "writable by others" in got["warnings"][0]


@needs_cc
@pytest.mark.parametrize("failure", ["exit1", "garbage"])
def test_failed_build_falls_back_warns_once_and_is_retried(tmp_path, failure):
    """A compiler that exits 1, or exits 0 with a file that is no library: TVM's pool,
    one warning naming the reason, nothing cached; the next process builds again (the
    same compiler identity, now working) and runs on OpenMP."""
    shims = tmp_path / "bin"
    shims.mkdir()
    _script(shims / "cc", f"""\
        if [ "$1" = "--version" ]; then echo "shim cc 1.0"; exit 0; fi
        case "$SHIM_MODE" in
          exit1) echo "shim: refusing to compile" >&2; exit 1;;
          garbage) out=""; prev=""
                   for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
                   echo "not a shared library" > "$out"; exit 0;;
        esac
        exec {REAL_CC} "$@"
        """)
    path = f"{shims}:{os.environ.get('PATH', '')}"
    failed = _probe(_env(tmp_path, PATH=path, SHIM_MODE=failure))
    assert failed["got"] == failed["again"] == "tvm"
    reason = "exited with status 1" if failure == "exit1" else "is unusable"
    assert reason in failed["why"] and str(shims / "cc") in failed["why"], failed
    assert len(failed["warnings"]) == 1 and reason in failed["warnings"][0], failed
    assert _libraries(tmp_path) == []                        # nothing cached
    retried = _probe(_env(tmp_path, PATH=path, SHIM_MODE=""))
    assert retried["got"] == "openmp" and retried["warnings"] == [], retried
    assert len(_libraries(tmp_path)) == 1


@needs_cc
def test_cc_from_the_environment_is_not_run_optgen_cc_is(tmp_path):
    marker = tmp_path / "cc-ran"
    hostile = _script(tmp_path / "hostile-cc", f'touch "{marker}"\nexec {REAL_CC} "$@"\n')
    got = _probe(_env(tmp_path, CC=hostile), marker)        # (the mark: $CC was run)
    assert got["got"] == "openmp"
    assert len(_libraries(tmp_path)) == 1
    chosen = _probe(_env(tmp_path, OPTGEN_CC=hostile))      # the documented choice
    assert chosen["got"] == "openmp" and marker.exists()
    assert len(_libraries(tmp_path)) == 2                    # its own key: its identity
    missing = _probe(_env(tmp_path, OPTGEN_CC=str(tmp_path / "no-such-cc")))
    assert missing["got"] == "tvm" and "OPTGEN_CC=" in missing["why"], missing


FORKED = """
import os, sys, time, numpy as np, torch, optgen
from optgen.runtime.backends import omp_pool
assert optgen.set_cpu_pool("openmp") == "openmp", optgen.cpu_pool()
p = np.zeros(200_003, np.float32)
opt = optgen.create("adam", [p])
for _ in range(2):
    opt.step([np.ones_like(p)])
    torch.ones(512, 512) @ torch.ones(512, 512)       # torch's OpenMP team, too
assert omp_pool.omp_launches() > 0
for call in ("optgen.cpu_pool()", "optgen.set_cpu_pool('openmp')",
             "optgen.set_num_threads(1)"):
    pid = os.fork()
    if pid == 0:                   # a query or a setting, then a step: TVM's pool
        n = omp_pool.omp_launches()
        eval(call)
        info = optgen.cpu_pool()
        opt.step([np.ones_like(p)])
        ok = (info["pool"] == "tvm" and "forked" in info["why"]
              and omp_pool.omp_launches() == n and abs(p[0] + 3e-3) < 1e-5)
        os._exit(0 if ok else 3)
    deadline = time.time() + 30
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            print(call, os.waitstatus_to_exitcode(status))
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print(call, "hung")
"""


def test_forked_child_queries_then_steps_without_hanging():
    env = {k: v for k, v in os.environ.items() if k != "OPTGEN_CPU_POOL"}
    out = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True,
                         env=env, timeout=240)
    if "no OpenMP pool" in out.stderr or "trampoline is unavailable" in out.stderr:
        pytest.skip(f"no OpenMP pool here: {out.stderr[-300:]}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:3] == ["optgen.cpu_pool() 0",
                                          "optgen.set_cpu_pool('openmp') 0",
                                          "optgen.set_num_threads(1) 0"], out.stdout

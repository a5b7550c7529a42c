"""The guides stay true: docs/writing-a-spec.md shows examples/specs/adan.py verbatim
(under 20 lines of code); examples/new_optimizer.py passes against its paper oracle and
fails when the oracle is perturbed; Adan builds for CUDA with the expected PTX entries;
the snippets of docs/getting-started.md and of the tutorial run and print what the docs
show. Also: a build without a C/C++ compiler says so (optgen/compiler/tvm_backend.py)."""
import ast
import contextlib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import optgen

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ADAN = os.path.join(ROOT, "examples", "specs", "adan.py")
SCRIPT = os.path.join(ROOT, "examples", "new_optimizer.py")
TUTORIAL = os.path.join(ROOT, "docs", "writing-a-spec.md")
GETTING_STARTED = os.path.join(ROOT, "docs", "getting-started.md")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _section(path: str, heading: str) -> str:
    """The text of the markdown section that starts with ``heading``."""
    text = _read(path)
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + len(heading) + 2)
    return text[start:] if end < 0 else text[start:end]


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, re.S | re.M)


def _run_snippet(code: str) -> str:
    """Execute a doc snippet as a fresh module; what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<doc snippet>", "exec"), {"__name__": "__doc_snippet__"})
    return out.getvalue()


def _script(*args: str) -> subprocess.CompletedProcess:
    """examples/new_optimizer.py as a command; the artifact cache (OPTGEN_CACHE_DIR, set
    by conftest) is inherited, so the build is shared with the in-process tests."""
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def _load_script():
    spec = importlib.util.spec_from_file_location("example_new_optimizer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- (a) the tutorial shows the spec file, and the spec is short -----------------------
def test_tutorial_shows_the_spec_file_verbatim():
    shown = [b for b in _blocks(_read(TUTORIAL), "python") if b.startswith('"""Adan:')]
    assert len(shown) == 1, "docs/writing-a-spec.md must show examples/specs/adan.py once"
    assert shown[0] == _read(ADAN), "docs/writing-a-spec.md and examples/specs/adan.py differ"


def test_adan_spec_is_under_20_lines_of_code():
    """Lines of code below the module docstring, blank lines and comment lines not counted."""
    source = _read(ADAN)
    docstring_end = ast.parse(source).body[0].end_lineno
    code = [ln for ln in source.splitlines()[docstring_end:]
            if ln.strip() and not ln.strip().startswith("#")]
    assert len(code) < 20, f"{len(code)} lines of code"
    assert f"in {len(code)} lines" in _read(TUTORIAL).splitlines()[0]


# -- (b) the paper oracle: it passes, it can fail, and it is the paper's formula ---------
def test_new_optimizer_quick_matches_the_paper():
    proc = _script("--quick")
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith(("float32", "float64"))]
    assert len(rows) == 4 and all(ln.endswith(": ok") for ln in rows), proc.stdout
    assert "kernels match the paper's Algorithm 1" in proc.stdout


def test_new_optimizer_fails_when_the_oracle_is_perturbed(monkeypatch, capsys):
    """The script's main, in process (the subprocess above covers the command)."""
    demo = _load_script()
    monkeypatch.setattr(sys, "argv", [SCRIPT, "--quick", "--perturb", "beta2=0.921"])
    assert demo.main() == 1
    out = capsys.readouterr().out
    assert out.count("MISMATCH") == 4 and "4 mismatch(es)" in out, out


@pytest.mark.parametrize("perturb", [{"weight_decay": 0.051}, {"eps": 1e-5},
                                     {"beta3": 0.996}, {"lr": 0.0201}])
def test_comparison_catches_a_small_change_of_any_hyperparameter(perturb):
    """In float64, every hyperparameter matters at the tolerance (the "busy" setting)."""
    demo = _load_script()
    art = optgen.get_artifact(ADAN)
    busy = demo.SETTINGS["busy"]
    errors = demo.compare(art, "float64", [(17,), (5, 3)], busy, perturb, seed=1)
    assert max(errors.values()) > 1e3 * demo.TOLERANCE["float64"], errors
    errors = demo.compare(art, "float64", [(17,), (5, 3)], busy, {}, seed=1)
    assert max(errors.values()) <= demo.TOLERANCE["float64"], errors


def test_paper_oracle_first_two_steps_by_hand():
    """The oracle's first step is Algorithm 1 with g_0 = g_1 and bias correction, worked
    out by hand: m = b1 g, v = 0, n = b3 g^2, so the step is eta * g / (|g| + eps)."""
    demo = _load_script()
    eta, b1, b2, b3, eps, lam = 0.1, 0.02, 0.08, 0.01, 1e-8, 0.5
    g1, g2 = np.array([2.0, -0.5]), np.array([1.0, 0.25])
    theta0 = np.array([1.0, -3.0])
    oracle = demo.PaperAdan(theta0, eta, b1, b2, b3, eps, lam)
    oracle.step(g1)
    np.testing.assert_allclose(oracle.theta,
                               (theta0 - eta * g1 / (np.abs(g1) + eps)) / (1 + lam * eta),
                               rtol=1e-15)
    np.testing.assert_array_equal(oracle.v, 0.0)
    oracle.step(g2)
    m = (1 - b1) * b1 * g1 + b1 * g2
    v = b2 * (g2 - g1)
    n = (1 - b3) * b3 * g1 ** 2 + b3 * (g2 + (1 - b2) * (g2 - g1)) ** 2
    m_hat, v_hat, n_hat = m / (1 - (1 - b1) ** 2), v / (1 - (1 - b2) ** 2), n / (1 - (1 - b3) ** 2)
    theta1 = (theta0 - eta * g1 / (np.abs(g1) + eps)) / (1 + lam * eta)
    theta2 = (theta1 - eta / (np.sqrt(n_hat) + eps) * (m_hat + (1 - b2) * v_hat)) / (1 + lam * eta)
    np.testing.assert_allclose(oracle.theta, theta2, rtol=1e-14)
    np.testing.assert_allclose(oracle.states()["s"], n, rtol=1e-14)


# -- (c) CUDA: PTX and cubin with one entry per kernel, no GPU needed --------------------
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_adan_cuda_build_has_the_expected_ptx_entries():
    result = optgen.build(ADAN, "cuda")        # the default variant: float32 parameters
    assert result.built == ["f32"]
    v = optgen.Artifact.load(result.path).variant("f32")
    kernels = {k["name"]: k for entry in v.manifest["device_kernels"].values()
               for k in entry["kernels"]}
    # (the dense kernel, the row-sparse one, and the multi-tensor one that steps a list
    # of tensors through a pointer table: runtime/strategies/multi.py)
    expected = {f"adan_f32{variant}_kernel" for variant in ("", "_lazy", "_mt")}
    assert set(kernels) == expected
    for arch in ("sm_80", "sm_90"):
        ptx = _read(os.path.join(v.path, f"kernels.{arch}.ptx"))
        entries = dict(re.findall(r"\.visible \.entry (\w+)\((.*?)\)", ptx, re.S))
        assert set(entries) == expected, arch
        for name, params in entries.items():   # the ABI's parameter count, per kernel
            assert params.count(".param") == len(kernels[name]["params"]), (arch, name)
        assert os.path.getsize(os.path.join(v.path, f"kernels.{arch}.cubin")) > 0


# -- (d) the snippets in the docs run and print what the docs show -----------------------
def test_getting_started_numpy_snippet():
    section = _section(GETTING_STARTED, "## Step an optimizer from numpy")
    code, = _blocks(section, "python")
    shown = _blocks(section, "console")[0].split()
    printed = _run_snippet(code).split()
    assert printed[0] == shown[0] == "300"
    assert float(printed[1]) < 1e-4 and float(shown[1]) < 1e-4
    assert printed[2:] == shown[2:] == ["['m',", "'v']"]


def test_getting_started_torch_snippet():
    pytest.importorskip("torch", reason="the torch snippet needs torch")
    section = _section(GETTING_STARTED, "## Use it from torch")
    code, = _blocks(section, "python")
    shown = _blocks(section, "console")[0]
    printed = _run_snippet(code)
    loss, lr = re.fullmatch(r"loss (\S+), lr (\S+)\n", printed).groups()
    shown_loss, shown_lr = re.fullmatch(r"loss (\S+), lr (\S+)\n", shown).groups()
    assert lr == shown_lr == "0.0125"
    assert float(loss) < 0.02 and abs(float(loss) - float(shown_loss)) < 1e-3


def test_tutorial_use_snippet(monkeypatch):
    monkeypatch.chdir(ROOT)    # the snippet names the spec by its path from the root
    section = _section(TUTORIAL, "## Use it")
    code, = _blocks(section, "python")
    shown = _blocks(section, "console")[0]
    pattern = r"300 loss (\S+) from (\S+) \['g_prev', 'm', 's', 'v'\]\n"
    loss, start = map(float, re.fullmatch(pattern, _run_snippet(code)).groups())
    shown_loss, shown_start = map(float, re.fullmatch(pattern, shown).groups())
    assert start == shown_start and loss < 1e-3 * start
    assert abs(loss - shown_loss) < 1e-3


# -- a build on a machine without a C/C++ compiler ---------------------------------------
def test_build_without_a_c_compiler_names_what_is_missing(tmp_path, monkeypatch):
    """TVM links kernels.so with the system compiler; without one it failed deep inside
    with "expected str, bytes or os.PathLike object, not NoneType"."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(optgen.BuildError, match=r"no C/C\+\+ compiler found to link "
                       r"kernels\.so: .*install one"):
        optgen.build(ADAN, "llvm", out=str(tmp_path / "out"), force=True)
    assert not os.path.exists(tmp_path / "out" / "kernels.so")


def test_adan_takes_torch_style_betas_as_a_triple():
    w = np.ones(3, dtype=np.float32)
    opt = optgen.create(ADAN, [w], betas=(0.9, 0.8, 0.7))
    assert (opt.hyper["beta1"], opt.hyper["beta2"], opt.hyper["beta3"]) == (0.9, 0.8, 0.7)
    with pytest.raises(TypeError, match=r"adan: betas must be a triple \(beta1, beta2, beta3\)"):
        optgen.create(ADAN, [w], betas=(0.9, 0.8))

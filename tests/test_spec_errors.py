"""Every verifier rule, one broken spec each: SpecError with the spec file, line and rule."""
import os
import subprocess
import sys
import textwrap

import pytest

from optgen.compiler.loader import load_spec
from optgen.compiler.verify import verify
from optgen.errors import SpecError

HEAD = """\
from optgen.dsl import Spec, sqrt, where
spec = Spec("toy")
lr = spec.hyper("lr", 0.1, "lr >= 0", "step")
m = spec.state("m", 0.0)
"""
GOOD_RULE = """
@spec.update
def rule(w, grad, flags):
    m_new = 0.9 * m + grad
    return {m: m_new, w: w - lr * m_new}
"""

# (id, source, expected line (1-based; None = no line), message regex)
CASES = [
    ("syntax-error", HEAD + "x = = 1\n", 5, r"syntax error"),
    ("undefined-name-module", HEAD + "beta = spec.hyper('beta', undefined_thing)\n", 5,
     r"undefined name: name 'undefined_thing' is not defined"),
    ("undefined-name-in-rule", HEAD + """
@spec.update
def rule(w, grad, flags):
    return {m: m * beta2, w: w - lr * grad}
""", 8, r"undefined name: name 'beta2' is not defined"),
    ("unknown-flag", HEAD + """
@spec.update
def rule(w, grad, flags):
    d = grad if flags.nesterov else m
    return {m: grad, w: w - lr * d}
""", 8, r"flags\.nesterov is not a declared flag"),
    ("assign-gradient", HEAD + """
@spec.update
def rule(w, grad, flags):
    return {m: grad, grad: grad * 2, w: w - lr * grad}
""", 8, r"assigns to the gradient"),
    ("assign-hyperparameter", HEAD + """
@spec.update
def rule(w, grad, flags):
    return {m: grad, lr: lr * 0.5, w: w - lr * grad}
""", 8, r"assigns to hyperparameter 'lr'"),
    ("assign-hyperparameter-by-name", HEAD + """
@spec.update
def rule(w, grad, flags):
    return {m: grad, "lr": lr * 0.5, w: w - lr * grad}
""", 8, r"assigns to hyperparameter 'lr'"),
    ("state-never-updated", HEAD + """
@spec.update
def rule(w, grad, flags):
    return {w: w - lr * grad}
""", 4, r"state 'm' is declared but never updated"),
    ("state-not-declared", HEAD + """
@spec.update
def rule(w, grad, flags):
    return {m: grad, "v": grad * grad, w: w - lr * grad}
""", 8, r"state 'v' is updated but not declared"),
    ("param-not-updated", HEAD + """
@spec.update
def rule(w, grad, flags):
    return {m: grad}
""", 6, r"no new value for the parameter w"),
    ("default-breaks-constraint", HEAD + "beta = spec.hyper('beta', 1.5, '0 <= beta < 1')\n" + GOOD_RULE,
     5, r"default beta=1\.5 breaks its own constraint '0 <= beta < 1'"),
    ("constraint-undefined-name", HEAD + "beta = spec.hyper('beta', 0.5, 'beta < gamma')\n" + GOOD_RULE,
     5, r"undefined name 'gamma' in the constraint"),
    ("constraint-bad-syntax", HEAD + "beta = spec.hyper('beta', 0.5, 'beta <')\n" + GOOD_RULE,
     5, r"bad constraint"),
    ("bad-default-type", HEAD + "k = spec.hyper('k', 'three')\n" + GOOD_RULE,
     5, r"bad default: .*must be a float"),
    ("flag-as-hyper", HEAD + "f = spec.hyper('f', True)\n" + GOOD_RULE, 5, r"declare it with spec\.flag"),
    ("dtype-bool-arithmetic", HEAD + """
@spec.update
def rule(w, grad, flags):
    big = grad > 1.0
    return {m: big * grad, w: w - lr * grad}
""", 9, r"dtype conflict: mul needs float operands"),
    ("dtype-where-float-condition", HEAD + """
@spec.update
def rule(w, grad, flags):
    return {m: where(grad, 1.0, 0.0), w: w - lr * grad}
""", 8, r"dtype conflict: the condition of where\(\) must be a comparison"),
    ("dtype-bool-update", HEAD + """
@spec.update
def rule(w, grad, flags):
    return {m: grad > 0.0, w: w - lr * grad}
""", 8, r"dtype conflict: the new value of 'm' is a bool"),
    ("python-if-on-tensor", HEAD + """
@spec.update
def rule(w, grad, flags):
    d = grad if grad > 0.0 else -grad
    return {m: d, w: w - lr * d}
""", 8, r"only known when the kernel runs; use where"),
    ("no-update-function", HEAD, 2, r"declares no update function"),
    ("two-update-functions", HEAD + GOOD_RULE + GOOD_RULE, 11, r"two update functions"),
    ("duplicate-name", HEAD + "m2 = spec.state('m', 1.0)\n" + GOOD_RULE, 5, r"declared twice"),
    ("reserved-name", HEAD + "t2 = spec.hyper('t', 1.0)\n" + GOOD_RULE, 5, r"reserved"),
    ("scalar-state-from-tensor", HEAD + "s = spec.state('s', 1.0, shape='scalar')\n" + """
@spec.update
def rule(w, grad, flags):
    return {m: grad, s: s * grad, w: w - lr * grad}
""", 9, r"scalar state 's' is computed from tensor values"),
    ("requirement-broken-by-defaults", HEAD + "spec.require('lr > 1', 'lr must be big')\n" + GOOD_RULE,
     5, r"defaults break the requirement 'lr > 1'"),
    ("non-number-in-rule", HEAD + """
@spec.update
def rule(w, grad, flags):
    return {m: grad * "x", w: w - lr * grad}
""", 8, r"cannot be used in an update rule"),
    ("no-spec", "x = 1\n", None, r"exactly one Spec \(or name it .spec.\), found 0"),
]


def _write(tmp_path, source):
    path = tmp_path / "toy.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


@pytest.mark.parametrize("case_id,source,line,pattern", CASES, ids=[c[0] for c in CASES])
def test_spec_error(tmp_path, case_id, source, line, pattern):
    path = _write(tmp_path, source)
    with pytest.raises(SpecError, match=pattern) as info:
        verify(load_spec(path))
    err = info.value
    assert err.file == path
    assert err.line == line, f"{case_id}: reported line {err.line}, expected {line}: {err}"
    assert str(err).startswith(f"{path}:{line}: " if line else f"{path}: ")


def test_good_toy_spec_passes(tmp_path):
    traces = verify(load_spec(_write(tmp_path, HEAD + GOOD_RULE)))
    assert len(traces) == 1 and set(traces[0].updates) == {"w", "m"}


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "optgen.cli", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=300)


def test_cli_spec_error_is_one_line_exit_2(tmp_path):
    path = _write(tmp_path, CASES[1][1])
    r = _cli("build", path)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{path}:5:" in lines[0] and "undefined name" in lines[0]


@pytest.mark.parametrize("args,pattern", [
    (("build", "no_such_optimizer"), "unknown optimizer 'no_such_optimizer'"),
    (("build", "/no/such/spec.py"), "does not exist"),
    (("build", "sgd", "--target", "quantum"), "unknown target 'quantum'"),
])
def test_cli_usage_errors_exit_2(args, pattern):
    r = _cli(*args)
    assert r.returncode == 2 and pattern in r.stderr and "Traceback" not in r.stderr


def test_cli_argparse_usage_exit_2():
    assert _cli("frobnicate").returncode == 2

"""Every verifier rule, one broken spec each: SpecError with the spec file, line and rule."""
import os
import re
import subprocess
import sys
import textwrap

import pytest

from optgen.compiler.loader import load_spec
from optgen.compiler.verify import verify
from optgen.errors import SpecError

HEAD = """\
from optgen.dsl import Spec, sqrt, where, mean, norm
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


def rule(body: str) -> str:
    """An update function (lines 2-4 of the returned text) returning ``body``. Errors in
    the returned dict point at its line; errors about the dict as a whole at the
    function (its decorator line, where Python's code object starts)."""
    return f"""
@spec.update
def rule(w, grad, flags):
    return {body}
"""


# (id, source, expected line (1-based; None = no line), message regex, hint regex)
CASES = [
    # Python errors while the spec file runs
    ("syntax-error", HEAD + "x = = 1\n", 5, r"syntax error", r"fix the syntax"),
    ("undefined-name-module", HEAD + "beta = spec.hyper('beta', undefined_thing)\n", 5,
     r"undefined name: name 'undefined_thing' is not defined", r"define it above this line"),
    ("undefined-name-in-rule", HEAD + rule("{m: m * beta2, w: w - lr * grad}"), 8,
     r"undefined name: name 'beta2' is not defined", r"spec\.hyper\(\)"),
    ("spec-code-raises", HEAD + "x = 1 / 0\n", 5, r"ZeroDivisionError: division by zero",
     r"Python code raised"),
    ("spec-imports-missing-module", HEAD + "import no_such_module_xyz\n", 5,
     r"ModuleNotFoundError: No module named 'no_such_module_xyz'", r"Python code raised"),
    ("spec-calls-exit", HEAD + "raise SystemExit(3)\n", 5, r"SystemExit: 3", r"Python code raised"),
    ("undefined-attribute", HEAD + "x = spec.hyperparameter('x', 1.0)\n", 5,
     r"undefined attribute: .*'hyperparameter'", r"spelling"),
    ("no-spec", "x = 1\n", None, r"exactly one Spec \(or name it .spec.\), found 0", r"Spec\("),
    # assignments the rule may not make
    ("assign-gradient", HEAD + rule("{m: grad, grad: grad * 2, w: w - lr * grad}"), 8,
     r"assigns to the gradient", r"new local value"),
    ("assign-hyperparameter", HEAD + rule("{m: grad, lr: lr * 0.5, w: w - lr * grad}"), 8,
     r"assigns to hyperparameter 'lr'", r"in a state"),
    ("assign-hyperparameter-by-name", HEAD + rule('{m: grad, "lr": lr * 0.5, w: w - lr * grad}'),
     8, r"assigns to hyperparameter 'lr'", r"in a state"),
    ("assign-flag", HEAD + "f = spec.flag('f', False)\n" + """
@spec.update
def rule(w, grad, flags):
    flags.f = True
    return {m: grad, w: w - lr * grad}
""", 9, r"cannot assign to flag 'f'", r"local variable"),
    ("update-not-a-dict", HEAD + rule("w - lr * grad"), 6, r"must return a dict",
     r"return \{m: m_new"),
    ("update-key-not-a-state", HEAD + rule("{m: grad, 3: grad, w: w - lr * grad}"), 6,
     r"update keys must be states or w, got 3", r"spec\.state\(\) returned"),
    # states and parameter
    ("state-never-updated", HEAD + rule("{w: w - lr * grad}"), 4,
     r"state 'm' is declared but never updated", r"return \{m: <new value>\}"),
    ("state-not-declared", HEAD + rule('{m: grad, "v": grad * grad, w: w - lr * grad}'), 8,
     r"state 'v' is updated but not declared", r"spec\.state\('v', 0\.0\)"),
    ("param-not-updated", HEAD + rule("{m: grad}"), 6, r"no new value for the parameter w",
     r"w: new_w"),
    ("state-bad-shape", HEAD + "s = spec.state('s', 0.0, shape='matrix')\n" + GOOD_RULE, 5,
     r"shape must be one of param, row, col, scalar, rr, cc, got 'matrix'", r"shape='param'"),
    ("state-bad-init", HEAD + "s = spec.state('s', 'zero')\n" + GOOD_RULE, 5,
     r"init must be a number, a hyperparameter expression or .w.", r"init=0\.0"),
    ("state-when-unknown-flag", HEAD + "s = spec.state('s', 0.0, when='amsgrad')\n" + GOOD_RULE,
     5, r"when= names 'amsgrad', which is not a flag declared before it", r"spec\.flag\(\)"),
    ("scalar-state-from-tensor", HEAD + "s = spec.state('s', 1.0, shape='scalar')\n"
     + rule("{m: grad, s: s * grad, w: w - lr * grad}"), 9,
     r"scalar state 's' is computed from tensor values", r"tensor state"),
    # hyperparameters, flags, constraints
    ("default-breaks-constraint", HEAD + "beta = spec.hyper('beta', 1.5, '0 <= beta < 1')\n"
     + GOOD_RULE, 5, r"default beta=1\.5 breaks its own constraint '0 <= beta < 1'",
     r"change the default"),
    ("constraint-undefined-name", HEAD + "beta = spec.hyper('beta', 0.5, 'beta < gamma')\n"
     + GOOD_RULE, 5, r"undefined name 'gamma' in the constraint", r"hyperparameters only"),
    ("constraint-bad-syntax", HEAD + "beta = spec.hyper('beta', 0.5, 'beta <')\n" + GOOD_RULE,
     5, r"bad constraint", r"0 <= beta < 1"),
    ("requirement-undefined-name", HEAD + "spec.require('lr < top', 'capped')\n" + GOOD_RULE,
     5, r"undefined name 'top' in the requirement", r"hyperparameters only"),
    ("requirement-broken-by-defaults", HEAD + "spec.require('lr > 1', 'lr must be big')\n"
     + GOOD_RULE, 5, r"defaults break the requirement 'lr > 1'", r"change the defaults"),
    ("bad-default-type", HEAD + "k = spec.hyper('k', 'three')\n" + GOOD_RULE,
     5, r"bad default: .*must be a float", r"declared type"),
    ("optional-without-none-value", HEAD + "c = spec.hyper('c', None, optional=True)\n"
     + GOOD_RULE, 5, r"optional hyperparameter 'c' needs none_value=", r"none_value="),
    ("none-default-not-optional", HEAD + "c = spec.hyper('c', None)\n" + GOOD_RULE, 5,
     r"has default None but is not optional=True", r"optional=True"),
    ("flag-as-hyper", HEAD + "f = spec.hyper('f', True)\n" + GOOD_RULE, 5,
     r"hyperparameter 'f' is a bool", r"spec\.flag\('f', True\)"),
    ("flag-non-bool-default", HEAD + "f = spec.flag('f', 1)\n" + GOOD_RULE, 5,
     r"flag 'f' needs a bool default, got 1", r"spec\.flag\('f', False\)"),
    ("unknown-flag", HEAD + """
@spec.update
def rule(w, grad, flags):
    d = grad if flags.nesterov else m
    return {m: grad, w: w - lr * d}
""", 8, r"flags\.nesterov is not a declared flag", r"spec\.flag\('nesterov', False\)"),
    ("too-many-flags", HEAD + "".join(f"f{i} = spec.flag('f{i}', False)\n" for i in range(7))
     + GOOD_RULE, 2, r"at most 6 flags per spec, found 7", r"float hyperparameter"),
    ("bad-shape-flag-rule", HEAD + "big = spec.shape_flag('big', 'rank >= 2')\n" + GOOD_RULE,
     5, r"shape flag 'big': the rule may use ndim, numel, rows, cols and int hyperparameters, not 'rank'", r"ndim >= 2"),
    # names
    ("duplicate-name", HEAD + "m2 = spec.state('m', 1.0)\n" + GOOD_RULE, 5, r"declared twice",
     r"its own name"),
    ("reserved-name", HEAD + "t2 = spec.hyper('t', 1.0)\n" + GOOD_RULE, 5, r"reserved",
     r"rename it"),
    ("underscore-name", HEAD + "x = spec.hyper('_x', 1.0)\n" + GOOD_RULE, 5,
     r"must not start with '_'", r"without the leading underscore"),
    ("non-identifier-name", HEAD + "x = spec.hyper('beta-1', 1.0)\n" + GOOD_RULE, 5,
     r"name 'beta-1' must be a Python identifier", r"letters, digits and underscores"),
    # dtype conflicts
    ("dtype-bool-arithmetic", HEAD + """
@spec.update
def rule(w, grad, flags):
    big = grad > 1.0
    return {m: big * grad, w: w - lr * grad}
""", 9, r"dtype conflict: mul needs float operands", r"where\(cond, 1\.0, 0\.0\)"),
    ("dtype-where-float-condition", HEAD + rule("{m: where(grad, 1.0, 0.0), w: w - lr * grad}"),
     8, r"dtype conflict: the condition of where\(\) must be a comparison",
     r"where\(grad > 0, a, b\)"),
    ("dtype-where-branches-differ", HEAD + rule("{m: where(grad > 0, grad, grad > 1), "
                                                "w: w - lr * grad}"),
     8, r"dtype conflict: where\(\) branches differ", r"both branches numbers"),
    ("dtype-logic-on-floats", HEAD + rule("{m: where((grad > 0) & m, grad, m), w: w - lr * grad}"),
     8, r"dtype conflict: 'and' needs bool operands", r"compare first"),
    ("dtype-bool-update", HEAD + rule("{m: grad > 0.0, w: w - lr * grad}"), 8,
     r"dtype conflict: the new value of 'm' is a bool", r"where\(cond, 1\.0, 0\.0\)"),
    ("python-if-on-tensor", HEAD + """
@spec.update
def rule(w, grad, flags):
    d = grad if grad > 0.0 else -grad
    return {m: d, w: w - lr * d}
""", 8, r"only known when the kernel runs", r"use where\(cond, a, b\)"),
    ("non-number-in-rule", HEAD + rule('{m: grad * "x", w: w - lr * grad}'), 8,
     r"cannot be used in an update rule", r"numbers, hyperparameters"),
    ("non-finite-constant", HEAD + rule("{m: grad * float('inf'), w: w - lr * grad}"), 8,
     r"constant inf is not finite", r"large finite number"),
    # shape conflicts and reductions
    ("shape-row-state-from-tensor", HEAD + "r = spec.state('r', 0.0, shape='row')\n"
     + rule("{m: grad, r: grad * grad, w: w - lr * grad}"), 9,
     r"shape conflict: the new value of 'r' varies along axes 'brc' but 'r' holds 'br'",
     r"row_mean"),
    ("reduce-a-scalar", HEAD + rule("{m: grad * mean(lr), w: w - lr * grad}"), 8,
     r"mean\(\) needs a tensor value", r"reduce a tensor expression"),
    ("reduce-bad-axes", HEAD + rule("{m: grad * mean(grad, 'rx'), w: w - lr * grad}"), 8,
     r"mean\(\) over axes 'rx'", r"axes the operand has"),
    ("reduce-in-a-lazy-spec", HEAD + "spec.lazy_update_default = True\n"
     + rule("{m: grad, w: w - lr * grad / (norm(grad) + 1.0)}"), 9,
     r"lazy_update_default is set, but the update reduces \(sum over axes 'brc'\)",
     r"drop lazy_update_default"),
    ("row-state-in-a-lazy-spec", HEAD + "spec.lazy_update_default = True\n"
     + "r = spec.state('r', 0.0, shape='row')\n"
     + rule("{m: grad, r: r + mean(grad, 'c'), w: w - lr * grad}"), 6,
     r"state 'r' has shape='row'; a lazy \(row-sparse\) kernel cannot keep it",
     r"drop lazy_update_default"),
    # the update function itself
    ("no-update-function", HEAD, 2, r"declares no update function", r"@spec\.update"),
    ("two-update-functions", HEAD + GOOD_RULE + GOOD_RULE, 11, r"two update functions",
     r"exactly one function"),
]


def _write(tmp_path, source):
    path = tmp_path / "toy.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


@pytest.mark.parametrize("case_id,source,line,pattern,hint", CASES, ids=[c[0] for c in CASES])
def test_spec_error(tmp_path, case_id, source, line, pattern, hint):
    path = _write(tmp_path, source)
    with pytest.raises(SpecError, match=pattern) as info:
        verify(load_spec(path))
    err = info.value
    assert err.file == path
    assert err.line == line, f"{case_id}: reported line {err.line}, expected {line}: {err}"
    assert str(err).startswith(f"{path}:{line}: " if line else f"{path}: ")
    assert err.hint and re.search(hint, err.hint), f"{case_id}: hint {err.hint!r}"
    assert str(err).endswith(f" (hint: {err.hint})") and "\n" not in str(err)


@pytest.mark.parametrize("case_id,source,line,pattern,hint", CASES, ids=[c[0] for c in CASES])
def test_cli_prints_each_spec_error_in_one_line(tmp_path, monkeypatch, capsys, case_id,
                                                 source, line, pattern, hint):
    """`optgen build` on every broken spec: exit 2, one line naming file and line, the
    hint, no traceback (in-process: main() is what the console script runs)."""
    from optgen import cli
    monkeypatch.setenv("OPTGEN_CACHE_DIR", str(tmp_path / "cache"))
    path = _write(tmp_path, source)
    assert cli.main(["build", path]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1, err
    assert lines[0].startswith(f"optgen: spec error: {path}:{line}: " if line
                               else f"optgen: spec error: {path}: ")
    assert re.search(pattern, lines[0]) and "(hint: " in lines[0] and "Traceback" not in err


def test_cases_cover_the_table():
    """The issue asks for one broken spec per verifier rule; keep the table wide."""
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


def test_base_on_a_spec_that_is_not_a_wrapper(tmp_path):
    path = _write(tmp_path, HEAD + GOOD_RULE)
    with pytest.raises(SpecError, match=r"is not a wrapper .*base= does not apply") as info:
        load_spec(path, base="adam")
    assert "lars" in info.value.hint


def test_unreadable_spec(tmp_path):
    with pytest.raises(SpecError, match=r"cannot read spec") as info:
        load_spec(str(tmp_path / "missing.py"))
    assert info.value.hint


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

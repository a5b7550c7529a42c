"""Matrix rules in the DSL: the spec errors of products, loops and refreshes, and the
planner's hazards (a state read transposed while it is written, one final pass reading
what another writes, loop-invariant products) compiled == reference."""
import re
import textwrap

import numpy as np
import pytest

import optgen
from optgen.compiler.loader import load_spec
from optgen.compiler.verify import verify
from optgen.errors import SpecError

HEAD = """\
from optgen.dsl import Spec, matmul, transpose, repeat, eye, inverse, norm, row_mean
spec = Spec("mx")
lr = spec.hyper("lr", 0.1, "lr >= 0", "step")
k = spec.hyper("k", 3, "k >= 0", "repetitions", type="int")
f = spec.hyper("f", 0.5, doc="a float")
S = spec.state("S", 0.0, shape="rr")
spec.shape_flag("matrix", "ndim == 2")
"""


def rule(body: str, refresh: str = "") -> str:
    return HEAD + refresh + f"""
@spec.update
def rule(w, grad, flags):
    if not flags.matrix:
        return {{S: S, w: w - lr * grad}}
    return {body}
"""


ERRORS = [
    ("elementwise-shapes", rule("{S: S, w: w - lr * matmul(grad, grad.T)}"),
     r"shape conflict: sub of a R x C and a R x R matrix", r"matmul"),
    ("inner-sizes", rule("{S: S, w: w - lr * matmul(grad, grad)}"),
     r"matmul of a R x C and a R x C matrix: the inner sizes C and R differ", r"transpose"),
    ("state-shape", rule("{S: matmul(grad.T, grad), w: w}"),
     r"the new value of 'S' is a C x C matrix, 'S' is R x R", r"transpose"),
    ("float-count", rule("{S: S, w: repeat(f, lambda x: 2 * x, grad)}"),
     r"repeat\(\) count 'f' is a float hyperparameter", r"type='int'"),
    ("body-shape", rule("{S: S, w: w - repeat(k, lambda x: matmul(x, x.T), grad)}"),
     r"the body returns .* of shape RR, not the R x C matrix", r"same shape"),
    ("inverse-in-update", rule("{S: inverse(S), w: w}"),
     r"inverse\(\) is used in the update .* refresh rule", r"@spec.refresh"),
    ("eye-in-update", rule("{S: S + eye('r'), w: w}"),
     r"eye\(\) is used in the update", r"@spec.refresh"),
    ("row-value", rule("{S: S, w: w - lr * matmul(S, grad) * row_mean(grad)}"),
     r"holds one value per row or column", r"param-shaped state"),
    ("not-square", rule("{S: S, w: w - inverse(grad)}"),
     r"inverse\(\) needs a square matrix", r"damping"),
]


@pytest.mark.parametrize("name,source,message,hint", ERRORS, ids=[e[0] for e in ERRORS])
def test_matrix_spec_errors(tmp_path, name, source, message, hint):
    path = tmp_path / "mx.py"
    path.write_text(source)
    with pytest.raises(SpecError) as err:
        verify(load_spec(str(path)))
    text = str(err.value)
    assert "mx.py:" in text, text           # located at the spec's line
    assert re.search(message, text), text
    assert re.search(hint, err.value.hint or ""), err.value.hint


REFRESH = """
@spec.refresh(every=k)
def refresh(w, flags):
    return {S: matmul(w, w.T) + eye("r")} if flags.matrix else {}
"""


def test_refresh_rule_errors(tmp_path):
    path = tmp_path / "mx.py"
    path.write_text(rule("{S: S, w: w}", REFRESH))
    assert verify(load_spec(str(path)))       # S refreshed from w, unchanged by the step
    path.write_text(rule("{S: S, w: w}", REFRESH.replace("else {}", "else {w: w}")))
    with pytest.raises(SpecError, match="the refresh function assigns to w"):
        verify(load_spec(str(path)))
    path.write_text(rule("{S: S, w: w}", REFRESH.replace("every=k", "every=f")))
    with pytest.raises(SpecError, match=r"refresh\(every=\.\.\.\) must be an int"):
        load_spec(str(path))
    path.write_text(rule("{S: S, w: w}", REFRESH.replace("every=k", "every=k, start=0")))
    with pytest.raises(SpecError, match=r"refresh\(start=\.\.\.\) must be an int >= 1"):
        load_spec(str(path))


HAZARDS = '''\
"""Planner hazards: S is read transposed while it is written, the parameter's pass
reads S (written by another final pass), and the loop body multiplies by a product
that does not change inside it."""
from optgen.dsl import Spec, matmul, norm, repeat

spec = Spec("hazards", __doc__, reference="tests/test_matrix_dsl.py")
lr = spec.hyper("lr", 0.05, "lr >= 0", "step")
k = spec.hyper("k", 2, "k >= 0", "repetitions", type="int")
spec.shape_flag("matrix", "ndim == 2")
S = spec.state("S", 0.0, "a symmetrized R x R accumulator", shape="rr", when="matrix")
m = spec.state("m", 0.0, "momentum")


@spec.update
def hazards(w, grad, flags):
    if not flags.matrix:
        return {m: 0.5 * m + grad, w: w - lr * grad}
    s_new = 0.5 * (S + S.T) + matmul(grad, grad.T) / (1.0 + norm(grad))
    gram = matmul(w, w.T)                       # loop-invariant
    x = repeat(k, lambda x: x - 0.1 * matmul(gram, x) / (1.0 + norm(gram)), grad)
    x = repeat(2, lambda y: 0.5 * y + 0.5 * matmul(S.T, y) / (1.0 + norm(S)), x)
    return {S: s_new, m: 0.5 * m + x, w: w - lr * (matmul(S, grad) + m.T.T)}
'''


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_planner_hazards_compiled_matches_reference(tmp_path, dtype):
    path = tmp_path / "hazards.py"
    path.write_text(HAZARDS)
    rng = np.random.default_rng(0)
    shapes = [(5, 3), (3, 5), (4, 4), (1, 6), (7,)]
    params = [rng.standard_normal(s).astype(dtype) for s in shapes]
    comp = optgen.create(str(path), [p.copy() for p in params], k=3)
    ref = optgen.create(str(path), [p.copy() for p in params], k=3, backend="reference")
    plan = comp._param_kernel(0).launches
    assert [ln["kind"] for ln in plan].count("repeat") == 2
    for _ in range(6):
        grads = [rng.standard_normal(s).astype(dtype) for s in shapes]
        comp.step([g.copy() for g in grads])
        ref.step([g.copy() for g in grads])
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    for i in range(len(shapes)):
        np.testing.assert_allclose(comp.params[i], ref.params[i], **tol)
        for name, v in comp.state[i].items():
            np.testing.assert_allclose(v, ref.state[i][name], **tol, err_msg=name)
    assert np.abs(comp.state[2]["S"] - comp.state[2]["S"].T).max() < 1e-4  # symmetric


def test_matrix_rule_needs_a_2d_parameter(tmp_path):
    path = tmp_path / "plain.py"
    path.write_text(textwrap.dedent('''\
        """A matrix rule for every parameter (no shape flag)."""
        from optgen.dsl import Spec, matmul
        spec = Spec("plain", __doc__, reference="tests")
        lr = spec.hyper("lr", 0.1, "lr >= 0", "step")

        @spec.update
        def plain(w, grad, flags):
            return {w: w - lr * matmul(matmul(grad, grad.T), grad)}
        '''))
    with pytest.raises(ValueError, match=r"parameter 0 has shape \(3, 4, 5\); .* needs a 2-D"):
        optgen.create(str(path), [np.zeros((3, 4, 5), np.float32)])


@pytest.mark.parametrize("name", ["thor", "muon"])
def test_checkpoint_round_trip_keeps_matrix_states_and_the_refresh_schedule(tmp_path, name):
    from optgen.commands import random_statistics
    rng = np.random.default_rng(1)
    shapes = [(6, 4), (3, 5), (5,)]
    hyper = {"frequency": 3} if name == "thor" else {}
    a = optgen.create(name, [rng.standard_normal(s).astype(np.float32) for s in shapes], **hyper)
    for _ in range(4):
        a.step([rng.standard_normal(s).astype(np.float32) for s in shapes],
               **random_statistics(a, rng))
    a.save(str(tmp_path / "ck"))
    b = optgen.create(name, [p.copy() for p in a.params], **hyper)
    assert name != "thor" or b.refresh_due      # a new optimizer refreshes first
    b.load(str(tmp_path / "ck"))
    assert not b.refresh_due and not a.refresh_due   # step 5: (5 - 1) % 3 != 0
    for _ in range(3):                               # step 7 refreshes
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        stats = random_statistics(a, rng)
        a.step([g.copy() for g in grads], **stats)
        b.step([g.copy() for g in grads], **stats)
    for i in range(len(shapes)):
        np.testing.assert_array_equal(a.params[i], b.params[i])
        for n, v in a.state[i].items():
            np.testing.assert_array_equal(v, b.state[i][n], err_msg=n)

"""DSL features adam and sgd do not use: every elementwise op, scalar states, int
hyperparameters, conditions on t, optional hyperparameters, state reset to a constant."""
import textwrap

import numpy as np
import pytest

import optgen

ALL_OPS = '''
"""Every op of the closed set, in one meaningless but well-defined update."""
from optgen.dsl import Spec, sqrt, rsqrt, exp, log, sign, minimum, maximum, where, clip, eq, ne

spec = Spec("allops", __doc__)
lr = spec.hyper("lr", 0.01, "lr > 0", "step")
k = spec.hyper("k", 3, "k >= 1", "an int hyperparameter")
cap = spec.hyper("cap", None, "cap > 0", "optional", optional=True, none_value=1e30)
use_abs = spec.flag("use_abs", False, "a flag")
a = spec.state("a", 0.5)
b = spec.state("b", 0.0)
decay = spec.state("decay", 1.0, "scalar state", shape="scalar")
t = spec.t

@spec.update
def rule(w, grad, flags):
    x = abs(grad) if flags.use_abs else -grad
    y = sqrt(abs(a) + 1) + rsqrt(a * a + 1) + exp(-abs(grad)) + log(1 + grad * grad)
    z = minimum(maximum(grad, -1.0), 1.0) * sign(w) + clip(grad, -0.5, 0.5) ** 2
    c = where((grad > 0) & ~(w < 0) | eq(grad, 0.0), 1.0, 2.0) + where(ne(w, 0.0), 0.5, 0.25)
    late = where(t > 2, x, y)             # a bool host scalar selecting between tensors
    step = lr * decay * 0.9 / k           # host scalar reading a scalar state
    return {a: y * 0.1 + late * 0.01, b: minimum(z * c, cap), decay: decay * 0.9,
            w: w - step * (late + z) / (1 + abs(w))}
'''


@pytest.fixture(scope="module")
def allops(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec") / "allops.py"
    path.write_text(textwrap.dedent(ALL_OPS))
    return optgen.get_artifact(str(path))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("use_abs", [False, True])
@pytest.mark.parametrize("cap", [None, 0.3])
def test_all_ops_compiled_matches_reference(allops, dtype, use_abs, cap):
    rng = np.random.default_rng(5)
    tol = dict(rtol=3e-6, atol=1e-6) if dtype == "float32" else dict(rtol=1e-12, atol=1e-13)
    for n in (0, 1, 17, 1009, 70_001):
        w0 = rng.standard_normal(n).astype(dtype)
        w0[::7] = 0.0
        wc, wr = w0.copy(), w0.copy()
        hp = dict(lr=0.1, k=2, cap=cap, use_abs=use_abs)
        c = optgen.create(allops, [wc], **hp)
        r = optgen.create(allops, [wr], backend="reference", **hp)
        for _ in range(4):
            g = rng.standard_normal(n).astype(dtype)
            g[::5] = 0.0
            c.step([g])
            r.step([g])
        np.testing.assert_allclose(wc, wr, **tol)
        for s in ("a", "b"):
            np.testing.assert_allclose(c.state[0][s], r.state[0][s], **tol)
        assert c.state[0]["decay"] == r.state[0]["decay"] == pytest.approx(0.9 ** 4)


def test_scalar_state_and_t_condition_by_hand(allops):
    """Step 1 with grad = 0: x = -0 = 0, late = y (t <= 2), decay 1 -> step = lr*0.9/k."""
    w = np.array([2.0], np.float64)
    opt = optgen.create(allops, [w], lr=0.1, k=3)
    opt.step([np.zeros(1)])
    y = np.sqrt(0.5 + 1) + 1 / np.sqrt(0.25 + 1) + 1.0 + 0.0
    expect = 2.0 - (0.1 * 0.9 / 3) * (y + 0.0) / 3.0
    assert w[0] == pytest.approx(expect, rel=1e-12)
    assert opt.state[0]["decay"] == pytest.approx(0.9)
    assert opt.state[0]["a"][0] == pytest.approx(y * 0.1 + y * 0.01, rel=1e-12)


def test_int_hyperparameter_rejects_float(allops):
    with pytest.raises(TypeError, match=r"allops: hyperparameter k must be an int, got float 2\.5"):
        optgen.create(allops, [np.zeros(3)], k=2.5)


CLAMP_SHAPES = [
    "w - lr * minimum(maximum(grad, -k), k)",
    "lr * minimum(maximum(grad, 0.5 * lr), lr)",
    "w - lr * clip(grad, -lr, lr)",
    "w * rsqrt(abs(grad) + k)",
]


@pytest.mark.parametrize("expr", CLAMP_SHAPES)
def test_shapes_that_crash_tvm_simplifier_build_and_match(tmp_path, expr):
    """Regression: with scalars as kernel parameters or let-bound values, TVM 0.27 failed to
    build these ("IntImm supports only int ... but float32 was supplied", or "variables
    are used, but are not passed in as API arguments" for rsqrt)."""
    path = tmp_path / "shape.py"
    path.write_text(textwrap.dedent(f'''
        from optgen.dsl import Spec, minimum, maximum, clip, rsqrt
        spec = Spec("shape")
        lr = spec.hyper("lr", 0.1)
        k = spec.hyper("k", 0.5)
        @spec.update
        def rule(w, grad, flags):
            return {{w: {expr}}}
    '''))
    rng = np.random.default_rng(2)
    w0 = rng.standard_normal(1001).astype(np.float32)
    wc, wr = w0.copy(), w0.copy()
    c, r = optgen.create(str(path), [wc]), optgen.create(str(path), [wr], backend="reference")
    for _ in range(3):
        g = rng.standard_normal(1001).astype(np.float32)
        c.step([g])
        r.step([g])
    np.testing.assert_allclose(wc, wr, rtol=2e-6, atol=1e-6)

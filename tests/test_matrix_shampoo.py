"""Shampoo (specs/shampoo.py) against the independent oracle in shampoo_oracles.py: 50
steps, both backends, both dtypes, several hyperparameter cases; SOAP's checkpoints and
the rules' host operations. (SOAP's rule is tested against its own oracle in
test_matrix_soap.py.)

Problem: one optimizer over 8x6, 6x10, a row 1x9, a column 9x1 and a 1-D bias of 7,
with gradients 0.5 * (a fixed per-element offset + N(0, 1)). Shampoo's roots do not
depend on a basis; its cases damp with epsilon 1e-3 .. 1e-2 so that the rank-deficient
early statistics are well conditioned.

Tolerances (measured, oracle in float64 on the same inputs, worst element relative to
the array's largest): float64 <= 1.0e-12 (Shampoo's root of the 9x1 layer's 9x9 L at
rank 5, damped by 1e-3), <= 1e-14 otherwise; float32 <= 4.4e-5 (that root again), the
weights <= 1.5e-6. So ATOL_REL 1e-10 (float64) and 2e-4 (float32), rtol alike. A rule
mistake (a transposed root, a missing bias correction, sqrt of the wrong v, beta in
place of 1 - beta) moves the weights by >= 1e-3 of their size.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

import optgen
from optgen.errors import SpecError
from shampoo_oracles import ShampooOracle
from soap_oracle import SoapOracle

SHAPES = [(8, 6), (6, 10), (1, 9), (9, 1), (7,)]
STEPS = 50
CHECK_AT = (1, 2, 4, 6, 11, 13, 25, 50)
TOL = {"float32": (2e-4, 2e-4), "float64": (1e-10, 1e-10)}
CASES = {
    ("shampoo", "default-f5"): dict(precondition_frequency=5, epsilon=1e-3, lr=0.01),
    ("shampoo", "ema-root2-wd"): dict(precondition_frequency=3, epsilon=1e-2, root=2.0,
                                      shampoo_beta2=0.9, weight_decay=0.1,
                                      start_preconditioning_step=2),
}
ORACLES = {"shampoo": ShampooOracle}


def problem(seed: int, dtype: str, steps: int = STEPS):
    rng = np.random.default_rng(seed)
    w0 = [(0.5 * rng.standard_normal(s)).astype(dtype) for s in SHAPES]
    offsets = [rng.standard_normal(s) for s in SHAPES]
    return w0, [[(0.5 * (o + rng.standard_normal(o.shape))).astype(dtype) for o in offsets]
                for _ in range(steps)]


def check(actual, expected, what: str, tol: tuple[float, float]) -> None:
    expected = np.asarray(expected, np.float64)
    actual = np.asarray(actual, np.float64)
    atol = tol[1] * float(np.max(np.abs(expected), initial=0.0))
    np.testing.assert_allclose(actual, expected, rtol=tol[0], atol=atol, err_msg=what)


@pytest.mark.parametrize("backend", ["compiled", "reference"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name,case", list(CASES))
def test_matches_oracle(name, case, dtype, backend):
    hyper = CASES[name, case]
    w0, grads = problem(zlib.crc32(f"{name}{case}{dtype}".encode()), dtype)
    params = [w.copy() for w in w0]
    opt = optgen.create(name, params, backend=backend, **hyper)
    oracle = ORACLES[name](w0, store_dtype=np.dtype(dtype), **hyper)
    f = hyper["precondition_frequency"]
    for t, g in enumerate(grads, 1):
        assert opt.refresh_due == ((t - 1) % f == 0), f"refresh_due before step {t}"
        opt.step(g)
        oracle.step(g)
        if t not in CHECK_AT:
            continue
        for i in range(len(SHAPES)):
            what = f"{name} {case} {dtype} {backend}: parameter {i} {SHAPES[i]} step {t}"
            check(params[i], oracle.w[i], f"{what}: w", TOL[dtype])
            for state, value in oracle.states(i).items():
                check(opt.state[i][state], value, f"{what}: {state}", TOL[dtype])
    assert all(p.dtype == np.dtype(dtype) for p in params)


def test_soap_rotates_and_shampoo_preconditions():
    """The matrix rules are not Adam in disguise: SOAP's v (eigenbasis) and w are not
    those of its own rule without a basis (Q = I: the oracle preconditioning no side),
    whose 1-D parameter it matches; Shampoo's direction is not the graft's (same norm,
    other direction)."""
    w0, grads = problem(7, "float64", 14)
    adam = ShampooOracle(w0, precondition_frequency=10, start_preconditioning_step=10 ** 6)
    plain = SoapOracle(w0, precondition_frequency=5, max_precond_dim=0)
    runs = {n: optgen.create(n, [w.copy() for w in w0], precondition_frequency=5)
            for n in ("shampoo", "soap")}
    for g in grads:
        adam.step(g)
        plain.step(g)
        for opt in runs.values():
            opt.step(g)
    assert not np.allclose(runs["soap"].state[0]["v"], plain.states(0)["v"], rtol=0.1)
    assert not np.allclose(runs["soap"].params[0], plain.w[0], rtol=1e-3)
    np.testing.assert_allclose(runs["soap"].params[4], plain.w[4], rtol=1e-12)   # 1-D
    assert not np.allclose(runs["shampoo"].params[0], adam.w[0], rtol=1e-3)
    np.testing.assert_allclose(runs["shampoo"].params[4], adam.w[4], rtol=1e-12)  # 1-D: graft


@pytest.mark.parametrize("name", ["shampoo", "soap"])
def test_checkpoint_resume_matches_an_uninterrupted_run(name):
    w0, grads = problem(11, "float32", 9)
    hyper = dict(precondition_frequency=3)
    whole = optgen.create(name, [w.copy() for w in w0], **hyper)
    first = optgen.create(name, [w.copy() for w in w0], **hyper)
    for g in grads[:5]:
        whole.step(g)
        first.step(g)
    sd = first.state_dict()
    resumed = optgen.create(name, [p.copy() for p in first.params], **hyper)
    resumed.load_state_dict(sd)
    assert resumed.refresh_due == whole.refresh_due
    for g in grads[5:]:
        whole.step(g)
        resumed.step(g)
    for a, b in zip(resumed.params, whole.params):
        np.testing.assert_array_equal(a, b)


HOST_ERRORS = [
    ("inverse_root(w, 4)", r"inverse_root\(\) needs a square matrix"),
    ("power_qr(eye('r'), eye('c'))", r"power_qr\(\): the basis is .* not a R x R matrix"),
    ("eigen_order(eye('r'), eye('c'))",
     r"eigen_order\(\): the basis is .* not a R x R matrix"),
    ("eigen_order(w, eye('r'))", r"eigen_order\(\) needs a square matrix"),
]


@pytest.mark.parametrize("expr,message", HOST_ERRORS)
def test_host_ops_reject_non_square_operands(expr, message, tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(
        "from optgen.dsl import Spec, eigen_order, eye, inverse_root, power_qr\n"
        "spec = Spec('bad', 'x')\n"
        "spec.shape_flag('matrix', 'ndim == 2', 'm')\n"
        "P = spec.state('P', 0.0, 'p', shape='rr', when='matrix')\n"
        "@spec.refresh(every=2)\n"
        "def refresh(w, flags):\n"
        f"    return {{P: {expr}}} if flags.matrix else {{}}\n"
        "@spec.update\n"
        "def bad(w, grad, flags):\n"
        "    return {w: w - grad}\n")
    with pytest.raises(SpecError, match=message):
        optgen.create(str(path), [np.zeros((3, 4), np.float32)])


@pytest.mark.parametrize("op", ["inverse_root(matmul(grad, grad.T), 4)",
                                "eigen_order(matmul(grad, grad.T), matmul(grad, grad.T))"])
def test_host_ops_are_refresh_only(op, tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(
        "from optgen.dsl import Spec, eigen_order, eye, inverse_root, matmul\n"
        "spec = Spec('bad', 'x')\n"
        "spec.shape_flag('matrix', 'ndim == 2', 'm')\n"
        "@spec.update\n"
        "def bad(w, grad, flags):\n"
        "    if not flags.matrix:\n"
        "        return {w: w - grad}\n"
        f"    return {{w: w - matmul({op}, grad)}}\n")
    with pytest.raises(SpecError, match=rf"{op.split('(')[0]}\(\) is used in the update"):
        optgen.create(str(path), [np.zeros((3, 4), np.float32)])

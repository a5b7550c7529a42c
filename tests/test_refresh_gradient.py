"""Refresh rules that read the step's gradient (``@spec.refresh`` on ``fn(w, grad, flags)``):
what the verifier accepts and when the runtime runs them (Shampoo's ``fresh_roots``)."""
from types import SimpleNamespace

import pytest

from optgen.compiler.loader import load_spec
from optgen.compiler.verify import verify
from optgen.errors import SpecError
from optgen.runtime import refresh

SPEC = '''
from optgen.dsl import Spec, eye, inverse, matmul
spec = Spec("gg", "x")
lr = spec.hyper("lr", 0.1, "lr >= 0", "step")
k = spec.hyper("k", 3, "k >= 1", "refresh period", type="int")
INPUT
spec.shape_flag("matrix", "ndim == 2")
P = spec.state("P", 0.0, "a C x C inverse", shape="cc", when="matrix")


@spec.refresh(every=k)
def refresh(ARGS):
    return {P: inverse(matmul(READ.T, READ) + eye("c"))} if flags.matrix else {}


@spec.update
def gg(w, grad, flags):
    return {w: w - lr * grad}
'''


def _spec(tmp_path, args="w, grad, flags", read="grad", extra=""):
    path = tmp_path / "gg.py"
    path.write_text(SPEC.replace("ARGS", args).replace("READ", read).replace("INPUT", extra))
    return load_spec(str(path))


def test_a_refresh_rule_may_read_the_gradient(tmp_path):
    assert verify(_spec(tmp_path))
    assert verify(_spec(tmp_path, "w, flags", "w"))          # the statistics-only form


def test_a_refresh_rule_reads_no_other_input(tmp_path):
    spec = _spec(tmp_path, read="snap", extra='snap = spec.input("snap", "another gradient")')
    with pytest.raises(SpecError, match="the refresh rule reads input 'snap'"):
        verify(spec)


def test_a_refresh_function_takes_two_or_three_arguments(tmp_path):
    with pytest.raises(SpecError, match="the refresh function has 1 parameters"):
        _spec(tmp_path, "flags")


@pytest.mark.parametrize("reads_grad,steps", [(False, {1, 4, 7}), (True, {3, 6, 9})])
def test_refresh_schedule(reads_grad, steps):
    """Statistics-only rules run before the steps 1, 1 + k, ...; gradient-reading ones on
    the steps k, 2k, ..., so that they see a multiple of k gradients either way."""
    k = SimpleNamespace(refresh={"every": "k", "grad": True} if reads_grad else {"every": "k"})
    refreshed, ran = None, set()
    for done in range(9):                       # steps taken before step done + 1
        if refresh.due(k, refreshed, done, {"k": 3}):
            ran.add(done + 1)
            refreshed = done + 1
    assert ran == steps

"""The state comparison of the kernel-vs-reference tests (helpers.assert_states_close)
is strict enough to catch a state that is wrong while the parameters are right, a
scalar state, a state one side lacks, and step counts that differ."""
import numpy as np
import pytest

import optgen
from helpers import assert_close, assert_states_close


def _twins(name, rng, steps=3):
    art = optgen.get_artifact(name)
    w0 = rng.standard_normal(1000).astype("float32")
    twins = [optgen.create(art, [w0.copy()], backend=b) for b in ("compiled", "reference")]
    for _ in range(steps):
        g = rng.standard_normal(1000).astype("float32")
        for opt in twins:
            opt.step([g.copy()])
    return twins


def test_as_computed_they_agree(rng):
    comp, ref = _twins("nadam", rng)
    assert_close(comp.params[0], ref.params[0], "float32", "w")
    assert_states_close(comp, ref, "float32", "nadam")


@pytest.mark.parametrize("name,state", [("adam", "v"), ("nadam", "mu_product")])
def test_a_wrong_state_with_right_parameters_fails_and_is_named(name, state, rng):
    comp, ref = _twins(name, rng)
    value = comp.state[0][state]
    comp.state[0][state] = value * value.dtype.type(1.001)   # 0.1 %: far beyond 1e-5
    assert_close(comp.params[0], ref.params[0], "float32", "w")     # (parameters: right)
    with pytest.raises(AssertionError, match=rf"state {state}\b"):
        assert_states_close(comp, ref, "float32", name)


def test_a_state_the_compiled_side_lacks_fails(rng):
    comp, ref = _twins("adam", rng)
    del comp.state[0]["v"]
    with pytest.raises(AssertionError, match="states"):
        assert_states_close(comp, ref, "float32", "adam")


def test_step_counts_that_differ_fail(rng):
    comp, ref = _twins("adam", rng)
    comp._steps = [s + 1 for s in comp._steps]
    with pytest.raises(AssertionError, match="step counts"):
        assert_states_close(comp, ref, "float32", "adam")

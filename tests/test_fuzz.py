"""Random optimizer calls against every catalog spec, driven by hypothesis.

The generators and the checks are tests/fuzz's (the standalone fuzzer runs the same
code from a numpy RNG for 10,000 calls); here hypothesis makes the choices through a
``Draw`` whose ``integer`` is ``st.integers``. One example is one call: random
parameters (shapes, dtypes, memory layouts), hyperparameters and runtime options (valid
and invalid, extremes included), warm-up steps, maybe ``set_hyper``, then a step with
random gradients. Every phase must succeed or raise a TypeError/ValueError (a
FloatingPointError where ``nonfinite``/``clip_global_norm`` ask for it); a failure must
leave parameters, states and step counts bit-identical and the optimizer usable; a
success must equal the reference interpreter (the same states, dtypes and shapes; in
calls whose numbers stay in [1e-30, 1e12], tests/fuzz TAME, NaN and inf at the same
places and values within helpers.assert_close, float32 rounding noise judged against a
float64 run, tests/fuzz compare); inputs that the rules call invalid must be rejected
and valid ones accepted.

Bounded for CI: ``EXAMPLES`` calls per spec (about 30 s for all of them on a 2-core VM,
plus the artifact builds when this file runs alone: about 2.5 min into the session's
fresh cache), derandomized (the same calls every run), no example database, no
shrinking (a failure prints the whole call instead); the families of tests/helpers.py
(FAMILY_SPECS) one per run, the others with ``--exhaustive``. ``OPTGEN_FUZZ_EXAMPLES=500`` runs
more; ``OPTGEN_FUZZ_SHRINK=1`` lets hypothesis shrink a failure to a smaller call.
"""
import os
import tempfile

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from helpers import assert_close, family_sampled

import fuzz   # tests/fuzz/, the fuzzer's package (tests/ is on sys.path under pytest)

# hypothesis keeps caches in ./.hypothesis even without an example database; keep the
# repository clean (HYPOTHESIS_STORAGE_DIRECTORY still wins when set)
if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
    set_hypothesis_home_dir(tempfile.mkdtemp(prefix="optgen-hypothesis-"))

EXAMPLES = int(os.environ.get("OPTGEN_FUZZ_EXAMPLES", "150"))
PHASES = [Phase.explicit, Phase.generate] + (
    [Phase.shrink] if os.environ.get("OPTGEN_FUZZ_SHRINK") else [])


class HypothesisDraw(fuzz.Draw):
    """tests/fuzz's choices, made by hypothesis."""

    def __init__(self, data):
        self.data = data

    def integer(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))


SPECS = fuzz.spec_list()
# the families (tests/helpers.py, FAMILY_SPECS) one at a time, as in every catalog-wide
# test: a matrix family is a minute of builds here
PARAMS = [pytest.param(s, id=s[0], marks=family_sampled(s[0], "fuzz")) for s in SPECS]


@pytest.mark.parametrize("spec", PARAMS)
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          phases=PHASES, print_blob=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.filter_too_much, HealthCheck.large_base_example])
@given(data=st.data())
def test_random_call(spec, data):
    case = fuzz.generate(HypothesisDraw(data), [spec])
    out = fuzz.run_case(case, close=assert_close)
    assert not out.bug, (f"{out.kind} in phase {out.phase}: {out.exc} {out.message}\n"
                         f"{out.detail}\ncall: {case.short()}")


def test_generator_covers_the_inputs():
    """The numpy-driven generator reaches every kind of input the brief lists, and its
    verdicts mix valid and invalid calls (so neither side of the checks is idle)."""
    import numpy as np
    seen = {"layouts": set(), "dtypes": set(), "shapes": set(), "grads": set(), "expect": set()}
    for i in range(400):
        case = fuzz.generate(fuzz.RngDraw(np.random.default_rng([12, i])), SPECS)
        for p in case.params:
            if isinstance(p, fuzz.ArraySpec):
                seen["layouts"].add(p.layout)
                seen["dtypes"].add(p.dtype)
                seen["shapes"].add(len(p.shape) if p.numel() else "empty")
        for g in case.grads if isinstance(case.grads, list) else []:
            seen["grads"].add(g.kind if g.kind != "array" else g.array.layout)
        seen["expect"].update(case.expect.values())
    assert {"plain", "offset", "misaligned", "strided", "transposed", "readonly"} <= seen["layouts"]
    assert {"float32", "float64", "float16", ">f4", "int32", "bool"} <= seen["dtypes"]
    assert {0, 1, 2, 3, "empty"} <= seen["shapes"]
    assert {"alias-param", "rowsparse", "none", "misaligned", "readonly"} <= seen["grads"]
    assert {"ok", "bad"} <= seen["expect"]

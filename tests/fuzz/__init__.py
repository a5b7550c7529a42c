"""Robustness fuzzing of the trainer-side runtime (a test tool: tests/test_fuzz.py runs it
under hypothesis in CI): random optimizer calls against every
catalog spec, each checked against the rules of docs/runtime.md.

    python tests/fuzz/run.py                                # 10,000 calls, seed 0
    python tests/fuzz/run.py --calls 2000 --seed 7 --json fuzz.json
    python tests/fuzz/run.py --replay 0:1234                # call 1234 of seed 0, in-process, verbose

One *call* is: construct a compiled optimizer and a ``backend="reference"`` twin from
identical copies of random parameters (shapes with 0, 1, 15, 16, 17 and prime sizes,
0-d to 4-D; float32/float64, float16/bfloat16 with and without multi_precision, and
invalid dtypes: int, bool, complex, big-endian, long double), laid out plainly, at byte
offsets inside a bigger buffer (element-aligned or not), strided, transposed, Fortran
ordered, read-only, broadcast, ndarray subclasses; random hyperparameters (valid and
invalid: 0, -0, 1e-38, 1e38, 1e-310, 5e-324, NaN, inf, negatives, str, None, lists,
0-d arrays, numpy scalars, lr sequences, callables and schedules), runtime options and
parameter groups; 0-2 warm-up steps; maybe a ``set_hyper``; then one step with random
gradients (extremes, NaN/Inf, wrong dtype/shape/layout, aliasing the parameter, a
state or another parameter, row-sparse, None, wrong count) and, for SVRG, extra inputs.

Each phase must either succeed or raise a TypeError or ValueError (FloatingPointError
where ``nonfinite``/``clip_global_norm`` ask for it). A failed phase must leave
parameters, states and step counts bit-identical, the reference twin must fail the same
way, and the optimizer must go on as if the call never happened (one more good step,
compared). A successful phase must give what the reference interpreter gives (the same
states, dtypes and shapes; in calls whose numbers stay in [1e-30, 1e12], see TAME, NaN
and ±inf at the same places and finite values within the tests' tolerances, float32
rounding noise judged against a float64 run, see ``compare``) and must not write to its
gradients. Inputs the rules call invalid must be rejected; valid ones accepted.

The generator is written against a tiny ``Draw`` interface (``integer(lo, hi)``), so the
same code runs from a numpy RNG here and from hypothesis in tests/test_fuzz.py, which
imports this package. Calls run in child processes (``--chunk`` calls each): a child that
dies (a segfault) is counted as a crash of the call it was running, with the seed and
call index to replay, and the rest of its chunk goes on in a new child.

Modules, in import order: draw (the Draw interface; specs, arrays, learning rates and
hyperparameter values to draw from), case (one call and the rules' verdict on its
inputs), generate (drawing a whole call), checks (verdicts, tolerances, snapshots, the
compiled-vs-reference comparison), world (running a call's phases), runner (run_case),
driver (the command line; run.py is its script).
"""
from .case import Case, GradSpec
from .checks import BUG_KINDS, TAME, TYPED, assert_close, compare
from .draw import ArraySpec, Draw, RngDraw, artifact, spec_list
from .generate import generate
from .runner import run_case
from .world import Outcome, World, categorize

__all__ = ["ArraySpec", "BUG_KINDS", "Case", "Draw", "GradSpec", "Outcome", "RngDraw", "TAME",
           "TYPED", "World", "artifact", "assert_close", "categorize", "compare", "generate",
           "run_case", "spec_list"]

"""A matrix rule's whole-matrix reductions (``norm``) on the CPU: compiled in fixed row
chunks, in parallel, in vector lanes (templates/kernel_llvm_matrix.py.j2), and equal to
the float64 sum for shapes that reach every branch of that schedule."""
import numpy as np
import pytest

import optgen
from optgen.compiler import targets
from optgen.compiler.plan import make_plan

NORMED = """\
from optgen.dsl import Spec, norm
spec = Spec("normed")
lr = spec.hyper("lr", 0.5, "lr >= 0", "step")
spec.shape_flag("matrix", "ndim == 2")


@spec.update
def normed(w, grad, flags):
    if not flags.matrix:
        return {w: w - lr * grad}
    return {w: w - lr * grad / norm(grad) - lr * grad.T.T / norm(w)}
"""


def _spec(tmp_path) -> str:
    path = tmp_path / "normed.py"
    path.write_text(NORMED)
    return str(path)


def test_a_matrix_reduction_runs_in_parallel_vector_lanes(tmp_path):
    plan = make_plan(_spec(tmp_path), targets.TARGETS["llvm"])
    reduce = [p.script for k in plan.kernels for p in k.passes
              if p.lowered.view == "matrix" and p.lowered.kind == "reduce"]
    assert len(reduce) >= 2      # (||grad|| and ||w||, in each variant)
    for script in reduce:
        assert "for ch in T.parallel(T.int64(64)):" in script
        assert "T.vectorized" in script and "T.unroll" in script


# (rows, cols): parallel and serial; rows under, over and not a multiple of the 64
# chunks; columns under one vector, with and without a remainder of chains and a tail
SHAPES = [(5, 3), (3, 40_000), (130, 301), (301, 130), (64, 512), (1000, 37)]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_matrix_reduction_is_the_float64_sum(tmp_path, shape):
    rng = np.random.default_rng(1)
    w0, g = rng.standard_normal(shape), rng.standard_normal(shape)
    opt = optgen.create(_spec(tmp_path), [w0.copy()])
    opt.step([g.copy()])
    want = w0 - 0.5 * g / np.sqrt(np.sum(g * g)) - 0.5 * g / np.sqrt(np.sum(w0 * w0))
    np.testing.assert_allclose(opt.params[0], want, rtol=1e-13, atol=1e-15)

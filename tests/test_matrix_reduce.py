"""A matrix rule's whole-matrix reductions (``norm``) on the CPU: compiled in fixed row
chunks, in parallel, in vector lanes (templates/kernel_llvm_matrix.py.j2), and equal to
the float64 sum for shapes that reach every branch of that schedule."""
import numpy as np
import pytest

import optgen
from optgen.compiler import targets
from optgen.compiler.plan import make_plan

SHARED = """\
from optgen.dsl import Spec, matmul, norm, repeat
spec = Spec("shared")
lr = spec.hyper("lr", 0.5, "lr >= 0", "step")
spec.shape_flag("matrix", "ndim == 2")


@spec.update
def shared(w, grad, flags):
    if not flags.matrix:
        return {w: w - lr * grad}
    x = 0.5 * grad + w * w
    y = matmul(x / norm(x), x.T)
    z = repeat(2, lambda v: v - 0.1 * matmul(y, v) / (1.0 + norm(1.5 * v + x)), x)
    return {w: w - lr * z / norm(w)}
"""


def _spec(tmp_path) -> str:
    path = tmp_path / "shared.py"
    path.write_text(SHARED)
    return str(path)


def _oracle(w0: np.ndarray, g: np.ndarray) -> np.ndarray:
    x = 0.5 * g + w0 * w0
    y = (x / np.sqrt(np.sum(x * x))) @ x.T
    v = x
    for _ in range(2):
        v = v - 0.1 * (y @ v) / (1.0 + np.sqrt(np.sum((1.5 * v + x) ** 2)))
    return w0 - 0.5 * v / np.sqrt(np.sum(w0 * w0))


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
SHAPES = [(6, 9), (3, 40_000), (130, 301), (301, 130), (64, 512), (1000, 37)]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_matrix_reduction_is_the_float64_sum(tmp_path, shape):
    rng = np.random.default_rng(1)
    w0, g = rng.standard_normal(shape), rng.standard_normal(shape)
    opt = optgen.create(_spec(tmp_path), [w0.copy()])
    opt.step([g.copy()])
    np.testing.assert_allclose(opt.params[0], _oracle(w0, g), rtol=1e-12, atol=1e-14)


def test_a_reduced_value_another_pass_reads_is_stored_by_the_reduction(tmp_path):
    """x is summed for its norm and read by the product's operand pass: the reduction's
    pass stores it and that pass reads it back, not grad and w; the reductions in the
    loop and of the final pass store nothing."""
    rng = np.random.default_rng(2)
    opt = optgen.create(_spec(tmp_path), [rng.standard_normal((6, 9))])
    launches = opt._param_kernel(0).launches
    reduces = [ln for ln in launches if ln["kind"] == "reduce"]
    assert len(reduces) == 3 and reduces[0]["outputs"] == ["_tmp0"]
    readers = [ln for ln in launches if ln["kind"] == "update" and "_tmp0" in ln["buffers"]
               and "w" not in ln["outputs"]]
    assert readers and all("grad" not in ln["buffers"] for ln in readers)
    assert all(ln["outputs"] == [] for ln in reduces[1:])

"""A spec's graph is lowered with each shared node once, and builds in time linear in it:
values whose unfolded tree grows large go through scratch buffers (a leaf to TVM's
analyzer, optgen/compiler/scratch.py), so deep reuse neither blows up the TVMScript nor
TVM's passes; the kernels still equal the reference interpreter."""
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import optgen
from optgen.compiler import pipeline, targets

HERE = os.path.dirname(os.path.abspath(__file__))
ATAN2 = os.path.join(HERE, "specs", "adam_atan2_poly.py")

DEEP = textwrap.dedent('''\
    """Depth 30, every node used twice."""
    from optgen.dsl import Spec

    spec = Spec("deep_shared", __doc__)
    lr = spec.hyper("lr", 0.1, "lr >= 0", "learning rate")


    @spec.update
    def deep_shared(w, grad, flags):
        x = grad
        for _ in range(30):
            x = 0.5 * x + 0.25 * x
        return {w: w - lr * x}
    ''')


def _build_in_time(path: str, out: str, limit: float) -> None:
    """Build in a fresh process, killed after ``limit`` seconds (a blow-up never ends)."""
    code = f"import optgen; optgen.build({path!r}, out={out!r})"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=limit)


def _compiled_vs_reference(path: str, dtype, steps: int = 3) -> float:
    rng = np.random.default_rng(0)
    shapes = [(37,), (5, 19)]
    params = [rng.standard_normal(s).astype(dtype) for s in shapes]
    twins = [optgen.create(path, [p.copy() for p in params], backend=b)
             for b in ("compiled", "reference")]
    for _ in range(steps):
        grads = [rng.standard_normal(s).astype(dtype) for s in shapes]
        for opt in twins:
            opt.step([g.copy() for g in grads])
    return max(float(np.max(np.abs(a - b))) for a, b in zip(twins[0].params, twins[1].params))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_deep_shared_graph_builds_in_seconds_and_equals_reference(tmp_path, dtype):
    path = tmp_path / "deep_shared.py"
    path.write_text(DEEP)
    _build_in_time(str(path), str(tmp_path / "out"), 60)
    assert _compiled_vs_reference(str(path), dtype) <= \
        4 * np.finfo(dtype).eps


def test_adam_atan2_written_out_builds_fast_and_equals_reference(tmp_path):
    _build_in_time(ATAN2, str(tmp_path / "out"), 60)
    assert _compiled_vs_reference(ATAN2, np.float32) <= 1e-6


def test_tvmscript_grows_with_the_graph_not_its_tree(tmp_path):
    path = tmp_path / "deep_shared.py"
    path.write_text(DEEP)
    *_, scripts = pipeline.front_end(str(path), targets.get("llvm"))
    text = scripts["deep_shared_f32"][0]
    assert len(text) < 40_000 and re.search(r"\b_t\d+\[", text)     # ~60 lets per body; a tree: 2**30
    *_, plain = pipeline.front_end(os.path.join(HERE, "..", "specs", "adam.py"),
                                   targets.get("llvm"))
    assert not any(re.search(r"\b_t\d+\[", s) for s, _ in plain.values())  # small: unchanged


@pytest.mark.parametrize("target", ["c", "opencl"])
def test_other_targets_build_the_written_out_atan2(tmp_path, target):
    code = (f"import optgen; optgen.build({ATAN2!r}, target={target!r}, "
            f"out={str(tmp_path)!r})")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=90)

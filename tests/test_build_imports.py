"""What a build imports: ml_dtypes (0.6 s of a cold build here) is kept out of tvm_ffi's
and TVM's imports where the process has not imported it (optgen.core.tvm_runtime
.torch_hidden); numpy bfloat16 arrays of an ml_dtypes imported afterwards still step."""
import os
import subprocess
import sys

ML_DTYPES_LATER = r"""
import sys
import numpy as np
import optgen
w = np.ones(1000, np.float32)
opt = optgen.create("sgd", [w], lr=0.01)
opt.step([np.full(1000, 0.5, np.float32)])          # built: TVM and tvm_ffi imported ...
assert "tvm" in sys.modules and "tvm_ffi" in sys.modules
assert "ml_dtypes" not in sys.modules, "the build imported ml_dtypes"   # ... without it
import ml_dtypes
bf16 = np.dtype(ml_dtypes.bfloat16)
rng = np.random.default_rng(0)
w = rng.standard_normal(1003).astype(bf16)
twins = [optgen.create("sgd", [w.copy()], lr=0.01, momentum=0.9, multi_precision=True,
                       backend=b)
         for b in ("compiled", "reference")]
for _ in range(3):
    g = rng.standard_normal(1003).astype(bf16)
    for o in twins:
        o.step([g.copy()])
a, b = (o.params[0].astype(np.float64) for o in twins)
assert twins[0].params[0].dtype == bf16 and np.array_equal(a, b), np.abs(a - b).max()
print("ok")
"""


def test_a_build_leaves_ml_dtypes_out_and_bfloat16_arrays_still_step(tmp_path):
    env = dict(os.environ, OPTGEN_CACHE_DIR=str(tmp_path))   # (empty: it builds)
    p = subprocess.run([sys.executable, "-c", ML_DTYPES_LATER], capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-2000:]

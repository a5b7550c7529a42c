"""q8's second moments of elements whose gradients come and go (embedding rows of rare
tokens; weights whose gradients shrink beside others in their block) must decay as
float32's do.

Adam's ``v`` moves by (1 - beta2) = 0.1 % a step, far below a code step of q8's map
(0.7 % to 7 % of sqrt(v) in a block's top decade, more below it). Rounded to the nearest
code, a decaying ``v`` whose block's largest value does not decay with it keeps its code
step after step and reads 1.3 to 2 times float32's sqrt(v) after 1,500 steps (300: 1.3; measured
with the compiled kernel and with bench/q8_variants.py's model; stochastic rounding of
the codes measured 1.00): those weights take steps that much smaller. q8 rounds to
nearest today, so this test is marked as the known defect it measures (strict: it fails
as soon as q8 holds, and the mark must then go).
"""
import numpy as np
import pytest

import optgen
from optgen.core import quant

F32 = np.float32


@pytest.mark.xfail(strict=True, reason="q8 rounds codes to nearest: a second moment that "
                   "decays 0.1 % a step beside a steady one in its block keeps its code "
                   "(docs/state-formats.md, q8: where it is still not safe)")
def test_second_moments_of_intermittent_gradients_decay_as_float32s():
    rng = np.random.default_rng(0)
    blocks, steps = 4, 300
    prob = np.ones((blocks, 256))
    prob[:, 128:] = np.logspace(0, -2, 128)        # half a block: gradients now and then
    prob = prob.reshape(-1)
    kw = dict(lr=1e-6, state_format_min_size=0)
    q8 = optgen.create("adam", [np.zeros(prob.size, F32)], state_format="q8", **kw)
    f32 = optgen.create("adam", [np.zeros(prob.size, F32)], **kw)
    for _ in range(steps):
        g = (rng.standard_normal(prob.size) * (rng.random(prob.size) < prob)).astype(F32)
        q8.step([g.copy()])
        f32.step([g.copy()])
    v8 = quant.dequantize(q8.state[0]["v"], q8.state[0]["v__absmax"], "usqrt")
    vf = np.asarray(f32.state[0]["v"], F32)
    idle = (prob < 0.3) & (vf > 0)
    ratio = np.sqrt(v8[idle] / vf[idle])
    # float32 states give 1; the steady half of each block (prob 1) reads 1.04 today
    assert abs(float(np.median(ratio)) - 1.0) < 0.1, np.median(ratio)

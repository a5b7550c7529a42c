"""The step inside backward (optgen/torch/in_backward.py) under torch.compile, on CPU:
AdamW, 10 steps of a small MLP, each way equal to the eager step inside backward.

- a compiled model, backward called eagerly: the hooks step each parameter;
- a compiled train step (forward and backward in one compiled function): backward is a
  graph break, its hooks run eagerly, and Dynamo compiles one frame (the hooks are
  ``torch.compiler.disable``: Dynamo does not trace the optimizer's Python);
- backward traced into the graph (``torch._dynamo.config.trace_autograd_ops``,
  ``fullgraph=True``): the graph accumulates ``.grad`` without running the hooks, so
  nothing steps in backward; ``opt.step()`` then steps the parameters holding a gradient
  (docs/runtime.md, "Stepping inside backward").

Under ZeRO-1 (torch's ZeroRedundancyOptimizer) the step inside backward is refused when
ZeRO makes its local optimizer: a ValueError naming the option and the rule, in a
one-rank gloo group (a subprocess: gloo's threads and ZeRO at interpreter exit).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

import optgen.torch as ot  # noqa: E402

STEPS = 10


def _data():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g))
            for _ in range(STEPS)]


def _train(mode):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = ot.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, step_in_backward=True)
    counter = CompileCounterWithBackend("aot_eager")
    forward = torch.compile(model, backend=counter) if mode == "model" else model

    def step(x, y):
        torch.nn.functional.mse_loss(forward(x), y).backward()

    if mode in ("train_step", "traced_backward"):
        step = torch.compile(step, backend=counter, fullgraph=mode == "traced_backward")
    for x, y in _data():
        step(x, y)
        if mode == "traced_backward":
            assert all(p.grad is not None for p in model.parameters())   # no hook ran
            opt.step()
            opt.zero_grad()
        assert all(p.grad is None for p in model.parameters())
    assert [int(s["step"]) for s in opt.state.values()] == [STEPS] * 4
    return [p.detach().clone() for p in model.parameters()], counter.frame_count


@pytest.fixture(scope="module")
def eager():
    return _train("eager")[0]


@pytest.mark.parametrize("mode", ["model", "train_step"])
def test_compiled_step_in_backward_equals_eager(mode, eager):
    got, frames = _train(mode)
    assert frames == 1, f"Dynamo compiled {frames} frames (the optimizer's own code?)"
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_backward_traced_into_the_graph_steps_in_opt_step(eager):
    # (config.patch, not monkeypatch: monkeypatch's undo deletes a config entry it found
    # through the module's __getattr__, which hides it from every later test)
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        got, _ = _train("traced_backward")
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


ZERO = """
import os, sys, torch, torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
import optgen.torch as ot
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
model = torch.nn.Linear(4, 2)
before = [p.detach().clone() for p in model.parameters()]
try:
    ZeroRedundancyOptimizer(model.parameters(), optimizer_class=ot.AdamW, lr=1e-3,
                            step_in_backward=True)
except ValueError as e:
    print("ValueError:", e)
assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
assert all(p._post_accumulate_grad_hooks is None for p in model.parameters())
zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=ot.AdamW, lr=1e-3)
model(torch.ones(3, 4)).sum().backward()
zero.step()
print("plain ZeRO steps:", not torch.equal(before[0], model.weight.detach()))
sys.stdout.flush()
dist.destroy_process_group()
os._exit(0)
"""


def test_zero1_refuses_step_in_backward_at_construction(tmp_path):
    r = subprocess.run([sys.executable, "-c", ZERO, str(tmp_path / "store")],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("ValueError: torch_adamw: step_in_backward with zero1 is refused: step_in_backward "
            "steps each parameter as its gradient completes; under ZeroRedundancyOptimizer "
            "(ZeRO-1)") in r.stdout, r.stdout
    assert "plain ZeRO steps: True" in r.stdout, r.stdout

"""bench/memory_count.py, the counter behind bench/memory_bench.py's bytes per parameter,
on cases whose answer is known from the sizes alone: torch's AdamW (4 + 4 + 8 B), the
gradient freed in backward (only the largest one alive at once), a master copy, memory
shared between a tensor and a numpy view (counted once), and a buffer the optimizer keeps
outside itself (found by the gc sweep), a tensor subclass that names a non-tensor among
its inner tensors (DTensor names its device mesh)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from memory_count import Intervals, measure, tensor_extents  # noqa: E402

ELSEWHERE: dict = {}     # where the "hidden" optimizer below keeps a buffer


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(),
                               torch.nn.Linear(128, 32))


def loss_of(model: torch.nn.Module) -> torch.Tensor:
    return model(torch.randn(8, 64)).pow(2).mean()


N = 64 * 128 + 128 + 128 * 32 + 32     # the MLP's parameters
STEP_BYTES = 4 * 4 / N                 # torch's four float32 "step" scalars


def test_torch_adamw_is_16_bytes_per_parameter():
    r = measure(mlp(), lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True), loss_of,
                warmup=1)
    pp = r.per_param()
    assert r.n_params == N
    assert (pp["weights"], pp["grads"], pp["master"], pp["other"]) == (4.0, 4.0, 0.0, 0.0)
    assert pp["states"] == pytest.approx(8.0 + STEP_BYTES, abs=1e-12)
    assert pp["total"] == pytest.approx(16.0 + STEP_BYTES, abs=1e-12)
    assert r.peak.where in ("before step", "after step")
    assert r.per_param(r.steady)["total"] == pytest.approx(12.0 + STEP_BYTES, abs=1e-12)


def test_gradients_freed_in_backward_leave_the_largest_alive():
    class InBackward:
        def __init__(self, params):
            self.opts = {p: torch.optim.SGD([p], lr=0.1) for p in params}

            def hook(p):
                self.opts[p].step()
                p.grad = None
            self.handles = [p.register_post_accumulate_grad_hook(hook) for p in params]

        def step(self):
            pass

        def zero_grad(self, set_to_none=True):
            pass
    r = measure(mlp(), InBackward, loss_of, warmup=1)
    pp = r.per_param()
    assert pp["grads"] == 64 * 128 * 4 / N       # the first layer's weight, alone
    assert pp["states"] == 0.0 and pp["total"] == pytest.approx(4.0 + pp["grads"], abs=1e-12)
    assert r.peak.where == "grad ready"
    assert r.per_param(r.steady)["total"] == 4.0


class Shadowed(torch.optim.SGD):
    """SGD keeping a float32 "master" of each parameter, a momentum it also holds as a
    numpy view, and (``hide``) a buffer of 1000 float32 outside itself."""

    def __init__(self, params, hide=False):
        super().__init__(params, lr=0.1)
        self.masters = {"master": [p.detach().clone() for p in self.param_groups[0]["params"]]}
        self.moms = [torch.zeros_like(p) for p in self.param_groups[0]["params"]]
        self.views = [m.numpy() for m in self.moms]
        if hide:
            ELSEWHERE["buffer"] = np.zeros(1000, np.float32)


def test_master_views_and_memory_outside_the_optimizer():
    try:
        r = measure(mlp(), lambda p: Shadowed(p, hide=True), loss_of, warmup=1)
        pp = r.per_param()
        assert (pp["weights"], pp["master"], pp["grads"], pp["states"]) == \
            (4.0, 4.0, 4.0, 4.0)               # the numpy views share the momenta's memory
        assert pp["other"] == 4000 / N
        assert pp["total"] == pytest.approx(16.0 + 4000 / N, abs=1e-12)
    finally:
        ELSEWHERE.clear()


def test_intervals_count_overlaps_once():
    iv = Intervals()
    assert iv.add(100, 50) == 50
    assert iv.add(120, 10) == 0                # inside
    assert iv.add(140, 40) == 30               # overlaps the end
    assert iv.add(0, 300) == 220               # swallows everything
    assert iv.covers(10, 20) and not iv.covers(290, 20)


class _Wrapper(torch.Tensor):
    """A tensor subclass as DTensor is one: its data in an inner tensor, and a name in
    ``__tensor_flatten__`` that is no tensor (DTensor's ``device_mesh``)."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor, mesh: object):
        t = torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)
        t.inner, t.mesh = inner, mesh
        return t

    def __tensor_flatten__(self):
        return ["inner", "mesh"], None

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"{func} (not needed: the counter reads storages only)")


def test_a_subclass_counts_its_inner_tensors_only():
    inner = torch.zeros(100)
    got = list(tensor_extents(_Wrapper(inner, object())))
    assert got == [(inner.untyped_storage().data_ptr(), 400)]

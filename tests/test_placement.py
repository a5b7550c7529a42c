"""The torch drop-ins' kernels run where the parameters are (optgen/torch/placement.py)."""
import pytest

torch = pytest.importorskip("torch", reason="the torch drop-ins need torch")

import optgen.torch as ot  # noqa: E402
from optgen.torch import placement  # noqa: E402


def test_the_target_follows_the_first_parameter(monkeypatch):
    cpu = torch.zeros(3)
    assert placement.default_target([cpu]) == "llvm"
    assert placement.default_target([]) == "llvm"
    monkeypatch.setitem(placement.TARGETS, "meta", "cuda")   # (a device type this machine has)
    meta = torch.zeros(3, device="meta")
    groups = placement.listed([{"params": iter([]), "lr": 1.0},
                               {"params": (p for p in [meta, cpu])}])
    assert [len(g["params"]) for g in groups] == [0, 2]     # generators read once, kept
    assert placement.default_target(groups) == "cuda"
    assert placement.default_target(placement.listed(iter([meta]))) == "cuda"


def test_a_drop_in_on_cpu_tensors_builds_for_llvm_from_a_generator():
    model = torch.nn.Linear(4, 3)
    opt = ot.AdamW(model.parameters(), lr=1e-2)       # a generator: read by both sides
    assert opt._target == "llvm" and len(opt.param_groups[0]["params"]) == 2
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    seeds = ot.seeds.LAMB((p for p in model.parameters()), lr=1e-2)
    assert seeds._target == "llvm" and len(seeds.param_groups[0]["params"]) == 2


def test_a_device_without_a_target_is_refused_naming_it(monkeypatch):
    with pytest.raises(TypeError, match="is on meta.*built for llvm"):
        ot.Adam([torch.nn.Parameter(torch.zeros(3, device="meta"))], lr=1e-2)

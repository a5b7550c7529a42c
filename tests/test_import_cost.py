"""``import optgen.torch`` costs little beyond ``import torch``: it does not import
torch._dynamo (torch.compile's, 0.5-0.7 s) nor torch.distributed.tensor (FSDP2's DTensor,
0.5-0.8 s) until they are used; the hooks still run eagerly under torch.compile
(tests/test_step_in_backward_compile_zero.py) and DTensors are still recognized
(tests/test_distributed.py)."""
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="the torch drop-ins need torch")

PROBE = """
import sys, torch
before = set(sys.modules)
import optgen.torch
print(sorted(m for m in set(sys.modules) - before
             if m in ("torch._dynamo", "torch.distributed.tensor", "torch._inductor")))
"""


def test_import_optgen_torch_leaves_dynamo_and_dtensor_unimported():
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


def test_dtensor_is_recognized_once_its_module_is_imported():
    from optgen.torch import fsdp
    from torch.distributed.tensor import DTensor   # noqa: F401 (imports the module)
    import torch
    assert not fsdp.is_dtensor(torch.zeros(2))
    assert fsdp._dtensor() is sys.modules["torch.distributed.tensor"]

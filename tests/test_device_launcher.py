"""The device launcher's pieces that need no GPU: grids, binary choice, clear errors."""
import numpy as np
import pytest

import optgen
from optgen.runtime import ArtifactError
from optgen.runtime.device import DeviceError, blocks, pick_binary

BIN = {a: {"ptx": f"kernels.{a}.ptx", "cubin": f"kernels.{a}.cubin"}
       for a in ("sm_80", "sm_90")}


@pytest.mark.parametrize("grid,dims,expected", [
    ({"extent": ["n"], "per_block": 256, "max_blocks": None}, {"n": 0}, 0),
    ({"extent": ["n"], "per_block": 256, "max_blocks": None}, {"n": 1}, 1),
    ({"extent": ["n"], "per_block": 256, "max_blocks": None}, {"n": 256}, 1),
    ({"extent": ["n"], "per_block": 256, "max_blocks": None}, {"n": 257}, 2),
    ({"extent": ["n"], "per_block": 256, "max_blocks": 1024}, {"n": 10**8}, 1024),
    ({"extent": ["B", "R"], "per_block": 1, "max_blocks": None}, {"B": 3, "R": 5}, 15),
    ({"extent": [], "per_block": 1, "max_blocks": None}, {}, 1),
])
def test_blocks(grid, dims, expected):
    assert blocks(grid, dims) == expected


@pytest.mark.parametrize("cc,expected", [
    (80, "kernels.sm_80.cubin"), (90, "kernels.sm_90.cubin"),
    (86, "kernels.sm_80.ptx"), (120, "kernels.sm_90.ptx"),
])
def test_pick_binary_exact_cubin_else_newest_lower_ptx(cc, expected):
    assert pick_binary(BIN, cc) == expected


def test_pick_binary_older_gpu_is_a_clear_error():
    with pytest.raises(DeviceError, match=r"code for sm_80, sm_90 only; this GPU is sm_75: "
                                          r"rebuild with --arch sm_75"):
        pick_binary(BIN, 75)


def test_arch_specific_code_is_not_used_on_other_gpus():
    binaries = {"sm_90a": {"ptx": "a.ptx", "cubin": "a.cubin"}}
    assert pick_binary(binaries, 90) == "a.cubin"
    with pytest.raises(DeviceError):
        pick_binary(binaries, 100)


def test_source_only_target_cannot_step_and_says_why():
    art = optgen.get_artifact("sgd", "metal")
    w = np.zeros(8, np.float32)
    with pytest.raises(TypeError, match=r"built for metal"):
        optgen.create(art, [w]).step([np.ones(8, np.float32)])
    with pytest.raises(ArtifactError, match=r"cannot run metal kernels; the artifact has "
                                            r"their source only"):
        art.function(art.kernels[0].launches[0]["symbol"])

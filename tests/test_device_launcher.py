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


# -- the CUDA launcher's arguments, with a stand-in for CuPy (the kernels run on a GPU only) --
class _Ctx:
    def __init__(self, ptr=0):
        self.ptr, self.id = ptr, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _FakeCuPy:
    """What _CuPy.run touches of CuPy: devices, streams, host-to-device copies."""
    def __init__(self):
        self.copies = []
        current = _Ctx(ptr=0)
        self.cuda = type("cuda", (), {"Device": staticmethod(lambda i=None: _Ctx()),
                                      "get_current_stream": staticmethod(lambda: current)})

    def asarray(self, x):
        self.copies.append(np.array(x))
        return ("device scalars", len(self.copies))


def test_cuda_launcher_passes_torch_pointers_and_copies_scalars_once_per_value_set():
    """A torch CUDA tensor reaches the kernel as its data pointer (an 8-byte unsigned
    integer: the bits of the kernel's pointer parameter), with its storage offset; the
    host scalars are copied to the device once per distinct value set, not per call."""
    torch = pytest.importorskip("torch", reason="the launcher's torch branch")
    from optgen.runtime.backends import cuda as device
    be = device._CuPy.__new__(device._CuPy)
    be.cp, be._streams, be._scalar_cache = _FakeCuPy(), {}, {}
    be._torch_stream = lambda dev: None          # (torch's stream: CUDA only)
    calls = []
    kernel = lambda grid, block, args: calls.append((grid, block, args))   # noqa: E731
    spec = {"dims": {"n": ("w", 0)}}
    entry = {"grid": {"extent": ["n"], "per_block": 256, "max_blocks": None, "threads": 256},
             "params": [{"buffer": "w"}, {"buffer": "g"}, {"scalars": True},
                        {"dim": "n", "type": "int64_t"}]}
    base = torch.zeros(1000)
    w, g = base[100:400], torch.ones(300)                # w: a view at an offset
    for scalars in ([0.5, 2.0], [0.5, 2.0], [0.25, 2.0]):
        be.run(spec, {"w": w, "g": g}, np.array(scalars), [(kernel, entry)])
    assert len(calls) == 3 and all(c[0] == (2,) and c[1] == (256,) for c in calls)
    wp, gp, sdev, n = calls[0][2]
    assert type(wp) is np.uint64 and int(wp) == base.data_ptr() + 100 * 4
    assert int(gp) == g.data_ptr() and type(n) is np.int64 and n == 300
    assert [list(c) for c in be.cp.copies] == [[0.5, 2.0], [0.25, 2.0]]   # one copy each
    assert calls[1][2][2] == sdev and calls[2][2][2] != sdev
    be.run(spec, {"w": w[:0], "g": g[:0]}, np.array([0.5, 2.0]), [(kernel, entry)])
    assert len(calls) == 3                                # an empty tensor: no launch

"""The memory-bandwidth anchors the optimizer rows are measured by: STREAM's copy
``a = b`` and triad ``a = b + s*c`` and the in-place axpy ``a = a + s*b``, as optgen's TVM
kernels (optgen.compiler.anchors), torch calls and numpy ufuncs. Bytes are STREAM's count
(copy 8, triad and axpy 12 per fp32 element); bench/README.md says why the triad's
store moves more than it counts and the axpy's does not."""
from __future__ import annotations

import numpy as np

from optgen.benchmark import Contender

TRIAD_B = 12                  # STREAM: read b, c; write a (the axpy: read a, b; write a)
TRIAD_TVM, TRIAD_TORCH = "triad optgen-tvm", "triad torch (add out=)"
TRIAD_NUMPY, AXPY_TORCH = "triad numpy (2 ufuncs)", "axpy torch (a.add_(b))"
TORCH_NOTES = {"copy": "a.copy_(b)", "triad": "add out=", "axpy": "a.add_(b)"}


def make_anchors(torch, n: int, which: tuple[str, ...]) -> list[Contender]:
    """optgen's TVM anchors and torch's, on shared arrays of ``n`` fp32 elements."""
    from optgen.compiler import anchors
    kernels = anchors.functions("float32")
    arrays = {x: np.full(n, v, np.float32) for x, v in (("a", 1.0), ("b", 2.0), ("c", 0.5))}
    s = np.array([0.5], np.float32)
    ta, tb, tcc = (torch.from_numpy(arrays[x]) for x in "abc")
    torch_calls = {"copy": lambda: ta.copy_(tb),
                   "triad": lambda: torch.add(tb, tcc, alpha=0.5, out=ta),
                   "axpy": lambda: ta.add_(tb, alpha=0.5)}
    out = []
    for name in which:
        bufs = [arrays[x] for x in anchors.KERNELS[name][0]] + [s]
        fn = kernels[name]
        nbytes = anchors.stream_bytes(name, "float32") * n
        out.append(Contender(f"{name} optgen-tvm", lambda fn=fn, b=bufs: fn(*b), nbytes,
                             "anchor", note=f"optgen.compiler.anchors {name}_f32"))
        out.append(Contender(f"{name} torch ({TORCH_NOTES[name]})", torch_calls[name], nbytes,
                             "anchor", note=f"torch, {torch.get_num_threads()} threads"))
    return out


COPY_TORCH, COPY_B = "copy torch (a.copy_(b))", 8     # STREAM: read b, write a


def make_torch_copy(torch, n: int) -> Contender:
    a, b = torch.zeros(n), torch.full((n,), 2.0)
    return Contender(COPY_TORCH, lambda: a.copy_(b), COPY_B * n, "anchor",
                     note="a.copy_(b): STREAM's copy, 8 B an element, all torch threads")


def make_numpy_triad(n: int) -> Contender:
    a, b, c = np.zeros(n, np.float32), np.full(n, 1.0, np.float32), np.full(n, 2.0, np.float32)
    s = np.float32(3.0)

    def step():
        np.multiply(c, s, out=a)
        np.add(a, b, out=a)
    return Contender(TRIAD_NUMPY, step, TRIAD_B * n, "anchor",
                     note="np.multiply(c, s, out=a); np.add(a, b, out=a): single-threaded, "
                          "two passes over a")


def make_torch_triad(torch, n: int) -> Contender:
    a, b, c = torch.zeros(n), torch.full((n,), 1.0), torch.full((n,), 2.0)
    return Contender(TRIAD_TORCH, lambda: torch.add(b, c, alpha=3.0, out=a), TRIAD_B * n,
                     "anchor", note="torch.add(b, c, alpha=s, out=a): one pass, all torch "
                                    "threads")


def make_torch_axpy(torch, n: int) -> Contender:
    a, b = torch.zeros(n), torch.full((n,), 2.0)
    return Contender(AXPY_TORCH, lambda: a.add_(b, alpha=3.0), TRIAD_B * n, "anchor",
                     note="a.add_(b, alpha=s): reads a, b, writes a in place, like Adam "
                          "(no write-allocate)")

"""A matrix rule's products that the runtime computes with the arrays' own library
instead of a compiled kernel:

- every product on a target with ``library_matmul`` (cuda: cuBLAS through CuPy or
  torch; numpy's BLAS for CPU arrays);
- on any target, a product rounded to bfloat16 (``"round": "bfloat16"`` in its launch,
  optgen/compiler/plan_matrix.py: torch.optim.Muon's Newton-Schulz) when its arrays
  are torch tensors: ``torch.addmm`` on bfloat16 copies of the operands, torch's own
  bfloat16 product (oneDNN on CPUs: AMX or AVX-512 BF16 where the CPU has them,
  float32 arithmetic on bfloat16 values where it has not; cuBLAS on GPUs), so the
  result is the one torch computes. The operands are bfloat16 values held in float32
  buffers, so the copies are exact.

The product is ``out = round(alpha * op(a) @ op(b) + beta * addend)``, alpha and beta
scalars of the kernel's scalar array (1 when absent), round only when asked.

On the torch route a plan keeps the bfloat16 copies of its temporaries (``Copies``):
a temporary a product wrote is read by the next product as the bfloat16 tensor torch
returned, and copied into its float32 buffer only when an elementwise pass reads it;
a copy made of a float32 buffer serves until an elementwise pass writes that buffer;
the loop buffer's copy pass copies the bfloat16 tensor. So the Newton-Schulz
iterations run on torch's bfloat16 tensors alone, as torch's own loop does, and only
the passes before and after them read and write float32.

May import: numpy, optgen.core.rounding, tensors. torch and CuPy only when their arrays
are passed.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from optgen.core.rounding import nearest_bfloat16
from . import tensors


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


ROUNDED = "bfloat16"


def _rounded(ln: Mapping[str, Any]) -> bool:
    return ln["kind"] == "matmul" and ln["matmul"].get("round") == ROUNDED


class Copies:
    """The bfloat16 copies of one plan's temporaries (``_tmp<k>``, ``_loop<k>``) on the
    torch route (see the module doc). ``launches``: the plan's launches."""

    def __init__(self, launches: Sequence[Mapping[str, Any]]):
        rounded = [ln["matmul"] for ln in launches if _rounded(ln)]
        self.kept = {m[r] for m in rounded for r in ("a", "b", "addend", "out")
                     if m.get(r) and m[r].startswith("_")}
        self.copies: dict[str, Any] = {}
        self.stale: set[str] = set()     # float32 buffers behind their copy

    def of(self, name: str, x: Any) -> Any:
        """Buffer ``name`` (array ``x``) in bfloat16."""
        import torch
        if name not in self.kept:
            return x.to(torch.bfloat16)
        if name not in self.copies:
            self.copies[name] = x.to(torch.bfloat16)
        return self.copies[name]

    def wrote(self, name: str, x: Any, value: Any) -> None:
        """A product wrote ``value`` (bfloat16) into buffer ``name`` (array ``x``): kept,
        its float32 buffer is filled when a pass reads it."""
        if name in self.kept:
            self.copies[name] = value
            self.stale.add(name)
        else:
            x.copy_(value)

    def writing(self, ln: Mapping[str, Any], fn: Callable) -> Callable:
        """``fn``, the call of a pass that is no rounded product: it first fills the
        float32 buffers it reads that are behind their copies, and drops the copies of
        those it writes; a copy of one temporary into another (``"copy"``, the loop
        buffer's) copies the bfloat16 tensor instead, when there is one."""
        names = list(ln["buffers"])
        outs = [b for b in ln.get("outputs", ()) if b in self.kept]
        if not outs and not any(b in self.kept for b in names):
            return fn
        src = ln.get("copy") if len(outs) == 1 and ln.get("copy") in self.kept else None

        def call(*args: Any) -> None:
            if src is not None and src in self.copies:
                self.copies[outs[0]] = self.copies[src]
                self.stale.add(outs[0])
                return
            for j, b in enumerate(names):
                if b in self.stale:
                    args[j].copy_(self.copies[b])
                    self.stale.discard(b)
            for b in outs:
                self.copies.pop(b, None)
            fn(*args)
        return call


def library_product(ln: Mapping[str, Any], scalars: Sequence[str], arrays: Sequence[Any],
                    library: bool, copies: Copies) -> Callable | None:
    """The call for matmul launch ``ln`` (``fn(*buffers, scalars)``, as a kernel) when
    the runtime computes it (``library``: the target leaves every product to it), over
    the kernel's scalar names ``scalars`` and its ``arrays`` (in ``ln["buffers"]``
    order; a name where the array is given per call); None: the compiled kernel runs.
    ``copies``: the plan's bfloat16 copies (the torch route)."""
    m, pos = ln["matmul"], {b: j for j, b in enumerate(ln["buffers"])}
    rnd = m.get("round")
    torch_route = rnd == ROUNDED and is_torch(arrays[pos[m["out"]]])
    if not (library or torch_route):
        return None
    ia, ib, io, ta, tb = pos[m["a"]], pos[m["b"]], pos[m["out"]], m["trans_a"], m["trans_b"]
    ic = pos[m["addend"]] if m.get("addend") else None
    ja, jb = (scalars.index(m[k]) if m.get(k) else None for k in ("alpha", "beta"))

    def product(*args: Any) -> None:
        s = args[-1]
        a, b, out = args[ia], args[ib], args[io]
        alpha = 1.0 if ja is None else float(s[ja])
        beta = 1.0 if jb is None else float(s[jb])
        c = args[ic] if ic is not None else None
        if torch_route:   # (copied before the transposes: a strided copy is slow)
            a, b = copies.of(m["a"], a), copies.of(m["b"], b)
            c = copies.of(m["addend"], c) if c is not None else None
            value = _torch_addmm(a.T if ta else a, b.T if tb else b, c, alpha, beta)
            copies.wrote(m["out"], out, value)
            return
        a, b = a.T if ta else a, b.T if tb else b
        tensors.matmul_into(a, b, out)
        if alpha != 1.0:
            out *= alpha
        if c is not None:
            out += beta * c if beta != 1.0 else c
        if rnd == "bfloat16":
            out[...] = _nearest(out)
    return product


def _torch_addmm(a: Any, b: Any, c: Any, alpha: float, beta: float) -> Any:
    """torch's bfloat16 ``addmm`` of bfloat16 ``a``, ``b``, ``c`` (``mm`` without an
    addend and alpha 1)."""
    import torch
    if c is None and alpha == 1.0:
        return torch.mm(a, b)
    if c is None:
        c = torch.zeros((), dtype=torch.bfloat16, device=a.device)
    return torch.addmm(c, a, b, beta=beta if c.dim() else 0.0, alpha=alpha)


def _nearest(x: Any) -> Any:
    """``x`` rounded to the nearest bfloat16, ties to even (optgen.core.rounding), on
    ``x``'s device: numpy or CuPy, float32 or float64 (through float32)."""
    if isinstance(x, np.ndarray):
        return nearest_bfloat16(x).astype(x.dtype)
    import cupy as xp
    f = xp.ascontiguousarray(x, dtype=xp.float32)
    bits = f.view(xp.uint32)
    near = (bits + xp.uint32(0x7FFF) + ((bits >> 16) & xp.uint32(1))) & xp.uint32(0xFFFF0000)
    nan = (bits & xp.uint32(0x7FFFFFFF)) > xp.uint32(0x7F800000)
    return xp.where(nan, f, near.view(xp.float32)).astype(x.dtype)

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

May import: numpy, optgen.core.rounding, tensors. torch and CuPy only when their arrays
are passed.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from optgen.core.rounding import nearest_bfloat16
from . import tensors


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def library_product(ln: Mapping[str, Any], scalars: Sequence[str], arrays: Sequence[Any],
                    library: bool) -> Callable | None:
    """The call for matmul launch ``ln`` (``fn(*buffers, scalars)``, as a kernel) when
    the runtime computes it (``library``: the target leaves every product to it), over
    the kernel's scalar names ``scalars`` and its ``arrays`` (in ``ln["buffers"]``
    order; a name where the array is given per call); None: the compiled kernel runs."""
    m, pos = ln["matmul"], {b: j for j, b in enumerate(ln["buffers"])}
    rnd = m.get("round")
    torch_route = rnd == "bfloat16" and is_torch(arrays[pos[m["out"]]])
    if not (library or torch_route):
        return None
    ia, ib, io, ta, tb = pos[m["a"]], pos[m["b"]], pos[m["out"]], m["trans_a"], m["trans_b"]
    ic = pos[m["addend"]] if m.get("addend") else None
    ja, jb = (scalars.index(m[k]) if m.get(k) else None for k in ("alpha", "beta"))

    def product(*args: Any) -> None:
        s = args[-1]
        a, b, out = args[ia], args[ib], args[io]
        a, b = a.T if ta else a, b.T if tb else b
        alpha = 1.0 if ja is None else float(s[ja])
        beta = 1.0 if jb is None else float(s[jb])
        c = args[ic] if ic is not None else None
        if torch_route:
            out.copy_(_torch_addmm(a, b, c, alpha, beta))
            return
        tensors.matmul_into(a, b, out)
        if alpha != 1.0:
            out *= alpha
        if c is not None:
            out += beta * c if beta != 1.0 else c
        if rnd == "bfloat16":
            out[...] = _nearest(out)
    return product


def _torch_addmm(a: Any, b: Any, c: Any, alpha: float, beta: float) -> Any:
    """torch's bfloat16 ``addmm`` (``mm`` without an addend and alpha 1)."""
    import torch
    a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
    if c is None and alpha == 1.0:
        return torch.mm(a, b)
    c = torch.zeros((), dtype=torch.bfloat16, device=a.device) if c is None else \
        c.to(torch.bfloat16)
    return torch.addmm(c, a, b, beta=beta if c.dim() else 0.0, alpha=alpha)


def _nearest(x: Any) -> Any:
    """``x`` rounded to the nearest bfloat16 (numpy; CuPy arrays through the host)."""
    if isinstance(x, type(nearest_bfloat16(0.0))):
        return nearest_bfloat16(x).astype(x.dtype)
    import cupy
    return cupy.asarray(nearest_bfloat16(cupy.asnumpy(x))).astype(x.dtype)

"""Stage 6b — the device ABI: which device kernels each PrimFunc became, their
parameters in the order the generated code declares them, and their launch grids.

TVM splits every thread-bound loop nest of a PrimFunc into a device kernel named
``<symbol>_kernel``, ``<symbol>_kernel_1``, ..., and sorts each kernel's parameters by
name (buffer pointers first, then the scalar shape variables it reads) rather than in
PrimFunc order (tvm-notes §5). A runtime that launches the kernels itself (CuPy,
pyopencl) needs exactly that, so it is read back from the generated source here and
checked against what the schedule asked for.
"""
from __future__ import annotations

from ..errors import BuildError
from .lower import SCALARS, LoweredKernel
from .plan import PassPlan
from .targets import Signature, Target

DOC = ("device_kernels[symbol] lists the device kernels of one kernel pass in launch "
       "order; each is launched on a 1-D grid of grid.threads threads per block and "
       "min(grid.max_blocks, ceil(prod(dims[extent]) / grid.per_block)) blocks (no launch "
       "when that is 0), with 'params' in order: {'buffer': name} a device pointer to that "
       "buffer of the pass, {'scalars': true} a device array of the pass's scalars (kernel "
       "dtype), {'dim': name} a shape variable of C type 'type'. 'dims' says where each "
       "shape variable comes from: [buffer, axis] of the arrays passed to the pass.")


def _params(plist: list[tuple[str, str]], k: LoweredKernel, kernel: str,
            dims: dict) -> list[dict]:
    by_var = {f"{b.var}_ptr": b.name for b in k.buffers}
    params = []
    for ctype, name in plist:
        raw = f"{ctype} {name}"
        if name in by_var:
            params.append({"buffer": by_var[name], "type": ctype})
        elif name == f"{SCALARS}_ptr":
            params.append({"scalars": True, "type": ctype})
        elif name in dims:
            params.append({"dim": name, "type": ctype})
        else:
            raise BuildError(f"device kernel {kernel} has a parameter {raw!r} that optgen "
                             "cannot bind (not a buffer, the scalars or a shape variable)")
    return params


def device_kernels(tg: Target, found: dict[str, Signature] | None,
                   passes: list[PassPlan]) -> dict[str, dict]:
    """symbol -> {"kernels": [...], "buffers", "writes", "dims"} for every pass;
    ``found``: the device kernels the target's signature reader found in what was built
    (Target.signatures), None where it has no reader; grids and shape variables as the
    plan (the schedule) declares them."""
    target = tg.name
    out = {}
    for p in passes:
        if p.library:    # computed by the runtime's BLAS (cuBLAS): no device kernel
            continue
        k, grids, dims = p.lowered, p.grids, p.dims
        kernels = []
        for j, grid in enumerate(grids):
            name = f"{k.symbol}_kernel" + (f"_{j}" if j else "")
            entry = {"name": name, "grid": grid.to_json()}
            if found is not None:
                if name not in found:
                    raise BuildError(f"{target} source has no kernel {name} (the schedule "
                                     f"of {k.symbol} expected {len(grids)})")
                bounds, plist = found[name]
                if bounds is not None and bounds != grid.to_json()["threads"]:
                    raise BuildError(f"{name}: launch bounds {bounds}, schedule "
                                     f"{grid.to_json()['threads']}")
                if plist is not None:
                    entry["params"] = _params(plist, k, name, dims)
            kernels.append(entry)
        extra = f"{k.symbol}_kernel_{len(kernels)}"
        if found is not None and extra in found:
            raise BuildError(f"{target} source has an unexpected kernel {extra}")
        # (a q8 pass also stores the new absmax of the q8 states it writes)
        writes = k.writes + [c for s, f in k.formats.items() if s in k.writes
                             for c in f.companions(s, 0)]
        out[k.symbol] = {"kernels": kernels, "buffers": [b.name for b in k.buffers],
                         "writes": writes, "dims": dims}
    return out

"""``backend="reference"``: the reference interpreter (optgen/core/reference.py) in
place of one parameter's kernels, on the same arrays the kernels would take (numpy
views of them), writing the new values back as the kernels store them: block-quantized
states as codes, bf16sr states rounded stochastically, a split master as the bfloat16
weight and its correction.

May import: numpy, tensors; core: formats, reference, rounding.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from . import tensors
from optgen.core import formats, reference, rounding


def host_values(k: Any, arrays: Mapping[str, Any], lib: str
                ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The kernel's arrays as numpy views, and the interpreter's inputs made from them
    (formatted states decoded, a split master's float32 weight)."""
    host = {n: tensors.numpy_view(a, lib) for n, a in arrays.items()}
    values = {**host, **{n: f.dequantize((host[n], *(host[c] for c in f.companions(n, 0))),
                                         host["w"].shape)
                         for n, f in k.formats.items()}}
    split, corr = formats.master(k.state_format), formats.CORRECTION
    if split:      # the float32 master, from the bfloat16 weight and its correction
        values["w"] = split.family.decode(split, host["w"], host[corr])
    return host, values


def step(k: Any, arrays: Mapping[str, Any], slot: Any, scalars: np.ndarray,
         given: Mapping[str, float] | None = None) -> None:
    """One parameter's update (its record ``slot``: library, dims), in place; ``given``:
    the totals of the sums over all parameters (``partial_sums``)."""
    host, values = host_values(k, arrays, slot.lib)
    split, corr = formats.master(k.state_format), formats.CORRECTION
    at = dict(zip(k.scalars, scalars))
    new = reference.evaluate(k.ir, k.dtype, values, k.buffer_axes, at, slot.dims,
                             [*k.stochastic, *(["w"] if split else [])], given)
    for name, value in new.items():
        if split and name == "w":
            host["w"][...], host[corr][...] = split.family.encode(split, value)
        elif name in k.formats:        # block-quantized: the codes of the new values
            fmt = k.formats[name]
            for arr, new in zip([host[name], *(host[c] for c in fmt.companions(name, 0))],
                                fmt.quantize(value)):
                arr[...] = new
        elif name in k.stochastic:   # bf16sr: rounded stochastically (then exact)
            hi, lo = (int(at[n]) for n in rounding.KEY_SCALARS)
            host[name][...] = rounding.to_bfloat16(value, hi << 16 | lo, k.stochastic[name])
        else:
            host[name][...] = value


def partial_sums(k: Any, arrays: Mapping[str, Any], lib: str, d: tuple[int, int, int],
                 scalars: np.ndarray) -> dict[str, float]:
    """One parameter's parts of the kernel's sums over all parameters."""
    _, values = host_values(k, arrays, lib)
    return reference.partial_sums(k.ir, k.dtype, values, k.buffer_axes,
                                  dict(zip(k.scalars, scalars)), d, k.global_sums)


def lazy(k: Any, full: Mapping[str, Any], rows: Any, indices: Any, nrows: int,
         scalars: np.ndarray) -> None:
    """The rule on the rows ``indices`` of the arrays ``full`` only (row-sparse
    gradient ``rows``: one row per index), in place."""
    sub = {"grad": rows.reshape(-1),
           **{n: a.reshape(nrows, -1)[indices].reshape(-1) for n, a in full.items()}}
    split, corr = formats.master(k.state_format), formats.CORRECTION
    if split:      # the float32 master, from the bfloat16 weight and its correction
        sub["w"] = split.family.decode(split, sub["w"], sub[corr])
    new = reference.evaluate(k.ir, k.dtype, sub, k.buffer_axes,
                             dict(zip(k.scalars, scalars)), (1, 1, rows.size),
                             ["w"] if split else ())
    if split:
        new["w"], new[corr] = split.family.encode(split, new["w"])
    for name, value in new.items():
        full[name].reshape(nrows, -1)[indices] = value.reshape(len(indices), -1)

"""Every check of what a trainer hands the optimizer: options, parameters, gradients,
row-sparse gradients and the spec's extra inputs (refresh statistics: refresh.py).

Each check is a function of what it checks (and the optimizer's name, ``owner``, for
the message); it returns the validated value or raises the typed error of
docs/reliability.md (TypeError for a wrong kind, ValueError for a wrong value) and
changes nothing. The optimizer runs them all before any kernel does.

May import: numpy, formats, state (a parameter's state arrays), tensors, sparse.
"""
from __future__ import annotations

import math
import numbers
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import backends, composition, state, tensors
from optgen.core import formats
from .sparse import RowSparse

NONFINITE = (None, "skip", "raise")
NO_INPUTS: Mapping[str, Any] = MappingProxyType({})   # a parameter's extra inputs, none


def label(i: int, names: Sequence[str | None] | None = None) -> str:
    """``parameter 3 (fc.weight)``: a parameter as messages name it."""
    name = names[i] if names is not None else None
    return f"parameter {i}" + (f" ({name})" if name else "")


# -- options ---------------------------------------------------------------------------
def check_bool(owner: str, what: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{owner}: {what} must be a bool, got {value!r}")
    return bool(value)


def check_master(owner: str, multi_precision: Any, master_format: Any) -> bool:
    """multi_precision as master_format says: "fp32" turns it on, a split format
    (optgen/core/formats/split.py) takes the place of the float32 master it keeps."""
    mp = check_bool(owner, "multi_precision", multi_precision)
    formats.mastered(owner, None, master_format)          # (a ValueError if unknown)
    if master_format not in (None, "fp32") and mp:
        composition.refuse(owner, f"master_{master_format}", "multi_precision")
    return mp or master_format == "fp32"


def check_positive(owner: str, what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {what} must be a float, got "
                        f"{type(value).__name__} {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{owner}: invalid {what}={value!r}: must be finite and > 0")
    return float(value)


def check_nonfinite(owner: str, value: Any) -> str | None:
    if value not in NONFINITE:
        raise ValueError(f"{owner}: nonfinite must be None, 'skip' or 'raise', "
                         f"got {value!r}")
    return value


def check_scaling(owner: str, hypers: Mapping[str, Any], loss_scale: float,
                  clip_global_norm: float | None) -> None:
    """loss_scale and clip_global_norm act through the spec's rescale_grad."""
    if "rescale_grad" not in hypers:
        for what, off in (("loss_scale", loss_scale == 1.0),
                          ("clip_global_norm", clip_global_norm is None)):
            if not off:
                raise ValueError(f"{owner}: {what} needs a spec with rescale_grad "
                                 "(the runtime scales gradients through it; use "
                                 "gradient_preprocessing or rescale_and_clip in the spec)")


def check_begin_num_update(owner: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{owner}: begin_num_update must be an int >= 0, got {value!r}")
    return int(value)


# -- parameters ------------------------------------------------------------------------
def check_params(owner: str, artifact: Any, params: Sequence[Any],
                 multi_precision: bool, backend: str = "compiled") -> list[str]:
    """Each parameter's library, after checking it is an array on the artifact's
    device (host arrays for the reference interpreter, whatever the target), of a
    supported dtype, contiguous, writeable, aligned and not sharing memory with another."""
    device = "cpu" if backend == "reference" else backends.get(artifact.target).device
    plain, mixed = artifact.dtypes, artifact.mixed_dtypes
    sr = formats.PARAM in artifact.state_format    # stochastic_rounding=True or a split master
    split = formats.master(artifact.state_format)
    libs, ranges = [], []
    for i, p in enumerate(params):
        lib = tensors.library(p)
        if lib is None:
            raise TypeError(f"{owner}: parameter {i} must be an array (numpy.ndarray, "
                            f"torch.Tensor or cupy.ndarray), got {type(p).__name__}")
        dev = tensors.device(p, lib)
        if dev.split(":")[0] != device:
            raise TypeError(f"{owner}: parameter {i} is on {dev}, but this optimizer's "
                            f"kernels are built for {artifact.target} ({device}); "
                            f"build for a matching target or move the parameter")
        if lib == "numpy" and not p.dtype.isnative:
            raise TypeError(f"{owner}: parameter {i} has dtype {p.dtype.str} in "
                            "non-native byte order; the kernels read native byte order "
                            "(convert with .astype(p.dtype.newbyteorder('=')))")
        dt = tensors.dtype_name(p, lib)
        if split and dt not in ("float32", split.dtype):
            raise TypeError(f"{owner}: parameter {i} has dtype {dt}; master_format="
                            f"{split.name!r} steps {split.dtype} parameters (float32 ones "
                            "keep their plain kernels)")
        if dt in tensors.LOW_PRECISION and dt in mixed:
            if not multi_precision and not (dt == "bfloat16" and sr):
                raise TypeError(f"{owner}: parameter {i} has dtype {dt}; low-precision "
                                "parameters need multi_precision=True (a float32 master "
                                "copy and float32 states)" + (
                                    ", or for bfloat16 master_format='split16' or 'split8' "
                                    "(the master kept as the weight and a 16- or 8-bit "
                                    "correction) or stochastic_rounding=True (stepped "
                                    "without a master)" if dt == "bfloat16" else ""))
        elif dt not in plain:
            raise TypeError(f"{owner}: parameter {i} has dtype {dt}; the kernels "
                            f"support {', '.join(plain + list(mixed))}"
                            + (" (low precision with multi_precision=True)" if mixed else ""))
        if not tensors.is_contiguous(p, lib):
            raise ValueError(f"{owner}: parameter {i} is not C-contiguous "
                             "(pass a contiguous copy and keep that array)")
        if not tensors.is_writeable(p, lib):
            raise ValueError(f"{owner}: parameter {i} is read-only; "
                             "parameters are updated in place")
        if lib == "numpy" and not p.flags.aligned:
            raise ValueError(f"{owner}: parameter {i} is not aligned to its "
                             f"{p.itemsize}-byte elements (data at address "
                             f"{p.ctypes.data:#x}); copy it into an aligned array "
                             "(optgen.aligned_full) and keep that array")
        r = tensors.address_range(p, lib)
        for j, q in enumerate(ranges):
            if tensors.overlaps(r, q):
                raise ValueError(f"{owner}: parameters {j} and {i} share memory")
        libs.append(lib)
        ranges.append(r)
    if sr and not split and not formats.stochastic(artifact.state_format) and not any(
            tensors.dtype_name(p, lib) == "bfloat16" for p, lib in zip(params, libs)
            if not multi_precision):
        raise ValueError(f"{owner}: stochastic_rounding=True rounds bfloat16 stores, and "
                         "there are none: no state is kept as bfloat16 (state_format='bf16') "
                         "and no bfloat16 parameter is stepped without a master copy")
    return libs


def check_names(owner: str, names: list[str | None], param_names: Sequence[str] | None,
                n: int) -> list[str | None]:
    """The parameters' names: the dict keys of ``params`` or ``param_names``."""
    if param_names is None:
        return names
    if any(x is not None for x in names):
        raise TypeError(f"{owner}: param_names given, but params already names its "
                        "parameters (dict keys)")
    param_names = list(param_names)
    if len(param_names) != n or not all(isinstance(x, str) for x in param_names):
        raise ValueError(f"{owner}: param_names must be {n} strings, one per parameter")
    return param_names


def check_centralization(owner: str, slots: Sequence[Any], centralized: Sequence[bool]
                         ) -> None:
    """grad_centralization (``centralized[group]``) applies to 4-D convolution weights
    only (``slots``: the parameters' records)."""
    for s in slots:
        if centralized[s.group] and len(s.array.shape) != 4:
            raise ValueError(f"{owner}: {label(s.index, [x.name for x in slots])} has shape "
                             f"{tuple(s.array.shape)}; grad_centralization applies "
                             f"only to 4-D convolution weights (group {s.group})")


def check_heads(owner: str, artifact: Any, slots: Sequence[Any], groups: Sequence[Any],
                flags_of: Callable[[int], dict], new: Mapping[int, tuple] = MappingProxyType({})
                ) -> None:
    """A rule that reduces over groups of rows (``head_mean``) views a parameter as
    [heads, R/heads, C]: heads (``new``: set_hyper's values) is an int >= 1 dividing R."""
    for i, s in enumerate(slots):
        for h in sorted({ln["heads"] for k in artifact.kernels if k.flags == flags_of(i)
                         for ln in k.launches if "heads" in ln}, key=str):
            n = new.get(s.group, (groups[s.group].hyper,))[0][h] if isinstance(h, str) else h
            what, shape = f"{h if isinstance(h, str) else 'heads'}={n!r}", tuple(s.array.shape)
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"{owner}: {what} for {label(i, [x.name for x in slots])}: "
                                 "the number of heads rows are grouped into is an int >= 1")
            if s.split is not None or s.dims[1] % n:
                why = "is split across ranks" if s.split is not None else \
                    f"has {s.dims[1]} rows, which {what} does not divide" + (
                        f" (a {len(shape)}-D parameter is one row; grouping rows by heads "
                        "needs a 2-D weight)" if len(shape) < 2 else "")
                raise ValueError(f"{owner}: {label(i, [x.name for x in slots])} (shape "
                                 f"{shape}) {why}: its rule views the whole weight as "
                                 "[heads, rows / heads, cols]")


def check_kernels(owner: str, artifact: Any, slots: Sequence[Any], *,
                  flags_of: Callable[[int], dict], multi_precision: bool) -> None:
    """Each parameter (``slots``: their records) has a kernel for its dtype under its
    flags (``flags_of(i)``; a matrix rule has float32/float64 kernels and bfloat16 ones
    with a float32 or split master; state formats compute in float32, and q8/q4 apply
    to elementwise rules), and a matrix rule (products) gets a 2-D parameter
    (specs pick it by a shape flag, so that fails only for a spec that does not)."""
    names = [s.name for s in slots]
    for i, s in enumerate(slots):
        p = s.array
        dt, flags = tensors.dtype_name(p, s.lib), flags_of(i)
        master = multi_precision or dt not in tensors.LOW_PRECISION
        k = artifact.kernel_for(dt, flags, s.formatted, master)
        plain = artifact.kernel_for(dt, flags, master=master) \
            if k is None and s.formatted else None
        if plain is not None:
            why = (f"its rule (flags {flags}) multiplies matrices; of the state formats "
                   "only 'bf16' applies to matrix rules, on the CPU targets"
                   ) if plain.matrix else (
                f"state formats compute in float32 (float32 parameters, or float16/bfloat16 "
                f"ones with multi_precision=True), not {dt}")
            raise TypeError(f"{owner}: {label(i, names)} ({int(np.prod(p.shape))} elements) "
                            f"would store its states as {artifact.state_format}, but {why}; "
                            "raise state_format_min_size above its size to keep its states "
                            "in full precision")
        if k is None:
            have = [x for x in artifact.kernels if x.flags == flags]
            if not have:   # (e.g. float16 states on OpenCL: no kernel for these flags)
                raise TypeError(f"{owner}: no kernel for dtype {dt} with flags {flags} "
                                f"({label(i, names)}): the {artifact.target} build has "
                                "none for these flags")
            matrix = " (matrix products run in float32 or float64: bfloat16 parameters " \
                "step through a float32 master, multi_precision=True or master_format " \
                "'split16'/'split8')" if any(x.matrix for x in have) else ""
            raise TypeError(f"{owner}: {label(i, names)} has dtype {dt}; its rule (flags "
                            f"{flags}) has kernels for "
                            f"{', '.join(sorted({x.param_dtype for x in have}))} only{matrix}")
        if k.matrix and len(p.shape) not in (1, 2):   # (1-D: a 1 x n row)
            raise ValueError(f"{owner}: {label(i, names)} has shape {tuple(p.shape)}; "
                             f"its rule (flags {k.flags}) multiplies matrices and needs a "
                             "2-D parameter (or a 1-D one, a row)")


# -- gradients and extra inputs ----------------------------------------------------------
def check_grads(owner: str, slots: Sequence[Any], grads: Any, what: str, *,
                cache: Any = None, row_sparse: Callable[[Any, RowSparse], Any] | None = None,
                among: Sequence[int] | None = None) -> list[Any]:
    """``grads`` (or the extra input ``what``) as a list, each one checked against its
    parameter (``slots``: their records; a gradient must not overlap the parameter's
    state arrays either). With a ``cache`` (gradients only: runtime/gradcache.py) only
    the gradients it has not seen, in this form and place, are checked, and noted
    there; ``row_sparse(slot, g)`` checks a RowSparse gradient; ``among``: only those
    parameters have one (a step in parts)."""
    if tensors.library(grads) is not None:
        raise TypeError(f"{owner}: {what} must be a list of arrays, got a single array")
    grads = list(grads)
    if len(grads) != len(slots):
        raise ValueError(f"{owner}: got {len(grads)} "
                         f"{'gradients' if what == 'grads' else what + ' arrays'} for "
                         f"{len(slots)} parameters")
    label_ = "gradient" if what == "grads" else what
    # (with a cache: the gradients not given, checked and noted last step as they lie now)
    for i in (range(len(grads)) if among is None else among) if cache is None else \
            cache.unseen(grads, slots, among):
        p, g, lib = slots[i].array, grads[i], slots[i].lib
        if g is None:   # no gradient (torch's p.grad is None): the parameter is skipped
            if cache is not None:
                cache.none(i)
            continue
        if isinstance(g, RowSparse) and what == "grads":
            g = grads[i] = row_sparse(slots[i], g)
            if cache is not None and isinstance(g, RowSparse):
                cache.none(i)
            elif cache is not None:   # (dense: a new array, made from the checked rows)
                cache.note(i, g, lib)
            continue
        if type(g) is not type(p) and tensors.library(g) != lib:
            kind = {"numpy": "numpy.ndarray", "torch": "torch.Tensor",
                    "cupy": "cupy.ndarray"}[lib]
            raise TypeError(f"{owner}: {label_} {i} must be a {kind} like parameter {i}, "
                            f"got {type(g).__name__}")
        if g.shape != p.shape:
            raise ValueError(f"{owner}: {label_} {i} has shape {tuple(g.shape)}, "
                             f"parameter {i} has shape {tuple(p.shape)}")
        if lib == "numpy" and not g.dtype.isnative:
            raise TypeError(f"{owner}: {label_} {i} has dtype {g.dtype.str} in "
                            "non-native byte order; the kernels read native byte order")
        if g.dtype != p.dtype:
            raise TypeError(f"{owner}: {label_} {i} has dtype "
                            f"{tensors.dtype_name(g, lib)}, parameter {i} has dtype "
                            f"{tensors.dtype_name(p, lib)}")
        r = None
        if lib == "numpy":
            if not g.flags.c_contiguous:
                raise ValueError(f"{owner}: {label_} {i} is not C-contiguous")
            if not g.flags.aligned:
                raise ValueError(f"{owner}: {label_} {i} is not aligned to its "
                                 f"{g.itemsize}-byte elements (data at address "
                                 f"{g.ctypes.data:#x}); pass an aligned copy (np.array(g))")
            if not g.flags.writeable:
                raise ValueError(f"{owner}: {label_} {i} is read-only; the kernels "
                                 "take arrays through DLPack, which cannot pass read-only "
                                 "numpy arrays: pass a writeable copy (np.array(g)); the "
                                 "optimizer never writes to it")
            shared = np.may_share_memory(g, p) or any(
                np.may_share_memory(g, s) for s in state.arrays(slots[i].state))
        else:
            if tensors.device(g, lib) != tensors.device(p, lib):
                raise TypeError(f"{owner}: {label_} {i} is on {tensors.device(g, lib)}, "
                                f"parameter {i} is on {tensors.device(p, lib)}")
            if not tensors.is_contiguous(g, lib):
                raise ValueError(f"{owner}: {label_} {i} is not C-contiguous")
            r = tensors.address_range(g, lib)
            shared = tensors.overlaps(r, tensors.address_range(p, lib)) or any(
                tensors.overlaps(r, tensors.address_range(s, lib))
                for s in state.arrays(slots[i].state))
        if shared:
            raise ValueError(f"{owner}: {label_} {i} shares memory with parameter {i} "
                             "or its state; pass a separate gradient array")
        if cache is not None:   # (until g or its parameter moves: gradcache.py)
            cache.note(i, g, lib, r)
    return grads


def check_row_sparse(owner: str, i: int, p: Any, lib: str, g: RowSparse,
                     centralized: bool) -> None:
    """A RowSparse gradient of numpy parameter ``i``: integer indices in range, rows of
    the parameter's row shape and dtype."""
    if lib != "numpy":
        raise TypeError(f"{owner}: gradient {i} is a RowSparse (numpy) gradient, but "
                        f"parameter {i} is a {lib} array")
    if centralized:
        raise TypeError(f"{owner}: gradient {i} is row-sparse, but its group uses "
                        "grad_centralization (dense gradients only)")
    idx, rows = g.indices, g.rows
    if p.ndim == 0:
        raise ValueError(f"{owner}: gradient {i} is row-sparse but parameter {i} is "
                         "a 0-d array (it has no rows)")
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"{owner}: gradient {i}: RowSparse indices must be a 1-D "
                        f"integer array, got {idx.dtype}{list(idx.shape)}")
    if rows.shape != (len(idx),) + p.shape[1:]:
        raise ValueError(f"{owner}: gradient {i}: RowSparse rows have shape "
                         f"{rows.shape}, expected {(len(idx),) + p.shape[1:]}")
    if rows.dtype != p.dtype:
        raise TypeError(f"{owner}: gradient {i}: RowSparse rows have dtype "
                        f"{rows.dtype}, parameter {i} has dtype {p.dtype}")
    if len(idx) and (idx.min() < 0 or idx.max() >= p.shape[0]):
        bad = idx[(idx < 0) | (idx >= p.shape[0])][0]
        raise ValueError(f"{owner}: gradient {i}: row index {bad} is out of range "
                         f"for parameter {i} with {p.shape[0]} rows")


def check_inputs(owner: str, wanted: Mapping[str, str], inputs: Mapping[str, Any],
                 grads: list, slots: Sequence[Any]) -> list[dict[str, Any]]:
    """The spec's extra per-element inputs (e.g. SVRG's grad_snapshot), per parameter,
    each input's arrays checked as gradients are (``slots``: the parameters' records)."""
    want = set(wanted)
    if set(inputs) != want:
        missing, extra = sorted(want - set(inputs)), sorted(set(inputs) - want)
        raise TypeError(f"{owner}: step() " + (f"needs {' and '.join(m + '=[...]' for m in missing)}"
                        if missing else f"got unexpected input {extra[0]!r}")
                        + (f" ({'; '.join(f'{n}: {d}' for n, d in wanted.items())})"
                           if want else ""))
    if not inputs:   # (most specs: one empty mapping for all, read only)
        return [NO_INPUTS] * len(grads)
    per_param: list[dict[str, Any]] = [{} for _ in grads]
    for name, arrays in inputs.items():
        checked = check_grads(owner, slots, arrays, name)
        for i, (a, g) in enumerate(zip(checked, grads)):
            if isinstance(g, RowSparse):
                raise TypeError(f"{owner}: gradient {i} is row-sparse, but {name} "
                                "inputs need dense gradients")
            if g is not None and a is None:
                raise TypeError(f"{owner}: {name} {i} is None but gradient {i} is not")
            per_param[i][name] = a
    return per_param


def gather(owner: str, artifact: Any, slots: Sequence[Any], grads: Any,
           inputs: dict[str, Any], *, cache: Any, row_sparse: Callable[[Any, RowSparse], Any],
           among: Sequence[int] | None = None
           ) -> tuple[list[Any], list[dict[str, Any]], dict[str, Any]]:
    """A step's arrays, checked: the gradients (each noted in ``cache``: a
    runtime.gradcache.GradCache), the spec's extra inputs per parameter, and the
    statistics passed (taken out of ``inputs`` by name; checked when due: refresh.py);
    ``among``: the parameters with a gradient, where the caller knows them."""
    stats = {n: inputs.pop(n) for n in list(inputs) if n in artifact.statistics}
    grads = check_grads(owner, slots, grads, "grads", cache=cache, row_sparse=row_sparse,
                        among=among)
    return grads, check_inputs(owner, artifact.inputs, inputs, grads, slots), stats


def check_seed(owner: str, seed: Any) -> int:
    """The seed of stochastic rounding: an int in [0, 2**63)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or \
            not 0 <= seed < 1 << 63:
        raise ValueError(f"{owner}: seed must be an int in [0, 2**63), got {seed!r}")
    return int(seed)

"""State formats: how a state is stored between steps, chosen per optimizer (and per
state) at run time and compiled into the kernels (``state_format=``).

The format of a state is a storage decision, not part of the algorithm: the kernel
loads the stored value, widens it to its compute dtype (float32), runs the rule
unchanged, and rounds the new value into the format on store, in the same pass.

    "default"  the compute dtype (the parameter's, float32 under mixed precision)
    "bf16", "bf16sr"   cast formats (cast.py): bfloat16, rounded to nearest even or
               stochastically; "bf16" with ``stochastic_rounding=True`` is "bf16sr"
    "q8", "q4"  block-quantized formats (blocked.py): 8-bit or 4-bit codes with one
               float32 absmax per block (elementwise rules only); "q8@128" sets the
               block size (a power of two, at least 32; one block size per request)
    "fp8"      block-scaled E4M3 codes (fp8.py): a byte per element, one float32 scale
               (absmax / 448) per block of 256 ("fp8@<block>"), decoded by arithmetic;
               non-negative states code their square root
    "split16", "split8"   master formats (split.py), not state formats: a bfloat16
               parameter stepped without a float32 master, the master's low bits kept
               in a per-element correction (``master_format=``)

Each family is a ``StateFormat`` registered in registry.py; a request's text parses to
a typed ``Format`` there, and every module asks that value instead of reading the text
(this module's functions take and give the canonical texts, which artifact keys,
manifests and checkpoints hold).

A request is ``"bf16"`` (every tensor state of the rule) or a dict ``{"m": "bf16"}``
(those states; the others keep the default). Scalar states (host float64) and the
square states of matrix rules keep their dtype. Tensors with fewer than
``MIN_SIZE`` elements keep full-precision states (as bitsandbytes does:
``state_format_min_size=``). Format kernels compute in float32: float32 parameters,
or float16/bfloat16 ones with ``multi_precision=True``; float64 parameters get no
format kernel (a TypeError names it).

May import: optgen.core.quant, optgen.core.rounding (nothing of the runtime: the compiler
and the runtime both read it).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from . import cast      # (registers the cast family first: the order of error messages)
from . import blocked   # (registers q8, q4)
from . import fp8       # (registers fp8)
from . import split     # (registers split16, split8: master formats)
from . import registry
from .blocked import NO_BLOCK
from .registry import (ABSMAX, BLOCKED_VIEW, FLAT_VIEWS, Format, FormattedKernel,
                       StateFormat, from_stored, kernel_formats, of, of_map, parse, table)

__all__ = ["ABSMAX", "BLOCKED_VIEW", "NO_BLOCK", "FLAT_VIEWS", "Format", "FormattedKernel",
           "StateFormat", "blocked", "cast", "fp8", "split", "from_stored", "kernel_formats", "of",
           "of_map", "parse", "table"]

PARAM = "w"                      # a request's entry for bfloat16 parameters stepped
                                 # without a master copy (stochastic_rounding=True)
EVERY = "*"                      # a request dict's entry for every tensor state
MASTERS = ("fp32", *split.SPLIT.names)   # master_format's choices (None: the default)
CORRECTION = PARAM + split.CORR  # a split master's correction: a state of the parameter
MIN_SIZE = 4096                  # smaller tensors keep full-precision states
TENSOR_SHAPES = ("param", "row", "col")   # states a format applies to


def request(owner: str, state_format: Any) -> str | dict[str, str] | None:
    """A validated request in its canonical form: None (default), a format name, or a
    dict state -> format (sorted, "default" entries dropped). The key of the artifact
    that holds its kernels is built from this (``key``)."""
    if state_format is None or state_format == "default":
        return None
    if isinstance(state_format, str):
        return _format(owner, "state_format", state_format)
    if not isinstance(state_format, Mapping) or not state_format:
        raise TypeError(f"{owner}: state_format must be a format name ({registry.syntax()}) or a "
                        f"non-empty dict state -> format, got {state_format!r}")
    out = {}
    for name, fmt in sorted(state_format.items(), key=lambda kv: str(kv[0])):
        if not isinstance(name, str):
            raise TypeError(f"{owner}: state_format keys are state names, got {name!r}")
        if fmt is None or fmt == "default":
            continue
        out[name] = _format(owner, f"state_format[{name!r}]", fmt, master=name == PARAM)
    return out or None


def _format(owner: str, what: str, fmt: Any, master: bool = False) -> str:
    parsed = parse(owner, what, fmt)
    if parsed.family is split.SPLIT and not master:
        raise ValueError(f"{owner}: {what} {fmt!r} is a master format: pass it as "
                         f"master_format={fmt!r} (bfloat16 parameters)")
    return str(parsed)


def mastered(owner: str, req: str | dict[str, str] | None, master_format: Any
             ) -> str | dict[str, str] | None:
    """A canonical request with ``master_format`` applied: "split16"/"split8" give it a
    ``PARAM`` entry of that format (kernels for bfloat16 parameters stepped without a
    float32 master, the master's low bits in a correction: split.py); None and "fp32"
    (the float32 master of multi_precision=True) leave it as it is."""
    if master_format is None or master_format == "fp32":
        return req
    if master_format not in MASTERS:
        raise ValueError(f"{owner}: master_format must be one of None, "
                         f"{', '.join(map(repr, MASTERS))}, got {master_format!r}")
    states = {} if req is None else {EVERY: req} if isinstance(req, str) else req
    return dict(sorted({**states, PARAM: master_format}.items()))


def master(fmt: Mapping[str, str]) -> Format | None:
    """The split master format of a format dict (its ``PARAM`` entry), else None."""
    f = fmt.get(PARAM)
    return None if f is None or of(f).family is not split.SPLIT else of(f)


def rounded(owner: str, req: str | dict[str, str] | None, stochastic: Any
            ) -> str | dict[str, str] | None:
    """A canonical request with ``stochastic_rounding=True`` applied: "bf16" states
    become "bf16sr", and the request gains ``PARAM`` ("w": "bf16sr"): kernels for
    bfloat16 parameters stepped without a float32 master, their stores rounded
    stochastically (a request naming every state keeps that as ``EVERY``)."""
    if stochastic is False:
        return req
    if not isinstance(stochastic, bool):
        raise TypeError(f"{owner}: stochastic_rounding must be a bool, got {stochastic!r}")
    states = {} if req is None else {EVERY: req} if isinstance(req, str) else req
    out = {**{n: str(of(f).rounded()) for n, f in states.items()},
           PARAM: str(cast.STOCHASTIC)}
    return dict(sorted(out.items()))          # (canonical: as ``request`` orders a dict)


def stochastic(fmt: Mapping[str, str]) -> list[str]:
    """The states of a format dict that round stochastically."""
    return [n for n, f in fmt.items() if of(f).stochastic and n != PARAM]


def states_of(fmt: Mapping[str, str]) -> dict[str, str]:
    """A format dict without its ``PARAM`` entry: the states' formats."""
    return {n: f for n, f in fmt.items() if n != PARAM}


def key(req: str | dict[str, str] | None) -> str | None:
    """The request as text for artifact keys and folder names: "bf16", "m-bf16.v-bf16"."""
    if req is None:
        return None
    if isinstance(req, str):
        return req
    return ".".join(f"{'all' if n == EVERY else n}-{f}" for n, f in req.items())


def expand(owner: str, req: str | dict[str, str] | None, states: Iterable[Any]
           ) -> dict[str, str]:
    """State name -> format for a spec's states (objects with ``name`` and ``shape``).
    A name is every tensor state; a dict must name tensor states of the spec."""
    if req is None:
        return {}
    states = list(states)
    tensor = [s.name for s in states if s.shape in TENSOR_SHAPES]
    if isinstance(req, str):
        if not tensor:
            raise ValueError(f"{owner}: state_format {req!r}: the rule has no tensor states "
                             "to store in it")
        return {n: req for n in tensor}
    if EVERY in req:                 # every tensor state, then the entries that name one
        return {**expand(owner, req[EVERY], states),
                **expand(owner, {n: f for n, f in req.items() if n != EVERY}, states)}
    shapes = {s.name: s.shape for s in states}
    for name in req:
        if name == PARAM and (of(req[name]) == cast.STOCHASTIC or master(req)):
            continue
        if name not in shapes:
            raise ValueError(f"{owner}: state_format names state {name!r}, which the rule "
                             f"does not have (its states: {', '.join(shapes) or 'none'})")
        if shapes[name] not in TENSOR_SHAPES:
            kind = "a scalar state (kept on the host in float64)" \
                if shapes[name] == "scalar" else f"a {shapes[name]!r} matrix state"
            raise ValueError(f"{owner}: state_format names {name!r}, {kind}: formats apply "
                             "to per-element, row and column states")
    return dict(req)


def check_min_size(owner: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{owner}: state_format_min_size must be an int >= 0, got {value!r}")
    return value


def dtypes(fmt: Mapping[str, str]) -> dict[str, str]:
    """State name -> stored dtype of the states in a cast format (bf16)."""
    return {n: of(f).dtype for n, f in fmt.items() if not of(f).blocked}


def quantized(fmt: Mapping[str, str]) -> list[str]:
    """The states of a block-quantized format (q8, q4)."""
    return [n for n, f in fmt.items() if of(f).blocked]


def block(owner: str, fmt: Mapping[str, str]) -> int | None:
    """The block size of a format dict's block-quantized states (each format's default
    unless "q8@<block>" says otherwise; None without such states); a ValueError where
    its states ask for different ones (one optimizer takes one block size:
    {"m": "q4", "v": "q8@128"} is fine)."""
    sizes = {of(fmt[n]).block for n in quantized(fmt)}
    if len(sizes) > 1:
        raise ValueError(f"{owner}: state_format asks for block sizes "
                         f"{sorted(sizes)}; one optimizer takes one block size")
    return sizes.pop() if sizes else None

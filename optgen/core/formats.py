"""State formats: how a state is stored between steps, chosen per optimizer (and per
state) at run time and compiled into the kernels (``state_format=``).

The format of a state is a storage decision, not part of the algorithm: the kernel
loads the stored value, widens it to its compute dtype (float32), runs the rule
unchanged, and rounds the new value into the format on store, in the same pass.

    "default"  the compute dtype (the parameter's, float32 under mixed precision)
    "bf16"     bfloat16, rounded to nearest even (2 bytes a value instead of 4)
    "bf16sr"   bfloat16, rounded stochastically (optgen/core/rounding.py): unbiased, so
               updates smaller than a bfloat16 step survive on average; also asked
               for as "bf16" with ``stochastic_rounding=True``
    "q8"       block-wise 8-bit codes into a dynamic map, one float32 absmax per 256
               elements (optgen/core/quant.py; elementwise rules only); "q8@128" sets the
               block size (a power of two, at least 32; one block size per request)
    "q4"       block-wise 4-bit codes, two a byte, one float32 absmax per 128 elements:
               the signed 4-bit dynamic map, or for states proven non-negative the
               zero-free linear map (optgen/core/quant.py); "q4@64" sets the block size

A request is ``"bf16"`` (every tensor state of the rule) or a dict ``{"m": "bf16"}``
(those states; the others keep the default). Scalar states (host float64) and the
square states of matrix rules keep their dtype. Tensors with fewer than
``MIN_SIZE`` elements keep full-precision states (as bitsandbytes does:
``state_format_min_size=``). Format kernels compute in float32: float32 parameters,
or float16/bfloat16 ones with ``multi_precision=True``; float64 parameters get no
format kernel (a TypeError names it).

May import: nothing of the runtime (the compiler and the runtime both read it).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

FORMATS = {"bf16": "bfloat16", "bf16sr": "bfloat16",   # format -> the dtype of its
           "q8": "uint8", "q4": "uint8"}              # stored values
QUANT = {"q8": 256, "q4": 128}   # block-wise formats -> their default block size
CAST = ("bf16", "bf16sr")        # formats that are a dtype (the kernel casts on load/store)
STOCHASTIC = {"bf16": "bf16sr"}  # a format -> its stochastically rounded twin
PARAM = "w"                      # a request's entry for bfloat16 parameters stepped
                                 # without a master copy (stochastic_rounding=True)
EVERY = "*"                      # a request dict's entry for every tensor state
ABSMAX = "__absmax"              # a q8/q4 state "v" keeps its block scales as "v__absmax"
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
        raise TypeError(f"{owner}: state_format must be a format name ({_names()}) or a "
                        f"non-empty dict state -> format, got {state_format!r}")
    out = {}
    for name, fmt in sorted(state_format.items(), key=lambda kv: str(kv[0])):
        if not isinstance(name, str):
            raise TypeError(f"{owner}: state_format keys are state names, got {name!r}")
        if fmt is None or fmt == "default":
            continue
        out[name] = _format(owner, f"state_format[{name!r}]", fmt)
    return out or None


def _names() -> str:
    return ", ".join(repr(f) for f in ("default", *FORMATS)) + " ('q8@<block>', 'q4@<block>')"


def _format(owner: str, what: str, fmt: Any) -> str:
    if fmt in FORMATS:
        return fmt
    if isinstance(fmt, str) and fmt[:3] in ("q8@", "q4@"):
        q, size = fmt[:2], fmt[3:]
        if not size.isdigit() or int(size) < 32 or int(size) & (int(size) - 1):
            raise ValueError(f"{owner}: {what} {fmt!r}: the {q} block size must be a power "
                             f"of two of at least 32 ({q}@32, {q}@64, ...), got {size!r}")
        return q if int(size) == QUANT[q] else f"{q}@{int(size)}"
    raise ValueError(f"{owner}: {what} must be one of {_names()}, got {fmt!r}")


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
    out = {**{n: STOCHASTIC.get(f, f) for n, f in states.items()}, PARAM: "bf16sr"}
    return dict(sorted(out.items()))          # (canonical: as ``request`` orders a dict)


def stochastic(fmt: Mapping[str, str]) -> list[str]:
    """The states of a format dict that round stochastically."""
    return [n for n, f in fmt.items() if f == "bf16sr" and n != PARAM]


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
        if name == PARAM and req[name] == "bf16sr":
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
    return {n: FORMATS[f] for n, f in fmt.items() if f in CAST}


def quantized(fmt: Mapping[str, str]) -> list[str]:
    """The states of a block-wise format (q8, q4)."""
    return [n for n, f in fmt.items() if f[:2] in QUANT]


def bits(fmt: str) -> int:
    """The code bits of a block-wise format ("q4@64": 4)."""
    return int(fmt[1])


def block(owner: str, fmt: Mapping[str, str]) -> int:
    """The block size of a format dict's q8/q4 states (256 for q8 and 128 for q4 unless
    "q8@<block>" says otherwise); a ValueError where its states ask for different
    ones (one optimizer takes one block size: {"m": "q4", "v": "q8@128"} is fine)."""
    sizes = {int(f[3:]) if "@" in f else QUANT[f] for n, f in fmt.items()
             if n in quantized(fmt)}
    if len(sizes) > 1:
        raise ValueError(f"{owner}: state_format asks for block sizes "
                         f"{sorted(sizes)}; one optimizer takes one block size")
    return sizes.pop() if sizes else 256

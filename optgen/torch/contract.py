"""Which items of the composition table (runtime/composition.py) a torch drop-in's options
and parameters turn on, and the table's check of them: construction asks the table
whether the active items compose, and nothing else decides.

``options`` (in ``_prepare``, before anything compiles): the step inside backward,
master and state formats, offload, flat, multi_tensor, the global clip, non-finite skips,
loss_scale, agree=<group>, being ZeroRedundancyOptimizer's local optimizer, the
schedule-free spec. ``check_groups`` (in ``_rebuild``, once the groups are known) adds
``capturable`` groups and FSDP2's DTensor parameters.
Imports: fsdp, in_backward_guard.
"""
from __future__ import annotations

from typing import Any, Mapping

from optgen.core import formats
from optgen.runtime import composition
from . import fsdp, in_backward_guard


def _formats(state_format: Any) -> set[str]:
    """The state-format items of a ``state_format`` request (a name or a dict)."""
    req = formats.request("state_format", state_format)
    out = set()
    for text in req.values() if isinstance(req, dict) else [req] if req else []:
        fmt = formats.of(text)
        if fmt.family is not formats.split.SPLIT:   # (a master entry: master_format's)
            out.add("state_q8" if fmt.blocked else "state_bf16")
    return out


def options(spec_name: str, flat: bool, options: Mapping[str, Any], offload: Any,
            agree: Any, step_in_backward: Any) -> set[str]:
    """The active items of a drop-in's options (values already of the right types, or
    checked later by their owners: an item is on only for a value that turns it on)."""
    on = _formats(options.get("state_format"))
    master = options.get("master_format")
    if master in formats.split.SPLIT.names:
        on.add(f"master_{master}")
    if options.get("multi_precision") is True or master == formats.MASTERS[0]:
        on.add("multi_precision")
    flags = {"step_in_backward": step_in_backward is True, "offload": offload is not None,
             "flat": flat is True, "multi_tensor": options.get("multi_tensor", True) is True,
             "clip_global_norm": options.get("clip_global_norm") is not None,
             "nonfinite_skip": options.get("nonfinite") == "skip",
             "loss_scale": options.get("loss_scale", 1.0) != 1.0,
             "agree": agree is not None and not isinstance(agree, str),
             "zero1": in_backward_guard.made_by_zero(),
             "schedule_free": spec_name.startswith("schedule_free")}
    return on | {k for k, v in flags.items() if v}


def checked(spec_name: str, flat: bool, options_: Mapping[str, Any], offload: Any,
            agree: Any, step_in_backward: Any) -> set[str]:
    """``options``' items, checked by the table (a ValueError naming a refused pair)."""
    active = options(spec_name, flat, options_, offload, agree, step_in_backward)
    composition.check(spec_name, active)
    return active


def check_groups(owner: str, active: set[str], param_groups: list[dict[str, Any]]) -> None:
    """The table's check with what the groups add (capturable groups, DTensors)."""
    more = {"capturable": any(g.get("capturable") for g in param_groups),
            "fsdp2": any(fsdp.is_dtensor(p) for g in param_groups for p in g["params"])}
    composition.check(owner, active | {k for k, v in more.items() if v})

"""The composition contract: for every pair of optgen's step options and the torch
features trainers combine them with, whether they compose (and how: who owns the
gradient, when the step runs, which storage is the truth) or are refused (and why, and
when the refusal comes: at construction, or at the first step before anything changes).

Construction reads this table (``check``) and the runtime's late detections raise the
table's text (``refuse``); nothing else decides whether two options meet. The generated
pair test (tests/test_composition_pairs.py) runs every pair on a small model against the
plain path or expects the refusal; docs/reliability.md shows the table.

    composition.check("adamw", {"step_in_backward", "offload"})   # ValueError naming both
    composition.verdict("step_in_backward", "GradScaler").composes  # False

Pure data and lookups: no torch, no numpy. Imports: nothing of optgen's.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable

# -- the items: optgen's options, then the torch features ------------------------------
OPTIONS: dict[str, str] = {
    "step_in_backward": "step each parameter in backward as its gradient completes",
    "accumulating": "opt.accumulating(): backwards inside step nothing",
    "attach_ddp": "opt.attach(ddp_model): DDP's bucket callback steps the bucket",
    "master_split16": "master_format='split16': bf16 weights + 16-bit correction",
    "master_split8": "master_format='split8': bf16 weights + 8-bit correction",
    "multi_precision": "multi_precision=True: a float32 master of a low-precision weight",
    "state_bf16": "state_format='bf16' (and 'bf16sr')",
    "state_q8": "state_format='q8' (and q4, fp8: block-scaled codes)",
    "offload": "offload='cpu': host master and states",
    "capturable": "capturable=True / staged_capture=True: CUDA-graph steps",
    "flat": "flat=True: a group in one buffer, one launch",
    "multi_tensor": "multi_tensor=True: one launch over a table of tensors",
    "clip_global_norm": "clip_global_norm=c: every gradient scaled by one global norm",
    "nonfinite_skip": "nonfinite='skip': a non-finite gradient skips the whole step",
    "loss_scale": "loss_scale=s: gradients divided by s in the kernel",
    "agree": "agree=<group>: ranks agree on each step before it changes anything",
    "fsdp2": "FSDP2 (DTensor shards)",
    "zero1": "ZeroRedundancyOptimizer (ZeRO-1) local optimizer",
    "schedule_free": "schedule-free train()/eval()",
}

FEATURES: dict[str, str] = {
    "torch_compile": "torch.compile of the train step (or of opt.step)",
    "GradScaler": "torch.amp.GradScaler: scale(loss), step(opt), update()",
    "checkpoint_reentrant": "activation checkpointing, use_reentrant=True",
    "checkpoint_nonreentrant": "activation checkpointing, use_reentrant=False",
    "plain_accumulation": "several backward() per step() without accumulating()",
    "freeze_unfreeze": "requires_grad_(False/True) after construction",
    "tied_weights": "one parameter used in several places of the model",
    "write_inplace": "p.copy_, load_state_dict: writes the version counter sees",
    "write_data": "p.data.mul_, p.data.clamp_: writes the version counter misses",
    "replace_data": "p.data = new",
    "lr_scheduler": "torch.optim.lr_scheduler",
    "clip_grad_norm": "torch.nn.utils.clip_grad_norm_ after backward",
    "torch_state_dict": "torch.save(opt.state_dict()) / opt.load_state_dict",
    "reshard_checkpoint": "a checkpoint loaded at another world size",
    "ddp": "DistributedDataParallel",
    "hf_trainer": "the Hugging Face Trainer with its defaults",
    "replaced_optimizer": "a second optimizer made on the same parameters",
    "named_parameters": "model.named_parameters() (or param_names=) given",
}

ITEMS: tuple[str, ...] = (*OPTIONS, *FEATURES)


@dataclass(frozen=True)
class Verdict:
    """One cell: ``composes`` and the text (how, or why not); a refusal's ``when``:
    "construction" (before torch's constructor returns) or "first step" (raised by the
    first hook or step that sees the second item, before anything changes)."""
    composes: bool
    text: str
    when: str = "construction"


def composes(how: str) -> Verdict:
    return Verdict(True, how)


def refused(why: str, when: str = "construction") -> Verdict:
    return Verdict(False, why, when)


TABLE: dict[frozenset, Verdict] = {}


def _rows(section: Iterable[tuple[str, str, Verdict]]) -> None:
    for a, b, v in section:
        if a not in ITEMS or b not in ITEMS or a == b:
            raise KeyError(f"composition table: unknown pair ({a!r}, {b!r})")
        key = frozenset((a, b))
        if key in TABLE:
            raise KeyError(f"composition table: ({a!r}, {b!r}) given twice")
        TABLE[key] = v


# -- the step inside backward: hooks, checkpointing, freezing, replacement -------------
_rows([
])

# -- the step inside backward against trainers' habits (DDP, GradScaler, clipping, loops)
_rows([
])

# -- masters, offload and writes from outside -----------------------------------------
# Where a master and its weight disagree the weight wins: a master refines the weight below
# its precision and never undoes a write (runtime/storage.py, optgen/core/formats/split.py,
# optgen/torch/offload.py). Told by content, not by torch's version counter (which misses
# p.data writes and counts a compiled step's own write-back).
_SPLIT_STALE = {
    "master_split16": "a zeroed weight with a negative correction, an infinite one with a "
                      "positive one: NaN",
    "master_split8": "a zero weight's correction of the other sign, one past the midpoint "
                     "below the first value of a binade",
}
_rows([row for m, stale in _SPLIT_STALE.items() for row in [
    (m, "write_inplace", composes(
        "the weight as written steps: its master is the weight and the old correction's "
        "low bits (within half a bfloat16 step of it), except where the correction cannot "
        f"belong to the weight ({stale}): there the master is the weight. The kernel and "
        "the reference tell by content")),
    (m, "write_data", composes(
        f"as write_inplace: p.data.mul_(mask), p.data.clamp_ are kept ({stale}: the weight)")),
    (m, "replace_data", composes(
        "new data (same shape, dtype, device) starts the correction at zero: the master is "
        "the new weight (new data holding the old values keeps it)")),
    (m, "torch_compile", composes(
        "the compiled step writes weight and correction as the eager one does; its "
        "write-back is no write from outside: bit for bit the eager run")),
    ("offload", m, refused(
        "offload='cpu' keeps a float32 master copy on the host; a split master_format keeps "
        "the master beside the weight on the device: pass one of them")),
    (m, "multi_precision", refused(
        "a split master_format keeps the master as the bfloat16 weight and a correction; "
        "multi_precision=True keeps a float32 copy instead: pass one of them")),
]])
_rows([
    ("master_split16", "master_split8", refused(
        "master_format takes one value: a parameter keeps one correction (a checkpoint of "
        "one loads into the other through the decoded master)")),
    ("multi_precision", "write_inplace", composes(
        "before each step the float32 master takes the weight's value wherever the weight "
        "is not the master rounded to its dtype (elementwise: written elements lose their "
        "digits below it, the others keep them)")),
    ("multi_precision", "write_data", composes(
        "as write_inplace: p.data.mul_(mask) prunes the master too")),
    ("multi_precision", "replace_data", composes(
        "as write_inplace, on the new data (p.data = p.data.clone() loses nothing)")),
    ("multi_precision", "torch_compile", composes(
        "the compiled step's write-back holds the master's rounding, so nothing is taken: "
        "bit for bit the eager run")),
    ("offload", "multi_precision", composes(
        "the host copy is the float32 master (offload keeps one for a low-precision "
        "parameter either way); the device weight gets its rounding after each step")),
    ("offload", "write_inplace", composes(
        "torch's version counter tells: before the step the host master takes the "
        "parameter's values wherever they are not its rounding")),
    ("offload", "write_data", composes(
        "a fingerprint tells (the sum of the parameter's bit patterns, taken on its device "
        "after each copy back), then as write_inplace; a write keeping that sum (a "
        "permutation of the values) is not seen")),
    ("offload", "replace_data", composes(
        "the new data is checked (shape, dtype, device: else the typed error before "
        "anything changes) and the host master takes its values where they are not its "
        "rounding")),
])

# -- checkpoints, state formats, schedule-free ----------------------------------------
_rows([
])

# -- capture, global clip, names -------------------------------------------------------
_rows([
])

# -- everything else -------------------------------------------------------------------
_rows([
])


def verdict(a: str, b: str) -> Verdict:
    """The cell of ``a`` and ``b`` (KeyError for an item or pair the table lacks)."""
    return TABLE[frozenset((a, b))]


def missing() -> list[tuple[str, str]]:
    """Pairs the table does not decide yet (the table test wants none)."""
    return [(a, b) for a, b in itertools.combinations(ITEMS, 2)
            if frozenset((a, b)) not in TABLE]


def refuse(owner: str, a: str, b: str, exc: type = ValueError) -> None:
    """Raise the table's refusal of ``a`` with ``b`` (a pair the table refuses)."""
    v = verdict(a, b)
    if v.composes:
        raise RuntimeError(f"composition table: ({a!r}, {b!r}) composes; nothing to refuse")
    raise exc(f"{owner}: {a} with {b} is refused: {v.text}")


def check(owner: str, active: Iterable[str]) -> None:
    """Refuse the first pair of ``active`` items that the table refuses at construction
    (in the table's item order, so the message is the same every time)."""
    on = [i for i in ITEMS if i in set(active)]
    for a, b in itertools.combinations(on, 2):
        v = TABLE.get(frozenset((a, b)))
        if v is not None and not v.composes and v.when == "construction":
            refuse(owner, a, b)

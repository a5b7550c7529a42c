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
_rows([
])

# -- checkpoints, state formats, schedule-free ----------------------------------------
_rows([
])

# -- capture, global clip, names -------------------------------------------------------
_rows([
    ("capturable", "torch_compile", composes(
        "torch.compile calls the step as one opaque op (optgen::step) at every iteration: its "
        "host half (step counts, lr, bias corrections into the ring of pinned buffers) and its "
        "launches run at each call, as eager steps; a CUDA graph captured around it replays "
        "after opt.stage(), as any capture")),
    ("capturable", "lr_scheduler", composes(
        "a scheduler's new lr in param_groups reaches the next opt.stage() (read as step() "
        "reads it) and goes into every captured graph's scalar buffer; nothing is rebuilt")),
    ("capturable", "step_in_backward", refused(
        "capturable=True steps in a captured graph, not in backward")),
    ("clip_global_norm", "step_in_backward", refused(
        "clip_global_norm needs every gradient first (the norm of all of them)")),
    ("clip_global_norm", "fsdp2", composes(
        "each rank sums the squares of its local shards; the split parameters' parts are "
        "summed across ranks, whole ones counted once: every rank clips by the global norm "
        "one process would find")),
    ("clip_global_norm", "ddp", composes(
        "DDP averages the gradients in backward; step() takes the norm of the averaged "
        "gradients, the same on every rank, and every rank clips alike")),
    ("clip_global_norm", "clip_grad_norm", composes(
        "clip_grad_norm_ scales .grad first, then step() clips the clipped gradients again "
        "by clip_global_norm (nothing more where it is not smaller): clip with one of them")),
    ("clip_global_norm", "multi_tensor", composes(
        "the norm is one sum-of-squares pass per gradient before the launches; the "
        "multi-tensor lists take the clip factor in their scalars (rescale_grad)")),
    ("clip_global_norm", "flat", composes(
        "the sum-of-squares pass reads each parameter's gradient view of the flat buffer; "
        "the flat run takes the clip factor in its scalars")),
    ("clip_global_norm", "offload", composes(
        "every gradient is copied to the host first; the norm is the array library's "
        "float64 pass over the host gradients, then the buckets step with the clip factor")),
    ("named_parameters", "fsdp2", composes(
        "the names are the groups' param_names, as torch keeps them; each rank's local shard "
        "takes its parameter's name, so the spec's name flags agree on every rank")),
    ("named_parameters", "torch_state_dict", composes(
        "state_dict's groups hold 'param_names' as torch's do; load_state_dict takes the "
        "checkpoint's names (torch's rule) and the spec's name flags follow them")),
    ("named_parameters", "flat", composes(
        "name flags stay per parameter when flat=True adopts a group into one buffer: a "
        "group mixing names steps each parameter by its own flag")),
    ("named_parameters", "multi_tensor", composes(
        "name flags pick each parameter's kernel as any flag does; multi-tensor lists hold "
        "parameters whose kernels agree")),
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

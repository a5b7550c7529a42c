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
    ("step_in_backward", "ddp", refused(
        "under DistributedDataParallel a gradient is complete only after its bucket's "
        "all-reduce, which the parameter's hook fires before: each rank would step on its "
        "own gradient, then DDP would write the average back for opt.step() to step "
        "again; call opt.attach(ddp_model) once, before the first backward (each bucket "
        "then steps after its all-reduce)", when="first step")),
    ("attach_ddp", "ddp", composes(
        "DDP's communication hook averages each bucket (its all-reduce over the world "
        "size, as DDP) and then steps the bucket's parameters with the averages; their "
        "gradients, which DDP writes back at the end of backward, are released then; "
        "find_unused_parameters=True is refused at attach")),
    ("step_in_backward", "attach_ddp", composes(
        "attach is for step_in_backward=True (a ValueError without it): the attached "
        "model's buckets step its parameters after their all-reduce, the hooks step the "
        "optimizer's other parameters")),
    ("attach_ddp", "accumulating", composes(
        "accumulating() also enters the attached model's no_sync(), so the micro-batch's "
        "forward must be inside it too; the last micro-batch's backward, outside, "
        "all-reduces the sums and steps each bucket; opt.step() refuses gradients that "
        "were never all-reduced")),
    ("accumulating", "ddp", composes(
        "backwards inside accumulating() step nothing, so DDP's own all-reduce writes "
        "each average into .grad as usual and opt.step() steps the sums, as DDP's "
        "ordinary loop; a backward outside it without opt.attach(ddp_model) is refused")),
    ("step_in_backward", "GradScaler", refused(
        "GradScaler.scale(loss) multiplies every gradient by the scale, and its step "
        "skips the whole update when any gradient is inf or NaN: inside backward each "
        "parameter would step with its scaled gradient before the others are seen; use "
        "loss_scale=s (a fixed scale, divided in each kernel; nonfinite='raise' stops at "
        "an overflow), run every micro-batch inside opt.accumulating() before "
        "scaler.step(opt), or step after backward", when="first step")),
    ("attach_ddp", "GradScaler", refused(
        "a bucket's step would take its scaled gradients before GradScaler has seen the "
        "others (as step_in_backward with GradScaler); use loss_scale=s (a fixed scale, "
        "divided in each kernel)", when="first step")),
    ("accumulating", "GradScaler", composes(
        "backwards inside accumulating() step nothing and keep their scaled gradients; "
        "scaler.step(opt) unscales them, checks them for inf and NaN and calls "
        "opt.step(), which steps the held gradients (or skips, as GradScaler does); no "
        "memory saving")),
    ("step_in_backward", "loss_scale", composes(
        "each parameter's kernel divides its gradient by the fixed scale, as the ordinary "
        "step does (the same kernel argument); nothing is skipped: nonfinite='raise' "
        "stops at a non-finite gradient, leaving that parameter as it was")),
    ("step_in_backward", "clip_grad_norm", refused(
        "every gradient is released in backward, before clip_grad_norm_ runs: it finds "
        "none, returns 0 and clips nothing; for a global clip step after backward "
        "(step_in_backward=False with clip_grad_norm_ or clip_global_norm=); refused "
        "under the Hugging Face Trainer with max_grad_norm > 0, a warning at the first "
        "backward when code calling it names clip_grad_norm_", when="first step")),
    ("attach_ddp", "clip_grad_norm", refused(
        "each bucket's gradients are released after its step, before clip_grad_norm_ "
        "runs (as step_in_backward with clip_grad_norm)", when="first step")),
    ("accumulating", "clip_grad_norm", composes(
        "backwards inside accumulating() keep their gradients: clip_grad_norm_ after the "
        "last one clips them and opt.step() steps the clipped gradients")),
    ("step_in_backward", "plain_accumulation", refused(
        "each backward outside accumulating() is a step: k micro-batches would take k "
        "steps with one micro-batch's gradient each; run all but the last micro-batch "
        "inside opt.accumulating(); seen as a parameter stepped again with no opt.step() "
        "or zero_grad() since, in a loop that calls them: refused before it is stepped "
        "(at that call, the first time a loop calls one)", when="first step")),
    ("attach_ddp", "plain_accumulation", refused(
        "each backward's buckets all-reduce and step (as step_in_backward with "
        "plain_accumulation); run all but the last micro-batch inside "
        "opt.accumulating(), which enters no_sync()", when="first step")),
    ("accumulating", "plain_accumulation", composes(
        "accumulating() is the step inside backward's gradient accumulation: backwards "
        "inside add up their gradients, the next backward outside (or opt.step()) steps "
        "with the sums, equal to backward() k times then step()")),
    ("step_in_backward", "hf_trainer", refused(
        "the Trainer clips after backward by default (max_grad_norm=1.0), when every "
        "gradient is already released: its clip would clip nothing; with "
        "max_grad_norm=0 they compose, gradient_accumulation_steps > 1 included "
        "(accelerate's sync_gradients=False holds the non-final micro-batches as "
        "accumulating() does); fp16 brings a GradScaler (refused)", when="first step")),
])

# -- masters, offload and writes from outside -----------------------------------------
_rows([
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

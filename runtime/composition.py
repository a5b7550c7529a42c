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
_SF = ("train()/eval() move the stored truth in float32: z read as its values ({z}), "
       "{master} lerped toward it and stored back in its format, the weight its rounding")
_TSD = ("state_dict() holds {holds}; load_state_dict restores it exactly (a resumed run "
        "is the uninterrupted one bit for bit){more}")
_rows([
    ("schedule_free", "state_bf16", composes(_SF.format(
        z="bfloat16 widened", master="the parameter"))),
    ("schedule_free", "state_q8", composes(_SF.format(
        z="codes dequantized; z itself is not written", master="the parameter"))),
    ("schedule_free", "master_split16", composes(_SF.format(
        z="as stored", master="the split master decoded from the weight and its correction,"
        " encoded back into both (exact)"))),
    ("schedule_free", "master_split8", composes(_SF.format(
        z="as stored", master="the split master decoded from the weight and its correction,"
        " encoded back into both (within ULP/254)"))),
    ("schedule_free", "multi_precision", composes(_SF.format(
        z="as stored", master="the float32 master"))),
    ("schedule_free", "offload", composes(_SF.format(
        z="as stored on the host", master="the host master") +
        "; the device parameter is copied from it")),
    ("schedule_free", "torch_state_dict", composes(
        "each group's train_mode is in the state_dict and restored with it; z and the "
        "master are states like any other (save after eval(), as the authors advise)")),
    ("state_q8", "torch_state_dict", composes(_TSD.format(
        holds="q8/q4/fp8 states as their float32 values (torch's names) with their block "
        "scales beside them (<state>__absmax, which torch.optim ignores)",
        more=": the values are coded in the saved blocks again; values of another format "
        "(torch.optim's, float32 states) are quantized anew, with a warning"))),
    ("state_bf16", "torch_state_dict", composes(_TSD.format(
        holds="bfloat16 states as they are",
        more="; float32 states from another optimizer are rounded into them, with a "
        "warning"))),
    ("master_split16", "torch_state_dict", composes(_TSD.format(
        holds="the correction (w__corr); the model's state_dict holds the bfloat16 "
        "weight: together they are the master",
        more=" when the model's weights are loaded first (a trainer's order); a float32 "
        "master's state_dict converts into a split one"))),
    ("master_split8", "torch_state_dict", composes(_TSD.format(
        holds="the int8 correction (w__corr) beside the model's bfloat16 weight",
        more=" when the model's weights are loaded first (a trainer's order)"))),
    ("multi_precision", "torch_state_dict", composes(_TSD.format(
        holds="the float32 master ('master'): it, not the bfloat16 weight, is the truth",
        more=""))),
    ("offload", "torch_state_dict", composes(_TSD.format(
        holds="the host states (and masters)",
        more=": the host copies are taken again from the loaded weights, then the "
        "states restored"))),
    ("fsdp2", "torch_state_dict", composes(
        "state_dict() holds DTensor states (torch.distributed.checkpoint's form); q8/q4/"
        "fp8 states of sharded parameters are kept in per-shard blocks that a DTensor "
        "cannot describe: state_dict() refuses them (a ValueError naming opt.save)")),
    ("state_q8", "hf_trainer", composes(
        "accelerate's AcceleratedOptimizer round-trips the state_dict at start (exact) and "
        "the Trainer's optimizer.pt resumes to the uninterrupted run's weights")),
    ("fsdp2", "reshard_checkpoint", composes(
        "opt.save(folder) writes each rank's rows; opt.load(folder) reads the rows it "
        "holds now at any world size, and a process with plain parameters (one process, "
        "DDP) reassembles every rank's rows")),
    ("zero1", "reshard_checkpoint", composes(
        "torch's ZeroRedundancyOptimizer owns the checkpoint: consolidate_state_dict() "
        "gathers every rank's local state_dict (torch's format) and its load_state_dict "
        "gives each rank's local optgen optimizer its partition through load_state_dict, "
        "which restores every state format as with torch_state_dict")),
    ("state_q8", "reshard_checkpoint", composes(
        "codes are blocked per shard: loaded at another world size (or by one process), "
        "each file's rows are dequantized with their own blocks and quantized in the new "
        "blocks (a warning says so); at the same world size the codes load as saved")),
    ("master_split16", "reshard_checkpoint", composes(
        "the correction is elementwise, split in rows like the weight: any world size "
        "reads its rows exactly")),
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

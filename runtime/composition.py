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
    ("step_in_backward", "accumulating", composes(
        "backwards inside accumulating() step nothing and add their gradients up in .grad; "
        "the next backward outside steps each parameter with the sum as its gradient "
        "completes, and at its end every parameter still holding a gradient (one it did "
        "not reach), as backward() k times then step()")),
    ("step_in_backward", "checkpoint_nonreentrant", composes(
        "the recomputation runs inside the backward the user called: each parameter's hook "
        "fires once, with its whole gradient, and steps it there")),
    ("step_in_backward", "checkpoint_reentrant", composes(
        "each segment runs a backward of its own that adds to .grad: a parameter such a "
        "backward reaches is held (its gradient stays) and stepped once, with the sum, when "
        "the outermost backward ends; parameters no segment reaches step as their gradient "
        "completes. A weight used outside and inside a segment whose outer gradient "
        "completes first is learned in the first backward that shows it, which raises "
        "ValueError (it stepped with part of its gradient); later backwards hold it")),
    ("step_in_backward", "tied_weights", composes(
        "torch sums a weight's uses into one gradient before its hook fires: one step with "
        "the sum, as the ordinary step")),
    ("step_in_backward", "freeze_unfreeze", composes(
        "every floating-point parameter carries its hook from construction, frozen ones "
        "too: one unfrozen later steps when its gradient completes; one frozen later gets "
        "no gradient and is not stepped (one frozen holding an accumulated gradient is "
        "stepped with it, as step() would)")),
    ("step_in_backward", "replaced_optimizer", refused(
        "the newest step_in_backward optimizer made on a parameter owns it and steps it in "
        "backward; an older one's hooks on it do nothing, and its step() and accumulating() "
        "raise this error (step with the newer optimizer, or delete the older one)",
        when="first step")),
    ("accumulating", "checkpoint_reentrant", composes(
        "inside accumulating() the segments' backwards add to .grad and step nothing; the "
        "stepping backward holds what its segments reach and steps it with the sum at its "
        "end")),
    ("accumulating", "checkpoint_nonreentrant", composes(
        "the recomputation runs inside each micro-batch's backward; inside accumulating() "
        "it adds to .grad, the stepping backward steps each parameter as its sum "
        "completes")),
    ("accumulating", "tied_weights", composes(
        "each micro-batch adds the sum of a weight's uses to .grad; the stepping backward "
        "steps it once with the total")),
    ("accumulating", "freeze_unfreeze", composes(
        "a parameter unfrozen mid-accumulation sums the gradients of the micro-batches "
        "after it; one frozen mid-accumulation keeps what it summed; the stepping backward "
        "steps each parameter holding a gradient (its hook, or its end), as step() does")),
    ("accumulating", "replaced_optimizer", refused(
        "the newest step_in_backward optimizer made on a parameter owns it: use its "
        "accumulating(); a replaced optimizer's accumulating() raises this error",
        when="first step")),
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

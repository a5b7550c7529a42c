"""The composition table's items (optgen's options, the torch features), its cells
(``Verdict``: composes, or refused and when) and the table itself, filled by
composition_rows.py (each concern's cells) and composition_rules.py (the rest);
runtime/composition.py reads it. Pure data: no torch, no numpy. Imports: nothing."""
from __future__ import annotations

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


WHEN = ("construction", "first step")


@dataclass(frozen=True)
class Verdict:
    """One cell: ``composes`` and the text (how, or why not); a refusal's ``when``:
    "construction" (before torch's constructor returns) or "first step" (raised by the
    first hook or step that sees the second item, before anything changes). A refusal
    ``unless`` a third item is on too (that item makes the pair compose: ``check`` lets
    it pass then)."""
    composes: bool
    text: str
    when: str = "construction"
    unless: str | None = None

    def __post_init__(self):
        if self.when not in WHEN:
            raise ValueError(f"composition table: when must be one of {WHEN}, got {self.when!r}")
        if self.unless is not None and (self.composes or self.unless not in ITEMS):
            raise ValueError(f"composition table: unless={self.unless!r} names no item or "
                             "qualifies a verdict that composes")


def composes(how: str) -> Verdict:
    return Verdict(True, how)


def refused(why: str, when: str = "construction", unless: str | None = None) -> Verdict:
    return Verdict(False, why, when, unless)


TABLE: dict[frozenset, Verdict] = {}


def _rows(section: Iterable[tuple[str, str, Verdict]]) -> None:
    for a, b, v in section:
        if a not in ITEMS or b not in ITEMS or a == b:
            raise KeyError(f"composition table: unknown pair ({a!r}, {b!r})")
        key = frozenset((a, b))
        if key in TABLE:
            raise KeyError(f"composition table: ({a!r}, {b!r}) given twice")
        TABLE[key] = v

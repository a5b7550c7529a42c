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
    ("master_split8", "reshard_checkpoint", composes(
        "the 8-bit correction is elementwise, split in rows like the weight: any world "
        "size reads its rows exactly")),
    ("multi_precision", "reshard_checkpoint", composes(
        "the float32 master is elementwise, split in rows like the weight: any world size "
        "reads its rows exactly")),
    ("state_bf16", "reshard_checkpoint", composes(
        "bf16 states are elementwise (no blocks): any world size reads its rows exactly")),
    ("schedule_free", "reshard_checkpoint", composes(
        "z (and the master the switch moves) are elementwise states: any world size reads "
        "its rows; each group's train_mode is in the checkpoint, as in schedulefree")),
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
        "step_in_backward steps each parameter as its gradient completes; "
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
# Fills the cells the sections above leave open (their rows win): the refusals and
# particular cells, the sub-modes of the step inside backward, then each item's rule.
_IB = "step_in_backward steps each parameter as its gradient completes; "
_CAPTURE = ("capturable=True cannot be combined with shards, clip_global_norm or nonfinite "
            "(they read gradients on the host or call collectives during a step, which a "
            "graph cannot replay)")
_SPLIT = ("master_format={} keeps the master as the bfloat16 weight and a correction; "
          "multi_precision=True keeps a float32 copy instead: pass one of them")
_OFFLOAD = ("offload='cpu' keeps a float32 master copy on the host; master_format={} "
            "applies without offload")
_ZERO = ("under ZeroRedundancyOptimizer (ZeRO-1) each rank's optimizer holds its partition "
         "and steps it alone: ")


def _fill(section: Iterable[tuple[str, str, Verdict]]) -> None:
    for a, b, v in section:
        if frozenset((a, b)) not in TABLE:
            _rows([(a, b, v)])


def _pairs(xs: Iterable[str], ys: Iterable[str]) -> set[frozenset]:  # (cells of xs, ys)
    return {frozenset((x, y)) for x in xs for y in ys if x != y}


_MASTERS = ("master_split16", "master_split8", "multi_precision")
_THEIRS = (   # (cells the sections above decide: where they are open, ``missing`` says)
    _pairs(["step_in_backward"], ["checkpoint_reentrant", "checkpoint_nonreentrant",
                                  "freeze_unfreeze", "replaced_optimizer", "ddp", "GradScaler",
                                  "clip_grad_norm", "plain_accumulation", "hf_trainer"])
    | _pairs([*_MASTERS, "offload"], ["write_inplace", "write_data", "replace_data",
                                      "torch_compile"])
    | _pairs([*_MASTERS, "schedule_free", "state_bf16", "state_q8"],
             ["torch_state_dict", "reshard_checkpoint"])
    | _pairs(["schedule_free"], [*_MASTERS, "state_bf16", "state_q8"])
    | _pairs(["fsdp2"], ["reshard_checkpoint"]))
_fill([
    ("step_in_backward", "clip_global_norm", refused(
        _IB + "clip_global_norm needs every gradient first (the norm of all of them)")),
    ("step_in_backward", "nonfinite_skip", refused(
        _IB + "nonfinite='skip' needs every gradient first (one non-finite gradient skips "
        "every parameter's update); nonfinite='raise' works")),
    ("step_in_backward", "flat", refused(
        _IB + "flat=True steps a whole group with one launch, after all its gradients")),
    ("step_in_backward", "offload", refused(
        _IB + "offload='cpu' with it is not built (bucketed host copies)")),
    ("step_in_backward", "agree", refused(
        _IB + "agree=<group> makes the ranks agree on each step before it changes anything; "
        "inside backward each rank steps alone")),
    ("step_in_backward", "zero1", refused(
        _IB + _ZERO + "it would step with the rank's own gradient, before DDP averages it; "
        "step after backward (step_in_backward=False), or use DDP with opt.attach(ddp_model)")),
    ("step_in_backward", "capturable", refused(
        _IB + "capturable=True steps in a captured graph, not in backward")),
    ("step_in_backward", "fsdp2", refused(
        _IB + "FSDP2's DTensor parameters are stepped by shards after their reduce-scatter")),
    ("step_in_backward", "accumulating", composes(
        "accumulating() holds the hooks: backwards inside add their gradients up, the next "
        "backward outside (or step()) steps with the sums")),
    ("step_in_backward", "attach_ddp", composes(
        "DDP's bucket callback steps the bucket's parameters with their averages after its "
        "all-reduce; their gradients are released at the end of backward")),
    ("attach_ddp", "ddp", composes(
        "attach takes the DDP model: its communication hook averages each bucket and steps it")),
    ("accumulating", "attach_ddp", composes(
        "accumulating() enters the DDP model's no_sync(): nothing is all-reduced or stepped "
        "until the backward outside it")),
    ("master_split16", "master_split8", refused(
        "master_format takes one value: a parameter's master is split16 or split8")),
    *((f"master_{m}", x, refused(text.format(repr(m)))) for m in ("split16", "split8")
      for x, text in (("multi_precision", _SPLIT), ("offload", _OFFLOAD))),
    ("offload", "flat", refused(
        "flat=True and offload='cpu' together are not built (flat groups adopt the device "
        "parameters into one buffer)")),
    ("offload", "fsdp2", refused("DTensor parameters with offload are not built")),
    ("flat", "fsdp2", refused("DTensor parameters with flat=True are not built")),
    ("offload", "capturable", refused(
        "offload='cpu' steps on the host, which a CUDA graph does not capture")),
    *(("capturable", x, refused(_CAPTURE)) for x in ("clip_global_norm", "nonfinite_skip",
                                                      "fsdp2")),
    ("capturable", "agree", refused(
        "agree=<group> all-reduces each step's checks on the host before the step, which a "
        "graph's replay would skip")),
    ("capturable", "zero1", refused(
        _ZERO + "ZeroRedundancyOptimizer broadcasts the partitions after each local step, "
        "which a replay of the local step does not")),
    ("clip_global_norm", "zero1", refused(
        _ZERO + "clip_global_norm would take the norm of that partition's gradients, not of "
        "all of them; clip with torch.nn.utils.clip_grad_norm_ before step()")),
    ("nonfinite_skip", "zero1", refused(
        _ZERO + "nonfinite='skip' would skip only the partition holding the non-finite "
        "gradient; with agree=<group> every rank skips when one does", unless="agree")),
    ("schedule_free", "zero1", refused(
        _ZERO + "eval() and train() would move only this rank's partition between x and y")),
    ("fsdp2", "zero1", refused(
        "FSDP2 shards each parameter across the ranks already; ZeroRedundancyOptimizer "
        "partitions whole parameters")),
    ("fsdp2", "agree", composes("FSDP2's steps agree over the mesh; agree=<group>: those ranks")),
    ("zero1", "agree", composes(
        "every rank's local step runs its checks, then the ranks agree: every rank steps "
        "its partition or none does")),
    ("fsdp2", "clip_global_norm", composes(
        "the shards' sums of squares are summed across the mesh: every whole gradient's norm")),
    ("fsdp2", "nonfinite_skip", composes(
        "the shards' non-finite checks are summed across the mesh: every rank skips or none")),
    ("state_bf16", "state_q8", composes(
        "a dict state_format (e.g. {'m': 'q8', 'v': 'bf16'}): each state in its own format")),
    ("clip_global_norm", "clip_grad_norm", composes(
        "torch clips the .grad in place, then the kernels scale by the norm of the clipped "
        "gradients")),
    ("loss_scale", "GradScaler", composes(
        "GradScaler unscales .grad by its scale, then the kernels divide by loss_scale: "
        "both scales are undone")),
    ("loss_scale", "clip_grad_norm", composes("clip at max_norm * loss_scale: clip_grad_norm_ "
                                              "sees .grad undivided")),
    ("nonfinite_skip", "GradScaler", composes(
        "GradScaler skips step() on an inf first; a non-finite gradient it lets through "
        "skips the step in optgen")),
    ("capturable", "GradScaler", composes(
        "eager steps as with torch.optim; a replayed graph runs without GradScaler's skip "
        "(unscale_ and check its found_inf before stage())")),
    ("capturable", "replace_data", refused(
        "a captured graph holds the parameters' addresses: stage() raises CaptureError for "
        "data that moved", when="first step")),
    ("capturable", "freeze_unfreeze", composes(
        "a graph steps the parameters that had gradients when it was captured; capture "
        "again after freezing or unfreezing")),
    ("flat", "freeze_unfreeze", composes(
        "a flat group's gradient views stay in .grad (zeroed, never None): a frozen "
        "parameter is stepped with a zero gradient, as torch.optim with set_to_none=False")),
    ("zero1", "torch_state_dict", composes(
        "ZeroRedundancyOptimizer.consolidate_state_dict gathers the local optimizers' "
        "states; each local state_dict round-trips every state")),
    ("fsdp2", "torch_state_dict", composes(
        "opt.state shows each state as a DTensor of the parameter's mesh and placements: "
        "DCP's get_state_dict and set_state_dict take them (q8/q4 states: opt.save)")),
])

# the step inside backward with the torch features the sections above leave
_IB_FEATURES = {
    **{x: "each hook steps its parameter with the kernels step() runs; " + how for x, how in (
        ("master_split16", "the bf16 weight and its correction are the truth"),
        ("master_split8", "the bf16 weight and its correction are the truth"),
        ("multi_precision", "the float32 master is the truth, rounded into the weight"),
        ("state_bf16", "states stored as bfloat16"),
        ("state_q8", "states stored as block-scaled codes"),
        ("schedule_free", "train()/eval() move the weights between y and x"))},
    "torch_compile": "the hooks run eagerly (torch.compiler.disable) inside the compiled "
                     "backward; the step is the eager one",
    "tied_weights": "the hook fires once, after the gradients of every use are summed",
    **dict.fromkeys(("write_inplace", "write_data"), "the weight itself is the truth (no "
                    "master copy): the next hook steps the written values"),
    "replace_data": "a backward's first hook follows moved data, as step() does",
    "torch_state_dict": "state_dict() after a backward holds every state and step count; "
                        "load_state_dict restores them",
    "reshard_checkpoint": "the states are whole per parameter: opt.save and state_dict "
                          "load in a run of any world size",
}
_fill(("step_in_backward", x, composes(how)) for x, how in _IB_FEATURES.items())
for _x in ITEMS:   # the sub-modes: as step_in_backward with the other item
    _v = TABLE.get(frozenset(("step_in_backward", _x)))
    for _mode, _what in (("accumulating", "accumulating() holds the step inside backward"),
                         ("attach_ddp", "opt.attach(ddp) steps inside backward")):
        if _v is not None and _x not in ("accumulating", "attach_ddp", _mode):
            _fill([(_mode, _x, Verdict(_v.composes, f"{_what}; as step_in_backward with "
                                                    f"{_x}: {_v.text}", _v.when, _v.unless))])

# items whose rule holds with every other item
_EVERY: dict[str, Verdict] = {
    "lr_scheduler": composes(
        "the scheduler writes param_groups' lr; the next step (step_in_backward: a "
        "backward's first hook; capturable: stage()) passes changed values to the kernels"),
    "named_parameters": composes(
        "the names reach the spec (name flags) and the messages; nothing else changes"),
    "tied_weights": composes("one parameter, one .grad summed over its uses, one update"),
    "loss_scale": composes("each gradient is divided by loss_scale in the kernel"),
    "multi_tensor": composes(
        "how many launches a step takes; what a parameter's step computes is the same"),
}
for _x, _v in _EVERY.items():
    _fill((_x, _y, _v) for _y in ITEMS if _y != _x and frozenset((_x, _y)) not in _THEIRS)

# torch features with the options that step after backward, and with each other
_AFTER = "the optimizer steps after backward on .grad, as torch.optim does: "
_FEATURE_RULES: dict[str, str] = {
    **dict.fromkeys(("checkpoint_reentrant", "checkpoint_nonreentrant"),
                    _AFTER + "checkpointing changes how .grad is computed, not it"),
    "GradScaler": "scaler.step(opt) unscales every .grad in place and calls step() only "
                  "when all are finite: the kernels step the unscaled gradients",
    "clip_grad_norm": _AFTER + "clip_grad_norm_ scales .grad in place before the step",
    "plain_accumulation": _AFTER + "the gradients add up in .grad until step()",
    "freeze_unfreeze": "a parameter whose .grad is None is not stepped (torch.optim's rule); "
                       "unfrozen, it steps again from its states",
    "replaced_optimizer": "only an optimizer whose step() runs steps; a new one starts from "
                          "the weights as they are, with states of its own",
    "ddp": "DDP averages every .grad during backward; step() after it steps the averages, "
           "alike on every rank",
    "hf_trainer": "the Trainer's loop is the plain one: backward, clip_grad_norm_, step(), "
                  "the scheduler's step, zero_grad()",
    "torch_compile": "a compiled opt.step() is one opaque op (optgen::step): the kernels "
                     "run on the parameters and states in place, as eagerly",
    **dict.fromkeys(("write_inplace", "write_data"), "the weight itself is the truth (no "
                    "master copy): the next step starts from the written values"),
    "replace_data": "followed as torch.optim does: the next step steps the new data",
    "torch_state_dict": "state_dict() holds every state and step count; load_state_dict "
                        "checks and restores them (format='torch' converts)",
    "reshard_checkpoint": "the states are whole per parameter (FSDP2: opt.save's folder "
                          "reshards): they load in a run of any world size",
}
_INSIDE = ("step_in_backward", "accumulating", "attach_ddp")
for _x, _how in _FEATURE_RULES.items():
    _fill((_x, _y, composes(_how)) for _y in ITEMS
          if _y != _x and _y not in _INSIDE and frozenset((_x, _y)) not in _THEIRS)

# two options that act on separate things: each one's part of the step
_HOW = {
    "master_split16": "the bf16 weight and its 16-bit correction are the truth",
    "master_split8": "the bf16 weight and its 8-bit correction are the truth",
    "multi_precision": "the float32 master is the truth, rounded into the weight",
    "state_bf16": "states stored as bfloat16",
    "state_q8": "states stored as block-scaled codes",
    "offload": "the host master and states are the truth, the weights copied back",
    "capturable": "the scalars reach the kernels through fixed buffers (stage())",
    "flat": "a group's parameters and gradients in one buffer each, one launch",
    "clip_global_norm": "every gradient scaled by the global norm before any update",
    "nonfinite_skip": "one non-finite gradient skips the whole step",
    "agree": "the ranks agree on each step before it changes anything",
    "fsdp2": "each rank steps its local shard, the states sharded alike",
    "zero1": "each rank steps its partition, ZeroRedundancyOptimizer broadcasts it",
    "schedule_free": "train()/eval() move the weights between y and x",
}
_fill((_a, _b, composes(f"{_a}: {_HOW[_a]}; {_b}: {_HOW[_b]}"))
      for _a, _b in itertools.combinations(_HOW, 2) if frozenset((_a, _b)) not in _THEIRS)


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
    (in the table's item order, so the message is the same every time); a refusal
    ``unless`` an item passes when that item is active too."""
    active = set(active)
    unknown = sorted(active - set(ITEMS))
    if unknown:
        raise KeyError(f"composition table: unknown items {unknown}")
    on = [i for i in ITEMS if i in active]
    for a, b in itertools.combinations(on, 2):
        v = TABLE.get(frozenset((a, b)))
        if v is not None and not v.composes and v.when == "construction" and \
                v.unless not in active:
            refuse(owner, a, b)

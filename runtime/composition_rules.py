"""The composition table's other cells: filled after composition_rows.py's (whose cells
win) from particular refusals, the sub-modes of the step inside backward, and each
item's rule. Imports: composition_items, composition_rows (its cells first)."""
from __future__ import annotations

import itertools
from typing import Iterable

from . import composition_rows  # noqa: F401  (its cells first: they win)
from .composition_items import ITEMS, TABLE, Verdict, _rows, composes, refused

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
    ("step_in_backward", "fsdp2", composes(
        "FSDP2 calls each sharded parameter's hook once its reduce-scatter is done: the "
        "hook steps this rank's shard with the averaged gradient and releases it, as "
        "step() steps shards (whole-tensor reductions summed and matrix rules' rows "
        "exchanged across the mesh, per bucket, alike on every rank)")),
    ("accumulating", "fsdp2", composes(
        "accumulating() holds the hooks: FSDP2 reduce-scatters each micro-batch and adds "
        "the shards' gradients up, the next backward outside steps with the sums "
        "(set_requires_gradient_sync(False) skips those reduce-scatters and their hooks)")),
    ("attach_ddp", "fsdp2", refused(
        "opt.attach takes a DistributedDataParallel model; FSDP2's sharded parameters are "
        "stepped by the hooks FSDP2 calls after their reduce-scatter, without attach")),
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

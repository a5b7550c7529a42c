"""The composition table's cells, by concern: the step inside backward (its hooks; the
loop around it), masters and writes from outside, checkpoints and formats, capture,
global clip and names. Each says how the two compose (who owns the gradient, when the
step runs, which storage is the truth) or why they are refused, and when.
Imports: composition_items."""
from __future__ import annotations

from .composition_items import _rows, composes, refused

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
    ("offload", "torch_compile", composes(
        "the compiled step calls the offloaded step as one opaque op (optgen::step): the "
        "copies to the host, the CPU kernels and the copies back run eagerly inside it; "
        "writes between steps are told as in eager (equal to eager bit for bit)")),
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

# -- shards under torch.compile, ZeRO-1's constructor, DDP's fixed buckets -------------
_rows([
    ("fsdp2", "torch_compile", composes(
        "a compiled step with DTensor parameters calls optgen's step eagerly (a graph "
        "break: fake DTensors cannot run the opaque op); the rest of the train step stays "
        "compiled and the step equals the eager one")),
    ("zero1", "named_parameters", refused(
        "torch's ZeroRedundancyOptimizer takes tensors or dicts of them and raises its own "
        "TypeError: `params` argument should be an iterable of Tensors or dicts; its "
        "partitions reach the optgen optimizer without names, so name flags take the "
        "unnamed default (every flag on)")),
    ("attach_ddp", "freeze_unfreeze", refused(
        "DDP fixes the parameters each bucket reduces when it wraps the model; a parameter "
        "frozen or unfrozen afterwards leaves a gradient that no bucket's all-reduce "
        "steps: opt.step() finds it and refuses before stepping it (freeze before "
        "wrapping, or step after backward without attach)", when="first step")),
])


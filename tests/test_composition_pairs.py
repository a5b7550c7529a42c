"""The composition table (runtime/composition.py) against what the code does: every pair
of items has a cell, docs/reliability.md shows the table as it is, and every pair runs
on a small model: a pair that composes gives what the plain path gives (torch.optim's
AdamW on a float32 copy with the same torch features; schedule-free: optgen's own
class without the option), within the bound of its formats; a refused pair raises the
table's text at construction with nothing changed.

Each item is one small function that turns it on in a scenario (``APPLY``): on the
optgen side only for an option, on both sides for a torch feature; a pair is two of
them, a triple three. CI runs the pairs of one process (sampled: a fixed covering of
the items; ``--exhaustive``: every pair, and the triples). The pairs with DDP,
opt.attach(ddp_model), ZeRO-1, agree=<group> or FSDP2 run in a 2-process gloo job
(tests/test_composition_pairs_distributed.py: this file's scenario, the item on through
``Scenario.wrap``/``make``/``after``); checkpoints at another world size, CUDA
(capturable) and the Hugging Face Trainer are checked here by their verdicts only (their
runs: tests/test_distributed*.py, the GPU runs, tests/test_hf_trainer.py): ``NOT_HERE``.
"""
from __future__ import annotations

import copy
import itertools
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import torch

import optgen.torch as ot
from optgen.runtime import composition, composition_doc

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, LR = 3, 1e-2
NOT_HERE = {   # item -> why its pairs are not run in this process
    **dict.fromkeys(("attach_ddp", "agree", "fsdp2", "zero1", "ddp", "reshard_checkpoint"),
                    "needs torch.distributed ranks"),
    "capturable": "needs a CUDA device (the torch forms refuse capturable CPU parameters)",
    "hf_trainer": "needs the Hugging Face Trainer (tests/test_hf_trainer.py)",
}


def test_every_pair_has_a_cell():
    assert composition.missing() == []


def test_the_docs_show_the_table():
    with open(os.path.join(HERE, "..", "docs", "reliability.md"), encoding="utf-8") as f:
        doc = f.read()
    assert composition_doc.replaced(doc) == doc, (
        "docs/reliability.md's composition table is stale: run "
        "python -m optgen.runtime.composition_doc --write docs/reliability.md")


def test_check_names_both_and_passes_what_composes():
    with pytest.raises(ValueError, match="adamw: step_in_backward with offload is refused: "):
        composition.check("adamw", {"offload", "step_in_backward", "lr_scheduler"})
    composition.check("adamw", {"offload", "lr_scheduler", "tied_weights"})
    with pytest.raises(ValueError, match="nonfinite_skip with zero1 is refused"):
        composition.check("adamw", {"zero1", "nonfinite_skip"})
    composition.check("adamw", {"zero1", "nonfinite_skip", "agree"})   # (unless agree)
    with pytest.raises(KeyError, match="unknown items"):
        composition.check("adamw", {"offlaod"})


# -- the scenario: a small model, 3 steps, both sides ----------------------------------
class Net(torch.nn.Module):
    def __init__(self, tied: bool, checkpoint: bool | None):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.h, self.b = (torch.nn.Linear(4, 8), torch.nn.Linear(8, 8),
                                  torch.nn.Linear(8, 3))
        self.tied, self.checkpoint = tied, checkpoint

    def _mid(self, x):
        x = torch.tanh(self.h(x))
        return torch.tanh(self.h(x)) if self.tied else x   # (h used twice: tied)

    def forward(self, x):
        x = torch.tanh(self.a(x))
        if self.checkpoint is not None:
            x = torch.utils.checkpoint.checkpoint(self._mid, x, use_reentrant=self.checkpoint)
        else:
            x = self._mid(x)
        return self.b(x)


@dataclass
class Scenario:
    kw: dict = field(default_factory=dict)   # optgen's options (the optgen side)
    cls: str = "AdamW"
    dtype: torch.dtype = torch.float32
    tol: float = 2e-5
    tied: bool = False
    checkpoint: bool | None = None
    micro: int = 1
    hold_first: bool = False                 # accumulating(): the first micro-batch held
    hold_all: bool = False                   # (and the last: opt.step() steps the sums)
    loss_scale: float = 1.0                  # the optgen side's loss multiplied by it
    nan_at: int | None = None                # nonfinite='skip': a NaN gradient at that step
    clip: float | None = None                # the plain side's clip for clip_global_norm
    scaler: bool = False
    sched: bool = False
    clip_grad: bool = False
    named: bool = False
    set_to_none: bool = True                 # the plain side's zero_grad
    # (side, model, step index) -> None, after each step (features' writes)
    between: list[Callable[[str, Any, int], None]] = field(default_factory=list)
    reload: bool = False                     # a new optimizer loads the state_dict
    replace: bool = False                    # a new optimizer on the same parameters
    compiled: bool = False
    masters: list[str] = field(default_factory=list)
    formats: dict[str, str] = field(default_factory=dict)
    # the optgen side under torch.distributed (tests/distributed_pairs_run.py): the model
    # the loop runs (DDP, FSDP2's fully_shard), the optimizer's maker (ZeRO-1) and what
    # follows it (opt.attach(ddp_model))
    wrap: Callable[[Any], Any] | None = None
    make: Callable[..., Any] | None = None
    after: Callable[[Any, Any], None] | None = None


def _kw(**kw):
    return lambda s: s.kw.update(kw)


def _master(fmt):
    def apply(s):
        s.masters.append(fmt)
        s.dtype, s.tol = torch.bfloat16, 2e-2
        if fmt == "mp":
            s.kw["multi_precision"] = True
        else:
            s.kw["master_format"] = fmt
    return apply


def _state(name, fmt):
    def apply(s):
        s.formats[name] = fmt
        s.kw.update(state_format=dict(s.formats), state_format_min_size=1)
        s.tol = max(s.tol, 2e-2)
    return apply


def _write(how):
    def at(side, net, i):
        if i == 1:
            w = net.a.weight
            if how == "inplace":
                with torch.no_grad():
                    w.mul_(0.5)
            elif how == "data":
                w.data.mul_(0.5)
            else:
                w.data = w.data * 0.5
    return lambda s: s.between.append(at)


def _freeze(s):
    def at(side, net, i):
        net.a.weight.requires_grad_(i != 0)   # frozen for step 2 only
    s.between.append(at)
    if s.kw.get("flat"):
        s.set_to_none = False


def _flat(s):
    s.kw["flat"] = True
    if any(f is _freeze for f in s.between):
        s.set_to_none = False


def _accumulating(s):
    s.kw["step_in_backward"] = True
    s.micro, s.hold_first = max(s.micro, 2), True


def _set(**attrs):
    def apply(s):
        for k, v in attrs.items():
            setattr(s, k, v)
    return apply


APPLY: dict[str, Callable[[Scenario], None]] = {
    "step_in_backward": _kw(step_in_backward=True),
    "accumulating": _accumulating,
    "master_split16": _master("split16"),
    "master_split8": _master("split8"),
    "multi_precision": _master("mp"),
    "state_bf16": _state("exp_avg_sq", "bf16"),
    "state_q8": _state("exp_avg", "q8"),
    "offload": _kw(offload="cpu"),
    "flat": _flat,
    "multi_tensor": _kw(multi_tensor=True),
    "clip_global_norm": lambda s: (s.kw.update(clip_global_norm=0.05), setattr(s, "clip", 0.05)),
    "nonfinite_skip": lambda s: (s.kw.update(nonfinite="skip"), setattr(s, "nan_at", 1)),
    "loss_scale": lambda s: (s.kw.update(loss_scale=8.0), setattr(s, "loss_scale", 8.0)),
    "schedule_free": _set(cls="AdamWScheduleFree"),
    "torch_compile": _set(compiled=True),
    "GradScaler": _set(scaler=True),
    "checkpoint_reentrant": _set(checkpoint=True),
    "checkpoint_nonreentrant": _set(checkpoint=False),
    "plain_accumulation": lambda s: setattr(s, "micro", max(s.micro, 2)),
    "freeze_unfreeze": _freeze,
    "tied_weights": _set(tied=True),
    "write_inplace": _write("inplace"),
    "write_data": _write("data"),
    "replace_data": _write("replace"),
    "lr_scheduler": _set(sched=True),
    "clip_grad_norm": _set(clip_grad=True),
    "torch_state_dict": _set(reload=True),
    "replaced_optimizer": _set(replace=True),
    "named_parameters": _set(named=True),
}
assert set(APPLY) | set(NOT_HERE) == set(composition.ITEMS)


def _optimizer(s: Scenario, side: str, net):
    params = list(net.named_parameters()) if s.named and side == "optgen" else \
        list(net.parameters())
    if s.cls == "AdamWScheduleFree":   # (no torch.optim twin: optgen's without options)
        opt = (s.make or _call)(ot.AdamWScheduleFree, params, lr=LR,
                                **(s.kw if side == "optgen" else {}))
        opt.train()
        return opt
    if side != "optgen":
        return torch.optim.AdamW(params, lr=LR, weight_decay=0.01)
    if s.make is not None:
        return s.make(ot.AdamW, params, lr=LR, weight_decay=0.01, **s.kw)
    return ot.AdamW(params, lr=LR, weight_decay=0.01, **s.kw)


def _batch(i: int, k: int):
    g = torch.Generator().manual_seed(10 * i + k)
    return torch.randn(6, 4, generator=g), torch.randn(6, 3, generator=g)


def run(s: Scenario, side: str) -> list[torch.Tensor]:
    """``STEPS`` steps of the scenario on one side: its weights (float32) after them."""
    net = Net(s.tied, s.checkpoint).to(s.dtype)
    if side == "reference":
        net = net.float()
    model = s.wrap(net) if s.wrap is not None and side == "optgen" else net
    opt = _optimizer(s, side, net)
    if s.after is not None and side == "optgen":
        s.after(opt, model)
    mixed = getattr(opt, "mixed", [])   # the plain side of a bfloat16 model
    params = [m for _, m in mixed] or list(net.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5) if s.sched else None
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0) if s.scaler else None
    step = torch.compile(opt.step, backend="eager") if s.compiled and side == "optgen" \
        else opt.step
    for i in range(STEPS):
        for k in range(s.micro):
            x, y = _batch(i, k)
            held = side == "optgen" and s.hold_first and (k < s.micro - 1 or s.hold_all)
            with opt.accumulating() if held else _nothing():   # (forward too: attach's
                # accumulating() enters DDP's no_sync())
                loss = torch.nn.functional.mse_loss(model(x.to(net.a.weight.dtype)).float(), y)
                loss = loss / s.micro * (s.loss_scale if side == "optgen" else 1.0)
                (scaler.scale(loss) if scaler else loss).backward()
        for p, m in mixed:
            m.grad = None if p.grad is None else p.grad.float()
        if s.nan_at == i and side == "optgen" and net.b.bias.grad is not None:
            g = net.b.bias.grad   # (FSDP2: this rank's shard)
            getattr(g, "_local_tensor", g)[0] = float("nan")
        if scaler is not None:
            scaler.unscale_(opt)
        if s.clip_grad:
            torch.nn.utils.clip_grad_norm_(   # (loss_scale: the scaled gradients' norm)
                params, 0.1 * (s.loss_scale if side == "optgen" else 1.0))
        if s.clip is not None and side != "optgen":
            torch.nn.utils.clip_grad_norm_(params, s.clip, foreach=False)
        if s.nan_at == i and side != "optgen":   # (the optgen side skips this step)
            if scaler is not None:
                scaler.update()
        elif scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            step()
        opt.zero_grad(set_to_none=s.set_to_none)
        if sched is not None:
            sched.step()
        with torch.no_grad():
            for p, m in mixed:
                p.copy_(m)
                p.grad = None
        for f in s.between:
            f(side, net, i)
        with torch.no_grad():
            for p, m in mixed:   # (a write: the float32 copy takes it)
                if not torch.equal(p, m.to(p.dtype)):
                    m.copy_(p)
        if s.replace and i == 0:
            opt = _optimizer(s, side, net)
            step = opt.step
        if s.reload and i == 0 and side == "optgen":
            sd = copy.deepcopy(opt.state_dict())
            opt = _optimizer(s, side, net)
            opt.load_state_dict(sd)
            step = opt.step
            if sched is not None:
                sched.optimizer = opt
        if (s.replace or s.reload) and i == 0 and s.after is not None and side == "optgen":
            model = s.wrap(net)   # (a DDP model takes one communication hook: a new one)
            s.after(opt, model)
    return [p.detach().float().clone() for p in net.parameters()]


def _call(cls, *args, **kw):
    return cls(*args, **kw)


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def scenario(items) -> Scenario:
    s = Scenario()
    for item in items:
        APPLY[item](s)
    return s


def check_items(items: tuple[str, ...]) -> None:
    """Run ``items`` together: the plain side's weights, or the table's refusal."""
    refusals = [(a, b) for a, b in itertools.combinations(items, 2)
                if not composition.verdict(a, b).composes]
    s = scenario(items)
    if refusals and all(composition.verdict(a, b).when == "first step" for a, b in refusals):
        # refused when the loop shows the second item: the run raises the table's text,
        # or (the scenario never shows it: a replaced optimizer left unused) ends where
        # the plain path does: never a silently different step
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                got = run(s, "optgen")
        except ValueError as e:
            said = str(e).split(" is refused: ", 1)[-1]
            assert any(said in composition.verdict(x, y).text for x, y in refusals), \
                (items, str(e))
            return
        if any(composition.verdict(x, y).text in str(w.message) for w in seen
               for x, y in refusals):
            return   # (told before the first step where the loop cannot be known: a
            # clip after backward in the user's own loop is a warning, the table says so)
        want = run(s, "plain" if s.cls == "AdamW" else "reference")
        for i, (g, w) in enumerate(zip(got, want)):
            err = (g - w).abs().max().item()
            assert err <= s.tol, f"{items}: parameter {i} is {err:.3g} from the plain path"
        return
    refusals = [(a, b) for a, b in refusals if composition.verdict(a, b).when == "construction"]
    if refusals:
        a, b = refusals[0]
        v = composition.verdict(a, b)
        if {a, b} == {"master_split16", "master_split8"}:   # (one option, one value)
            with pytest.raises(ValueError, match="master_format takes one value"):
                composition.check("adamw", {a, b})
            return
        net = Net(s.tied, s.checkpoint).to(s.dtype)
        before = [p.detach().clone() for p in net.parameters()]
        assert v.when == "construction", v
        with pytest.raises(ValueError, match=" is refused: ") as e:
            _optimizer(s, "optgen", net)
        said = str(e.value).split(" is refused: ", 1)[1]
        assert any(said in composition.verdict(x, y).text for x, y in refusals), \
            (items, str(e.value))
        assert all(torch.equal(p, q) for p, q in zip(net.parameters(), before))
        return
    got, want = run(s, "optgen"), run(s, "plain" if s.cls == "AdamW" else "reference")
    for i, (g, w) in enumerate(zip(got, want)):
        err = (g - w).abs().max().item()
        assert err <= s.tol, f"{items}: parameter {i} is {err:.3g} from the plain path"


def _here(items) -> bool:
    return not any(i in NOT_HERE for i in items)


PAIRS = [p for p in itertools.combinations(composition.ITEMS, 2)
         if frozenset(p) in composition.TABLE]
LOCAL = [p for p in PAIRS if _here(p)]
# CI: a fixed covering (each item with a few others, every refusal); the rest exhaustive
SAMPLED = {p for j, p in enumerate(LOCAL)
           if j % 7 == 0 or not composition.verdict(*p).composes}


@pytest.mark.parametrize("pair", [
    pytest.param(p, marks=() if p in SAMPLED else pytest.mark.exhaustive,
                 id="+".join(p)) for p in LOCAL])
def test_pair(pair):
    check_items(pair)


@pytest.mark.exhaustive
@pytest.mark.parametrize("triple", [
    pytest.param(t, id="+".join(t)) for t in itertools.combinations(composition.ITEMS, 3)
    if _here(t) and all(frozenset(p) in composition.TABLE
                        for p in itertools.combinations(t, 2))])
def test_triple(triple):
    check_items(triple)


@pytest.mark.parametrize("pair", [p for p in PAIRS if not _here(p)],
                         ids=lambda p: "+".join(p))
def test_pairs_not_run_here_have_a_reasoned_verdict(pair):
    """Pairs with a distributed or CUDA item: their verdict exists and says how or why
    (their runs: tests/test_composition_pairs_distributed.py, tests/test_distributed*.py,
    test_step_in_backward*.py, the GPU runs)."""
    v = composition.verdict(*pair)
    assert v.text and (v.composes or v.when in composition.WHEN)

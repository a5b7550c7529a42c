"""The suite's workloads as data: one record per workload with its sizes, its contenders
(by name, from ROWS), its reference row and its goals (a target, a comparison, and the
measure that reads the value from the results). measure.py runs a record, report.py
prints it; a new workload is one more record here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from optgen.benchmark import Contender, Goal
from contenders import (ADAM_B, DROP_IN_ROWS, FOREACH, FUSED, LAMB_FLAT, LAMB_OPTGEN,
                        NUMPY_EXPR, NUMPY_INPLACE, OPTGEN, OPTGEN_FLAT, OPTGEN_PER, SINGLE,
                        make_8bit, make_drop_in, make_numpy_expr, make_numpy_inplace,
                        make_optgen, make_torch_adam, state_row)
from goals import ExtraRss, Median, OfLimit, Ratio
from lamb_rows import LAMB_OPTAX, LAMB_TORCH, make_optax_lamb, make_torch_lamb
from params import WD, ParamSet, bert_params, flat_params

STATE_FORMATS = ("bf16", "q8", "q4", "fp8")
TRAINER_FUSED, TRAINER_DEFAULT = "torch fused", "optgen default"   # trainer_bench's rows
# x torch fused fp32 Adam: issue 22's bf16 and q8 goals, issue 33's fp8 (q4: none)
STATE_TARGETS = {"bf16": 0.85, "q8": 0.75, "fp8": 0.75}
BNB, TORCHAO = "bitsandbytes Adam8bit", "torchao AdamW8bit"

# contender name -> maker(torch, params); a maker returns None (or raises
# lamb_rows.Unavailable) when its library is not installed
Maker = Callable[[object, ParamSet], "Contender | None"]
ROWS: dict[str, Maker] = {
    OPTGEN: lambda torch, ps: make_optgen(ps, "adam", OPTGEN),
    OPTGEN_FLAT: lambda torch, ps: make_optgen(ps, "adam", OPTGEN_FLAT, flat=True),
    OPTGEN_PER: lambda torch, ps: make_optgen(ps, "adam", OPTGEN_PER, multi_tensor=False),
    **{state_row(f): (lambda torch, ps, f=f: make_optgen(ps, "adam", state_row(f),
                                                         state_format=f))
       for f in STATE_FORMATS},
    **{name: (lambda torch, ps, name=name: make_drop_in(torch, ps, name))
       for name in DROP_IN_ROWS},
    BNB: lambda torch, ps: make_8bit(torch, ps, BNB),
    TORCHAO: lambda torch, ps: make_8bit(torch, ps, TORCHAO),
    FUSED: lambda torch, ps: make_torch_adam(torch, ps, FUSED, fused=True),
    FOREACH: lambda torch, ps: make_torch_adam(torch, ps, FOREACH, foreach=True),
    SINGLE: lambda torch, ps: make_torch_adam(torch, ps, SINGLE, foreach=False),
    NUMPY_EXPR: lambda torch, ps: make_numpy_expr(ps),
    NUMPY_INPLACE: lambda torch, ps: make_numpy_inplace(ps),
    LAMB_OPTGEN: lambda torch, ps: make_optgen(ps, "lamb", LAMB_OPTGEN),
    LAMB_FLAT: lambda torch, ps: make_optgen(ps, "lamb", LAMB_FLAT, flat=True),
    LAMB_TORCH: lambda torch, ps: make_torch_lamb(torch, ps),
    LAMB_OPTAX: lambda torch, ps: make_optax_lamb(ps),
}


@dataclass
class Sizes:
    stream: int = 32_000_000          # 128 MB per array: 4x the 32 MB L3 (STREAM's rule)
    adam_small: int = 10_000_000
    adam_large: int = 100_000_000
    lamb: int = 10_000_000
    bert_layers: int = 12
    bert_vocab: int = 30522
    latency_tensors: int = 100
    latency_size: int = 1000
    memory: int = 100_000_000
    reps: int = 10
    warmup: int = 2
    latency_inner: int = 20
    build_reps: int = 10
    compile_reps: int = 3


QUICK = Sizes(stream=1_000_000, adam_small=1_000_000, adam_large=2_000_000,
              lamb=1_000_000, bert_layers=1, bert_vocab=3000, memory=2_000_000, reps=3,
              warmup=1, latency_inner=5, build_reps=2, compile_reps=1)


class Measure(Protocol):
    def value(self, wl: dict | None, lim: dict) -> float | None: ...


@dataclass(frozen=True)
class Workload:
    """One workload. ``title`` may name {m} (millions of parameters), {tensors} and
    {size} (parameters per tensor). ``params``: Sizes -> the parameters; ``n``: without
    them, the Sizes field of the element count (the stream anchors', memory's); ``inner``:
    the Sizes field of the calls per sample; ``runner``: "timed" in this process,
    "build", "memory" or "trainer" (bench/trainer_bench.py, default and quiet pools)
    in new ones."""
    name: str
    title: str
    params: Callable[[Sizes], ParamSet] | None = None
    rows: tuple[str, ...] = ()
    reference: str | None = None
    anchors: tuple[str, ...] = ("triad",)
    n: str | None = None
    inner: str | None = None
    bandwidth: bool = True            # False: latency-bound, no "% of limit"
    note: str = ""
    goals: tuple[tuple[Goal, Measure], ...] = ()
    runner: str = "timed"
    trainer: str = ""                 # runner "trainer": trainer_bench.py's workload


def flat(n_field: str, wd: float = 0.0) -> Callable[[Sizes], ParamSet]:
    return lambda sz: flat_params(getattr(sz, n_field), wd=wd)


def bert(sz: Sizes) -> ParamSet:
    return bert_params(sz.bert_layers, sz.bert_vocab)


def latency(sz: Sizes) -> ParamSet:
    return flat_params(sz.latency_tensors * sz.latency_size, sz.latency_tensors)


def adam_goals(label: str) -> tuple[tuple[Goal, Measure], ...]:
    """The goals of a one-tensor Adam workload; the state formats' against fp32 Adam."""
    return ((Goal(f"{label}: optgen / torch fused", "<=", 1.0), Ratio(OPTGEN, FUSED)),
            (Goal(f"{label}: optgen bytes/s / limit", ">=", 0.90), OfLimit(OPTGEN, ADAM_B)),
            *((Goal(f"{label}: optgen {f} states / torch fused fp32", "<=", t),
               Ratio(state_row(f), FUSED)) for f, t in STATE_TARGETS.items()))


def versus(label: str, names: tuple[str, ...], others: tuple[tuple[str, float], ...]):
    """For each optgen row (the flattened one tagged), its median over each other row's."""
    return tuple((Goal(f"{label}{' (flatten)' if 'flatten' in n else ''}: optgen / {o}",
                       "<=", t), Ratio(n, o)) for n in names for o, t in others)


def loose_goal(label: str) -> tuple[tuple[Goal, Measure], ...]:
    """Issue 31: loose tensors (the default multi-tensor launch) within 1.1x of flatten."""
    return ((Goal(f"{label}: optgen loose / optgen flatten", "<=", 1.1),
             Ratio(OPTGEN, OPTGEN_FLAT)),)


ADAM_ROWS = (OPTGEN, *(state_row(f) for f in STATE_FORMATS), FUSED, FOREACH)
WORKLOADS: tuple[Workload, ...] = (
    Workload("stream", "STREAM copy/triad/axpy, {m:g}M fp32", n="stream",
             anchors=("copy", "triad", "axpy")),
    Workload("adam-10m", "Adam fp32, {m:g}M params, 1 tensor", flat("adam_small"),
             ADAM_ROWS + (NUMPY_INPLACE, NUMPY_EXPR), FUSED, goals=adam_goals("Adam 10M")),
    Workload("adam-100m", "Adam fp32, {m:g}M params, 1 tensor", flat("adam_large"),
             ADAM_ROWS + (NUMPY_INPLACE,), FUSED,
             note="numpy out-of-place left out at 100M (temporaries, ~17x slower)",
             goals=adam_goals("Adam 100M")),
    Workload("bert-adam", f"BERT-base list, Adam, wd {WD} on weights", bert,
             (OPTGEN, OPTGEN_PER, OPTGEN_FLAT, FUSED, FOREACH), FUSED,
             goals=versus("BERT Adam", (OPTGEN, OPTGEN_FLAT),
                          ((FUSED, 1.0), (FOREACH, 0.33))) + loose_goal("BERT Adam")),
    # the flattened LAMB: segmented passes, one call per pass per decay group
    Workload("bert-lamb", f"BERT-base list, LAMB, wd {WD} on weights", bert,
             (LAMB_OPTGEN, LAMB_FLAT, LAMB_TORCH, LAMB_OPTAX), LAMB_TORCH),
    Workload("lamb-10m", f"LAMB fp32, {{m:g}}M params, 1 tensor, wd {WD}", flat("lamb", WD),
             (LAMB_OPTGEN, LAMB_TORCH, LAMB_OPTAX), LAMB_TORCH,
             goals=((Goal("LAMB 10M: optgen / optax.lamb jit", "<=", 0.67),
                     Ratio(LAMB_OPTGEN, LAMB_OPTAX)),
                    (Goal("LAMB 10M: optgen / torch foreach LAMB", "<=", 0.67),
                     Ratio(LAMB_OPTGEN, LAMB_TORCH)),
                    (Goal("LAMB 10M: optgen time / 28-B limit time", "<=", 1.6),
                     OfLimit(LAMB_OPTGEN, ADAM_B, inverse=True)))),
    Workload("small-100x1k", "step latency, {tensors} x {size} params", latency,
             (OPTGEN, OPTGEN_PER, OPTGEN_FLAT, FUSED, FOREACH), FUSED, anchors=(),
             inner="latency_inner", bandwidth=False,
             goals=versus("100x1k latency", (OPTGEN, OPTGEN_FLAT), ((FUSED, 0.5),))
             + loose_goal("100x1k latency")),
    *(Workload(f"trainer-{t}", f"trainer-like: torch fwd/bwd then the step, {t}",
               runner="trainer", trainer=t, reference=TRAINER_FUSED,
               goals=((Goal(f"trainer {t}: optgen default / torch fused", "<=", 1.0),
                       Ratio(TRAINER_DEFAULT, TRAINER_FUSED)),))
      for t in ("mlp", "10m", "gpt2")),
    Workload("build", "build: new processes (optgen adam, llvm; torch.compile)",
             runner="build",
             goals=((Goal("cold optgen build, new process wall", "<", 3.0, ".2f", " s"),
                     Median("optgen cold: process wall")),
                    (Goal("cache hit: optgen.build() after import", "<", 0.5, ".3f", " s"),
                     Median("optgen hit: build() call")))),
    Workload("memory", "peak extra RSS in one step, {m:g}M fp32", n="memory",
             rows=(OPTGEN, FUSED, FOREACH, LAMB_OPTGEN, LAMB_TORCH), runner="memory",
             goals=tuple((Goal(f"extra RSS in a step, {n}, % of param bytes", "<", 1.0,
                               ".2f", " %"), ExtraRss(n)) for n in (OPTGEN, LAMB_OPTGEN))),
)
BY_NAME = {w.name: w for w in WORKLOADS}

"""The timing harness that ``optgen bench`` and the scripts in bench/ share.

One protocol for every side-by-side measurement: each contender is one callable that
steps its own copy of the data; every contender is warmed up first; then rep r times
every contender once, starting at contender r mod k, so drift of the machine (another
process taking a core, a clock change, a pool falling asleep) hits all of them alike.
Results are medians and ratios of medians, never one sample.

- ``Contender``: a named callable, the bytes one call must move, its samples;
- ``interleave``: the timing loop (``rotations`` is its order, ``wall_clock`` its
  default sampler; a GPU script passes a sampler built on device events);
- ``Goal``: a target with its comparison, judged MET / MISSED / not run;
- ``quiet_pools``, ``cpu_model``, ``thread_env``: the machine facts a report prints.

The harness measures; what a benchmark's report shows is up to its script.
"""
from __future__ import annotations

import operator
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

# seconds per call of ``step`` over a batch of ``inner`` calls
Sampler = Callable[[Callable[[], object], int], float]
QUIET_ENV = {"OMP_WAIT_POLICY": "passive", "TVM_THREAD_POOL_SPIN_COUNT": "0"}
THREAD_ENV = ("TVM_NUM_THREADS", "TVM_THREAD_POOL_SPIN_COUNT", "OMP_NUM_THREADS",
              "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "XLA_FLAGS")
ORDERS = ("interleave", "blocked")


@dataclass
class Contender:
    """One row of a side-by-side benchmark. ``bytes``: what one call must move (0 where
    bandwidth means nothing); ``weights``: the final parameters (flat), for checking that
    every contender computed the same steps; ``inner``: calls per timed sample (for calls
    too short for the clock)."""
    name: str
    step: Callable[[], object]
    bytes: int = 0
    kind: str = ""
    weights: Callable[[], object] | None = None
    note: str = ""
    inner: int = 1
    times: list[float] = field(default_factory=list)   # seconds per call, one per sample

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def best(self) -> float:
        return min(self.times)

    def gbps(self, seconds: float) -> float:
        """The bandwidth (GB/s) of moving ``bytes`` in ``seconds``."""
        return self.bytes / seconds / 1e9


def wall_clock(clock: Callable[[], float] = time.perf_counter) -> Sampler:
    """The default sampler: ``inner`` calls between two readings of ``clock``."""
    def sample(step: Callable[[], object], inner: int) -> float:
        t0 = clock()
        for _ in range(inner):
            step()
        return (clock() - t0) / inner
    return sample


def rotations(k: int, reps: int) -> Iterator[list[int]]:
    """The contender indices of each interleaved rep: rep r starts at r mod k."""
    for rep in range(reps):
        start = rep % k
        yield list(range(start, k)) + list(range(start))


def interleave(contenders: Sequence[Contender], reps: int, warmup: int = 1,
               order: str = "interleave", gap_s: float = 0.0, wake: bool = False,
               sample: Sampler | None = None,
               sleep: Callable[[float], None] = time.sleep) -> None:
    """Warm every contender up (``warmup`` untimed calls each), then append ``reps``
    samples to each one's ``times``. ``gap_s``: an untimed pause before each sample, so
    the previous contender's thread pool goes idle; ``wake``: one untimed call after the
    pause, so the sample does not pay the own pool's wake-up. ``order="blocked"`` runs
    each contender's reps back to back: a diagnostic only, as drift then biases ratios."""
    if order not in ORDERS:
        raise ValueError(f"interleave: order {order!r} is not one of {', '.join(ORDERS)}")
    if reps < 1 or warmup < 0 or any(c.inner < 1 for c in contenders):
        raise ValueError(f"interleave: need reps >= 1, warmup >= 0 and inner >= 1 "
                         f"(reps={reps}, warmup={warmup})")
    sample = sample or wall_clock()
    for c in contenders:
        for _ in range(warmup):
            c.step()

    def one(c: Contender) -> None:
        if gap_s:
            sleep(gap_s)
        if wake:
            c.step()
        c.times.append(sample(c.step, c.inner))

    if order == "blocked":
        for c in contenders:
            for _ in range(reps):
                one(c)
        return
    for idx in rotations(len(contenders), reps):
        for i in idx:
            one(contenders[i])


def median(times: Sequence[float]) -> float:
    return statistics.median(times)


def ratio(a: Sequence[float] | None, b: Sequence[float] | None) -> float | None:
    """median(a) / median(b); None where either was not measured."""
    return median(a) / median(b) if a and b else None


# -- goals ---------------------------------------------------------------------------------
OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}


@dataclass(frozen=True)
class Goal:
    """A target for a measured value: ``value <op> target``."""
    text: str
    op: str
    target: float
    fmt: str = ".2f"          # how the value prints
    unit: str = ""

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"goal {self.text!r}: comparison {self.op!r} is not one of "
                             f"{', '.join(OPS)}")

    def judge(self, value: float | None) -> str:
        """"MET", "MISSED", or "not run" where nothing was measured (None)."""
        if value is None:
            return "not run"
        return "MET" if OPS[self.op](value, self.target) else "MISSED"

    def record(self, value: float | None, suffix: str = "") -> dict:
        """The goal's line of a report, as JSON-ready data."""
        return {"goal": self.text + suffix, "value": value, "op": self.op,
                "target": self.target, "fmt": self.fmt, "unit": self.unit,
                "status": self.judge(value)}


def goal_line(g: dict) -> str:
    """One printed goal line from ``Goal.record``'s data."""
    value = "-" if g["value"] is None else format(g["value"], g["fmt"]) + g["unit"]
    target = f"{g['op']} {g['target']:g}{g['unit']}"
    return f"  {g['goal']:<58} {value:>10}  {target:<10} {g['status']}"


# -- machine ---------------------------------------------------------------------------------
def quiet_pools() -> list[str]:
    """Idle thread pools sleep at once instead of spinning into the next contender's
    call: sets QUIET_ENV's variables where unset and returns the names it set. Call it
    before torch and TVM start (libgomp reads them when torch loads, TVM when its pool
    starts)."""
    set_here = [k for k in QUIET_ENV if k not in os.environ]
    for k in set_here:
        os.environ[k] = QUIET_ENV[k]
    return set_here


def thread_env() -> dict[str, str | None]:
    """The thread-pool settings of this process's environment."""
    return {k: os.environ.get(k) for k in THREAD_ENV}


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what platform knows."""
    fallback = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), fallback)
    except OSError:   # no /proc (not Linux)
        return fallback

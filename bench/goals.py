"""How a goal's value is read from a workload's results (the goals themselves, with their
targets and comparisons, are in the workload table, workloads.py). Each measure reads
one workload's result dict, as measure.py returns it and report.summarize completes it,
and gives None where the rows it needs were not run."""
from __future__ import annotations

import statistics
from dataclasses import dataclass


def row(wl: dict | None, contender: str) -> dict | None:
    """The row of ``contender`` in the workload's results, None if it has none."""
    if wl is None:
        return None
    return next((r for r in wl["rows"] if r["contender"] == contender), None)


def med(r: dict) -> float:
    return statistics.median(r["times_s"])


@dataclass(frozen=True)
class Ratio:
    """median(a) / median(b), both rows of the workload."""
    a: str
    b: str

    def value(self, wl: dict | None, lim: dict) -> float | None:
        ra, rb = row(wl, self.a), row(wl, self.b)
        return med(ra) / med(rb) if ra and rb else None


@dataclass(frozen=True)
class OfLimit:
    """The row's bandwidth, counting ``per_param`` bytes per parameter at its median,
    over the run's limit; ``inverse``: its time over the limit time instead."""
    contender: str
    per_param: int
    inverse: bool = False

    def value(self, wl: dict | None, lim: dict) -> float | None:
        r = row(wl, self.contender)
        if not r or not lim["limit_Bps"]:
            return None
        f = self.per_param * wl["params"] / med(r) / lim["limit_Bps"]
        return (1 / f if f else None) if self.inverse else f


@dataclass(frozen=True)
class Median:
    """The row's median, seconds."""
    contender: str

    def value(self, wl: dict | None, lim: dict) -> float | None:
        r = row(wl, self.contender)
        return med(r) if r else None


@dataclass(frozen=True)
class ExtraRss:
    """The row's extra peak RSS in a later step, % of the parameters' bytes."""
    contender: str

    def value(self, wl: dict | None, lim: dict) -> float | None:
        r = row(wl, self.contender)
        return 100 * r["step_bytes"] / r["param_bytes"] if r else None

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

The items and cells: composition_items.py, composition_rows.py, composition_rules.py.
Pure data and lookups: no torch, no numpy. Imports: composition_items,
composition_rules (which fills the table).
"""
from __future__ import annotations

import itertools
from typing import Iterable

from . import composition_rules  # noqa: F401  (the table filled)
from .composition_items import (FEATURES, ITEMS, OPTIONS, TABLE, WHEN, Verdict,  # noqa: F401
                                composes, refused)


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

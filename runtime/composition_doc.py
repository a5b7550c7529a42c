"""The composition table as docs/reliability.md shows it ("How options compose"): a
matrix of symbols (✓ composes, ✗ refused at construction, ! refused at the first step)
and, below it, each item's cells with their texts.

    python -m optgen.runtime.composition_doc            # prints the section
    python -m optgen.runtime.composition_doc --write docs/reliability.md

``--write`` replaces what lies between the markers (``BEGIN`` and ``END``) of that file;
tests/test_composition_pairs.py checks that the file holds what ``markdown()`` makes.
Imports: composition.
"""
from __future__ import annotations

import sys

from . import composition

BEGIN = "<!-- composition table: made by python -m optgen.runtime.composition_doc -->"
END = "<!-- end of the composition table -->"
SYMBOL = {(True, "construction"): "✓", (False, "construction"): "✗",
          (False, "first step"): "!"}


def symbol(a: str, b: str) -> str:
    if a == b:
        return "·"
    v = composition.TABLE.get(frozenset((a, b)))
    return "?" if v is None else SYMBOL[v.composes, v.when]


def _cell_text(v: composition.Verdict) -> str:
    if v.composes:
        return f"✓ {v.text}"
    unless = f" (composes with {v.unless})" if v.unless else ""
    return f"{SYMBOL[False, v.when]} refused at {v.when}{unless}: {v.text}"


def markdown() -> str:
    """The section's body: the matrix, then per item its cells with each later item
    (cells of one text listed together)."""
    items = composition.ITEMS
    head = "| | " + " | ".join(str(j + 1) for j in range(len(items))) + " |"
    lines = ["✓ composes, ✗ refused at construction, ! refused at the first step, "
             "? not decided. Columns are numbered as the rows.", "",
             head, "|---" * (len(items) + 1) + "|"]
    for i, a in enumerate(items):
        lines.append(f"| {i + 1} `{a}` | " + " | ".join(symbol(a, b) for b in items) + " |")
    lines.append("")
    for i, a in enumerate(items):
        by_text: dict[str, list[str]] = {}
        for b in items[i + 1:]:
            v = composition.TABLE.get(frozenset((a, b)))
            by_text.setdefault("? not decided" if v is None else _cell_text(v), []).append(b)
        if not by_text:
            continue
        what = composition.OPTIONS.get(a) or composition.FEATURES[a]
        lines += [f"**{i + 1} `{a}`** ({what}), with:", ""]
        lines += [f"- {', '.join(f'`{b}`' for b in bs)}: {text}" for text, bs in by_text.items()]
        lines.append("")
    return "\n".join(lines)


def replaced(doc: str) -> str:
    """``doc`` with the text between the markers made anew."""
    if BEGIN not in doc or END not in doc:
        raise ValueError(f"the file has no composition table markers ({BEGIN} ... {END})")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{markdown()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write"] and len(argv) == 2:
        with open(argv[1], encoding="utf-8") as f:
            doc = f.read()
        with open(argv[1], "w", encoding="utf-8") as f:
            f.write(replaced(doc))
        return 0
    if argv:
        print("usage: python -m optgen.runtime.composition_doc [--write FILE]", file=sys.stderr)
        return 2
    print(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

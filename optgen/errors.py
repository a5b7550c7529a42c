"""Errors raised by the compiler side of optgen."""
from __future__ import annotations


class SpecError(Exception):
    """A spec is invalid. ``str(err)`` reads ``file:line: message (hint: how to fix it)``,
    one line; ``file``, ``line``, ``message`` and ``hint`` are attributes."""

    def __init__(self, message: str, loc=None, *, file: str | None = None,
                 line: int | None = None, hint: str | None = None):
        self.message = message
        self.hint = hint
        self.file = file if file is not None else getattr(loc, "file", None)
        self.line = line if line is not None else getattr(loc, "line", None)
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        return where + self.message + (f" (hint: {self.hint})" if self.hint else "")


class BuildError(RuntimeError):
    """TVM or the toolchain failed on a spec that passed the verifier (an optgen bug)."""

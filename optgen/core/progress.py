"""Progress lines for commands that may take a while (``optgen build``, ``optgen check``).

A command that finishes within ``$OPTGEN_PROGRESS_AFTER`` seconds (default 2) prints
nothing; past that, one line on stderr says what it is doing (its task: the spec, the
target, the variant k of n, and the stage: trace, lower, compile, link, verify), and then
one line each time the stage or the task changes, never more::

    optgen: [2.0 s] lamb for llvm: compile (variant f32-bias_correction)
    optgen: [2.1 s] check lamb, variant f64 (2 of 4): verify

The compiler reports its stages (``stage``) whether or not a command listens: without an
active ``reporting`` block they cost a global lookup.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import TextIO

AFTER = 2.0           # seconds before the first line (OPTGEN_PROGRESS_AFTER)
STAGES = ("trace", "lower", "compile", "link", "verify")


class Progress:
    """The task and stage of one command; printed once ``after`` seconds have passed
    (by a timer thread, so a long stage is reported while it runs), then at each change."""

    def __init__(self, after: float, stream: TextIO):
        self.after, self.stream = after, stream
        self.start = time.monotonic()
        self._task = self._stage = ""
        self._due = False                 # ``after`` has passed: print each change
        self._shown: str | None = None    # the last line printed (without its time)
        self._lock = threading.Lock()
        self._timer = threading.Timer(after, self._wake)
        self._timer.daemon = True
        self._timer.start()

    def task(self, text: str) -> None:
        """What the command works on now (``adam for llvm``); its stage starts empty."""
        with self._lock:
            self._task, self._stage = text, ""

    def stage(self, name: str, detail: str = "") -> None:
        """The stage the task is in now (one of STAGES), and what it works on (left out
        where the task says it already)."""
        with self._lock:
            self._stage = f"{name} ({detail})" if detail and detail not in self._task else name
            self._print()

    def close(self) -> None:
        self._timer.cancel()

    def _wake(self) -> None:
        with self._lock:
            self._due = True
            self._print()

    def _print(self) -> None:
        line = f"{self._task}: {self._stage}" if self._task else self._stage
        if not self._due or not self._stage or line == self._shown:
            return
        self._shown = line
        with contextlib.suppress(OSError, ValueError):   # (a closed or broken stderr)
            print(f"optgen: [{time.monotonic() - self.start:.1f} s] {line}",
                  file=self.stream, flush=True)


_current: Progress | None = None


def after() -> float:
    """``$OPTGEN_PROGRESS_AFTER`` (seconds, >= 0), else AFTER."""
    text = os.environ.get("OPTGEN_PROGRESS_AFTER", "").strip()
    if not text:
        return AFTER
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:       # (NaN too)
        raise ValueError(f"OPTGEN_PROGRESS_AFTER={text!r}: expected a number of seconds >= 0")
    return value


@contextlib.contextmanager
def reporting(stream: TextIO | None = None):
    """Report the stages of the block's builds and checks (see the module's docstring)
    on ``stream`` (default: stderr)."""
    global _current
    outer, _current = _current, Progress(after(), stream or sys.stderr)
    try:
        yield _current
    finally:
        _current.close()
        _current = outer


def task(text: str) -> None:
    """Set the active report's task (nothing without one)."""
    if _current is not None:
        _current.task(text)


def stage(name: str, detail: str = "") -> None:
    """Set the active report's stage (nothing without one)."""
    if _current is not None:
        _current.stage(name, detail)

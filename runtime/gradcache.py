"""The gradients of an optimizer's steps as the runtime last saw them, and the one rule
for when what was derived from them is stale.

Per parameter it keeps the gradient that passed the checks (a weak reference, its
layout, the bytes it covers) and a generation number. A parameter's generation changes
when

- its gradient's storage changes: another object, or the same object with another
  address, shape, strides or dtype (numpy: or writeable flag); a gradient that is
  missing (None) or row-sparse counts as none, a change only when it comes or goes;
- its step count is set from outside a step (``Optimizer.set_step_counts``);
- its data moves (runtime/storage.py: the check's overlap verdict read it).

Multipliers are not in it: the runs are grouped by them and found again when they
change (``Optimizer.set_lr_mult``). Everything derived from gradients is kept while
the generations it read hold:

    the check's verdict    a gradient that passed is not checked again   (checks.py)
    a run's verdict        whether a flat run or multi-tensor list fuses: its members'
                           gradients present and dense, their step counts equal, the
                           gradients back to back (flat) or apart from the run's
                           arrays (multi-tensor)                (strategies/base.py)
    a run's pointers       a multi-tensor table's gradient column, a flat run's span

``version`` changes with every generation, so a run whose verdict is current pays one
comparison a step.

May import: tensors.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Iterable, Sequence

from . import tensors

NONE = ("none",)   # the layout of a parameter without a dense gradient this step


def layout(g: Any, lib: str) -> tuple:
    """What a gradient's cached verdicts depend on besides the object: where and how it
    lies (address, shape, strides, dtype, device; a numpy array's memory is fixed for
    its life: its form and writeability)."""
    if lib == "torch":
        return g.data_ptr(), g.shape, g.stride(), g.dtype, g.device
    if lib == "numpy":
        return g.shape, g.dtype, g.strides, g.flags.writeable
    return g.data.ptr, g.shape, g.strides, g.dtype, g.device.id


class GradCache:
    """The gradient each parameter was last given, and the generations of the rule."""

    def __init__(self, n: int):
        self.refs: list[Any] = [None] * n            # weakref of the gradient checked
        self.layouts: list[tuple | None] = [None] * n
        self.ranges: list[tuple[int, int]] = [(0, 0)] * n   # its bytes [start, end)
        self.gens = [0] * n
        self.version = 0

    def unseen(self, grads: Sequence[Any], slots: Sequence[Any],
               among: Sequence[int] | None = None) -> list[int]:
        """The parameters whose gradient in ``grads`` is not the one they were given
        last, in the same place and form (``slots``: their records): the ones to check
        and note; a missing gradient that was missing last time is seen. ``among``:
        only those parameters are looked at (a step in parts)."""
        refs, layouts, out = self.refs, self.layouts, []
        for i in range(len(grads)) if among is None else among:
            g = grads[i]
            if g is None:
                if layouts[i] is not NONE:
                    out.append(i)
                continue
            r = refs[i]
            if r is None or r() is not g or layouts[i] != layout(g, slots[i].lib):
                out.append(i)
        return out

    def note(self, i: int, g: Any, lib: str, where: tuple[int, int] | None = None) -> None:
        """Parameter ``i``'s gradient is ``g`` (checked, or made from one that was;
        ``where``: its bytes, when the caller has them)."""
        try:
            self.refs[i] = weakref.ref(g)
        except TypeError:       # an array type without weak references: never "seen"
            self.refs[i] = None
        self.layouts[i] = layout(g, lib)
        self.ranges[i] = where or tensors.address_range(g, lib)
        self._bump(i)

    def none(self, i: int) -> None:
        """Parameter ``i`` has no dense gradient this step (None, or row-sparse)."""
        if self.layouts[i] is not NONE:
            self.refs[i], self.layouts[i], self.ranges[i] = None, NONE, (0, 0)
            self._bump(i)

    def replaced(self, grads: Sequence[Any], slots: Sequence[Any]) -> None:
        """The kernels read ``grads[i]`` in place of the checked gradient of each of
        ``slots`` (their records) this step: new arrays (gradient centralization); the
        check's verdict on the gradients given stays."""
        for s in slots:
            if grads[s.index] is not None:
                self.ranges[s.index] = tensors.address_range(grads[s.index], s.lib)
                self._bump(s.index)

    def changed(self, indices: Iterable[int]) -> None:
        """Something a run's verdict reads changed for these parameters (their step
        counts were set): every run holding one decides again."""
        for i in indices:
            self._bump(i)

    def forget(self, indices: Iterable[int]) -> None:
        """These parameters' data moved: their gradients are checked again (the check
        compared them with the old data), and every run holding one decides again."""
        for i in indices:
            self.refs[i] = self.layouts[i] = None
            self._bump(i)

    def dense(self, indices: Sequence[int]) -> bool:
        """Whether each of ``indices`` has a dense gradient this step."""
        return all(self.layouts[i] not in (None, NONE) for i in indices)

    def _bump(self, i: int) -> None:
        self.gens[i] += 1
        self.version += 1


class Verdict:
    """A run's verdict on its members' gradients: ``make(step)``'s ``value`` (None: the
    run declines), made again by ``update`` only on a step where one of their
    generations changed. Current while ``version`` is the cache's (one comparison:
    ``verdict.version == cache.version``, the runs' fast path)."""

    def __init__(self, cache: GradCache, indices: Sequence[int],
                 make: Callable[[Any], Any]):
        self.cache, self.indices, self.make = cache, list(indices), make
        self.version, self.gens, self.value = -1, None, None

    def update(self, step: Any) -> Any:
        """The verdict for this step (made again if a member's generation changed)."""
        c = self.cache
        gens = [c.gens[i] for i in self.indices]
        if gens != self.gens:
            self.value, self.gens = self.make(step), gens
        self.version = c.version
        return self.value


__all__ = ["GradCache", "Verdict", "layout"]

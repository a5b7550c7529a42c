"""The optimizer's record of one parameter: ``ParamSlot``.

An Optimizer keeps one table of these (``Optimizer.records``), one per parameter in
its order; everything it knows about a parameter lives in its slot, and the runtime's
rooms (launch.py, the launch strategies of strategies/, checkpoint.py, the torch layer)
read the slot rather than parallel lists. The fields fall into four parts: what the
trainer gave (array, name, group), what is fixed at construction (library, shape view,
flags set by shape and name, state format, split across ranks, flat chain), what a
step changes (states, step count, multipliers, the last refresh) and what preparing a
kernel fills in (the kernel, its launch strategy, its launch plan and workspaces).

Other modules read slots freely; the Optimizer's methods are what change them
(``set_lr_mult``, ``set_step_counts``, ``load_state_dict``, ...). ``RecordTable`` is
the Optimizer's interface to its table (``records``, ``params``, ``names``, ``state``).

May import: nothing of the runtime (types only).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence


@dataclass(eq=False)
class ParamSlot:
    """One parameter of an optimizer and everything the optimizer keeps for it."""
    index: int                     # its position in the optimizer's order
    array: Any                     # the parameter (numpy, torch, CuPy), updated in place
    lib: str                       # its library: "numpy", "torch" or "cupy"
    name: str | None = None
    group: int = 0                 # its group's index
    dims: tuple[int, int, int] = (1, 1, 1)   # its [B, R, C] view (optgen.core.views)
    fixed_flags: dict[str, bool] = field(default_factory=dict)  # set by shape and name
    lr_mult: float = 1.0
    wd_mult: float = 1.0
    steps: int = 0                 # updates applied to it (its bias corrections' t)
    state: dict[str, Any] = field(default_factory=dict)   # name -> array or np.float64
    mixed: bool = False            # low precision stepped through a float32 master copy
    formatted: bool = False        # its states are kept in the requested state format
    split: Any = None              # its runtime.shards.Split (None: whole on this rank)
    chain: tuple[int, int] | None = None   # its flat chain [start, end) (runtime/flat.py)
    refreshed: int | None = None   # its step count at its last refresh rule
    where: tuple | None = None     # its data as karg, plan and runs saw it (storage.py)
    # prepared (under the current flags): its kernel and how it is launched
    kernel: Any = None             # runtime.artifact.KernelInfo, None until prepared
    strategy: Any = None           # its launch strategy alone (runtime/strategies/)
    # the launcher's (runtime/launch.py): kernel argument, size, plan, workspaces
    karg: Any = None
    numel: int = 0
    bf16_numpy: bool = False
    plan: list | None = None
    work: dict[str, dict[str, Any]] = field(default_factory=dict)

    def forget_kernel(self) -> None:
        """Prepare the kernel again before the next launch (flags or states changed)."""
        self.kernel = self.strategy = None


class RecordTable:
    """The table of an optimizer's records (``_slots``, set by the Optimizer), and the
    views of it that trainers, checkpoints and the torch layer read."""
    _slots: tuple[ParamSlot, ...]

    @property
    def records(self) -> tuple[ParamSlot, ...]:
        """Each parameter's record, in order (read them; the methods change them)."""
        return self._slots

    @property
    def params(self) -> list[Any]:
        """The parameters, in the optimizer's order."""
        return [s.array for s in self._slots]

    @property
    def names(self) -> list[str | None]:
        """The parameters' names (None where unnamed)."""
        return [s.name for s in self._slots]

    @property
    def state(self) -> list[dict[str, Any]]:
        """Each parameter's states: name -> array, or np.float64 for scalar states (the
        dicts themselves: changing a value in place changes the state)."""
        return [s.state for s in self._slots]

    def adopt(self, i: int, donor: ParamSlot) -> None:
        """Parameter ``i`` goes on from ``donor``, another optimizer's record of the same
        array: its states, step count and last refresh (the torch layer rebuilds its
        optimizer when a group is added)."""
        s = self._slots[i]
        s.state, s.steps, s.refreshed = donor.state, donor.steps, donor.refreshed
        self._counts_set([i])

    def set_step_counts(self, counts: Mapping[int, int]) -> None:
        """Parameter index -> its step count (torch checkpoints keep one per parameter)."""
        for i, n in counts.items():
            self._slots[i].steps = int(n)
        self._counts_set(list(counts))

    def _counts_set(self, indices: Sequence[int]) -> None:
        """These parameters' step counts were set from outside a step (the Optimizer:
        what was kept on them is decided again)."""

    # the per-parameter lists of earlier versions, as views of the table (tests read them)
    @property
    def _steps(self) -> list[int]:
        return [s.steps for s in self._slots]

    @_steps.setter
    def _steps(self, counts: Sequence[int]) -> None:
        self.set_step_counts(dict(enumerate(counts)))

    @property
    def _wd_mult(self) -> list[float]:
        return [s.wd_mult for s in self._slots]

    @property
    def _flags_fixed(self) -> list[dict[str, bool]]:
        return [s.fixed_flags for s in self._slots]


__all__ = ["ParamSlot", "RecordTable"]

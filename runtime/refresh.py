"""Refresh rules of matrix optimizers (THOR's inverses, Shampoo's roots, SOAP's basis):
when they run and what they read.

A kernel with a refresh rule recomputes some states (in float64, or in the kernel's
dtype where the spec says so: SOAP's float32, as its authors' code; with torch where
torch parameters live, refresh_torch, else with numpy's reference interpreter) from the
parameter, its states and statistics the trainer passes (THOR's ``A`` and ``G``),
before a parameter's step ``start`` (its first step unless the spec says otherwise;
SOAP: its second) and then every ``every`` steps (a number or a hyperparameter). The statistics are read, and checked (here), only on
the steps that refresh; a trainer asks ``refresh_due`` to compute them only then.

May import: numpy, checks, owned, reference, refresh_torch, tensors.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import checks, owned, refresh_torch, tensors
from optgen.core import reference


def every(k: Any, hyper: Mapping[str, Any]) -> int:
    """How many steps apart kernel ``k``'s refreshes are, under a group's ``hyper``."""
    n = k.refresh["every"]
    return int(hyper[n]) if isinstance(n, str) else int(n)


def start(k: Any) -> int:
    """The parameter's step of kernel ``k``'s first refresh (1 unless the spec says)."""
    return int(k.refresh.get("start", 1))


def due(k: Any, refreshed: int | None, step: int, hyper: Mapping[str, Any]) -> bool:
    """Whether a parameter's next step runs kernel ``k``'s refresh rule: its steps s,
    s + every, s + 2 every, ... (s = ``start(k)``; its first refresh also comes at the
    first step from s on when ``refreshed`` is None); ``step`` is its step count so far.
    A rule that reads the step's gradient (Shampoo's ``fresh_roots``) runs on its steps
    every, 2 every, ... from s on instead."""
    if k.refresh is None or step + 1 < start(k):
        return False
    if k.refresh.get("grad"):
        return (step + 1) % every(k, hyper) == 0
    return refreshed is None or (step + 1 - start(k)) % every(k, hyper) == 0


def last(k: Any, steps: int, hyper: Mapping[str, Any]) -> int | None:
    """The step count before a parameter's last refresh on kernel ``k``'s schedule after
    ``steps`` steps (None before its first refresh, or without a refresh rule): what a
    checkpoint that keeps step counts only (torch's) restores."""
    if k.refresh is None or steps < start(k):
        return None
    n = every(k, hyper)
    return (steps - start(k)) // n * n + start(k) - 1


# -- the statistics a refresh reads -------------------------------------------------------
def check_statistic_lists(owner: str, stats: Mapping[str, Any], n: int) -> None:
    """Each statistic is a list with one matrix (or None) per parameter."""
    for name, arrays in stats.items():
        if tensors.library(arrays) is not None or not isinstance(arrays, (list, tuple)):
            raise TypeError(f"{owner}: {name} must be a list with one matrix (or "
                            "None) per parameter")
        if len(arrays) != n:
            raise ValueError(f"{owner}: got {len(arrays)} {name} matrices for "
                             f"{n} parameters")


def check_statistic(what: str, a: Any, n: int, reads: Sequence[str]) -> np.ndarray:
    """One statistic matrix (``what`` names it for the message) as a float64 numpy
    ``n x n`` copy, present, finite; ``reads`` are the statistics its rule reads."""
    if a is None:
        raise ValueError(f"{what}, which is missing: pass step(grads, "
                         f"{', '.join(f'{s}=[...]' for s in reads)}) "
                         "on steps where opt.refresh_due is True")
    lib = tensors.library(a)
    if lib is None:
        raise TypeError(f"{what}; got {type(a).__name__}, not an array")
    host = np.asarray(tensors.to_numpy(a, lib), dtype=np.float64)
    if host.shape != (n, n):
        raise ValueError(f"{what}; got shape {tuple(host.shape)}")
    if not np.isfinite(host).all():
        raise ValueError(f"{what}; it has NaN or Inf values")
    return host


def collect(owner: str, stats: Mapping[str, Any], grads: Sequence[Any],
            slots: Sequence[Any], *, kinds: Mapping[str, str],
            kernel_of: Callable[[int], Any], is_due: Callable[[int, Any], bool]
            ) -> dict[int, dict[str, np.ndarray]]:
    """Parameter -> its statistics (numpy float64) for the parameters this step
    refreshes (``slots``: the optimizer's records; ``kinds``: each statistic's shape,
    "rr" or "cc"), and its gradient as ``"grad"`` where the rule reads it; every
    statistic is checked before anything changes."""
    n = len(grads)
    names = [s.name for s in slots]
    check_statistic_lists(owner, stats, n)
    out = {}
    for i, g in enumerate(grads):
        if g is None:
            continue
        k = kernel_of(i)
        if not is_due(i, k):
            continue
        d = slots[i].dims
        out[i] = {"grad": g} if k.refresh.get("grad") else {}   # (read when it runs)
        reads = k.refresh["reads"]
        for name in reads:
            m = d[1] if kinds[name] == "rr" else d[2]
            what = (f"{owner}: step {slots[i].steps + 1} of {checks.label(i, names)} refreshes "
                    f"and reads statistic {name!r} ({m} x {m})")
            out[i][name] = check_statistic(what, stats.get(name, [None] * n)[i], m, reads)
    return out


def dtype(k: Any) -> str:
    """The dtype kernel ``k``'s refresh rule is evaluated in: float64, or the kernel's
    (``spec.refresh(dtype="kernel")``: SOAP, float32 for float32 parameters)."""
    return k.dtype if k.refresh.get("dtype") == "kernel" else "float64"


def run(k: Any, slot: Any, env: Mapping[str, Any], stats: Mapping[str, np.ndarray], *,
        kinds: Mapping[str, str]) -> None:
    """Run kernel ``k``'s refresh rule for a parameter (``slot``: its record) in
    ``dtype(k)`` and store the new states in their dtype: with torch where a torch
    parameter lives (refresh_torch), else on the host (numpy, the reference interpreter)."""
    st, w, lib, d = slot.state, slot.array, slot.lib, owned.whole_dims(slot)
    ir = k.refresh["ir"]
    axes = {**k.buffer_axes, **{n: kinds[n].upper() for n in stats if n != "grad"}}
    scalars = {**env, **{n: v for n, v in st.items() if isinstance(v, np.floating)},
               "rows": d[1], "cols": d[2]}
    if lib == "torch" and refresh_torch.evaluable(ir):
        read = {**{n: v for n, v in st.items() if not isinstance(v, np.floating)}, **stats}
        refresh_torch.store(st, refresh_torch.evaluate(ir, dtype(k), read, axes, scalars, d))
        return
    arrays = {n: tensors.to_numpy(v, lib) for n, v in st.items()
              if not isinstance(v, np.floating)}
    arrays["w"] = tensors.to_numpy(w, lib)
    arrays.update({n: tensors.to_numpy(v, lib) if n == "grad" else v for n, v in stats.items()})
    new = reference.evaluate(ir, dtype(k), arrays, axes, scalars, d)
    for name, value in new.items():
        tensors.copy_into(st[name], lib, value)


class RefreshRules:
    """The Optimizer's refresh rules, per parameter (a base of runtime.Optimizer, whose
    records, groups and kernels it reads)."""

    def _due(self, i: int, k: Any) -> bool:
        s = self._slots[i]
        return due(k, s.refreshed, s.steps, self._groups[s.group].hyper)

    @property
    def refresh_due(self) -> bool:
        """Whether the next step() runs a refresh rule (and reads statistics: THOR's A, G)."""
        return any(self._due(i, self._param_kernel(i)) for i in range(len(self._slots)))

    def restore_refreshes(self, indices: Sequence[int]) -> None:
        """Each parameter's last refresh from its step count (torch checkpoints keep those)."""
        for i in indices:
            s = self._slots[i]
            s.refreshed = last(self._param_kernel(i), s.steps, self._groups[s.group].hyper)

    def _refresh_due(self, grads: list, stats: Mapping[str, Any]) -> dict[int, dict]:
        if not self._refreshing:        # (most specs: nothing to do per step)
            return {}
        return collect(self.name, stats, grads, self._slots, kinds=self.artifact.statistics,
                       kernel_of=self._param_kernel, is_due=self._due)

"""Every rank's step goes on, or none does: the torch drop-ins' step agreement under
torch.distributed.

A step can fail on one rank only: a hyperparameter set on that rank alone, a gradient
of another dtype, shape or device there, a NaN with ``nonfinite="raise"`` in that
rank's ZeRO-1 partition. Left alone, that rank raises while the others go on into the
step's collectives (FSDP2's sums and all-to-alls, ZeRO-1's broadcasts, DDP's next
gradient all-reduce) and wait there until the process group's timeout.

So each step runs everything that may refuse it (pending hyperparameter changes, every
check of the runtime's ``check_step``) first, then the ranks agree in one all-reduce of
five float64 values: how many ranks failed, how many skip the step for a non-finite
gradient, the number of ranks, and a fingerprint of what each steps (FSDP2: its split
parameters and which have gradients) and its square. When any rank failed, the ranks
exchange their errors (one all_gather, on that path only) and every rank raises the
same ``DistributedStepError`` naming each failing rank and what it raised, with
parameters and states unchanged on every rank. When any rank skips, every rank skips.

Which ranks agree (``agree=`` of the drop-ins): ``"auto"`` (the default) is the mesh
dimension FSDP2's parameters are split on, whose steps communicate anyway, else nobody:
a step whose parameters are whole (one process, DDP, ZeRO-1's partitions) sends
nothing unless asked, as torch.optim's does not, so an optimizer that steps on some
ranks only never waits for the others. A ``ProcessGroup`` names the ranks that agree
(DDP and ZeRO-1: ``torch.distributed.group.WORLD`` or a subgroup); ``None`` turns the
agreement off.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from optgen.runtime import shards as runtime_shards

AUTO = "auto"


class DistributedStepError(RuntimeError):
    """A step failed on some rank and was applied on none: raised alike on every rank.
    ``failures``: global rank -> what it raised (``"TypeName: message"``)."""

    def __init__(self, message: str, failures: dict[int, str]):
        super().__init__(message)
        self.failures = failures


@dataclass(frozen=True)
class Agreement:
    """The ranks whose steps agree: ``group`` (None: the default group), the device of
    the values sent, and the split parameters whose fingerprints are compared."""
    group: Any
    device: torch.device
    shards: Any = None


def _dist():
    import torch.distributed as dist
    return dist


def check(owner: str, agree: Any) -> Any:
    """The ``agree`` option: ``"auto"``, None or a torch.distributed ProcessGroup."""
    if agree is None or (isinstance(agree, str) and agree == AUTO):
        return agree
    dist = _dist()
    if dist.is_available() and isinstance(agree, dist.ProcessGroup):
        return agree
    raise TypeError(f"{owner}: agree must be 'auto', None or a torch.distributed "
                    f"ProcessGroup, got {agree!r}")


def choose(agree: Any, shards: Any) -> Agreement | None:
    """Who agrees on this optimizer's steps (see the module's docstring); ``shards``:
    the runtime's split parameters (None: none)."""
    dist = _dist()
    if agree is None or not (dist.is_available() and dist.is_initialized()):
        return None
    if isinstance(agree, str):          # "auto": where the step communicates anyway
        if shards is None:
            return None
        return Agreement(shards.collective.group, shards.collective.device, shards)
    group = agree
    if dist.get_world_size(group) < 2:
        return None
    cuda = "nccl" in str(dist.get_backend(group)) and torch.cuda.is_available()
    return Agreement(group, torch.device("cuda", torch.cuda.current_device()) if cuda
                     else torch.device("cpu"))


def run(agreement: Agreement | None, owner: str, checks: Callable[[], Any],
        grads: Sequence[Any]) -> tuple[Any, bool]:
    """``checks()`` on every rank, then the agreement: its result and whether any rank
    skips the step (the result's ``skips``). Raises on every rank when any rank's
    checks raised (``DistributedStepError``) or the ranks would step different
    parameters (ValueError)."""
    if agreement is None:
        out = checks()
        return out, False
    error, out = None, None
    try:
        out = checks()
    except Exception as e:     # noqa: BLE001 (told to every rank, raised on every rank)
        error = e
    f = runtime_shards.fingerprint(agreement.shards, grads) if agreement.shards else 0.0
    sent = [float(error is not None), float(bool(getattr(out, "skips", False))), 1.0, f, f * f]
    if agreement.shards is not None:   # (counted with the step's other sums)
        values = np.array(sent)
        agreement.shards.all_reduce([values])
    else:
        values = torch.tensor(sent, dtype=torch.float64, device=agreement.device)
        _dist().all_reduce(values, group=agreement.group)
    failed, skips, world, total, squares = values.tolist()
    if failed:
        _raise_everywhere(owner, error, agreement.group)
    if world * squares != total * total:
        raise ValueError(f"{owner}: the ranks would step different parameters (another "
                         "rank's optimizer has other parameters, shapes or splits, or "
                         "gradients where this one has none); nothing was changed")
    return out, bool(skips)


def _raise_everywhere(owner: str, error: BaseException | None, group: Any) -> None:
    dist = _dist()
    got: list = [None] * dist.get_world_size(group)
    said = None if error is None else f"{type(error).__name__}: {error}"
    dist.all_gather_object(got, (dist.get_rank(), said), group=group)
    failures = {r: e for r, e in got if e is not None}
    raise DistributedStepError(
        f"{owner}: the step failed on {len(failures)} of {len(got)} rank(s): " +
        "; ".join(f"rank {r}: {e}" for r, e in sorted(failures.items())) +
        "; nothing was changed on any rank", failures) from error

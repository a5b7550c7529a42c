"""Drop-in ``torch.optim.Optimizer`` classes stepping with optgen's fused kernels.

    model = torch.nn.Linear(10, 1)
    opt = optgen.torch.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    loss.backward(); opt.step(); sched.step(); opt.zero_grad()
    torch.save(opt.state_dict(), "opt.pt")

Two families (docs/catalog.md lists both, side by side):

* **torch forms** (optgen/torch/optim.py): ``Adam``, ``AdamW``, ``SGD``, ``Adagrad``,
  ``RMSprop``, ``Adadelta``, ``Adamax``, ``NAdam``, ``RAdam``, ``Adafactor``, ``Muon``,
  ``ASGD``, ``Rprop``, ``SparseAdam`` are torch.optim's optimizers of the same name:
  torch's signature, defaults, checks, param_groups, rule (the ``torch_<name>`` specs)
  and state_dict. ``TORCH_FORMS`` names them. LBFGS has no twin (a closure-driven line
  search is not a fused elementwise step).
* **seed forms** (optgen/torch/seeds.py): one class per catalog spec, with the spec's
  hyperparameter names and defaults (MXNet/MindSpore conventions):
  ``optgen.torch.seeds.RMSprop``, ``optgen.torch.make("rmsprop")``. Optimizers torch has
  no twin of (``LAMB``, ``Lion``, ``FTML``, ``FTRL``, ``THOR``, ...) are these classes
  under ``optgen.torch`` as before; ``CLASSES`` maps their catalog names to class names.
* ``SOAP`` (optgen/torch/soap.py) is the SOAP authors' optimizer: their signature,
  defaults and rule (the ``soap`` spec), for 1-D and 2-D parameters; ``SOAPNAdam``
  (optgen/torch/soap_nadam.py) is heavyball's SOAP-NAdam with its signature (the
  ``soap_nadam`` spec); ``PSGDKron``
  (optgen/torch/psgd_kron.py) is heavyball's PSGDKron (the ``psgd_kron`` spec, its
  Kronecker factors fitted on the host before each fused step); ``DAdaptAdam``
  (optgen/torch/dadapt.py) is D-Adaptation's authors' DAdaptAdam (the ``dadapt_adam``
  spec); ``Prodigy``, ``CAME`` and ``AdamAtan2`` (optgen/torch/papers.py) and
  ``AdamMini`` (optgen/torch/adam_mini.py) are their authors' classes (the ``prodigy``,
  ``came``, ``adam_atan2`` and ``adam_mini`` specs); ``ADOPT``, ``AdEMAMix``, ``LaProp``,
  ``Yogi``, ``AdaBound``, ``QHAdam``, ``QHM``, ``AdaMod``, ``DiffGrad``, ``SGDW``,
  ``PAdam``, ``Grams`` and ``Tiger`` (optgen/torch/families.py) are the families'
  classes with their authors' signatures; ``Scion`` (the LIONS-EPFL authors'),
  ``MuonLaProp``, ``OrthoLaProp`` and ``LaPropOrtho`` (heavyball's) too
  (optgen/torch/lmo_families.py). ``SAM``
  (optgen/torch/sam.py) wraps any of them
  in sharpness-aware minimization (``step(closure)``: a second gradient per step).

Each class reads ``p.grad``, keeps torch's ``param_groups`` (every torch lr scheduler
works: a changed ``lr`` is a new kernel argument, never a rebuild) and stores its states
in ``opt.state[p]`` as tensors, with ``step`` as torch does.

``flat=True`` adopts each group's parameters into one buffer (``p.data`` becomes a view,
the Parameter objects stay the same) and gives them ``.grad`` views of a second buffer,
which backward accumulates into and ``zero_grad`` zeroes in place: an elementwise rule
then steps a whole group with one kernel call (docs/runtime.md, "Flat groups").
``offload="cpu"`` keeps states and master copies in host memory (optgen/torch/offload.py).
``step_in_backward=True`` steps each parameter in backward as soon as its gradient is
complete and releases that gradient (``opt.accumulating()``, ``opt.attach(ddp_model)``:
optgen/torch/in_backward.py).
Under FSDP2 (and DDP or ZeRO-1 with ``agree=group``) the ranks agree on each step before
it changes anything: a bad input on one rank raises ``DistributedStepError`` on every
rank (``agree=``:
optgen/torch/agreement.py, docs/distributed.md).
"""
from __future__ import annotations

import os

from . import seeds
from .agreement import DistributedStepError
from .drop_in import OptgenOptimizer
from .families import Tiger
from .lmo_families import LaPropOrtho
from .kfac import KFACStatistics
from .optim import TORCH_FORMS
from .seeds import CLASSES
from .sam import SAM
from .sharded_checkpoint import ShardedCheckpointError
from .soap import SOAP
from .psgd_kron import PSGDKron
from optgen.runtime import catalog

globals().update(TORCH_FORMS)


def make(spec: str | os.PathLike | object, base: str | None = None,
         name: str | None = None) -> type:
    """The drop-in class of a spec (catalog name, registered name or file), optionally
    wrapping ``base`` (``make("lars", base="momentum")``): a ``torch_<name>`` spec gives
    its torch form (``make("torch_adam") is optgen.torch.Adam``), any other spec its
    seed form (``make("adam") is optgen.torch.seeds.Adam``), a spec made by
    optgen.transforms its class (``make(cautious("adamw"))``, docs/transforms.md)."""
    if not isinstance(spec, (str, os.PathLike)):
        if base is not None:
            raise TypeError("make(): base= applies to wrapper spec files, not to a "
                            "transformed spec (transform the base itself)")
        return seeds.transformed(spec, name)
    if base is None and name is None:
        path = catalog.resolve(spec)
        for cls in TORCH_FORMS.values():
            if catalog.resolve(cls.spec_name) == path:
                return cls
    return seeds.make(spec, base=base, name=name)


def __getattr__(attr: str) -> type:
    if attr == "AdamOffload" or (attr in CLASSES.values() and attr not in TORCH_FORMS):
        return getattr(seeds, attr)
    names = [*CLASSES.values(), *(n for n in TORCH_FORMS if n not in CLASSES.values())]
    raise AttributeError(f"module 'optgen.torch' has no attribute {attr!r}; optimizers: "
                         f"{', '.join(names)} (or optgen.torch.make(spec))")


__all__ = ["CLASSES", "DistributedStepError", "KFACStatistics", "OptgenOptimizer", "ShardedCheckpointError",
           "LaPropOrtho", "PSGDKron", "SAM", "SOAP", "TORCH_FORMS", "Tiger", "make", "seeds",
           "AdamOffload", *TORCH_FORMS,
           *(n for n in CLASSES.values() if n not in TORCH_FORMS and n != "SOAP")]

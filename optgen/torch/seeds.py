"""The seeds' forms as torch.optim.Optimizer classes: one per catalog spec.

``optgen.torch.seeds.RMSprop`` is the MindSpore RMSProp (lr 0.1, decay 0.9, epsilon
1e-10 inside the root), ``seeds.SGD`` / ``seeds.Adagrad`` / ``seeds.Adam`` the MXNet and
MindSpore conventions of specs/sgd.py, specs/adagrad.py, specs/adam.py, ...: what
``optgen.create(name)`` steps for numpy, with torch's bookkeeping. Their constructors
take the spec's hyperparameter names (and the aliases of runtime/groups.py) plus the
runtime options (``target``, ``flat``, ``offload``, ``state_format``, ...).
``optgen.torch.Adam`` etc. are torch.optim's own rules instead (optgen/torch/optim.py);
optimizers torch has no twin of (LAMB, Lion, FTML, ...) are the seeds' classes there too.

``make(spec, base=None)`` gives the class of any spec file, registered name or wrapper.
Schedule-Free AdamW has a class of its own (``OWN``: optgen/torch/schedule_free.py, with
the authors' ``train()`` and ``eval()``), and so has D-Adaptation Adam
(optgen/torch/dadapt.py, the authors' signature), and so have Prodigy, CAME and
Adam-atan2 (optgen/torch/papers.py, the authors' signatures) and Adam-mini
(optgen/torch/adam_mini.py), and so have the elementwise families (ADOPT, AdEMAMix,
LaProp, ...: optgen/torch/families.py).
The SOAP variant heavyball has, SOAPNAdam, has its class too (optgen/torch/soap_nadam.py,
heavyball's signature).
Imports: adam_mini, dadapt, drop_in, families, offload, papers, schedule_free, soap_nadam.
"""
from __future__ import annotations

import os

from . import offload as torch_offload
from .drop_in import OptgenOptimizer
from .dadapt import DAdaptAdam
from .adam_mini import AdamMini
from .families import FAMILIES
from .lmo_families import LMO_FAMILIES
from .papers import AdamAtan2, CAME, Prodigy
from .schedule_free import AdamWScheduleFree
from .soap_nadam import SOAPNAdam
from optgen.runtime import catalog

# catalog name -> class name, in torch's spelling where torch has the optimizer
CLASSES = {"adabelief": "AdaBelief", "adadelta": "Adadelta", "adafactor": "Adafactor",
           "adagrad": "Adagrad", "adam": "Adam", "adamax": "Adamax", "adamw": "AdamW",
           "adam_atan2": "AdamAtan2", "adam_mini": "AdamMini", "adamweightdecay": "AdamWeightDecay",
           "came": "CAME", "cautious_adamw": "CAdamW",
           "dadapt_adam": "DAdaptAdam", "ftml": "FTML",
           "ftrl": "FTRL", "lamb": "LAMB", "lazyadam": "LazyAdam", "lion": "Lion",
           "mars_adamw": "MARS", "momentum": "Momentum", "muon": "Muon", "nadam": "NAdam",
           "nag": "NAG", "prodigy": "Prodigy", "proximal_adagrad": "ProximalAdagrad",
           "radam": "RAdam",
           "rmsprop": "RMSprop", "schedule_free_adamw": "AdamWScheduleFree", "sgd": "SGD",
           "shampoo": "Shampoo", "signum": "Signum", "soap": "SOAP", "soap_nadam": "SOAPNAdam",
           "thor": "THOR",
           **{name: cls.__name__ for name, cls in {**FAMILIES, **LMO_FAMILIES}.items()}}

# catalog name -> its class, where the spec needs more than the generated one
OWN = {"schedule_free_adamw": AdamWScheduleFree, "dadapt_adam": DAdaptAdam,
       "prodigy": Prodigy, "came": CAME, "adam_atan2": AdamAtan2,
       "adam_mini": AdamMini, "soap_nadam": SOAPNAdam, **FAMILIES, **LMO_FAMILIES}

_made: dict[tuple, type] = {}


def make(spec: str | os.PathLike, base: str | None = None, name: str | None = None) -> type:
    """The drop-in class of a spec (catalog name, registered name or file), optionally
    wrapping ``base`` (``make("lars", base="momentum")``), with the spec's own
    hyperparameter names and defaults."""
    path = catalog.resolve(spec)
    key = (path, base)
    own = OWN.get(os.path.splitext(os.path.basename(path))[0])
    if own is not None and base is None and name is None and \
            path == catalog.resolve(own.spec_name):
        return own
    if key not in _made:
        stem = os.path.splitext(os.path.basename(path))[0]
        cls_name = name or CLASSES.get(stem) or "".join(w.capitalize() for w in stem.split("_"))
        if base is not None:
            cls_name += "_" + CLASSES.get(base, base)
        _made[key] = type(cls_name, (OptgenOptimizer,),
                          {"spec": path, "base": base, "__module__": __name__,
                           "__doc__": f"optgen's {stem} as a torch.optim.Optimizer "
                                      "(see optgen.torch.seeds)."})
    return _made[key]


def transformed(spec, name: str | None = None) -> type:
    """The drop-in class of a spec made by optgen.transforms (``make(cautious("adamw"))``):
    written as a spec file (optgen.transforms.spec_file); a schedule-free one has the
    authors' ``train()`` and ``eval()`` (AdamWScheduleFree's)."""
    from optgen.transforms import spec_file   # (the transforms trace specs: loaded on use)
    path = spec_file(spec)
    key = (path, None, name)
    if key not in _made:
        attrs = {"spec": path, "base": None, "__module__": __name__,
                 "__doc__": f"optgen's {spec.name} (optgen.transforms) as a "
                            "torch.optim.Optimizer."}
        parent = OptgenOptimizer
        if "schedule_free" in getattr(spec, "transforms", ()):
            parent = AdamWScheduleFree
            attrs.update(spec_name=path, interpolation=spec.schedule_free_beta)
            del attrs["spec"]
        cls_name = name or "".join(w.capitalize() for w in spec.name.split("_"))
        _made[key] = type(cls_name, (parent,), attrs)
    return _made[key]


def __getattr__(attr: str) -> type:
    if attr == "AdamOffload":   # the seeds' name (optgen/torch/offload.py)
        return _made.setdefault(("AdamOffload",), torch_offload.seed_class(make("adam")))
    for stem, cls_name in CLASSES.items():
        if cls_name == attr:
            return make(stem)
    raise AttributeError(f"module 'optgen.torch.seeds' has no attribute {attr!r}; "
                         f"optimizers: {', '.join(CLASSES.values())} (or make(spec))")


__all__ = ["CLASSES", "make", "AdamOffload", *CLASSES.values()]

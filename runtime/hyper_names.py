"""The names a trainer may give a spec's hyperparameters by, and ``alias``, which maps
them to the spec's names.

Besides the spec's names: the aliases of MXNet (``learning_rate``, ``wd``,
``lr_scheduler``), MindSpore (``learning_rate``, ``weight_decay``) and torch
(``eps``/``epsilon``, ``nesterov``/``use_nesterov``), and tuples: ``betas=(b1, b2)``,
one entry per ``beta<k>`` of the spec (``(b1, b2, b3)`` for Adan), or the tuples a spec
declares (``spec.hyper(..., tuple="eps")``: CAME's ``eps=(eps1, eps2)``; Prodigy's
``betas`` pair beside its own ``beta3``). A torch group holds each tuple as one value
(``torch_view``).

May import: nothing of optgen.
"""
from __future__ import annotations

from typing import Any, Mapping

# alias -> spec name; used only when the spec has no hyperparameter of the alias's name
ALIASES = {"learning_rate": "lr", "lr_scheduler": "lr", "wd": "weight_decay",
           "eps": "epsilon", "epsilon": "eps", "nesterov": "use_nesterov",
           "use_nesterov": "nesterov"}

TUPLES = {2: "pair", 3: "triple"}


def beta_names(hypers: Mapping[str, Any]) -> list[str]:
    """The hyperparameters a torch-style ``betas`` tuple sets when the spec declares no
    tuple ``betas``: ``beta1``, ``beta2``, ... as far as the spec declares them without a
    gap (Adan: three); none unless the spec has ``beta1`` and ``beta2`` and no ``betas``."""
    names: list[str] = []
    while f"beta{len(names) + 1}" in hypers:
        names.append(f"beta{len(names) + 1}")
    return names if len(names) >= 2 and "betas" not in hypers else []


def tuple_names(hypers: Mapping[str, Any]) -> dict[str, list[str]]:
    """The tuples a torch class takes: tuple name -> its hyperparameters in order. Those
    the spec declares (``spec.hyper(..., tuple="eps")``; Prodigy's ``betas`` pair beside
    ``beta3``), and ``betas`` over ``beta1, beta2, ...`` where it declares none."""
    out: dict[str, list[str]] = {}
    for name, info in hypers.items():
        if getattr(info, "tuple", None):
            out.setdefault(info.tuple, []).append(name)
    if "betas" not in out and not any(n in m for m in out.values() for n in beta_names(hypers)):
        out.update({"betas": beta_names(hypers)} if beta_names(hypers) else {})
    return out


def torch_view(hypers: Mapping[str, Any], hyper: Mapping[str, Any]) -> dict[str, Any]:
    """Spec-named hyperparameters as a torch group holds them: each tuple of
    ``tuple_names`` as one tuple (``betas``, CAME's ``eps``), the tuples ``alias`` splits."""
    out = dict(hyper)
    for key, names in tuple_names(hypers).items():
        if all(n in out for n in names):
            out[key] = tuple(out.pop(n) for n in names)
    return out


def alias(owner: str, hypers: Mapping[str, Any], given: Mapping[str, Any],
          where: str = "") -> dict[str, Any]:
    """``given`` with every key renamed to the spec's hyperparameter name."""
    out: dict[str, Any] = {}
    came_from: dict[str, str] = {}

    def put(key: str, name: str, value: Any) -> None:
        if name in out:
            raise TypeError(f"{owner}: {where}{came_from[name]!r} and {key!r} both set "
                            f"hyperparameter {name}")
        out[name], came_from[name] = value, key

    tuples = tuple_names(hypers)
    for key, value in given.items():
        if key in tuples and key not in hypers:
            names = tuples[key]
            if not isinstance(value, (tuple, list)) or len(value) != len(names):
                raise TypeError(f"{owner}: {where}{key} must be a "
                                f"{TUPLES.get(len(names), f'{len(names)}-tuple')} "
                                f"({', '.join(names)}), got {value!r}")
            for name, v in zip(names, value):
                put(key, name, v)
        elif key in hypers:
            put(key, key, value)
        elif key in ALIASES and ALIASES[key] in hypers:
            put(key, ALIASES[key], value)
        else:
            known = ", ".join(hypers)
            usable = sorted([a for a, n in ALIASES.items() if n in hypers and a not in hypers]
                            + list(tuples))
            raise TypeError(f"{owner}: {where}unknown hyperparameter {key!r}; known: {known}"
                            + (f" (aliases: {', '.join(usable)})" if usable else ""))
    return out


def is_hyper_key(key: str, hypers: Mapping[str, Any]) -> bool:
    """Whether ``key`` names a hyperparameter, directly or as an alias."""
    return key in hypers or (key in ALIASES and ALIASES[key] in hypers) or \
        key in tuple_names(hypers)

"""Elementwise families with their authors' signatures and defaults, stepped by catalog
specs: ``ADOPT``, ``AdEMAMix``, ``LaProp``, ``Yogi``, ``AdaBound``, ``QHAdam``, ``QHM``,
``AdaMod``, ``DiffGrad``, ``SGDW``, ``PAdam``, ``Grams`` (specs/<name>.py, lower case)
and ``Tiger`` (the ``signum`` spec: Tiger is Signum with decoupled decay).

    opt = optgen.torch.ADOPT(model.parameters(), lr=1e-3, betas=(0.9, 0.9999))
    opt = optgen.torch.AdEMAMix(model.parameters(), alpha=5.0, beta3_warmup=10_000,
                                alpha_warmup=10_000)

Tuples (``betas``, QHAdam's ``nus``) are the specs' (``spec.hyper(..., tuple=...)``);
every spec hyperparameter may also be given by its own name (``beta1=0.8``,
``clip_power=0.5``). What the authors' classes take and these do not build is refused
with a ValueError naming it (ADOPT's clip_lambda other than step**0.25 or None,
LaProp's amsgrad and centered, QHM's weight_decay_type="direct"). Where the authors'
class has no default (QHM's lr), it must be given. docs/catalog.md lists where these
defaults differ from pytorch-optimizer's and heavyball's classes of the same name.
Imports: drop_in, papers.
"""
from __future__ import annotations

from typing import Any, Callable

from .drop_in import OptgenOptimizer
from .papers import tuple_option
from optgen.runtime import catalog


def _quarter_power(step: float) -> float:
    """The authors' default clip_lambda of ADOPT: step**0.25."""
    return step ** 0.25


class _Family(OptgenOptimizer):
    """A catalog spec behind an author's signature: ``_init(params, tuples, hypers)``
    passes each tuple on unless one of its names is given by itself."""

    spec_name = ""

    def _init(self, params, tuples: dict[str, tuple[Any, tuple[str, ...]]],
              options: dict[str, Any], **hypers: Any) -> None:
        self.spec = catalog.resolve(self.spec_name)
        for key, (value, names) in tuples.items():
            tuple_option(options, key, value, names)
        super().__init__(params, **hypers, **options)


def _refuse(cls: str, name: str, value: Any, built: Any) -> None:
    if value != built:
        raise ValueError(f"{cls}: {name}={value!r} is not built ({name}={built!r})")


B12 = ("beta1", "beta2")


class ADOPT(_Family):
    """ADOPT (Taniguchi et al. 2024) as the authors' ADOPT steps it."""

    spec_name = "adopt"

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.9999),
                 eps: float = 1e-6,
                 clip_lambda: Callable[[float], float] | None = _quarter_power,
                 weight_decay: float = 0.0, decouple: bool = False, **options: Any) -> None:
        if clip_lambda is not None and clip_lambda is not _quarter_power:
            raise ValueError("ADOPT: clip_lambda must be None or the default step**0.25 "
                             "(pass clip_power=p for a clip at step**p)")
        if "clip_power" not in options:
            options["clip_power"] = None if clip_lambda is None else 0.25
        self._init(params, {"betas": (betas, B12)}, options, lr=lr, eps=eps,
                   weight_decay=weight_decay, decouple=decouple)


class AdEMAMix(_Family):
    """AdEMAMix (Pagliardini et al. 2024) as the authors' AdEMAMix steps it."""

    spec_name = "ademamix"

    def __init__(self, params, lr: float = 1e-3,
                 betas: tuple[float, float, float] = (0.9, 0.999, 0.9999), alpha: float = 2.0,
                 beta3_warmup: int | None = None, alpha_warmup: int | None = None,
                 eps: float = 1e-8, weight_decay: float = 0.0, **options: Any) -> None:
        self._init(params, {"betas": (betas, ("beta1", "beta2", "beta3"))}, options, lr=lr,
                   alpha=alpha, beta3_warmup=_float(beta3_warmup),
                   alpha_warmup=_float(alpha_warmup), eps=eps, weight_decay=weight_decay)


def _float(value: Any) -> Any:
    """A warm-up length in steps: the authors' ints are the spec's floats."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


class LaProp(_Family):
    """LaProp (Ziyin et al. 2020) as the authors' LaProp steps it."""

    spec_name = "laprop"

    def __init__(self, params, lr: float = 4e-4, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-15, weight_decay: float = 0.0, amsgrad: bool = False,
                 centered: bool = False, **options: Any) -> None:
        _refuse("LaProp", "amsgrad", amsgrad, False)
        _refuse("LaProp", "centered", centered, False)
        self._init(params, {"betas": (betas, B12)}, options, lr=lr, eps=eps,
                   weight_decay=weight_decay)


class Yogi(_Family):
    """Yogi (Zaheer et al. 2018) as pytorch-optimizer's Yogi steps it (decoupled decay)."""

    spec_name = "yogi"

    def __init__(self, params, lr: float = 1e-2, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-3, initial_accumulator: float = 1e-6,
                 weight_decay: float = 0.0, **options: Any) -> None:
        self._init(params, {"betas": (betas, B12)}, options, lr=lr, eps=eps,
                   initial_accumulator=initial_accumulator, weight_decay=weight_decay)


class AdaBound(_Family):
    """AdaBound (Luo et al. 2019) as the authors' AdaBound steps it: ``final_lr`` follows
    the lr schedule, scaled by lr over the group's lr at construction (``base_lr``)."""

    spec_name = "adabound"

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 final_lr: float = 0.1, gamma: float = 1e-3, eps: float = 1e-8,
                 weight_decay: float = 0.0, amsbound: bool = False, **options: Any) -> None:
        params = list(params)
        if params and isinstance(params[0], dict):    # each group's own initial lr
            params = [{"base_lr": g.get("lr", lr), **g} for g in params]
        options.setdefault("base_lr", lr)
        self._init(params, {"betas": (betas, B12)}, options, lr=lr, final_lr=final_lr,
                   gamma=gamma, eps=eps, weight_decay=weight_decay, amsbound=amsbound)


class QHAdam(_Family):
    """QHAdam (Ma & Yarats 2019) as the authors' QHAdam (qhoptim) steps it."""

    spec_name = "qhadam"

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 nus: tuple[float, float] = (1.0, 1.0), weight_decay: float = 0.0,
                 decouple_weight_decay: bool = False, eps: float = 1e-8,
                 **options: Any) -> None:
        self._init(params, {"betas": (betas, B12), "nus": (nus, ("nu1", "nu2"))}, options,
                   lr=lr, weight_decay=weight_decay,
                   decouple_weight_decay=decouple_weight_decay, eps=eps)


class QHM(_Family):
    """QHM (Ma & Yarats 2019) as the authors' QHM (qhoptim) steps it: lr must be given;
    momentum and nu default to the paper's recommendation (0.999, 0.7), which the
    authors' class requires."""

    spec_name = "qhm"

    def __init__(self, params, lr: float | None = None, momentum: float = 0.999,
                 nu: float = 0.7, weight_decay: float = 0.0, weight_decay_type: str = "grad",
                 **options: Any) -> None:
        if lr is None:
            raise ValueError("QHM: lr must be given (the authors' QHM has no default), "
                             "e.g. lr=1.0 with momentum=0.999, nu=0.7")
        _refuse("QHM", "weight_decay_type", weight_decay_type, "grad")
        self._init(params, {}, options, lr=lr, momentum=momentum, nu=nu,
                   weight_decay=weight_decay)


class AdaMod(_Family):
    """AdaMod (Ding et al. 2019) as the authors' AdaMod steps it (``beta3`` by itself)."""

    spec_name = "adamod"

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 beta3: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
                 **options: Any) -> None:
        self._init(params, {"betas": (betas, B12)}, options, lr=lr, beta3=beta3, eps=eps,
                   weight_decay=weight_decay)


class DiffGrad(_Family):
    """diffGrad (Dubey et al. 2020) as the authors' diffGrad steps it."""

    spec_name = "diffgrad"

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, **options: Any) -> None:
        self._init(params, {"betas": (betas, B12)}, options, lr=lr, eps=eps,
                   weight_decay=weight_decay)


class SGDW(_Family):
    """SGDW (Loshchilov & Hutter 2019) as pytorch-optimizer's SGDW steps it."""

    spec_name = "sgdw"

    def __init__(self, params, lr: float = 1e-4, momentum: float = 0.0,
                 weight_decay: float = 0.0, dampening: float = 0.0, nesterov: bool = False,
                 **options: Any) -> None:
        self._init(params, {}, options, lr=lr, momentum=momentum, weight_decay=weight_decay,
                   dampening=dampening, nesterov=nesterov)


class PAdam(_Family):
    """Padam (Chen et al. 2020) as the authors' Padam steps it (amsgrad on by default)."""

    spec_name = "padam"

    def __init__(self, params, lr: float = 0.1, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = True,
                 partial: float = 0.25, **options: Any) -> None:
        self._init(params, {"betas": (betas, B12)}, options, lr=lr, eps=eps,
                   weight_decay=weight_decay, amsgrad=amsgrad, partial=partial)


class Grams(_Family):
    """Grams (Cao et al. 2024) as pytorch-optimizer's Grams steps it."""

    spec_name = "grams"

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 weight_decay: float = 0.0, eps: float = 1e-6, **options: Any) -> None:
        self._init(params, {"betas": (betas, B12)}, options, lr=lr,
                   weight_decay=weight_decay, eps=eps)


class Tiger(_Family):
    """Tiger (Su 2023; pytorch-optimizer's Tiger): the sign of one EMA of the gradient,
    with decoupled weight decay, stepped by the ``signum`` spec (``momentum`` = beta,
    ``wd_lh`` = weight_decay)."""

    spec_name = "signum"

    def __init__(self, params, lr: float = 1e-3, beta: float = 0.965,
                 weight_decay: float = 0.01, **options: Any) -> None:
        self._init(params, {}, options, lr=lr, momentum=beta, wd_lh=weight_decay)


FAMILIES = {"adopt": ADOPT, "ademamix": AdEMAMix, "laprop": LaProp, "yogi": Yogi,
            "adabound": AdaBound, "qhadam": QHAdam, "qhm": QHM, "adamod": AdaMod,
            "diffgrad": DiffGrad, "sgdw": SGDW, "padam": PAdam, "grams": Grams}

for _cls in (*FAMILIES.values(), Tiger):
    _cls.__module__ = "optgen.torch"

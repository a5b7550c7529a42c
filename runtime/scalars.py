"""The host scalars of a step: every kernel scalar is computed on the host in float64
(hyperparameters, the lr of the step, bias corrections, ...) and rounded once to the
kernel dtype when packed.

A group's environment is built once a step; a parameter's values differ from it only
by its lr/wd multipliers and its own step count; scalars that read a scalar state or
the parameter's shape (``param_scalars``) are evaluated per parameter, and so are the
updates of scalar states.

May import: numpy, rounding, scalar_expr. Imports no other runtime module.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from optgen.core import rounding, scalar_expr


def group_env(infos: Mapping[str, Any], hyper: Mapping[str, Any], lr: float | None,
              grad_scale: float, t: int) -> dict[str, Any]:
    """The scalar environment of a group for one step: its hyperparameters (None as the
    spec's ``none_value``), this step's ``lr``, rescale_grad times ``grad_scale``, ``t``."""
    env = {}
    for n, v in hyper.items():
        env[n] = infos[n].none_value if v is None else v
    if "lr" in env:
        env["lr"] = infos["lr"].none_value if lr is None else lr
    if "rescale_grad" in env:
        env["rescale_grad"] = env["rescale_grad"] * grad_scale
    env["t"] = t
    env.update(dict.fromkeys(rounding.KEY_SCALARS, 0.0))   # (set per parameter: keyed)
    return env


def step_values(k: Any, env: Mapping[str, Any], *, step: int, t: int, lr_mult: float,
                wd_mult: float, has_lr: bool) -> tuple[dict[str, Any], np.ndarray | None]:
    """(values, packed) of kernel ``k`` for a parameter at its ``step`` in a group of
    environment ``env``: the environment with the multipliers applied and the
    scalars that read only hyperparameters and t; packed is None when the kernel has
    scalars to evaluate per parameter (``param_values``)."""
    if lr_mult != 1.0 or wd_mult != 1.0 or step != t:
        env = dict(env, t=step)
        if lr_mult != 1.0 and has_lr and "lr" in env:
            env["lr"] = env["lr"] * lr_mult
        if wd_mult != 1.0 and "weight_decay" in env:
            env["weight_decay"] = env["weight_decay"] * wd_mult
    values = {**env, **{n: scalar_expr.evaluate(k.host_scalars[n], env)
                        for n in k.step_scalars}}
    return values, (None if k.param_scalars else pack(k, values))


def param_values(k: Any, values: Mapping[str, Any], st: dict[str, Any],
                 dims: tuple[int, int, int], packed: np.ndarray | None,
                 sums: Mapping[str, float] | None = None) -> np.ndarray:
    """A parameter's packed scalars when they read its scalar states or shape (``packed``
    None), and its scalar states' updates, written into its state ``st``; where the
    kernel has sums over all parameters, those wait for their totals (``sums``)."""
    local = {**values, **{n: v for n, v in st.items() if isinstance(v, np.floating)},
             "rows": dims[1], "cols": dims[2]}
    if packed is None:
        local.update((n, scalar_expr.evaluate(k.host_scalars[n], local))
                     for n in k.param_scalars)
        packed = pack(k, local)
    if k.global_sums and sums is None:
        return packed
    local.update(sums or {})
    for n, e in k.scalar_state_updates.items():
        st[n] = np.float64(scalar_expr.evaluate(e, local))
    return packed


def pack(k: Any, values: Mapping[str, Any]) -> np.ndarray:
    """The kernel's scalar array: float64 on the host, rounded once to the kernel dtype."""
    return np.array([values[s] for s in k.scalars], dtype=k.dtype)


def keyed(k: Any, packed: np.ndarray, seed: int, step: int, index: int) -> np.ndarray:
    """A stochastically rounding kernel's scalars with parameter ``index``'s key for
    its ``step`` (optgen/core/rounding.py): a copy, as packed arrays are shared."""
    out = packed.copy()
    for name, v in zip(rounding.KEY_SCALARS, rounding.key_scalars(
            rounding.key(seed, step, index))):
        out[k.scalars.index(name)] = v
    return out

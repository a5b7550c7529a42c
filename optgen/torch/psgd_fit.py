"""PSGD-Kron's preconditioner fit on the host (Li's whitening rule for Q, with the
running lower bound and factor balancing heavyball 3.2.1 uses), for
``optgen.torch.PSGDKron``; the per-step update is the ``psgd_kron`` spec's kernel.

One fit of the factors Q_1, Q_2 (P = Q^T Q, Kronecker-factored) from the momentum m and
a probe V ~ N(0, I):

    balance:  Q_i *= exp(mean_j log max|Q_j| - log max|Q_i|)   (the product is unchanged)
    G      = m + (dampening + eps_f32 |m|) V                   (a perturbed gradient)
    A      = Q_1 G Q_2^T                  B = Q_1^-T V Q_2^-1      (triangular solves)
    side 1 (side 2 alike with A^T A, B^T B):
        T1 = A A^T,  T2 = B B^T
        l  = the largest eigenvalue of T1 + T2 (triangular Q: a power iteration on
             (T1 + T2)^2 from its largest row, ``power_iter`` times; diagonal Q: the
             largest entry of the row sums of A o A + B o B)
        l  = max(l, lb + (1 - lower_bound_beta) (l - lb));   lb = l
        Q_1 -= precond_lr / l * triu(T1 - T2) Q_1     (diagonal: q -= precond_lr / l * q (t1 - t2))

A diagonal factor is a vector; a parameter that is not a matrix has one diagonal factor
of its own shape (T1 = A o A, l = max(T1 + T2)). Everything runs in float32 (the
bounds in float64), as heavyball's does.
Imports: torch only.
"""
from __future__ import annotations

import math

import torch

EPS32 = torch.finfo(torch.float32).eps
TINY32 = torch.finfo(torch.float32).tiny


def init_scale(g: torch.Tensor, scale: float | None, scale_scale: float,
               scale_power: float | None) -> float:
    """The initial scale of P's factors' product: ``scale`` when given, else
    (mean |g|^4)^(-1/8) * scale_scale, to the power ``scale_power`` (None: 1/2)."""
    if scale is not None:
        return float(scale)
    x = g.detach().double().abs().clamp(min=1e-12).log().flatten() * 4
    lse = (torch.logsumexp(x, 0) - math.log(max(g.numel(), 1))) / 8
    s = float(torch.exp(-lse)) * scale_scale
    return s ** (0.5 if scale_power is None else scale_power)


def balance(factors: list[torch.Tensor]) -> None:
    """Scale the factors in place to the geometric mean of their largest entries."""
    logs = [f.abs().max().log() for f in factors]
    mean = sum(logs) / len(factors)
    for f, n in zip(factors, logs):
        f.mul_(torch.exp(mean - n))


def largest_eigenvalue(a: torch.Tensor, iterations: int) -> torch.Tensor:
    """An estimate of the largest eigenvalue of the symmetric PSD ``a``: power
    iterations on a^2 started from a's row of largest norm."""
    norms = a.norm(dim=-1)
    scale, i = norms.max(dim=-1)
    scale = scale.clamp(min=TINY32)
    a = a / scale
    x = a[i] / scale

    def times(v: torch.Tensor) -> torch.Tensor:
        return (v @ a.T) @ a.T

    for _ in range(iterations):
        x = torch.nn.functional.normalize(times(x), dim=-1)
    return (x * times(x)).sum().sqrt() * scale


def bounded(ell: torch.Tensor, lb: float, beta: float) -> tuple[torch.Tensor, float]:
    """The normalizer after the running lower bound, and the new bound."""
    lb_t = torch.tensor(lb, dtype=torch.float64)
    new = torch.maximum(ell.double(), lb_t + (ell.double() - lb_t) * (1 - beta))
    return new.to(ell.dtype), float(new)


def _apply(factor: torch.Tensor, x: torch.Tensor, side: int) -> torch.Tensor:
    """Q x along ``side`` (0: rows, Q x; 1: columns, x Q^T); a diagonal Q scales."""
    if factor.dim() == 1:
        return x * (factor[:, None] if side == 0 else factor[None, :])
    return factor @ x if side == 0 else x @ factor.T


def _solve(factor: torch.Tensor, x: torch.Tensor, side: int) -> torch.Tensor:
    """Q^-T x along ``side`` (0: Q^-T x; 1: x Q^-1); a diagonal Q divides."""
    if factor.dim() == 1:
        return x / (factor[:, None] if side == 0 else factor[None, :])
    if side == 0:
        return torch.linalg.solve_triangular(factor.T, x, upper=False)
    return torch.linalg.solve_triangular(factor, x, upper=True, left=False)


def fit_matrix(factors: list[torch.Tensor], m: torch.Tensor, v: torch.Tensor,
               bounds: list[float], *, precond_lr: float, lower_bound_beta: float,
               dampening: float, power_iter: int) -> list[float]:
    """One fit of a matrix's two factors (each R x R / C x C upper triangular or a
    vector), in place, from the momentum ``m`` and the probe ``v``; returns the bounds."""
    balance(factors)
    g = m + (dampening + EPS32 * m.abs()) * v
    a, b = g, v
    for side in (0, 1):
        if factors[side].dim() == 1:
            a, b = _apply(factors[side], a, side), _solve(factors[side], b, side)
    for side in (0, 1):
        if factors[side].dim() == 2:
            a, b = _apply(factors[side], a, side), _solve(factors[side], b, side)
    out = []
    for side, (q, lb) in enumerate(zip(factors, bounds)):
        if q.dim() == 1:
            t1, t2 = (a * a).sum(1 - side), (b * b).sum(1 - side)
            ell, lb = bounded((t1 + t2).max(), lb, lower_bound_beta)
            step = q * (t1 - t2)
        else:
            t1 = a @ a.T if side == 0 else a.T @ a
            t2 = b @ b.T if side == 0 else b.T @ b
            ell, lb = bounded(largest_eigenvalue(t1 + t2, power_iter), lb, lower_bound_beta)
            step = torch.triu(t1 - t2) @ q
        q.sub_(step / ell * precond_lr)
        out.append(lb)
    return out


def fit_diagonal(q: torch.Tensor, m: torch.Tensor, v: torch.Tensor, lb: float, *,
                 precond_lr: float, lower_bound_beta: float, dampening: float) -> float:
    """One fit of the one diagonal factor of a parameter that is not a matrix (``q``
    of its shape), in place; returns the bound."""
    g = m + (dampening + EPS32 * m.abs()) * v
    a, b = q * g, v / q
    t1, t2 = a * a, b * b
    ell, lb = bounded((t1 + t2).max(), lb, lower_bound_beta)
    q.sub_(q * (t1 - t2) / ell * precond_lr)
    return lb


def split_diagonal(d: torch.Tensor, tri: tuple[bool, bool]) -> list[torch.Tensor | None]:
    """The diagonal factors held in D[i, j] = d_L[i] d_R[j] (None for a triangular
    side), balanced when both are diagonal (the unique balanced split)."""
    if tri[0]:
        return [None, d[0].clone()]
    if tri[1]:
        return [d[:, 0].clone(), None]
    root = d.abs().max().sqrt()
    return [d.abs().amax(1) / root, d.abs().amax(0) / root]


def join_diagonal(d: torch.Tensor, left: torch.Tensor | None,
                  right: torch.Tensor | None) -> None:
    """Write D = d_L d_R^T (1 on a triangular side) in place."""
    rows = left[:, None] if left is not None else 1.0
    cols = right[None, :] if right is not None else 1.0
    d.copy_(torch.ones_like(d) * rows * cols)

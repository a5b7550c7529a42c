"""Distributed Shampoo's single-device step, re-read as numpy (float64).

Written from facebookresearch/optimizers (distributed_shampoo/, read at commit f606606),
not from specs/shampoo.py, for the configuration tests/test_shampoo_vs_distributed.py
checks: root-inverse Shampoo by eigendecomposition (DefaultShampooConfig: EigenConfig
with PerturbationConfig(perturb_before_computation=True)), grafting None or Adam
(AdamPreconditionerConfig), no iterate averaging, weight decay L2 or DECOUPLED. Names in
the comments are theirs.

One ``step`` (DistributedShampoo._group_step_body, _compute_search_directions), with one
step counter t for the group:

    perform = (t % f == 0 and t > s) or t == s       s = start_preconditioning_step (-1: f)
    grafting_only = t < s and grafting is set
    per block (after merge_small_dims and multi_dim_split, Distributor):
      g += wd W                                           (_add_l2_regularization: L2 only)
      F_k = b2 F_k + c g_(k) g_(k)^T for each dim k       (_update_factor_matrices;
            c = 1 if b2 == 1 else 1 - b2; g_(k): g with dim k first, the others contracted)
      when perform, per factor (amortized_computation, matrix_inverse_root_eigen):
            A = F_k / (1 - b2^t) (use_bias_correction and b2 < 1; else F_k)
            lam, Q = eigh(A + epsilon I)      (matrix_eigendecomposition, perturb before)
            lam <- lam - min(lam) + epsilon  when min(lam) < epsilon
                                              (matrix_inverse_root_from_eigendecomposition)
            X_k = Q diag(lam^(-1/root_k)) Q^T,  root_k = 2 * order  (1/(2 max(order, 1)))
      v = gb2 v + (1 - gb2) g^2                           (AdagradPreconditionerList, Adam)
      m = b1 m + (1 - b1) g;  mbar = m / (1 - b1^t)       (_compute_filtered_grad_list;
            beta3 = beta1; no correction without use_bias_correction; b1 = 0: mbar = g)
      a = mbar / (sqrt(v / (1 - gb2^t)) + geps)           (the graft's precondition)
      P = a                                  when grafting_only
      P = X_0 . X_1 ... mbar  (tensordot over each dim in turn, _precondition_grad)
      P = P ||a|| / (||P|| + 1e-16)          grafted (_precondition_and_grafting)
      P += wd W                                           (_apply_weight_decay: DECOUPLED)
      W -= lr P

The inverse factors start as identities (RootInvShampooKroneckerFactorsState) and the
factors as zeros. Shapes: merge_small_dims squeezes dimensions of size 1 and merges
adjacent dimensions (last first) while their product stays <= max_preconditioner_dim and
more than target_parameter_dimensionality remain; multi_dim_split cuts every dimension
into blocks of max_preconditioner_dim. A 0-D parameter is a 1-element vector.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

ADAM = dict(beta2=0.999, epsilon=1e-10)   # AdamPreconditionerConfig's defaults


def merged_shape(shape: tuple[int, ...], threshold: float, target: float) -> tuple[int, ...]:
    """merge_small_dims (distributed_shampoo/utils/shampoo_utils.py)."""
    if 0 in shape:
        return (0,)
    if target == math.inf:
        return tuple(shape)
    dims = [d for d in reversed(shape) if d != 1] or [1]
    out = [dims[0]]
    for done, d in enumerate(dims[1:], start=1):
        if len(out) + len(dims) - done > target and out[-1] * d <= threshold:
            out[-1] *= d
        else:
            out.append(d)
    return tuple(reversed(out))


def block_slices(shape: tuple[int, ...], size: float) -> list[tuple[slice, ...]]:
    """multi_dim_split: every dimension cut into chunks of ``size``."""
    step = [d if size == math.inf else int(size) for d in shape]
    ranges = [[slice(i, min(i + s, d)) for i in range(0, d, s)] for d, s in zip(shape, step)]
    return list(itertools.product(*ranges))


def inverse_root(a: np.ndarray, root: float, epsilon: float) -> np.ndarray:
    """matrix_inverse_root with EigenConfig and PerturbationConfig (before computation)."""
    lam, q = np.linalg.eigh(a + epsilon * np.eye(len(a)))
    lam_min = lam.min()
    if lam_min < epsilon:
        lam = lam - lam_min + epsilon
    return (q * lam ** (-1.0 / root)) @ q.T


class DistributedShampooOracle:
    def __init__(self, params0, *, lr=1e-2, betas=(0.9, 1.0), epsilon=1e-12,
                 weight_decay=0.0, weight_decay_type="decoupled", max_preconditioner_dim=1024,
                 target_parameter_dimensionality=1, precondition_frequency=1,
                 start_preconditioning_step=-1, use_bias_correction=True, grafting=None):
        if weight_decay_type not in ("decoupled", "l2"):
            raise ValueError(f"weight_decay_type {weight_decay_type!r}: 'decoupled' or 'l2'")
        f = precondition_frequency
        s = f if start_preconditioning_step == -1 else start_preconditioning_step
        if s < f:
            raise ValueError(f"start_preconditioning_step {s} < precondition_frequency {f}")
        self.lr, self.b1, self.b2, self.eps = lr, betas[0], betas[1], epsilon
        self.wd, self.wd_type, self.f, self.s = weight_decay, weight_decay_type, f, s
        self.bias_correction, self.graft = use_bias_correction, grafting
        self.t = 0
        self.w = [np.array(p, np.float64) for p in params0]
        self.blocks = []             # (param index, merged shape, slices, state)
        for i, w in enumerate(self.w):
            shape = merged_shape(w.shape or (1,), max_preconditioner_dim,
                                 target_parameter_dimensionality)
            for sl in block_slices(shape, max_preconditioner_dim):
                dims = [x.stop - x.start for x in sl]
                st = {"F": [np.zeros((d, d)) for d in dims],
                      "X": [np.eye(d) for d in dims], "m": np.zeros(dims), "v": np.zeros(dims)}
                self.blocks.append((i, shape, sl, st))

    def step(self, grads) -> None:
        self.t += 1
        t, f, s = self.t, self.f, self.s
        perform = (t % f == 0 and t > s) or t == s
        grafting_only = t < s and self.graft is not None
        updates = []
        for i, shape, sl, st in self.blocks:
            w = self.w[i].reshape(shape)[sl]
            g = np.asarray(grads[i], np.float64).reshape(shape)[sl]
            if self.wd_type == "l2" and self.wd:
                g = g + self.wd * w
            self._factors(st, g, perform)
            mbar = self._filtered(st, g)
            if grafting_only:
                p = self._adam(st, mbar)
            else:
                p = mbar
                for x in st["X"]:         # contract dim 0 with X, rotating the dims
                    p = np.tensordot(p, x, axes=([0], [0]))
                if self.graft is not None:
                    a = self._adam(st, mbar)
                    p = p * (np.linalg.norm(a) / (np.linalg.norm(p) + 1e-16))
            if self.wd_type == "decoupled" and self.wd:
                p = p + self.wd * w
            updates.append((i, shape, sl, -self.lr * p))
        for i, shape, sl, u in updates:
            self.w[i].reshape(shape)[sl] += u

    def _factors(self, st, g, perform):
        b2, order = self.b2, g.ndim
        c = 1.0 if b2 == 1 else 1 - b2
        for k in range(order):
            rest = [j for j in range(order) if j != k]
            st["F"][k] = b2 * st["F"][k] + c * np.tensordot(g, g, axes=(rest, rest))
        if self.graft is not None:
            gb2 = self.graft["beta2"]
            st["v"] = gb2 * st["v"] + (1 - gb2) * g * g
        if not perform:
            return
        bc = 1 - b2 ** self.t if self.bias_correction and b2 < 1 else 1.0
        st["X"] = [inverse_root(F / bc, 2 * max(order, 1), self.eps) for F in st["F"]]

    def _filtered(self, st, g):
        if self.b1 == 0:
            return g
        st["m"] = st["m"] + (1 - self.b1) * (g - st["m"])      # torch._foreach_lerp_
        return st["m"] / (1 - self.b1 ** self.t) if self.bias_correction else st["m"]

    def _adam(self, st, mbar):
        gb2, geps = self.graft["beta2"], self.graft["epsilon"]
        return mbar / (np.sqrt(st["v"] / (1 - gb2 ** self.t)) + geps)

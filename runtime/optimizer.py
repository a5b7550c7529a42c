"""The trainer-side optimizer: validated hyperparameters, states, and one fused kernel
call per parameter per step.

Every input is checked before any kernel runs, so an error leaves parameters and states
bit-identical. Messages name the optimizer, the parameter index, the value and the rule.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from . import hyper as hyper_rules
from . import reference, scalar_expr, views
from .artifact import Artifact, KernelInfo
from .sparse import RowSparse

ALIGN = 64


def aligned_full(shape: tuple, value: float, dtype, align: int = ALIGN) -> np.ndarray:
    """A C-contiguous array whose data starts on an ``align``-byte boundary."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(n * dtype.itemsize + align, dtype=np.uint8)
    start = (-raw.ctypes.data) % align
    arr = raw[start:start + n * dtype.itemsize].view(dtype).reshape(shape)
    arr.fill(value)
    return arr


class Optimizer:
    """Steps a list of numpy arrays in place with an artifact's kernels.

    ``backend="reference"`` runs the reference interpreter instead of the compiled
    kernels (same IR, same host scalars): the oracle used by the tests.
    """

    def __init__(self, artifact: Artifact, params: Iterable[np.ndarray], *,
                 backend: str = "compiled", lazy_update: bool | None = None,
                 param_names: Sequence[str] | None = None,
                 name_filters: Mapping[str, Any] | None = None, **hyper: Any):
        self.artifact = artifact
        self.name = artifact.name
        if backend not in ("compiled", "reference"):
            raise ValueError(f"{self.name}: backend must be 'compiled' or 'reference', "
                             f"got {backend!r}")
        self.backend = backend
        if lazy_update is None:
            lazy_update = artifact.lazy_update_default
        if not isinstance(lazy_update, bool):
            raise TypeError(f"{self.name}: lazy_update must be a bool, got {lazy_update!r}")
        self.lazy_update = lazy_update
        self.params: list[np.ndarray] = self._check_params(params)
        defaults = {n: h.default for n, h in artifact.hypers.items()}
        self._hyper = hyper_rules.resolve(self.name, artifact.hypers, artifact.requirements,
                                          defaults, hyper)
        self.t = 0
        self._shape_flags = [{n: bool(scalar_expr.evaluate(rule, {"ndim": p.ndim,
                                                                   "numel": p.size}))
                              for n, rule in artifact.shape_flags.items()}
                             for p in self.params]
        for flags, name in zip(self._shape_flags, self._check_names(param_names, name_filters)):
            flags.update(name)
        self.state: list[dict[str, Any]] = [{} for _ in self.params]
        self._prepared: list[KernelInfo | None] = [None] * len(self.params)
        for i in range(len(self.params)):
            self._ensure_state(i)
        self._kernels: dict[tuple, KernelInfo] = {}
        self._work: list[dict[str, dict[str, np.ndarray]]] = [{} for _ in self.params]

    # -- construction ------------------------------------------------------------------
    def _check_params(self, params) -> list[np.ndarray]:
        if isinstance(params, np.ndarray):
            raise TypeError(f"{self.name}: params must be a list of arrays, got a single array "
                            "(wrap it in a list)")
        params = list(params)
        dtypes = self.artifact.dtypes
        for i, p in enumerate(params):
            if not isinstance(p, np.ndarray):
                raise TypeError(f"{self.name}: parameter {i} must be a numpy.ndarray, "
                                f"got {type(p).__name__}")
            if p.dtype.name not in dtypes:
                raise TypeError(f"{self.name}: parameter {i} has dtype {p.dtype}; "
                                f"the kernels support {', '.join(dtypes)}")
            if not p.flags.c_contiguous:
                raise ValueError(f"{self.name}: parameter {i} is not C-contiguous "
                                 "(pass np.ascontiguousarray(...) and keep that array)")
            if not p.flags.writeable:
                raise ValueError(f"{self.name}: parameter {i} is read-only; "
                                 "parameters are updated in place")
            for j in range(i):
                if np.may_share_memory(p, params[j]):
                    raise ValueError(f"{self.name}: parameters {j} and {i} share memory")
        return params

    def _check_names(self, names, filters) -> list[dict[str, bool]]:
        """Per-parameter name flags (LARS's filter) from ``param_names``/``name_filters``."""
        flags = self.artifact.name_flags
        filters = dict(filters or {})
        unknown = sorted(set(filters) - set(flags))
        if unknown:
            raise ValueError(f"{self.name}: name_filters has {unknown[0]!r}; this optimizer's "
                             f"name flags are {sorted(flags) or 'none'}")
        for n, f in filters.items():
            if not callable(f):
                raise TypeError(f"{self.name}: name_filters[{n!r}] must be a callable "
                                f"name -> bool, got {type(f).__name__}")
        if names is not None:
            names = list(names)
            if len(names) != len(self.params) or not all(isinstance(x, str) for x in names):
                raise ValueError(f"{self.name}: param_names must be {len(self.params)} "
                                 "strings, one per parameter")
        out = []
        for i in range(len(self.params)):
            name = names[i] if names is not None else None
            row = {}
            for n, exclude in flags.items():
                if n in filters:
                    row[n] = bool(filters[n](name if name is not None else ""))
                else:
                    row[n] = name is None or not any(x in name for x in exclude)
            out.append(row)
        return out

    def _flags(self, i: int) -> dict[str, bool]:
        """Parameter ``i``'s flags: the user's, then those set by its shape."""
        return {**{n: self._hyper[n] for n in self.artifact.flags}, **self._shape_flags[i]}

    def _ensure_state(self, i: int) -> None:
        """Allocate the states parameter ``i`` has under its current flags (a state that
        appears when a flag is switched on starts at its init value)."""
        p, st, flags = self.params[i], self.state[i], self._flags(i)
        for s in self.artifact.states:
            if s.name in st or not s.exists(flags):
                continue
            init = s.init if not isinstance(s.init, str) else \
                scalar_expr.evaluate(s.init, self._scalar_env())
            half = s.half_when is not None and scalar_expr.evaluate(s.half_when, flags)
            st[s.name] = (np.float64(init) if s.shape == "scalar" else
                          aligned_full(views.state_shape(p.shape, s.shape), init,
                                       np.float16 if half else p.dtype))

    # -- hyperparameters ---------------------------------------------------------------
    @property
    def hyper(self) -> dict[str, Any]:
        """A copy of the current hyperparameters (change them with ``set_hyper``)."""
        return dict(self._hyper)

    def set_hyper(self, **changes: Any) -> None:
        """Validate and apply new values; nothing changes if any value is invalid."""
        self._hyper = hyper_rules.resolve(self.name, self.artifact.hypers,
                                          self.artifact.requirements, self._hyper, changes)
        self._prepared = [None] * len(self.params)  # flags may have changed

    def _param_kernel(self, i: int) -> KernelInfo:
        """Parameter ``i``'s kernel under the current flags, with its states ready for it
        (cached: only a flag change, through set_hyper or load_state_dict, redoes this)."""
        k = self._prepared[i]
        if k is not None:
            return k
        k = self._kernel(self.params[i].dtype.name, self._flags(i))
        self._ensure_state(i)
        st = self.state[i]
        for n in k.buffers:  # a storage flag changed: convert the state (rounds once)
            want = k.storage.get(n, k.dtype)
            if isinstance(st.get(n), np.ndarray) and st[n].dtype.name != want:
                new = aligned_full(st[n].shape, 0.0, want)
                new[...] = st[n]
                st[n] = new
        self._prepared[i] = k
        return k

    def _kernel(self, dtype: str, flags: dict[str, bool]) -> KernelInfo:
        key = (dtype, tuple(sorted(flags.items())))
        k = self._kernels.get(key)
        if k is None:
            k = self.artifact.kernel_for(dtype, flags)
            if k is None:
                raise TypeError(f"{self.name}: no kernel for dtype {dtype} with flags {flags}")
            self._kernels[key] = k
        return k

    def _scalar_env(self) -> dict[str, Any]:
        env = {}
        for n, v in self._hyper.items():
            info = self.artifact.hypers[n]
            env[n] = info.none_value if v is None else v
        env["t"] = self.t
        return env

    # -- stepping ----------------------------------------------------------------------
    def _check_grads(self, grads: Sequence[np.ndarray], what: str = "grads") -> list[np.ndarray]:
        if isinstance(grads, np.ndarray):
            raise TypeError(f"{self.name}: {what} must be a list of arrays, got a single array")
        grads = list(grads)
        if len(grads) != len(self.params):
            raise ValueError(f"{self.name}: got {len(grads)} "
                             f"{'gradients' if what == 'grads' else what + ' arrays'} for "
                             f"{len(self.params)} parameters")
        label = "gradient" if what == "grads" else what
        for i, (p, g) in enumerate(zip(self.params, grads)):
            if isinstance(g, RowSparse) and what == "grads":
                grads[i] = self._check_row_sparse(i, p, g)
                continue
            if not isinstance(g, np.ndarray):
                raise TypeError(f"{self.name}: {label} {i} must be a numpy.ndarray, "
                                f"got {type(g).__name__}")
            if g.shape != p.shape:
                raise ValueError(f"{self.name}: {label} {i} has shape {g.shape}, "
                                 f"parameter {i} has shape {p.shape}")
            if g.dtype != p.dtype:
                raise TypeError(f"{self.name}: {label} {i} has dtype {g.dtype}, "
                                f"parameter {i} has dtype {p.dtype}")
            if not g.flags.c_contiguous:
                raise ValueError(f"{self.name}: {label} {i} is not C-contiguous")
            if np.may_share_memory(g, p) or any(
                    isinstance(s, np.ndarray) and np.may_share_memory(g, s)
                    for s in self.state[i].values()):
                raise ValueError(f"{self.name}: {label} {i} shares memory with parameter {i} "
                                 "or its state; pass a separate gradient array")
        return grads

    def _check_row_sparse(self, i: int, p: np.ndarray, g: RowSparse):
        """A valid RowSparse gradient, coalesced; or its dense array (lazy_update off,
        or a rule with whole-tensor reductions, which has no lazy variant)."""
        idx, rows = g.indices, g.rows
        if p.ndim == 0:
            raise ValueError(f"{self.name}: gradient {i} is row-sparse but parameter {i} is "
                             "a 0-d array (it has no rows)")
        if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
            raise TypeError(f"{self.name}: gradient {i}: RowSparse indices must be a 1-D "
                            f"integer array, got {idx.dtype}{list(idx.shape)}")
        if rows.shape != (len(idx),) + p.shape[1:]:
            raise ValueError(f"{self.name}: gradient {i}: RowSparse rows have shape "
                             f"{rows.shape}, expected {(len(idx),) + p.shape[1:]}")
        if rows.dtype != p.dtype:
            raise TypeError(f"{self.name}: gradient {i}: RowSparse rows have dtype "
                            f"{rows.dtype}, parameter {i} has dtype {p.dtype}")
        if len(idx) and (idx.min() < 0 or idx.max() >= p.shape[0]):
            bad = idx[(idx < 0) | (idx >= p.shape[0])][0]
            raise ValueError(f"{self.name}: gradient {i}: row index {bad} is out of range "
                             f"for parameter {i} with {p.shape[0]} rows")
        k = self._prepared[i] or self._kernel(p.dtype.name, self._flags(i))
        if not self.lazy_update or k.lazy is None:
            return g.to_dense(p.shape)
        return g.coalesce()

    def _check_inputs(self, inputs: dict[str, Any], grads: list) -> list[dict[str, np.ndarray]]:
        """The spec's extra per-element inputs (e.g. SVRG's grad_snapshot), per parameter."""
        want = set(self.artifact.inputs)
        if set(inputs) != want:
            missing, extra = sorted(want - set(inputs)), sorted(set(inputs) - want)
            raise TypeError(f"{self.name}: step() " + (f"needs {' and '.join(m + '=[...]' for m in missing)}"
                            if missing else f"got unexpected input {extra[0]!r}")
                            + (f" ({'; '.join(f'{n}: {d}' for n, d in self.artifact.inputs.items())})"
                               if want else ""))
        per_param: list[dict[str, np.ndarray]] = [{} for _ in self.params]
        for name, arrays in inputs.items():
            checked = self._check_grads(arrays, what=name)
            for i, (a, g) in enumerate(zip(checked, grads)):
                if isinstance(g, RowSparse):
                    raise TypeError(f"{self.name}: gradient {i} is row-sparse, but {name} "
                                    "inputs need dense gradients")
                per_param[i][name] = a
        return per_param

    def step(self, grads: Sequence[np.ndarray], **inputs: Sequence[np.ndarray]) -> None:
        """One update of every parameter, in place. Specs with extra inputs (SVRG) take
        them by name: ``step(grads, grad_snapshot=[...], full_grad=[...])``."""
        grads = self._check_grads(grads)
        extra = self._check_inputs(inputs, grads)
        self.t += 1
        env = self._scalar_env()
        shared: dict[str, tuple] = {}  # kernel -> (values, scalar array) for this step
        for i, (p, g, st) in enumerate(zip(self.params, grads, self.state)):
            k = self._param_kernel(i)
            if k.symbol not in shared:  # host scalars that read no scalar state: once a step
                values = {**env, **{n: scalar_expr.evaluate(k.host_scalars[n], env)
                                    for n in k.step_scalars}}
                shared[k.symbol] = values, (None if k.param_scalars else self._pack(k, values))
            values, scalars = shared[k.symbol]
            if k.scalar_state_updates:  # this parameter's scalar states
                local = {**values, **{n: v for n, v in st.items() if not isinstance(v, np.ndarray)}}
                if scalars is None:
                    local.update((n, scalar_expr.evaluate(k.host_scalars[n], local))
                                 for n in k.param_scalars)
                    scalars = self._pack(k, local)
                for n, e in k.scalar_state_updates.items():
                    st[n] = np.float64(scalar_expr.evaluate(e, local))
            if isinstance(g, RowSparse):
                if len(g.indices) and p.size:
                    self._run_lazy(k, p, g, st, scalars)
            elif p.size:
                self._run(i, k, p, g, st, scalars, extra[i])

    @staticmethod
    def _pack(k: KernelInfo, values: Mapping[str, Any]) -> np.ndarray:
        """The kernel's scalar array: float64 on the host, rounded once to the kernel dtype."""
        return np.array([values[s] for s in k.scalars], dtype=k.dtype)

    def _workspace(self, i: int, k: KernelInfo, d: tuple[int, int, int]) -> dict[str, np.ndarray]:
        """Parameter ``i``'s float64 reduction buffers for kernel ``k`` (kept between steps)."""
        ws = self._work[i].get(k.symbol)
        if ws is None:
            ws = self._work[i][k.symbol] = {
                n: aligned_full((self.artifact.reduction_buffer_size,) if not axes
                                else views.extents(d, axes), 0.0, np.float64)
                for n, axes in k.workspaces.items()}
        return ws

    def _run(self, i: int, k: KernelInfo, p, g, st, scalars: np.ndarray,
             extra: Mapping[str, np.ndarray]) -> None:
        d = views.dims(p.shape)
        arrays = {"w": p, "grad": g, **extra, **{n: st[n] for n in k.buffers if n in st}}
        if self.backend == "compiled":
            arrays.update(self._workspace(i, k, d))
            for ln in k.launches:
                view = ln["view"]
                self.artifact.function(ln["symbol"])(
                    *(views.as_kernel(arrays[b], k.buffer_axes[b], d, view)
                      for b in ln["buffers"]), scalars)
        else:
            new = reference.evaluate(k.ir, k.dtype, arrays, k.buffer_axes,
                                     dict(zip(k.scalars, scalars)), d)
            for name, value in new.items():
                arrays[name][...] = value

    def _run_lazy(self, k: KernelInfo, p, g: RowSparse, st, scalars: np.ndarray) -> None:
        """The rule on the rows ``g`` names only (indices unique and in range)."""
        rows = g.rows.reshape(len(g.indices), -1)
        states = [n for n in k.buffers if n in st and isinstance(st[n], np.ndarray)]
        if self.backend == "compiled":
            arrays = {"w": p.reshape(-1), "grad": rows, "_indices": g.indices,
                      **{n: st[n].reshape(-1) for n in states}}
            self.artifact.function(k.lazy["symbol"])(*(arrays[b] for b in k.lazy["buffers"]),
                                                     scalars)
            return
        sub = {"w": p.reshape(p.shape[0], -1)[g.indices].reshape(-1),
               "grad": rows.reshape(-1),
               **{n: st[n].reshape(p.shape[0], -1)[g.indices].reshape(-1) for n in states}}
        new = reference.evaluate(k.ir, k.dtype, sub, k.buffer_axes,
                                 dict(zip(k.scalars, scalars)), (1, 1, rows.size))
        for name, value in new.items():
            target = p if name == "w" else st[name]
            target.reshape(p.shape[0], -1)[g.indices] = value.reshape(len(g.indices), -1)

    # -- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.name, "key": self.artifact.key, "t": self.t,
                "hyper": dict(self._hyper),
                "state": [{n: (v.copy() if isinstance(v, np.ndarray) else float(v))
                           for n, v in st.items()} for st in self.state]}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore a ``state_dict``; validated whole before anything is overwritten."""
        if sd.get("optimizer") != self.name:
            raise ValueError(f"{self.name}: state_dict is for optimizer {sd.get('optimizer')!r}")
        states = sd.get("state")
        if not isinstance(states, list) or len(states) != len(self.params):
            raise ValueError(f"{self.name}: state_dict has state for "
                             f"{len(states) if isinstance(states, list) else '?'} parameters, "
                             f"this optimizer has {len(self.params)}")
        t = sd.get("t")
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
            raise ValueError(f"{self.name}: state_dict step t must be an int >= 0, got {t!r}")
        hyper = hyper_rules.resolve(self.name, self.artifact.hypers, self.artifact.requirements,
                                    self._hyper, sd.get("hyper", {}))
        for i, (mine, theirs) in enumerate(zip(self.state, states)):
            if set(mine) != set(theirs):
                raise ValueError(f"{self.name}: state_dict state {i} has {sorted(theirs)}, "
                                 f"expected {sorted(mine)}")
            for n, v in mine.items():
                if isinstance(v, np.ndarray):
                    src = np.asarray(theirs[n])
                    if src.shape != v.shape or src.dtype != v.dtype:
                        raise ValueError(f"{self.name}: state_dict state {i}.{n} is "
                                         f"{src.dtype}{list(src.shape)}, expected "
                                         f"{v.dtype}{list(v.shape)}")
        for mine, theirs in zip(self.state, states):
            for n, v in mine.items():
                if isinstance(v, np.ndarray):
                    v[...] = theirs[n]
                else:
                    mine[n] = np.float64(theirs[n])
        self._hyper, self.t = hyper, int(t)
        self._prepared = [None] * len(self.params)

    def __repr__(self) -> str:
        hp = ", ".join(f"{k}={v!r}" for k, v in self._hyper.items())
        return f"<optgen {self.name} ({len(self.params)} params, t={self.t}): {hp}>"

"""A built artifact on disk: its manifest and its kernels, loaded without the TVM compiler.

The library is opened with ``tvm_ffi`` after loading ``libtvm_runtime.so`` into the
global symbol namespace: the runtime library provides the thread pool and workspace
hooks the kernels call (tvm-notes §7), and ``import tvm`` (seconds) is never needed.

Loading reads the manifest and nothing else that could run code (never spec.py or the
wrapper module), and verifies the artifact before anything uses it (optgen/core/manifest.py:
format, keys, versions, file sizes and hashes; ArtifactError names what is wrong and the
rebuild command; those names are re-exported here).

The manifest lists every kernel; their functions are in one library per variant (a
parameter dtype and flag values), each in a folder of the artifact, loaded (and verified)
when one of its kernels is first called. A variant not built yet is built then by the
artifact's ``builder`` (``optgen.get_artifact`` gives it one); an artifact without one
(``optgen.load``, ``build=False``) raises VariantNotBuilt naming the build command.
"""
from __future__ import annotations

import functools
import os
import threading
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from .. import backends
from ..device import DeviceError, DeviceProgram
from optgen.core.manifest import ArtifactError, load_variant, load_verified, verify_files
from optgen.core.tvm_runtime import load_tvm_runtime as _load_tvm_runtime  # noqa: F401
from optgen.core import scalar_expr
from optgen.core import formats
from optgen.core.hyper import HyperInfo, Requirement


@dataclass(frozen=True, eq=False)
class KernelInfo(formats.FormattedKernel):
    """One kernel of the manifest. ``dtype`` is the compute dtype (and the scalars'),
    ``param_dtype`` the parameter's: equal for plain kernels; float16/bfloat16 for mixed
    precision (dtype float32), where ``w`` is the float32 master and ``w_low`` the
    parameter the kernel rewrites from it (see docs/design.md)."""
    symbol: str
    dtype: str
    param_dtype: str
    flags: dict[str, bool]
    buffers: list[str]
    scalars: list[str]
    host_scalars: dict[str, str]
    scalar_state_updates: dict[str, str]
    ir: dict
    launches: list[dict]
    buffer_axes: dict[str, str]
    lazy: dict | None       # the row-sparse launch, for row-wise elementwise rules
    storage: dict[str, str]  # buffers in another dtype: float16 states, mixed-precision I/O
    refresh: dict | None = None  # matrix rules: {"every", "start", "ir", "reads"}, "dtype"
    state_format: dict[str, str] = dataclasses.field(default_factory=dict)  # state ->
    # format (optgen/core/formats.py); empty for the plain kernels
    quant: dict[str, str] = dataclasses.field(default_factory=dict)  # q8 state -> its map
    stochastic: dict[str, int] = dataclasses.field(default_factory=dict)  # bf16sr state ->
    # its salt (optgen/core/rounding.py)
    quant_block: int = formats.NO_BLOCK   # block-quantized states: elements per absmax
    variant: str = ""       # the variant whose library holds its functions

    @classmethod
    def from_json(cls, d: dict) -> "KernelInfo":
        return cls(d["symbol"], d["dtype"], d["param_dtype"], d["flags"], d["buffers"],
                   d["scalars"], d["host_scalars"], d["scalar_state_updates"], d["ir"],
                   d["launches"], d["buffer_axes"], d["lazy"], d["storage"], d["refresh"],
                   d["state_format"], d["quant"], d.get("stochastic", {}),
                   d.get("quant_block", formats.NO_BLOCK), d["variant"])

    @property
    def functions(self) -> list[str]:
        """The symbols of its library functions: launches, their segmented and
        multi-tensor twins and the row-sparse pass (a matmul left to BLAS has none)."""
        lns = [*self.launches, *([self.lazy] if self.lazy else [])]
        return [ln[k] for ln in lns for k in ("symbol", "seg_symbol", "mt_symbol")
                if ln.get(k)]

    @functools.cached_property
    def matrix(self) -> bool:
        """A matrix rule (products of 2-D parameters; optgen.compiler.plan_matrix)."""
        return any(ln["view"] == "matrix" for ln in self.launches)

    @property
    def master(self) -> bool:
        """False for a bfloat16 kernel that steps the parameter itself, without a
        float32 master (stochastic rounding: ``formats.PARAM``)."""
        return formats.PARAM not in self.state_format

    @property
    def mixed(self) -> bool:
        """Mixed precision: a float32 master ``w`` and a low-precision copy ``w_low``."""
        return self.param_dtype != self.dtype

    @functools.cached_property
    def workspaces(self) -> dict[str, str]:
        """Buffers the runtime keeps per parameter, with the axes each holds: reductions
        (float64) and a matrix rule's temporaries and loop buffers (kernel dtype)."""
        return {n: a for n, a in self.buffer_axes.items()
                if n.startswith(("_red", "_tmp", "_loop"))}

    @functools.cached_property
    def global_sums(self) -> tuple[str, ...]:
        """The reduction buffers of sums over all parameters (``global_sum``)."""
        return tuple(r for ln in self.launches if ln["kind"] == "reduce"
                     for r, op in [(ln["red"], ln["op"])] +
                     [(a["red"], a["op"]) for a in ln.get("also", ())] if op == "gsum")

    @functools.cached_property
    def gathers(self) -> int:
        """How many launches come before the global sums' totals are needed: up to the
        last one that fills a part of one (0: none)."""
        fills = [j for j, ln in enumerate(self.launches) if ln["kind"] == "reduce" and
                 set(self.global_sums) & {ln["red"], *(a["red"] for a in ln.get("also", ()))}]
        return fills[-1] + 1 if fills else 0

    @functools.cached_property
    def param_scalars(self) -> tuple[str, ...]:
        """Host scalars that read a scalar state or the parameter's shape (rows, cols):
        evaluated per parameter."""
        per_param = set(self.scalar_state_updates) | {"rows", "cols"}
        return tuple(n for n, e in self.host_scalars.items()
                     if scalar_expr.names(e) & per_param)

    @functools.cached_property
    def step_scalars(self) -> tuple[str, ...]:
        """Host scalars that read only hyperparameters and t: evaluated once per step."""
        return tuple(n for n in self.host_scalars if n not in self.param_scalars)


@dataclass(frozen=True)
class StateInfo:
    name: str
    init: float | str     # a number or a Python expression over hyperparameters
    shape: str            # "param", "row", "col" or "scalar"
    doc: str = ""
    when: str | None = None   # flag expression: the state exists only where it holds
    half_when: str | None = None  # flag expression: stored as float16 where it holds

    def exists(self, flags: dict[str, bool]) -> bool:
        return self.when is None or bool(scalar_expr.evaluate(self.when, flags))


@functools.lru_cache(maxsize=1)
def _bfloat16_view() -> tuple[Callable, Any]:
    _load_tvm_runtime()
    import tvm_ffi
    return tvm_ffi.get_global_func("runtime.TVMTensorCreateView"), tvm_ffi.dtype("bfloat16")


def bfloat16_tensor(arr: Any) -> Any:
    """A kernel argument for a numpy bfloat16 (ml_dtypes) array: a tvm_ffi tensor of
    dtype bfloat16 on the same memory (zero copy, about 1.3 us). numpy's DLPack export
    refuses ml_dtypes' bfloat16, so the array goes through its uint16 bits and TVM's
    runtime re-types the view. Other arrays (torch bfloat16 included) pass as they are."""
    if not isinstance(arr, np.ndarray) or arr.dtype.name != "bfloat16":
        return arr
    import tvm_ffi
    create_view, bf16 = _bfloat16_view()
    return create_view(tvm_ffi.from_dlpack(arr.view("uint16")), arr.shape, bf16, 0)


@dataclass(frozen=True)
class Variant:
    """One built variant of an artifact: its folder and its manifest (the artifact's
    merged with the variant's record: library, sources, binaries, device ABI)."""
    name: str
    path: str
    manifest: dict


class Artifact:
    """One (spec, target) artifact directory."""

    def __init__(self, path: str, manifest: dict):
        self.path = path
        self.manifest = manifest
        self.name: str = manifest["name"]
        self.doc: str = manifest.get("doc", "")
        self.target: str = manifest["target"]
        self.key: str = manifest["key"]
        self.hypers = {h["name"]: HyperInfo.from_json(h) for h in manifest["hyperparameters"]}
        self.requirements = [Requirement(**r) for r in manifest["requirements"]]
        self.states = [StateInfo(**s) for s in manifest["states"]]
        self.kernels = [KernelInfo.from_json(k) for k in manifest["kernels"]]
        self.shape_flags: dict[str, str] = {n: f["rule"]
                                            for n, f in manifest["shape_flags"].items()}
        self.lazy_update_default: bool = manifest["lazy_update_default"]
        self.inputs: dict[str, str] = manifest["inputs"]
        self.statistics: dict[str, str] = {n: f["shape"]
                                           for n, f in manifest["statistics"].items()}
        self.accepted: dict[str, str] = manifest["accepted"]
        self.name_flags: dict[str, tuple[str, ...]] = {
            n: tuple(f["exclude"]) for n, f in manifest["name_flags"].items()}
        self.reduction_buffer_size: int = manifest["reduction_buffer_size"]
        self.reduction_dtype: str = manifest["reduction_dtype"]
        self.state_format: dict[str, str] = manifest["state_format"]   # state -> format
        # how each formatted state is stored: a dtype (bf16) or "q8:<map>[:<block>]"
        # (optgen/core/formats: Format.stored)
        self.stored: dict[str, str] = {
            n: f.stored for k in self.kernels for n, f in k.formats.items()} | {
            n: dt for n, dt in formats.dtypes(self.state_format).items()}
        # variant -> {"param_dtype", "flags", "kernels"}; the defaults `optgen build` makes
        self.variants: dict[str, dict] = manifest["variants"]
        self.default_variants: list[str] = list(manifest["default_variants"])
        # builds the named variants into this folder (optgen.get_artifact sets it); None:
        # a variant not built is a VariantNotBuilt error
        self.builder: Callable[[list[str]], None] | None = None
        self._owners: dict[str, list[str]] = {}    # function -> the variants that hold it
        for k in self.kernels:
            for f in k.functions:
                if k.variant not in self._owners.setdefault(f, []):
                    self._owners[f].append(k.variant)
        self._built: dict[str, Variant] = {}
        self._modules: dict[str, Any] = {}
        self._functions: dict[str, Callable] = {}
        self._lock = threading.RLock()

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Artifact":
        """The verified artifact at ``path``: reads manifest.json and hashes the files the
        runtime reads; runs no code of the artifact (the library is opened on first use)."""
        return load_verified(os.path.abspath(os.fspath(path)), cls)

    @property
    def flags(self) -> dict[str, HyperInfo]:
        return {n: h for n, h in self.hypers.items() if h.is_flag}

    def kernel_for(self, dtype: str, flags: dict[str, bool], formatted: bool = False,
                   master: bool = True) -> KernelInfo | None:
        """The kernel for parameters of ``dtype``: plain for float32/float64, mixed
        precision (float32 master) for float16/bfloat16, or with ``master=False`` the
        bfloat16 kernel without one (stochastic rounding). ``formatted``: the kernel with
        the artifact's state formats; where the build made none for ``flags`` because no
        formatted state is stored in the kernel dtype under them (absent, or float16 by the
        spec's ``half_when``), that is the plain kernel; matrix rules have none."""
        mine = [k for k in self.kernels
                if k.param_dtype == dtype and k.flags == flags and k.master == master]
        for k in mine:
            if bool(formats.states_of(k.state_format)) == formatted:
                return k
        if formatted and not any(k.flags == flags and formats.states_of(k.state_format)
                                 and k.master == master for k in self.kernels):
            plain = self.kernel_for(dtype, flags, master=master)
            if plain is not None and not plain.matrix:
                return plain
        return None

    @property
    def dtypes(self) -> list[str]:
        """Parameter dtypes with plain kernels (float32, float64)."""
        return sorted({k.dtype for k in self.kernels if not k.mixed})

    @property
    def mixed_dtypes(self) -> list[str]:
        """Parameter dtypes with mixed-precision kernels (float16, bfloat16)."""
        return sorted({k.param_dtype for k in self.kernels if k.mixed})

    def variant(self, name: str) -> Variant:
        """Variant ``name`` (see ``variants``), verified; built first by the ``builder``
        where it is not built yet or broken (the build reports a broken one), else
        VariantNotBuilt naming the command that builds it (or, broken, ArtifactError)."""
        with self._lock:
            got = self._built.get(name)
            if got is None:
                try:
                    merged = load_variant(self.path, self.manifest, name)
                except ArtifactError:
                    if self.builder is None or name not in self.variants:
                        raise
                    self.builder([name])
                    merged = load_variant(self.path, self.manifest, name)
                got = self._built[name] = Variant(name, os.path.join(self.path, name),
                                                  merged)
            return got

    def ensure(self, names: Iterable[str]) -> None:
        """Have the variants ``names`` built: those not built yet (or broken) are built
        together, into one library (cheaper than one by one), by the ``builder``;
        without one, VariantNotBuilt (or ArtifactError) for the first not to be had."""
        with self._lock:
            if self.builder is None:
                for n in names:
                    self.variant(n)
                return
            missing = [n for n in names if n not in self._built and not self._verified(n)]
            if missing:
                self.builder(missing)

    def _verified(self, name: str) -> bool:
        try:
            load_variant(self.path, self.manifest, name)
        except ArtifactError:
            return False
        return True

    def ready(self, kernel: KernelInfo) -> None:
        """Load the library of ``kernel``'s variant, building it first where it is not
        built and the artifact has a builder: a variant that cannot be had is a
        VariantNotBuilt here, before a step changes anything."""
        if kernel.functions:
            with self._lock:
                self._module(kernel.variant)

    def function(self, symbol: str) -> Callable[..., Any]:
        """The compiled kernel, ``fn(*arrays, scalars)`` (loaded once, handle cached),
        from the library of its variant (built on first use where the artifact has a
        builder): through the target's runtime backend (runtime/backends/): CPU
        targets' library through tvm_ffi, GPU targets through their device ABI
        (runtime/device.py)."""
        fn = self._functions.get(symbol)
        if fn is None:
            with self._lock:
                if symbol not in self._owners:
                    raise ArtifactError(f"{self.path}: no kernel function {symbol!r}")
                module = self._module(self._holder(symbol))
                if isinstance(module, DeviceProgram):
                    try:
                        fn = module.function(symbol)
                    except DeviceError as e:
                        raise ArtifactError(f"{self.path}: {e}") from None
                else:
                    fn = module[symbol]
                self._functions[symbol] = fn
        return fn

    def _holder(self, symbol: str) -> str:
        """A variant whose library holds function ``symbol`` (kernels of several variants
        may run one function): one loaded already, else one built, else the first."""
        owners = self._owners[symbol]
        return next((v for v in owners if v in self._modules), None) or next(
            (v for v in owners if os.path.isdir(os.path.join(self.path, v))), owners[0])

    def _module(self, name: str):
        module = self._modules.get(name)
        if module is None:
            v = self.variant(name)
            verify_files(v.path, v.manifest)  # unchanged since? (a stat per file)
            backend = backends.get(self.target)
            if backend.load is not None:         # a library through tvm_ffi (CPU targets)
                _load_tvm_runtime()
                module = backend.load(v.path, v.manifest)
            else:
                try:
                    module = DeviceProgram(v.path, v.manifest)
                except DeviceError as e:
                    raise ArtifactError(f"{v.path}: {e}") from None
            self._modules[name] = module
        return module

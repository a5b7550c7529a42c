"""optgen's trainer-side runtime: load artifacts and step optimizers. Imports no TVM compiler.

    opt = optgen.create("adam", params, lr=1e-3)
    opt.step(grads)
"""
from __future__ import annotations

import os
from typing import Any, Callable

from . import backends, schedules
from optgen.core import cache, catalog
from optgen.core import formats
from .artifact import Artifact, ArtifactError, ArtifactWarning, VariantNotBuilt
from optgen.core.manifest import not_built
from optgen.core.catalog import register
from .flat import flatten
from .optimizer import Optimizer, aligned_full, default_decay_filter
from .sparse import RowSparse
from . import launch as _launch
from .threads import cpu_pool, get_num_threads, set_cpu_pool, set_num_threads

__all__ = ["Artifact", "ArtifactError", "ArtifactWarning", "Optimizer", "RowSparse",
           "VariantNotBuilt",
           "aligned_full", "create", "default_decay_filter", "flatten", "get_artifact", "get_num_threads",
           "load", "register", "schedules", "set_num_threads", "cpu_pool", "set_cpu_pool"]


def get_artifact(spec: str | os.PathLike, target: str = "llvm", *, build: bool = True,
                 base: str | None = None, state_format: Any = None,
                 stochastic_rounding: bool = False, master_format: Any = None) -> Artifact:
    """The cached artifact of a spec (catalog name or file), building it if needed.
    ``base`` names the base optimizer of a wrapper spec (``get_artifact("lars", base="adam")``);
    ``state_format`` gets the artifact that also holds that format's kernels
    (optgen/core/formats.py; ``stochastic_rounding`` makes its bf16 states bf16sr;
    ``master_format`` "split16"/"split8" adds kernels for bfloat16 parameters stepped
    through a split master, optgen/core/formats/split.py).

    The artifact lists every kernel; each variant's library (a parameter dtype and flag
    values) is compiled when its kernels are first called, so a step with new settings
    (another dtype, a flag turned on) may compile once; ``build=False`` builds nothing
    (a variant not built is then a VariantNotBuilt error).

    The artifact is verified on load (Artifact.load). A cached one that fails (corrupted,
    truncated, another optgen/TVM version) is rebuilt with an ArtifactWarning saying why;
    with ``build=False`` it is an ArtifactError saying why."""
    path = catalog.resolve(spec)
    if base is not None:
        catalog.resolve(base)  # an unknown base is a ValueError naming the known ones
    owner = os.path.basename(path)
    req = formats.rounded(owner, formats.request(owner, state_format), stochastic_rounding)
    state_format = formats.mastered(owner, req, master_format)
    fmt = formats.key(state_format)
    with open(path, encoding="utf-8") as f:
        backend = backends.get(target)
        key = cache.artifact_key(f.read(), backend.target_key(), base, fmt,
                                 machine_bound=backend.machine_bound)
    dest = os.path.join(cache.cache_dir(), cache.artifact_dirname(path, target, key, base, fmt))
    fix = f"run `optgen build {path} --target {target}" + \
        (f" --state-format {formats.key(req)}" if req else "") + \
        (f" --master-format {master_format}" if state_format != req else "") + \
        "` or pass build=True"
    try:
        art = Artifact.load(dest)
    except ArtifactError as e:
        if not build and os.path.lexists(dest):
            raise ArtifactError(f"{e.problem}; {fix}", e.problem) from None
        art = None  # missing or broken: the build below reports a broken one and replaces it
    if art is None or art.key != key:
        if not build:
            raise ArtifactError(f"{os.path.basename(path)} is not built for {target}; {fix}"
                                if art is None else f"{dest}: its manifest's key "
                                f"{art.key[:16]}... is not the spec's key {key[:16]}...; {fix}")
        from optgen.compiler.pipeline import build as build_spec  # the compiler, when needed
        art = Artifact.load(build_spec(path, target, base=base, state_format=state_format,
                                       variants=None).path)     # (no library yet)
    if build:
        art.builder = _builder(art, path, base, state_format)
    return art


def _builder(art: Artifact, spec_path: str, base: str | None, state_format: Any
             ) -> Callable[[list[str]], None]:
    """What builds variants of ``art`` (cached from the spec file ``spec_path``) on first
    use; where this machine cannot (no toolchain, a folder it cannot write), a
    VariantNotBuilt naming the variant, why, and the command that builds it."""
    def build_variants(names: list[str]) -> None:
        from optgen.compiler.pipeline import build as build_spec  # (the compiler)
        from optgen.errors import BuildError
        try:
            r = build_spec(spec_path, art.target, base=base, state_format=state_format,
                           arch=",".join(art.manifest["archs"]) or None, variants=names)
        except (BuildError, OSError) as e:
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise not_built(art.path, art.manifest, names[0],
                            f", and it cannot be built here ({why})") from e
        if r.path != art.path:
            raise ArtifactError(f"{spec_path} changed since {art.path} was loaded (it now "
                                f"builds {r.path}): get the artifact again")
    return build_variants


def load(path: str | os.PathLike) -> Artifact:
    """A prebuilt artifact directory (e.g. from ``optgen build --out DIR``), verified
    like a cached one; a broken one is an ArtifactError with the rebuild command (it is
    never rebuilt here: only its manifest and library are read, no spec code runs)."""
    return Artifact.load(path)


def create(spec: str | os.PathLike | Artifact, params: Any, *, target: str = "llvm",
           build: bool = True, base: str | None = None, **options: Any) -> Optimizer:
    """An optimizer for ``params`` from a catalog name, a registered name, a spec file or
    an artifact. ``options`` are the Optimizer's keyword arguments (hyperparameters,
    aliases such as ``learning_rate``/``wd``, and the runtime options ``multi_precision``,
    ``clip_global_norm``, ``nonfinite``, ``loss_scale``, ``lr_mult``, ``wd_mult``,
    ``decay_filter``, ``param_names``, ``name_filters``, ``lazy_update``, ``backend``,
    ``begin_num_update``, ``state_format``, ``state_format_min_size``,
    ``stochastic_rounding``, ``master_format``, ``seed``). ``base``: the
    base optimizer of a wrapper spec (LARS)."""
    art = spec if isinstance(spec, Artifact) else get_artifact(
        spec, target, build=build, base=base, state_format=options.get("state_format"),
        stochastic_rounding=options.get("stochastic_rounding", False),
        master_format=options.get("master_format"))
    return Optimizer(art, params, **options)


def _sum_of_squares(art: Artifact, dtype: str, compiled: bool) -> tuple | None:
    """(artifact, kernel, function or False) of specs/_sum_of_squares.py's pass (the
    reduction ``clip_global_norm`` and the non-finite check run on every gradient) for
    ``dtype`` gradients of an optimizer of ``art``: built once per target where ``art``
    may build; else the one ``art`` ships (``optgen build --out``), or None (compiles
    nothing: the array library's pass runs)."""
    if art.builder is not None:
        if art.target not in _SQUARES:
            _SQUARES[art.target] = get_artifact(
                os.path.join(catalog.specs_dir(), catalog.SQUARES_SPEC), art.target)
        squares = _SQUARES[art.target]
    else:
        shipped = os.path.join(art.path, catalog.SHIPPED_SQUARES)
        if shipped not in _SQUARES:
            _SQUARES[shipped] = Artifact.load(shipped) if os.path.isdir(shipped) else None
        squares = _SQUARES[shipped]
    k = None if squares is None else squares.kernel_for(dtype, {})
    if k is None:
        return None
    if compiled:
        try:
            squares.ready(k)
        except VariantNotBuilt:
            if squares.builder is not None:
                raise
            return None     # (shipped for other dtypes)
    return squares, k, compiled and squares.function(k.launches[0]["symbol"])


_SQUARES: dict[str, Artifact | None] = {}
_launch.SUM_OF_SQUARES = _sum_of_squares

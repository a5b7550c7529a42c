"""optgen's trainer-side runtime: load artifacts and step optimizers. Imports no TVM compiler.

    opt = optgen.create("adam", params, lr=1e-3)
    opt.step(grads)
"""
from __future__ import annotations

import os
from typing import Any

from . import cache, catalog, schedules
from .artifact import Artifact, ArtifactError
from .catalog import register
from .optimizer import Optimizer, aligned_full, default_decay_filter
from .sparse import RowSparse
from .threads import get_num_threads, set_num_threads

__all__ = ["Artifact", "ArtifactError", "Optimizer", "RowSparse", "aligned_full", "create",
           "default_decay_filter", "get_artifact", "get_num_threads", "load", "register",
           "schedules", "set_num_threads"]


def get_artifact(spec: str | os.PathLike, target: str = "llvm", *, build: bool = True,
                 base: str | None = None) -> Artifact:
    """The cached artifact of a spec (catalog name or file), building it if needed.
    ``base`` names the base optimizer of a wrapper spec (``get_artifact("lars", base="adam")``)."""
    path = catalog.resolve(spec)
    if base is not None:
        catalog.resolve(base)  # an unknown base is a ValueError naming the known ones
    with open(path, encoding="utf-8") as f:
        key = cache.artifact_key(f.read(), cache.target_key(target), base)
    dest = os.path.join(cache.cache_dir(), cache.artifact_dirname(path, target, key, base))
    try:
        art = Artifact.load(dest)
    except ArtifactError:
        art = None  # missing, incomplete or another format: build it below
    if art is not None and art.key == key:
        return art
    if not build:
        raise ArtifactError(f"{os.path.basename(path)} is not built for {target}; run "
                            f"`optgen build {path} --target {target}` or pass build=True")
    from optgen.compiler.pipeline import build as build_spec  # the compiler, only when needed
    return Artifact.load(build_spec(path, target, base=base).path)


def load(path: str | os.PathLike) -> Artifact:
    """A prebuilt artifact directory (e.g. from ``optgen build --out DIR``)."""
    return Artifact.load(path)


def create(spec: str | os.PathLike | Artifact, params: Any, *, target: str = "llvm",
           build: bool = True, base: str | None = None, **options: Any) -> Optimizer:
    """An optimizer for ``params`` from a catalog name, a registered name, a spec file or
    an artifact. ``options`` are the Optimizer's keyword arguments (hyperparameters,
    aliases such as ``learning_rate``/``wd``, and the runtime options ``multi_precision``,
    ``clip_global_norm``, ``nonfinite``, ``loss_scale``, ``lr_mult``, ``wd_mult``,
    ``decay_filter``, ``param_names``, ``name_filters``, ``lazy_update``, ``backend``,
    ``begin_num_update``). ``base``: the base optimizer of a wrapper spec (LARS)."""
    art = spec if isinstance(spec, Artifact) else get_artifact(spec, target, build=build,
                                                               base=base)
    return Optimizer(art, params, **options)

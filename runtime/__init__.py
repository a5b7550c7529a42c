"""optgen's trainer-side runtime: load artifacts and step optimizers. Imports no TVM compiler.

    opt = optgen.create("adam", params, lr=1e-3)
    opt.step(grads)
"""
from __future__ import annotations

import os
from typing import Any, Iterable

import numpy as np

from . import cache, catalog
from .artifact import Artifact, ArtifactError
from .optimizer import Optimizer, aligned_full
from .sparse import RowSparse

__all__ = ["Artifact", "ArtifactError", "Optimizer", "RowSparse", "aligned_full", "create",
           "get_artifact", "load"]


def get_artifact(spec: str | os.PathLike, target: str = "llvm", *, build: bool = True,
                 base: str | None = None) -> Artifact:
    """The cached artifact of a spec (catalog name or file), building it if needed.
    ``base`` names the base optimizer of a wrapper spec (``get_artifact("lars", base="adam")``)."""
    path = catalog.resolve(spec)
    if base is not None:
        catalog.resolve(base)  # an unknown base is a ValueError naming the known ones
    with open(path, encoding="utf-8") as f:
        key = cache.artifact_key(f.read(), target, base)
    dest = os.path.join(cache.cache_dir(), cache.artifact_dirname(path, target, key, base))
    try:
        art = Artifact.load(dest)
        if art.key == key:
            return art
    except ArtifactError:
        pass
    if not build:
        raise ArtifactError(f"{os.path.basename(path)} is not built for {target}; run "
                            f"`optgen build {path} --target {target}` or pass build=True")
    from optgen.compiler.pipeline import build as build_spec  # the compiler, only when needed
    return Artifact.load(build_spec(path, target, base=base).path)


def load(path: str | os.PathLike) -> Artifact:
    """A prebuilt artifact directory (e.g. from ``optgen build --out DIR``)."""
    return Artifact.load(path)


def create(spec: str | os.PathLike | Artifact, params: Iterable[np.ndarray], *,
           target: str = "llvm", build: bool = True, backend: str = "compiled",
           base: str | None = None, lazy_update: bool | None = None,
           param_names: Iterable[str] | None = None, name_filters: dict | None = None,
           **hyper: Any) -> Optimizer:
    """An optimizer for ``params`` from a catalog name, a spec file or an artifact.

    ``base``: the base optimizer of a wrapper spec (LARS). ``lazy_update``: whether a
    ``RowSparse`` gradient updates only its rows (default: the spec's choice, True for
    lazyadam). ``param_names`` (one per parameter) and ``name_filters`` set per-parameter
    name flags, such as LARS's filter that leaves out LayerNorm and bias parameters."""
    art = spec if isinstance(spec, Artifact) else get_artifact(spec, target, build=build,
                                                               base=base)
    return Optimizer(art, params, backend=backend, lazy_update=lazy_update,
                     param_names=param_names, name_filters=name_filters, **hyper)

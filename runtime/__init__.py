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

__all__ = ["Artifact", "ArtifactError", "Optimizer", "aligned_full", "create", "get_artifact",
           "load"]


def get_artifact(spec: str | os.PathLike, target: str = "llvm", *, build: bool = True) -> Artifact:
    """The cached artifact of a spec (catalog name or file), building it if needed."""
    path = catalog.resolve(spec)
    with open(path, encoding="utf-8") as f:
        key = cache.artifact_key(f.read(), target)
    dest = os.path.join(cache.cache_dir(), cache.artifact_dirname(path, target, key))
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
    return Artifact.load(build_spec(path, target).path)


def load(path: str | os.PathLike) -> Artifact:
    """A prebuilt artifact directory (e.g. from ``optgen build --out DIR``)."""
    return Artifact.load(path)


def create(spec: str | os.PathLike | Artifact, params: Iterable[np.ndarray], *,
           target: str = "llvm", build: bool = True, backend: str = "compiled",
           **hyper: Any) -> Optimizer:
    """An optimizer for ``params`` from a catalog name, a spec file or an artifact."""
    art = spec if isinstance(spec, Artifact) else get_artifact(spec, target, build=build)
    return Optimizer(art, params, backend=backend, **hyper)

"""What an artifact built with ``--out`` ships beside its own kernels: the global-norm
pass (specs/_sum_of_squares.py), which ``clip_global_norm`` and the non-finite check run
on every gradient. A prebuilt artifact is loaded where nothing may compile
(``optgen.load``); it finds that pass's kernels in its folder ``_sum_of_squares``, for
the gradient dtypes of the variants it holds (built once in the cache, linked in).

    optgen build adamw --out dist/    ->  dist/adamw-llvm/_sum_of_squares/
"""
from __future__ import annotations

import os
import shutil
from typing import Any

from optgen.core import catalog
from optgen.core.manifest import load_verified
from . import pipeline


def ship_squares(result: Any, target: str, arch: str | None = None) -> None:
    """Put the sum-of-squares kernels for the dtypes of ``result``'s variants (a
    ``pipeline.BuildResult`` under --out) in its folder; the artifact of that spec
    itself ships nothing."""
    spec = os.path.join(catalog.specs_dir(), catalog.SQUARES_SPEC)
    manifest = load_verified(result.path, lambda _, m: m)
    if manifest["name"] == "sum_of_squares":
        return
    dtypes = {manifest["variants"][v]["param_dtype"] for v in result.have}
    cached = pipeline.build(spec, target, arch=arch, variants=None)
    variants = load_verified(cached.path, lambda _, m: m)["variants"]
    wanted = [v for v, rec in variants.items() if rec["param_dtype"] in dtypes]
    cached = pipeline.build(spec, target, arch=arch, variants=wanted)
    dest = os.path.join(result.path, catalog.SHIPPED_SQUARES)
    with pipeline._locked(result.path + ".lock"):           # the artifact's builders'
        tmp = pipeline._temp_folder("build", dest)
        try:
            shutil.copytree(cached.path, tmp, dirs_exist_ok=True, copy_function=pipeline._link,
                            ignore=shutil.ignore_patterns(".*"))
            pipeline._publish(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["ship_squares"]

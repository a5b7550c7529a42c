"""optgen: an optimizer compiler.

Declare an optimizer in the spec DSL (see specs/), compile it through TVM into fused
kernels, and step it from a trainer::

    import optgen
    opt = optgen.create("adam", [w], lr=1e-3)
    opt.step([g])

``import optgen`` does not import TVM; building a spec does (see optgen.compiler).
``optgen.torch`` holds drop-in ``torch.optim.Optimizer`` classes (imports torch).
"""
from .core._version import __version__

from .errors import BuildError, SpecError  # noqa: E402
from optgen.runtime import (Artifact, ArtifactError, ArtifactWarning,  # noqa: E402
                            Optimizer, RowSparse, VariantNotBuilt, aligned_full, create,
                            flatten, get_artifact, get_num_threads, load, register,
                            schedules, set_num_threads, cpu_pool, set_cpu_pool)


def build(spec, target: str = "llvm", *, out=None, force: bool = False, base=None,
          arch: str | None = None, state_format=None, variants="default"):
    """Build a spec (catalog name or file) for ``target`` and return the BuildResult;
    ``arch``: the CUDA architectures (cuda only, default "sm_80,sm_90");
    ``state_format``: also the kernels with states in that format (bf16);
    ``variants``: the libraries built now, "default" (float32 parameters, default flag
    values), "all", or a list of variant names (the others build on first use). Under
    ``out`` the artifact also ships the kernels of the global-norm pass
    (``clip_global_norm``) for its variants' dtypes (optgen/compiler/ship.py)."""
    from optgen.compiler.pipeline import build as _build
    from optgen.compiler.ship import ship_squares
    from optgen.core import catalog
    r = _build(catalog.resolve(spec), target, out=out, force=force, base=base, arch=arch,
               state_format=state_format, variants=variants)
    if out is not None:   # a prebuilt artifact ships the global-norm pass (optgen.load)
        ship_squares(r, target, arch)
    return r


__all__ = ["Artifact", "ArtifactError", "ArtifactWarning", "BuildError", "Optimizer",
           "RowSparse", "SpecError", "VariantNotBuilt", "aligned_full", "build", "create",
           "flatten", "get_artifact",
           "get_num_threads", "load", "register", "schedules", "set_num_threads",
           "cpu_pool", "set_cpu_pool",
           "__version__"]

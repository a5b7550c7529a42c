"""A built artifact loaded without the TVM compiler (load). Where artifacts live and the
key that names them, the spec catalog and the manifest checks are the kernel core's
(optgen.core.cache, catalog, manifest: the compiler reads them too); the names trainers
and the runtime use are re-exported here."""
from __future__ import annotations

from optgen.core import cache, catalog, manifest  # noqa: F401
from optgen.core.manifest import (ArtifactError, ArtifactWarning, VariantNotBuilt,  # noqa: F401
                                  rebuild_hint, runtime_files, verify_files, verify_manifest,
                                  warn_rebuild)
from optgen.core.tvm_runtime import torch_hidden  # noqa: F401
from .load import (Artifact, KernelInfo, StateInfo, Variant, _load_tvm_runtime,  # noqa: F401
                   bfloat16_tensor)

__all__ = ["Artifact", "ArtifactError", "ArtifactWarning", "KernelInfo", "StateInfo",
           "Variant", "VariantNotBuilt", "bfloat16_tensor", "rebuild_hint", "runtime_files",
           "torch_hidden", "verify_files", "verify_manifest", "warn_rebuild"]

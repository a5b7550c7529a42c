"""A built artifact loaded without the TVM compiler (load). Where artifacts live and the
key that names them, the spec catalog and the manifest checks are the kernel core's
(optgen.core.cache, catalog, manifest: the compiler reads them too); the names trainers
and the runtime use are re-exported here."""
from __future__ import annotations

from optgen.core import cache, catalog, manifest  # noqa: F401
from optgen.core.manifest import (ArtifactError, ArtifactWarning, rebuild_hint,  # noqa: F401
                                  runtime_files, verify_files, verify_manifest, warn_rebuild)
from optgen.core.tvm_runtime import torch_hidden  # noqa: F401
from .load import Artifact, KernelInfo, StateInfo, _load_tvm_runtime, bfloat16_tensor  # noqa: F401

__all__ = ["Artifact", "ArtifactError", "ArtifactWarning", "KernelInfo", "StateInfo",
           "bfloat16_tensor", "rebuild_hint", "runtime_files", "torch_hidden",
           "verify_files", "verify_manifest", "warn_rebuild"]

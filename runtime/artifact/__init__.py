"""A built artifact: where it lives and the key that names it (cache), the spec catalog
(catalog), its manifest checked before use (manifest), and the artifact loaded without
the TVM compiler (load). The names trainers and the runtime use are re-exported here."""
from __future__ import annotations

from . import cache, catalog, manifest
from .load import (Artifact, KernelInfo, StateInfo, _load_tvm_runtime,  # noqa: F401
                   bfloat16_tensor, torch_hidden)
from .manifest import (ArtifactError, ArtifactWarning, rebuild_hint,  # noqa: F401
                       runtime_files, verify_files, verify_manifest, warn_rebuild)

__all__ = ["Artifact", "ArtifactError", "ArtifactWarning", "KernelInfo", "StateInfo",
           "bfloat16_tensor", "cache", "catalog", "manifest", "rebuild_hint",
           "runtime_files", "torch_hidden", "verify_files", "verify_manifest",
           "warn_rebuild"]

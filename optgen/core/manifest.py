"""An artifact directory's manifest checked before anything uses it: its format and keys,
the optgen and TVM versions it was built with (they must be the running ones), and the
size and sha256 of every file the runtime reads (``runtime_files``). A failure is an
ArtifactError naming the file, what is wrong and the rebuild command (``rebuild_hint``).
Each variant's library is a folder of the artifact with a record of its own
(VARIANT_RECORD), checked the same way when it is first used (``load_variant``); one not
built yet is a VariantNotBuilt error naming it and the command that builds it.

Both sides read it: the compiler checks a cached artifact before reusing it, the
runtime before loading it. What they need to know of the artifact's target (device ABI,
TVM's runtime, the files its runtime reads) is the core's own registry's (targets.py).
Imports: cache, catalog, targets, _version; nothing that loads a kernel.
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import sys
import warnings
import json
from typing import Any, Callable, TypeVar

from ._version import __version__

from . import cache, catalog, targets
from .cache import FORMAT


class ArtifactError(RuntimeError):
    """An artifact directory is missing, incomplete, corrupted or from another build
    (format, optgen or TVM version). ``problem``: the message without the fix."""

    def __init__(self, message: str, problem: str | None = None):
        super().__init__(message)
        self.problem = problem or message


def _broken(where: str, what: str, path: str, manifest: Any = None,
            variant: str | None = None) -> ArtifactError:
    """The error for a broken artifact (or variant): the file, what is wrong, the rebuild
    command."""
    return ArtifactError(f"{where}: {what}; {rebuild_hint(path, manifest, variant)}",
                         f"{where}: {what}")


class VariantNotBuilt(ArtifactError):
    """A variant (a parameter dtype and flag values: its own library) of an artifact is
    not built, and is not built here: the artifact was loaded without a way to build
    (optgen.load, build=False, a read-only folder) or this machine cannot build it.
    ``variant``: its name; ``command``: the ``optgen build`` command that builds it."""

    def __init__(self, message: str, variant: str, command: str):
        super().__init__(message)
        self.variant, self.command = variant, command


class ArtifactWarning(RuntimeWarning):
    """An artifact failed verification and is being rebuilt (get_artifact, build)."""


# what Artifact and the optimizer read; a manifest without one of them is an ArtifactError
MANIFEST_KEYS = ("format", "name", "target", "key", "optgen_version", "tvm_version",
                 "files", "sources", "hyperparameters", "archs", "variants",
                 "default_variants", "requirements", "states", "kernels", "shape_flags",
                 "name_flags", "inputs", "statistics", "accepted",
                 "lazy_update_default", "reduction_buffer_size", "reduction_dtype")
VARIANT_RECORD = "variant.json"   # in a variant's folder: its library's record
VARIANT_KEYS = ("format", "key", "variant", "target", "library", "files", "sources",
                "binaries")


def runtime_files(manifest: dict) -> list[str]:
    """The files of an artifact the runtime reads, which its manifest's ``files``
    records (size, sha256): spec.py (checkpoints hash it), or for a variant's record
    (or the merged manifest ``load_variant`` returns) the variant's (``variant_files``).
    The wrapper module and the other sources are for people and are not verified."""
    return variant_files(manifest) if "variant" in manifest else ["spec.py"]


def variant_files(record: dict) -> list[str]:
    """The files of a variant the runtime reads: its library, the PTX and cubin files
    (cuda) and what the target's runtime backend reads besides (the OpenCL source)."""
    names = [record["library"]]
    names += [f for files in record["binaries"].values() for f in files.values()]
    names += targets.get(record["target"]).files(record)
    return list(dict.fromkeys(names))


def warn_rebuild(path: str, reason: str) -> None:
    """Report a broken artifact that is rebuilt, pointing at the first caller outside
    optgen (the trainer's get_artifact/create line)."""
    roots = tuple(os.path.dirname(m.__file__) + os.sep for m in
                  (sys.modules.get("optgen"), sys.modules.get("optgen.runtime")) if m)
    level, frame = 2, sys._getframe(1)   # level 1 is this function, 2 its caller
    while frame is not None and frame.f_code.co_filename.startswith(roots):
        level, frame = level + 1, frame.f_back
    warnings.warn(f"optgen: rebuilding the broken artifact {path}: {reason}", ArtifactWarning,
                  stacklevel=level)


def rebuild_hint(path: str, manifest: Any = None, variant: str | None = None) -> str:
    """How to rebuild the artifact at ``path`` (or only its ``variant``): the ``optgen
    build`` command."""
    cmd, note = build_command(path, manifest, variant)
    outside = bool(note) and os.path.dirname(path) != cache.cache_dir()   # not the catalog
    return f"rebuild it {'from its spec file ' if outside else ''}with `{cmd}`{note}"


def build_command(path: str, manifest: Any = None, variant: str | None = None
                  ) -> tuple[str, str]:
    """The ``optgen build`` command that (re)builds the artifact at ``path`` (or only its
    ``variant``), and a note: where the spec is for a spec outside the catalog, what
    get_artifact does for a cached one."""
    m = manifest if isinstance(manifest, dict) else {}
    folder = os.path.basename(path)
    in_cache = os.path.dirname(path) == cache.cache_dir()
    stem, _, target = re.sub(r"-[0-9a-f]{16}$", "", folder).rpartition("-")
    stem, _, base = (stem or folder).partition("+")
    spec_file = m.get("spec_file") if isinstance(m.get("spec_file"), str) else stem + ".py"
    target = m.get("target") if isinstance(m.get("target"), str) else target or "llvm"
    base = m.get("base") if isinstance(m.get("base"), str) else base
    archs = m.get("archs") if isinstance(m.get("archs"), list) else []
    name = spec_file[:-3] if spec_file.endswith(".py") else spec_file
    shipped = name in catalog.list_specs()
    cmd = (f"optgen build {name if shipped else spec_file} --target {target}"
           + (f" --base {base}" if base else "")
           + (f" --arch {','.join(map(str, archs))}" if archs else "")
           + ("" if in_cache else f" --out {os.path.dirname(path)}")
           + (f" --variant {variant}" if variant else ""))
    if in_cache:
        return cmd, " (optgen.get_artifact rebuilds it by itself)"
    if shipped:
        return cmd, ""
    copy = os.path.join(path, "spec.py")
    return cmd, (f" ({copy} is a copy of {spec_file})" if os.path.isfile(copy)
                 else " (the artifact holds no copy of the spec)")


def _folder_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _running_tvm() -> str | None:
    try:
        return cache.tvm_version()
    except importlib.metadata.PackageNotFoundError:
        return None


def verify_manifest(path: str, manifest: Any) -> None:
    """The manifest's format, keys and versions; ArtifactError naming what is wrong."""
    mpath = os.path.join(path, "manifest.json")

    def fail(what: str):
        raise _broken(mpath, what, path, manifest)
    if not isinstance(manifest, dict):
        fail(f"the manifest is a JSON {type(manifest).__name__}, not an object")
    if manifest.get("format") != FORMAT:
        fail(f"manifest format {manifest.get('format')!r}, this optgen reads format {FORMAT}")
    target = manifest.get("target")
    if isinstance(target, str) and target not in targets.FACTS:
        fail(f"built for target {target!r}, which this optgen does not know "
             f"(targets: {', '.join(targets.FACTS)})")
    backend = targets.get(target) if isinstance(target, str) else None
    missing = [k for k in MANIFEST_KEYS if k not in manifest]
    if missing:
        fail(f"the manifest lacks {', '.join(map(repr, missing))}")
    if manifest["optgen_version"] != __version__:
        fail(f"built by optgen {manifest['optgen_version']}, this is optgen {__version__}")
    tvm = _running_tvm()
    if tvm is None and (backend is None or backend.needs_tvm):
        raise ArtifactError(f"{path}: the kernels need TVM's runtime, and apache-tvm is not "
                            f"installed (pip install apache-tvm=={manifest['tvm_version']})")
    if tvm is not None and manifest["tvm_version"] != tvm:
        fail(f"built with TVM {manifest['tvm_version']}, this is TVM {tvm}")


def verify_files(path: str, manifest: dict) -> None:
    """Every file the runtime reads exists with the size and sha256 the manifest records
    (an artifact's, or a variant's merged one with ``path`` its folder). Hashes are
    computed once per process per file version (cache.file_record)."""
    variant = manifest.get("variant")
    variant = variant if isinstance(variant, str) else None
    mpath = os.path.join(path, VARIANT_RECORD if variant else "manifest.json")
    home = os.path.dirname(path) if variant else path       # the artifact's folder
    files = manifest["files"]
    try:
        names = runtime_files(manifest)
        if not isinstance(files, dict):
            raise TypeError("'files' is not an object")
    except (KeyError, TypeError, AttributeError) as e:
        raise _broken(mpath, f"malformed manifest ({type(e).__name__}: {e})", home,
                      manifest, variant) from None
    for name in names:
        rec = files.get(name)
        plain = isinstance(name, str) and name not in ("", ".", "..") and \
            os.path.basename(name) == name
        if not plain or not isinstance(rec, dict) or not isinstance(rec.get("size"), int) \
                or not isinstance(rec.get("sha256"), str):
            raise _broken(mpath, f"the manifest records no size and sha256 for {name!r}",
                          home, manifest, variant)
        fpath = os.path.join(path, name)
        try:
            got = cache.file_record(fpath)
        except FileNotFoundError:
            problem = "missing"
        except OSError as e:
            problem = f"unreadable ({e.strerror})"
        else:
            problem = None
            if got["size"] != rec["size"]:
                problem = (f"{got['size']} bytes, the manifest records {rec['size']} "
                           f"({'truncated' if got['size'] < rec['size'] else 'changed'})")
            elif got["sha256"] != rec["sha256"]:
                problem = (f"sha256 {got['sha256'][:16]}..., the manifest records "
                           f"{rec['sha256'][:16]}... (corrupted, or the manifest is from "
                           "another build)")
        if problem:
            raise _broken(fpath, problem, home, manifest, variant)


T = TypeVar("T")


def load_verified(path: str, make: Callable[[str, dict], T]) -> T:
    """``make(path, manifest)`` for the verified manifest of the artifact at ``path``
    (absolute): its format, keys, versions and the files the runtime reads; a manifest
    ``make`` cannot read (KeyError, TypeError, ...) is a malformed one. Runs no code of
    the artifact. The runtime makes an Artifact, the compiler reads the key."""
    for _ in range(2):
        before = _folder_id(path)
        try:
            return _load_once(path, make)
        except ArtifactError:
            # a builder replaced the folder while we read it (old manifest, new
            # library): read the new one; a broken folder that stays put is the error
            if _folder_id(path) == before:
                raise
    return _load_once(path, make)


def _load_once(path: str, make: Callable[[str, dict], T]) -> T:
    mpath = os.path.join(path, "manifest.json")
    if not os.path.isdir(path):
        raise ArtifactError(f"{path}: no such artifact directory")
    try:
        with open(mpath, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise _broken(mpath, "missing (not a complete optgen artifact)", path) from None
    except (OSError, ValueError) as e:
        raise _broken(mpath, f"unreadable manifest ({e})", path) from None
    verify_manifest(path, manifest)
    verify_files(path, manifest)
    try:
        return make(path, manifest)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise _broken(mpath, f"malformed manifest ({type(e).__name__}: {e})", path,
                      manifest) from None


# -- variants ---------------------------------------------------------------------------
def variant_text(manifest: dict, name: str) -> str:
    """A variant in words: ``f32-use_nesterov (float32 parameters, use_nesterov=True)``."""
    v = manifest["variants"][name]
    flags = ", ".join(f"{f}={on}" for f, on in v["flags"].items())
    return f"{name} ({v['param_dtype']} parameters{', ' + flags if flags else ''})"


def not_built(path: str, manifest: dict, name: str, why: str = "") -> VariantNotBuilt:
    """The error for variant ``name`` of the artifact at ``path`` that is not built (and
    ``why`` it is not built here), with the commands that build it, or every variant."""
    cmd, _ = build_command(path, manifest, name)
    every = cmd.replace(f"--variant {name}", "--all-variants")
    return VariantNotBuilt(
        f"{path}: the variant {variant_text(manifest, name)} of {manifest['name']} for "
        f"{manifest['target']} is not built{why}; build it with `{cmd}`, or every variant "
        f"with `{every}`", name, cmd)


def load_variant(path: str, manifest: dict, name: str) -> dict:
    """The manifest of the verified artifact at ``path`` (``manifest``) merged with the
    record of its variant ``name``, verified (format, key, its files' sizes and sha256):
    what the runtime loads the variant's library from, in the folder ``path/name``.
    VariantNotBuilt where that folder does not exist; ArtifactError where it is broken
    or from another build. Runs no code of the artifact."""
    if name not in manifest["variants"]:
        raise ArtifactError(f"{path}: {manifest['name']} has no variant {name!r}; its "
                            f"variants: {', '.join(manifest['variants'])}")
    folder = os.path.join(path, name)
    for _ in range(2):
        before = _folder_id(folder)
        try:
            return _variant_once(path, manifest, name)
        except VariantNotBuilt:
            raise
        except ArtifactError:       # replaced while we read it (as in load_verified)?
            if _folder_id(folder) == before:
                raise
    return _variant_once(path, manifest, name)


def _variant_once(path: str, manifest: dict, name: str) -> dict:
    folder = os.path.join(path, name)
    rpath = os.path.join(folder, VARIANT_RECORD)
    if not os.path.isdir(folder):
        raise not_built(path, manifest, name)

    def fail(what: str):
        raise _broken(rpath, what, path, manifest, name)
    try:
        with open(rpath, encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        fail("missing (not a complete variant)")
    except (OSError, ValueError) as e:
        fail(f"unreadable record ({e})")
    if not isinstance(record, dict):
        fail(f"the record is a JSON {type(record).__name__}, not an object")
    if record.get("format") != FORMAT:
        fail(f"record format {record.get('format')!r}, this optgen reads format {FORMAT}")
    device = targets.get(manifest["target"]).device_abi
    missing = [k for k in VARIANT_KEYS + (("device_kernels",) if device else ())
               if k not in record]
    if missing:
        fail(f"the record lacks {', '.join(map(repr, missing))}")
    if (record["key"], record["variant"], record["target"]) != \
            (manifest["key"], name, manifest["target"]):
        fail(f"it records {record['variant']!r} for {record['target']!r} with the key "
             f"{str(record['key'])[:16]}..., not {name!r} for {manifest['target']!r} with the "
             f"artifact's key {manifest['key'][:16]}... (from another build)")
    if not isinstance(record["sources"], dict):
        fail("malformed record ('sources' is not an object)")
    merged = {**manifest, **record, "sources": {**manifest["sources"], **record["sources"]}}
    verify_files(folder, merged)
    return merged

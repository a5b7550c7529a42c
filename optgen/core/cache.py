"""Where artifacts live and the content hash that names them.

Everything here is computable without importing TVM, so a trainer finds a cached
artifact without paying for the compiler.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import platform


FORMAT = 8   # 8: a folder per variant (its library and variant.json); 7: "state_format";
#              6: matrix rules ("statistics", "accepted", kernels' "refresh"); 5: "files"


def cache_dir() -> str:
    """``$OPTGEN_CACHE_DIR``, else ``$XDG_CACHE_HOME/optgen``, else ``~/.cache/optgen``."""
    if os.environ.get("OPTGEN_CACHE_DIR"):
        return os.path.abspath(os.environ["OPTGEN_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "optgen")


@functools.lru_cache(maxsize=1)
def machine() -> str:
    """The CPU a llvm artifact is built for: architecture plus a hash of its ISA flags."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = line.split(":", 1)[1].strip()
                    break
    except OSError:
        flags = platform.processor()
    return f"{platform.machine()}-{hashlib.sha256(flags.encode()).hexdigest()[:12]}"


# What decides what a kernel computes, by installed package: every .py and .j2 file of
# the package (None), or the files named (a name ending in "/": every .py and .j2 file of
# that sub-folder). The cache key hashes these and nothing else, so
# editing the CLI, the torch drop-ins or the runtime keeps the cached kernels, and editing
# any of these rebuilds them (tests/test_cache_key.py edits each in a copy of the tree).
KERNEL_SEMANTIC: dict[str, tuple[str, ...] | None] = {
    "optgen": ("blocks.py", "declarations.py", "dsl.py", "ir.py", "tracing.py", "transforms/"),
    "optgen.compiler": None,
    "optgen.core": ("_version.py", "dtypes.py", "formats/", "hyper.py", "quant.py",
                    "reference.py", "rounding.py", "scalar_expr.py", "targets.py", "views.py"),
    "optgen.templates": None,
}
# the modules of those packages that do not (tests/test_cache_key.py checks that every
# module is in one list or the other): the CLI, the errors' wording, where artifacts live,
# the catalog, the manifest checks
NOT_SEMANTIC: dict[str, tuple[str, ...]] = {
    "optgen": ("__init__.py", "benchmark.py", "checking.py", "cli.py", "cli_args.py",
               "commands.py", "errors.py", "torch/"),
    "optgen.core": ("__init__.py", "cache.py", "catalog.py", "filelocks.py", "manifest.py",
                    "progress.py", "tvm_runtime.py"),
}


def package_folders() -> dict[str, str]:
    """The installed folder of each package of KERNEL_SEMANTIC, found without importing
    it (optgen.compiler imports TVM's front end)."""
    out = {}
    for package in KERNEL_SEMANTIC:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(f"the package {package} is not installed")
        out[package] = list(spec.submodule_search_locations)[0]
    return out


def fingerprint(folders: dict[str, str]) -> str:
    """A hash of the KERNEL_SEMANTIC files, each package read from ``folders[package]``."""
    h = hashlib.sha256()
    for package, names in KERNEL_SEMANTIC.items():
        top = folders[package]
        for dirpath, dirnames, files in sorted(os.walk(top)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(files):
                rel = os.path.relpath(os.path.join(dirpath, name), top).replace(os.sep, "/")
                if _hashed(rel, names):
                    with open(os.path.join(dirpath, name), "rb") as f:
                        h.update(f"{package}/{rel}\0".encode() + f.read())
    return h.hexdigest()[:16]


def _hashed(rel: str, names: tuple[str, ...] | None) -> bool:
    code = rel.endswith((".py", ".j2"))
    if names is None:
        return code
    return rel in names or code and any(n.endswith("/") and rel.startswith(n) for n in names)


@functools.lru_cache(maxsize=1)
def compiler_fingerprint() -> str:
    """A hash of the code that decides what a kernel computes (KERNEL_SEMANTIC); the
    version is among it (_version.py)."""
    return fingerprint(package_folders())


@functools.lru_cache(maxsize=1)
def tvm_version() -> str:
    """The installed apache-tvm's version, read from its metadata (never ``import tvm``);
    PackageNotFoundError when it is not installed."""
    return importlib.metadata.version("apache-tvm")


_DIGESTS: dict[tuple, str] = {}   # (path, dev, inode, size, mtime, ctime) -> sha256


def file_record(path: str) -> dict:
    """``{"size", "sha256"}`` of a file. A file is hashed once per process while its
    inode, size, mtime and ctime stay the same, so verifying an artifact again (every
    ``get_artifact``) costs a ``stat``. OSError if it cannot be read."""
    st = os.stat(path)
    memo = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    digest = _DIGESTS.get(memo)
    if digest is None:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digest = _DIGESTS[memo] = h.hexdigest()
    return {"size": st.st_size, "sha256": digest}


_BASE_SPEC = re.compile(r"""base_spec\(\s*["'](\w+)["']""")


def _catalog_sources(spec_source: str, base: str | None) -> dict[str, str]:
    """Sources of the catalog specs a spec builds on (``base_spec("x")``, ``base=``)."""
    from . import catalog
    known = catalog.list_specs()
    todo = _BASE_SPEC.findall(spec_source) + ([base] if base else [])
    out: dict[str, str] = {}
    while todo:
        name = todo.pop()
        if name in out or name not in known:
            continue
        with open(known[name], encoding="utf-8") as f:
            out[name] = f.read()
        todo += _BASE_SPEC.findall(out[name])
    return out


def artifact_key(spec_source: str, target: str, base: str | None = None,
                 state_format: str | None = None, *, machine_bound: bool) -> str:
    """``target``: the target as its key (``TargetFacts.key``: with CUDA's
    architectures); ``state_format``: the request's key text (optgen/core/formats/), None
    for plain; ``machine_bound``: the code is for this machine's CPU (``TargetFacts``;
    optgen/core/targets.py, which the compiler's Target and the runtime's Backend read)."""
    parts = {"format": FORMAT, "spec": spec_source, "compiler": compiler_fingerprint(),
             "tvm": tvm_version(), "target": target, "base": base,
             "state_format": state_format,
             "bases": _catalog_sources(spec_source, base),
             "machine": machine() if machine_bound else None}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def artifact_dirname(spec_file: str, target: str, key: str | None,
                     base: str | None = None, state_format: str | None = None) -> str:
    stem = os.path.splitext(os.path.basename(spec_file))[0] + (f"+{base}" if base else "") \
        + (f"~{state_format}" if state_format else "")
    return f"{stem}-{target}" + (f"-{key[:16]}" if key else "")

"""Where artifacts live and the content hash that names them.

Everything here is computable without importing TVM, so a trainer finds a cached
artifact without paying for the compiler.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import re
import platform

from . import backends

FORMAT = 7   # 7: "state_format"; 6: matrix rules ("statistics", "accepted", kernels'
#              "refresh"); 5: "files", "base"


def target_key(target: str, archs: tuple[str, ...] | None = None) -> str:
    """The target as the artifact key sees it (CUDA artifacts differ by architectures:
    its runtime backend says how)."""
    return backends.get(target).target_key(archs)


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


# optgen/ modules that never decide what a kernel computes: editing them keeps the cache
NOT_COMPILER = frozenset({"__init__.py", "cli.py", "commands.py", "torch.py"})


@functools.lru_cache(maxsize=1)
def compiler_fingerprint() -> str:
    """optgen's version plus a hash of the code that decides what a kernel computes."""
    import optgen.templates
    from optgen import _version
    h = hashlib.sha256(_version.__version__.encode())
    top = os.path.dirname(_version.__file__)
    roots = [top, os.path.dirname(optgen.templates.__file__)]
    for root in roots:
        for dirpath, dirnames, files in sorted(os.walk(root)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(files):
                if dirpath == top and name in NOT_COMPILER:
                    continue
                if name.endswith((".py", ".j2")):
                    with open(os.path.join(dirpath, name), "rb") as f:
                        h.update(name.encode() + f.read())
    return h.hexdigest()[:16]


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
                 state_format: str | None = None) -> str:
    """``state_format``: the request's key text (optgen/core/formats.py), None for plain."""
    parts = {"format": FORMAT, "spec": spec_source, "compiler": compiler_fingerprint(),
             "tvm": tvm_version(), "target": target, "base": base,
             "state_format": state_format,
             "bases": _catalog_sources(spec_source, base),
             "machine": machine() if backends.get(target).machine_bound else None}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def artifact_dirname(spec_file: str, target: str, key: str | None,
                     base: str | None = None, state_format: str | None = None) -> str:
    stem = os.path.splitext(os.path.basename(spec_file))[0] + (f"+{base}" if base else "") \
        + (f"~{state_format}" if state_format else "")
    return f"{stem}-{target}" + (f"-{key[:16]}" if key else "")

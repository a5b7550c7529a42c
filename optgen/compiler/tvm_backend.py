"""Stage 6 — build with TVM. The only module of optgen that imports TVM.

Keeping every TVM name here means the next TVM rename touches one file.
"""
from __future__ import annotations

import importlib.metadata
import os

from ..errors import BuildError


def _tvm():
    import tvm  # noqa: PLC0415 — deliberately lazy: importing TVM takes seconds
    return tvm


def tvm_version() -> str:
    return importlib.metadata.version("apache-tvm")


def host_cpu() -> str:
    return _tvm().target.codegen.llvm_get_system_cpu()


def target_for(name: str):
    """A TVM Target for a target name. ``llvm`` is this machine's CPU."""
    tvm = _tvm()
    if name == "llvm":
        return tvm.target.Target({"kind": "llvm", "mcpu": host_cpu()})
    raise BuildError(f"target {name!r} is not supported yet (supported: llvm)")


def parse_tvmscript(text: str, symbol: str):
    """TVMScript text -> PrimFunc. A failure here is a bug in lowering or scheduling."""
    tvm = _tvm()
    try:
        return tvm.script.from_source(text)
    except Exception as e:
        raise BuildError(f"TVMScript for {symbol} did not parse: {e}\n{text}") from e


def build_library(funcs: dict, target, path: str) -> dict[str, str]:
    """Compile PrimFuncs into one shared library at ``path``; return target sources."""
    tvm = _tvm()
    try:
        ex = tvm.compile(tvm.IRModule(funcs), target=target)
        ex.export_library(path)
    except Exception as e:
        raise BuildError(f"TVM failed to build {sorted(funcs)}: {e}") from e
    sources = {}
    for kind in ("ll", "asm"):
        try:
            sources[kind] = ex.mod.inspect_source(kind)
        except Exception:  # a source kind the target does not have
            pass
    return sources

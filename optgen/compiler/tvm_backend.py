"""Stage 6 — build with TVM. The only module of optgen that imports TVM.

Keeping every TVM name here means the next TVM rename touches one file.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from ..errors import BuildError
from optgen.core.tvm_runtime import torch_hidden
from . import tvmscript_fast


def _tvm():
    with torch_hidden():   # (which TVM would import, for nothing optgen uses)
        import tvm  # noqa: PLC0415 — deliberately lazy: importing TVM takes seconds
    _register_c_fabs()
    return tvm


@functools.lru_cache(maxsize=1)
def _register_c_fabs() -> None:
    """TVM 0.27's C code generator has no rule for ``tirx.fabs`` (``abs`` in a spec:
    "Unresolved call ... tirx.fabs"); lower it to libm's fabsf/fabs on the C target."""
    from tvm.tirx import call_pure_extern
    from tvm.tirx.op import register_intrin_lowering

    def fabs(op):
        dtype = str(op.ty.dtype)
        if dtype in ("float32", "float64"):
            return call_pure_extern(op.ty, "fabsf" if dtype == "float32" else "fabs", *op.args)
        return op

    register_intrin_lowering("tirx.fabs", target="c", f=fabs, level=99)


def tvm_version() -> str:
    return importlib.metadata.version("apache-tvm")


def host_cpu() -> str:
    return _tvm().target.codegen.llvm_get_system_cpu()


def target_for(name: str, arch: str | None = None):
    """A TVM Target for a target name. ``llvm`` is this machine's CPU; device targets
    get it as their host. ``arch`` is the CUDA architecture TVM generates for (the
    source itself does not depend on it; nvcc compiles it for every --arch)."""
    tvm = _tvm()
    host = {"kind": "llvm", "mcpu": host_cpu()}
    if name == "llvm":
        return tvm.target.Target(host)
    if name == "c":
        return tvm.target.Target({"kind": "c"})
    if name == "cuda":
        return tvm.target.Target({"kind": "cuda", "arch": arch or "sm_80"}, host=host)
    if name == "rocm":
        return tvm.target.Target({"kind": "rocm", "mcpu": arch or "gfx942"}, host=host)
    if name in ("opencl", "metal", "webgpu"):
        return tvm.target.Target({"kind": name}, host=host)
    raise BuildError(f"target {name!r} is not supported")


def parse_tvmscript(text: str, symbol: str):
    """TVMScript text -> PrimFunc. optgen's own subset goes through the fast loader
    (tvmscript_fast: the same PrimFunc, about 10x faster, tested equal over the catalog);
    anything else through TVM's parser. A failure here is a bug in lowering or
    scheduling."""
    tvm = _tvm()
    with contextlib.suppress(tvmscript_fast.Unsupported):
        return tvmscript_fast.load_prim_func(tvm, text)
    try:
        return tvm.script.from_source(text)
    except Exception as e:
        raise BuildError(f"TVMScript for {symbol} did not parse: {e}\n{text}") from e


# gcc options of the C target: -fno-math-errno lets gcc vectorize sqrtf (tvm-notes §8);
# TVM's C code names float16 "half", which is C's _Float16 (IEEE binary16, gcc >= 12)
C_OPTIONS = ["-O3", "-fno-math-errno", "-Dhalf=_Float16"]


def build_library(funcs: dict, target, path: str,
                  then: Callable[[dict[str, str]], Any] | None = None
                  ) -> tuple[dict[str, str], Any]:
    """Compile PrimFuncs into one shared library at ``path``. Returns the sources by
    kind — "ll" (llvm), "c" (C), or the device source under the device module's
    kind ("cuda", "opencl", "metal", "webgpu") — and what ``then(sources)`` returned:
    it is called as soon as the sources exist, before the library is exported, so a
    caller can start work on them (nvcc) that overlaps the export.

    Device code is generated, not compiled, here: TVM embeds the source in the library
    (its CUDA fallback module, forced so builds do not depend on a GPU being present);
    native compilation (nvcc) is a separate stage."""
    tvm = _tvm()
    kind = target.kind.name
    _require_linker(tvm)
    options = C_OPTIONS if kind == "c" else None
    old = os.environ.get("TVM_COMPILE_FORCE_FALLBACK")
    os.environ["TVM_COMPILE_FORCE_FALLBACK"] = "1"
    # Device targets: no common-subexpression elimination, which would hoist a product
    # of shape variables (the grid extent, also a bounds check) into a host value passed
    # as an extra kernel parameter that the ABI cannot name; nvcc/the driver do CSE anyway.
    config = {"tirx.disable_cse_tir": True} if kind not in ("llvm", "c") else {}
    try:
        if kind == "llvm" and len(funcs) >= 2 * MIN_FUNCS_PER_PART and len(_cores()) > 1:
            sources, pending = _build_llvm_parts(tvm, funcs, target, path, then)
        else:
            with tvm.transform.PassContext(opt_level=3, config=config):
                ex = tvm.compile(tvm.IRModule(funcs), target=target)
            sources = _sources(ex, kind)
            pending = then(sources) if then is not None else None
            ex.export_library(path, options=options)
    except Exception as e:
        raise BuildError(f"TVM failed to build {sorted(funcs)} for {kind}: "
                         f"{str(e).strip().splitlines()[-1] if str(e).strip() else e}") from e
    finally:
        if old is None:
            os.environ.pop("TVM_COMPILE_FORCE_FALLBACK", None)
        else:
            os.environ["TVM_COMPILE_FORCE_FALLBACK"] = old
    return sources, pending


MIN_FUNCS_PER_PART = 4   # below this a thread's share is too small to pay for itself


def _cores() -> set[int]:
    return os.sched_getaffinity(0)


def _build_llvm_parts(tvm, funcs: dict, target, path: str, then) -> tuple[dict[str, str], Any]:
    """The llvm target's build on several cores: the functions split into one module
    per core, each compiled by TVM in its own thread (TVM releases the GIL in LLVM's
    code generation) to an object file, and the objects linked into one library.
    The objects share no strong symbols (only TVM's weak runtime hooks), so the library
    is what one module would give; adam's cold build spends about 0.65 s less."""
    names = sorted(funcs)      # contiguous parts: a kernel and its passes stay together
    count = min(len(_cores()), len(names) // MIN_FUNCS_PER_PART)
    parts = [names[len(names) * k // count:len(names) * (k + 1) // count]
             for k in range(count)]
    folder = os.path.dirname(path)

    def compile_part(k: int) -> str:
        with tvm.transform.PassContext(opt_level=3):
            ex = tvm.compile(tvm.IRModule({n: funcs[n] for n in parts[k]}), target=target)
        ex.mod.write_to_file(os.path.join(folder, f"part{k}.o"))
        return ex.mod.inspect_source("ll")

    with ThreadPoolExecutor(max_workers=len(parts)) as pool:
        texts = list(pool.map(compile_part, range(len(parts))))
    sources = {"ll": "\n".join(texts)}
    pending = then(sources) if then is not None else None
    objects = [os.path.join(folder, f"part{k}.o") for k in range(len(parts))]
    try:
        tvm.support.cc.create_shared(path, objects)
    finally:
        for o in objects:
            if os.path.exists(o):
                os.remove(o)
    return sources, pending


def _require_linker(tvm) -> None:
    """export_library links kernels.so with the system's C/C++ compiler; without one,
    TVM fails deep inside with "expected str, bytes or os.PathLike object, not NoneType"."""
    if tvm.support.cc.get_cc() is None:
        raise BuildError("no C/C++ compiler found to link kernels.so: TVM uses $CXX or $CC, "
                         "else the first of g++, gcc, clang++, clang, c++, cc on the PATH "
                         "(install one, e.g. apt install g++, or set CXX)")


def _sources(ex, kind: str) -> dict[str, str]:
    if kind in ("llvm", "c"):
        # LLVM IR only: the assembly would run code generation a second time (0.5 s of
        # adam's cold build); `objdump -d kernels.so` shows it
        return {sk: ex.mod.inspect_source(sk) for sk in (("ll",) if kind == "llvm" else ("c",))}
    return {m.kind: m.inspect_source("") for m in ex.mod.imports}

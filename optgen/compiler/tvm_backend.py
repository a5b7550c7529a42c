"""Stage 6 — build with TVM. The only module of optgen that imports TVM.

Keeping every TVM name here means the next TVM rename touches one file.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from ..errors import BuildError
from optgen.core.tvm_runtime import torch_hidden
from . import targets, tvmscript_fast


def _tvm():
    with torch_hidden():   # (torch, ml_dtypes: TVM imports them for nothing optgen uses)
        import tvm  # noqa: PLC0415 — deliberately lazy: importing TVM takes seconds
    _check_compiler(os.path.dirname(tvm.__file__))
    _register_c_fabs()
    return tvm


@functools.lru_cache(maxsize=1)
def _check_compiler(folder: str) -> None:
    """TVM imports without its compiler library (only its runtime is needed to run
    prebuilt kernels), and then fails deep inside a build; say so before."""
    libs = os.listdir(os.path.join(folder, "lib")) if os.path.isdir(
        os.path.join(folder, "lib")) else []
    if any(n.startswith("libtvm_runtime.") for n in libs) and \
            not any(n.startswith("libtvm_compiler.") for n in libs):
        raise BuildError(f"TVM's compiler library is not in {folder}/lib (this TVM runs "
                         "prebuilt kernels only): building needs the whole apache-tvm wheel, "
                         "or the prebuilt artifacts in the cache ($OPTGEN_CACHE_DIR)")


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


@functools.lru_cache(maxsize=None)
def host_has(feature: str) -> bool:
    """Whether LLVM generates code for this machine's CPU with ``feature`` (an LLVM
    target feature name, "avx512f"): intrinsics that need it compile here."""
    tvm = _tvm()
    return bool(tvm.target.codegen.target_has_features(feature, tvm.target.Target(host_target())))


def target_for(name: str, arch: str | None = None):
    """The TVM Target of a registered target (optgen.compiler.targets). ``arch`` is the
    architecture TVM generates for where the target takes one; a GPU target gets this
    machine's CPU as its host."""
    tvm = _tvm()
    tg = targets.get(name)
    host = host_target()
    if tg.family == "cpu":
        return tvm.target.Target(tg.tvm_target(arch, host))
    return tvm.target.Target(tg.tvm_target(arch, host), host=host)


def host_target() -> dict:
    """This machine's CPU as a TVM target dict."""
    return {"kind": "llvm", "mcpu": host_cpu()}


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
    native compilation (nvcc) is a separate stage; a target that links during TVM's
    build (rocm: ld.lld) does so through its ``tvm_callbacks``, next to ``path``."""
    tvm = _tvm()
    kind = target.kind.name
    tg = targets.get(kind)
    _require_linker(tvm)
    options = tg.export_options()
    old = os.environ.get("TVM_COMPILE_FORCE_FALLBACK")
    os.environ["TVM_COMPILE_FORCE_FALLBACK"] = "1"
    # Device targets: no common-subexpression elimination, which would hoist a product
    # of shape variables (the grid extent, also a bounds check) into a host value passed
    # as an extra kernel parameter that the ABI cannot name; nvcc/the driver do CSE anyway.
    config = {"tirx.disable_cse_tir": True} if tg.family == "gpu" else {}
    try:
        if tg.vector and len(funcs) >= 2 * MIN_FUNCS_PER_PART and len(_cores()) > 1:
            sources, pending = _build_llvm_parts(tvm, funcs, target, path, then)
        else:
            with tvm.transform.PassContext(opt_level=3, config=config), \
                    _callbacks(tg.tvm_callbacks(os.path.dirname(path))), _refusing(tg):
                ex = tvm.compile(tvm.IRModule(funcs), target=target)
            sources = _sources(ex, tg)
            pending = then(sources) if then is not None else None
            with torch_hidden():   # (export imports tvm.contrib.tvmjs, which imports both)
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


def _sources(ex, tg: targets.Target) -> dict[str, str]:
    """The generated source: the host module's (CPU; for llvm the LLVM IR only: the
    assembly would run code generation a second time, 0.5 s of adam's cold build;
    `objdump -d kernels.so` shows it), else the device module's."""
    mod = ex.mod if tg.family == "cpu" else ex.mod.imports[0]
    return {tg.source_key: mod.inspect_source(tg.source_format)}


_local = threading.local()


@contextlib.contextmanager
def _refusing(tg: targets.Target):
    """Refuse, with an exception naming why, the intrinsics the target's back end cannot
    compile here (Target.intrinsic_gaps): LLVM would abort the whole process on them."""
    gaps = tg.intrinsic_gaps()
    for op, _ in gaps:
        _guard_intrinsic(tg.name, op)
    saved = getattr(_local, "gaps", {})
    _local.gaps = gaps
    try:
        yield
    finally:
        _local.gaps = saved


@functools.lru_cache(maxsize=None)
def _guard_intrinsic(kind: str, op_name: str) -> None:
    """Put a check before TVM's lowering of ``op_name`` for target ``kind`` (once)."""
    tvm = _tvm()
    from tvm.tirx.op import register_intrin_lowering
    previous = tvm.ir.Op.get(op_name).get_attr(f"{kind}.FLowerIntrinsic")

    def lower(op):
        why = getattr(_local, "gaps", {}).get((op_name, str(op.ty.dtype)))
        if why is not None:
            raise BuildError(f"{op_name.split('.')[-1]} on {op.ty.dtype}: {why}")
        return previous(op) if previous is not None else op

    register_intrin_lowering(op_name, target=kind, f=lower, level=99)


@contextlib.contextmanager
def _callbacks(hooks: dict[str, Callable]):
    """Route the TVM global functions named in ``hooks`` to them on this thread for the
    duration (TVM calls them back on the thread that builds); other threads, and this
    one afterwards, get what was registered before (TVM's own, if any)."""
    if not hooks:
        yield
        return
    for name in hooks:
        _dispatcher(name)
    saved = getattr(_local, "hooks", {})
    _local.hooks = {**saved, **hooks}
    try:
        yield
    finally:
        _local.hooks = saved


@functools.lru_cache(maxsize=None)
def _dispatcher(name: str) -> None:
    """Register, once per name, a global function that calls this thread's hook."""
    import tvm_ffi
    with contextlib.suppress(ImportError):   # TVM's own hooks, registered on import
        import tvm.support.rocm  # noqa: F401
    previous = tvm_ffi.get_global_func(name, allow_missing=True)

    def dispatch(*args):
        hook = getattr(_local, "hooks", {}).get(name)
        if hook is not None:
            return hook(*args)
        if previous is None:
            raise RuntimeError(f"{name}: no hook registered for this build")
        return previous(*args)

    tvm_ffi.register_global_func(name, dispatch, override=True)

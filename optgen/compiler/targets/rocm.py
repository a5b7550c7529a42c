"""rocm: AMD GPUs. TVM's AMDGPU back end (LLVM) writes the kernels as LLVM IR and an
object file; ``ld.lld`` links that into the HSA code object (``kernels.<arch>.hsaco``).

The linker is ROCm's (``$ROCM_PATH``, /opt/rocm, next to hipcc), else pip's ``ziglang``
(``python -m ziglang ld.lld``: an LLD of TVM's LLVM major version, installable anywhere,
so CI builds and checks ROCm code objects without ROCm), else the system's ``ld.lld``.
optgen links through TVM's ``tvm_callback_rocm_link`` hook rather than a wrapper script
named ld.lld on PATH: the hook receives the object and returns the code object, so the
build also keeps that code object without changing the environment. Without ROCm's
device libraries (ocml), the kernels link only against LLVM's own intrinsics, which
the float32/float16 math lowers to (sqrt, exp, log, pow); float64 exp, log and pow have
no such lowering (LLVM would abort the process), so a kernel that needs them is a
BuildError saying so (``intrinsic_gaps``) unless ROCm's device libraries are installed.

The device ABI is read from the LLVM IR (kernel parameters, sorted by name as for CUDA;
launch bounds from ``amdgpu-flat-work-group-size``) and checked against the code
object's ELF symbol table: every kernel the IR defines must be a symbol there, with its
kernel descriptor ``<name>.kd``. Running needs a ROCm runtime, which optgen does not have.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from typing import Callable

from ...errors import BuildError
from .base import Signature, Target

ARCH = "gfx942"          # MI300 (CDNA3): the architecture TVM generates code for
_DEFINE = re.compile(r"^define [^@\n]*amdgpu_kernel void @(\w+)\((.*)\)[^()\n]*#(\d+) \{$", re.M)
_GROUP = re.compile(r'^attributes #(\d+) = \{([^\n]*)\}', re.M)
_BOUNDS = re.compile(r'"amdgpu-flat-work-group-size"="\d+,(\d+)"')
_LLVM_C = {"i64": "int64_t", "i32": "int", "float": "float", "double": "double", "half": "half"}


def rocm_path() -> str | None:
    """A ROCm installation: ``$ROCM_PATH``, /opt/rocm, or the one holding hipcc."""
    for p in (os.environ.get("ROCM_PATH"), "/opt/rocm"):
        if p and os.path.isdir(p):
            return p
    hipcc = shutil.which("hipcc")
    return os.path.dirname(os.path.dirname(hipcc)) if hipcc else None


def linker() -> list[str] | None:
    """The ld.lld command: ROCm's, else pip's ziglang, else the system's; None if none."""
    rp = rocm_path()
    if rp and os.path.isfile(os.path.join(rp, "llvm", "bin", "ld.lld")):
        return [os.path.join(rp, "llvm", "bin", "ld.lld")]
    if importlib.util.find_spec("ziglang") is not None:
        return [sys.executable, "-m", "ziglang", "ld.lld"]
    exe = shutil.which("ld.lld")
    return [exe] if exe else None


def toolchain() -> str | None:
    """Where the build's linker comes from, in words; None when there is none."""
    cmd = linker()
    if cmd is None:
        return None
    return "pip's ziglang (python -m ziglang ld.lld)" if "ziglang" in cmd else cmd[0]


def link(obj: bytes, out: str) -> bytes:
    """The relocatable AMDGPU object -> the code object at ``out`` (and its bytes)."""
    cmd = linker()
    if cmd is None:
        raise BuildError("target rocm needs ld.lld to link the code object: none found")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernels.o")
        with open(src, "wb") as f:
            f.write(bytes(obj))
        # --no-undefined: an unresolved device-library call fails here, by name
        r = subprocess.run([*cmd, "--no-undefined", "-shared", src, "-o", out],
                           capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"ld.lld failed to link the ROCm code object: "
                         f"{(r.stderr or r.stdout).strip()[-2000:]}")
    with open(out, "rb") as f:
        return f.read()


def elf_symbols(data: bytes) -> dict[str, int]:
    """Symbol name -> ELF symbol type (2 function, 1 object) of an AMDGPU ELF64 code
    object, from its .symtab and .dynsym; ValueError if it is not one."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    machine, = struct.unpack_from("<H", data, 18)
    if machine != 224:                                  # EM_AMDGPU
        raise ValueError(f"ELF machine {machine}, not AMDGPU (224)")
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum = struct.unpack_from("<HH", data, 58)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    out: dict[str, int] = {}
    for _, kind, _, _, off, size, link_, _, _, entsize in sections:
        if kind not in (2, 11) or not entsize:          # SHT_SYMTAB, SHT_DYNSYM
            continue
        stroff = sections[link_][4]
        for k in range(size // entsize):
            name, info = struct.unpack_from("<IB", data, off + k * entsize)
            end = data.index(b"\0", stroff + name)
            if name:
                out[data[stroff + name:end].decode()] = info & 0xF
    return out


def _param(text: str) -> tuple[str, str]:
    """An LLVM IR parameter as (C type, name) in the CUDA source's naming, which the ABI
    binds: a buffer's pointer ``%B_w`` is ``B_w_ptr``, a shape variable keeps its name."""
    kind, name = text.split()[0], text.split()[-1].lstrip("%")
    return ("void*", f"{name}_ptr") if kind == "ptr" else (_LLVM_C.get(kind, kind), name)


class ROCm(Target):
    def tvm_target(self, arch: str | None, host: dict) -> dict:
        return {"kind": "rocm", "mcpu": ARCH}

    def tvm_callbacks(self, folder: str) -> dict[str, Callable]:
        out = os.path.join(folder, f"kernels.{ARCH}.hsaco")
        hooks: dict[str, Callable] = {"tvm_callback_rocm_link": lambda obj: link(obj, out)}
        if rocm_path() is None:   # no device libraries: LLVM's intrinsics only
            hooks["tvm_callback_rocm_bitcode_path"] = lambda *_: []
        return hooks

    def intrinsic_gaps(self) -> dict[tuple[str, str], str]:
        if rocm_path() is not None:      # ROCm's device library (ocml) has them
            return {}
        why = ("LLVM's AMDGPU back end has no float64 exp, log or pow; ROCm's device "
               "library (ocml) provides them: install ROCm (ROCM_PATH or /opt/rocm) to "
               "build this spec's float64 kernels for rocm")
        return {(op, "float64"): why for op in ("tirx.exp", "tirx.log", "tirx.pow")}

    def math_name(self, fn: str, dtype: str) -> str:
        if rocm_path() is None:
            raise self.lacks(fn, "LLVM's AMDGPU back end has no such function; ROCm's "
                             "device library (ocml) has it: install ROCm (ROCM_PATH or "
                             "/opt/rocm)")
        return f"__ocml_{fn}_{'f32' if dtype == 'float32' else 'f64'}"

    def check_toolchain(self) -> None:
        if linker() is None:
            raise BuildError("target rocm needs a ROCm toolchain (ld.lld to link the code "
                             "object): none found in $ROCM_PATH, /opt/rocm, next to hipcc "
                             "on PATH, pip's ziglang or PATH (pip install ziglang)")

    def status(self) -> dict[str, str]:
        where = toolchain()
        return {"build": f"yes (LLVM AMDGPU, {ARCH})" if where else "no: no ROCm toolchain "
                "(set ROCM_PATH, install ROCm in /opt/rocm, or pip install ziglang)",
                "compile": f"yes (ld.lld: {where})" if where else "no: needs ld.lld",
                "run": "no: optgen's runtime has no ROCm launcher yet"}

    def detail(self, archs: tuple[str, ...], host: dict) -> dict:
        return {**super().detail(archs, host), "archs": [ARCH], "linker": toolchain()}

    def compile_native(self, sources: dict[str, str], archs: tuple[str, ...],
                       folder: str) -> dict[str, dict[str, str]]:
        name = f"kernels.{ARCH}.hsaco"      # linked during TVM's build (tvm_callbacks)
        if not os.path.isfile(os.path.join(folder, name)):
            raise BuildError(f"TVM's ROCm build wrote no code object ({name})")
        return {ARCH: {"hsaco": name}}

    def signatures(self, sources: dict[str, str], folder: str) -> dict[str, Signature]:
        """The IR's kernels, each checked against the code object's symbols."""
        text = sources[self.source_key]
        bounds = {g: b.group(1) for g, body in _GROUP.findall(text)
                  if (b := _BOUNDS.search(body))}
        with open(os.path.join(folder, f"kernels.{ARCH}.hsaco"), "rb") as f:
            symbols = elf_symbols(f.read())
        found: dict[str, Signature] = {}
        for name, plist, group in _DEFINE.findall(text):
            if symbols.get(name) != 2 or f"{name}.kd" not in symbols:
                raise BuildError(f"the ROCm code object has no kernel {name} (function "
                                 "symbol and kernel descriptor) that the IR defines")
            params = [_param(p) for p in plist.split(", ") if p.strip()]
            found[name] = (int(bounds[group]) if group in bounds else None, params)
        return found


TARGET = ROCm("rocm", ("float32", "float64"), ("float16",), True, "float64",
              "AMD GPUs through ROCm: LLVM AMDGPU code objects (ld.lld: ROCm's or pip's "
              "ziglang); built and checked, not run", source_format="")

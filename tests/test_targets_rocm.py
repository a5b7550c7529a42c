"""The rocm target, built for real without a GPU: TVM's AMDGPU back end and ld.lld (ROCm's,
or pip's ziglang from the ``test`` extra) give an HSA code object per artifact, whose ELF
symbol table must hold exactly the device kernels the manifest's ABI lists.

Checked here, independently of optgen's own ELF reader where it matters: the code
object's ELF header (AMDGPU machine, gfx942 in e_flags), each manifest kernel a function
symbol with its kernel descriptor ``<name>.kd``, no kernel the manifest does not list,
every parameter of every kernel bound; a code object missing a kernel the IR defines is a
BuildError; a float64 exp/log/pow without ROCm's device library is a BuildError naming
it (LLVM would abort the process); the artifact loads and says it cannot be run. Without
a linker (simulated)
the build is a BuildError naming what to install. Skipped, naming the cause, where no
ld.lld exists (pip install ziglang, or ROCm).
"""
from __future__ import annotations

import json
import os
import struct

import pytest

from optgen.compiler import pipeline, targets
from optgen.compiler.targets import rocm
from optgen.errors import BuildError
from optgen.runtime import Artifact, ArtifactError, catalog
from helpers import EXHAUSTIVE, matrix_specs

# every kind of pass (updates, lazy rows, whole-tensor, row and column reductions, the
# float64 pow): every catalog spec builds (checked by hand, 6.5 min here), these stand in
SPECS = ["adafactor", "adam", "ftrl", "lamb", "lazyadam", "sgd"]
assert set(SPECS) <= set(catalog.list_specs()) - matrix_specs()
# adafactor's 8 flag variants take ~100 s to link on a 2-core machine: lamb's whole-tensor
# reductions run by default, adafactor's factored ones with --exhaustive
SAMPLED_SPECS = [pytest.param(s, marks=EXHAUSTIVE) if s == "adafactor" else s for s in SPECS]
BASE = {"lars": "adam"}
EM_AMDGPU, GFX942 = 224, 0x04C        # ELF e_machine; EF_AMDGPU_MACH_AMDGCN_GFX942
# specs whose float64 kernels need exp, log or pow in float64 (ftrl: pow), which only
# ROCm's device library (ocml) provides: without it the build says so (golden)
NEEDS_OCML = {"ftrl"}

needs_lld = pytest.mark.skipif(
    rocm.linker() is None, reason="no ld.lld to link ROCm code objects: pip install ziglang "
    "(in optgen's test extra) or install ROCm (ROCM_PATH, /opt/rocm)")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("rocm")
    cache: dict[str, str] = {}

    def get(name: str) -> str:
        """The folder of the spec's default variant (float32, default flags: its library)."""
        if name not in cache:
            path = pipeline.build(catalog.resolve(name), "rocm", out=str(out),
                                  base=BASE.get(name)).path
            with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
                cache[name] = os.path.join(path, json.load(f)["default_variants"][0])
        return cache[name]
    return get


def _manifest(path: str) -> dict:
    """A variant's manifest: the artifact's with the variant's record merged in."""
    with open(os.path.join(path, "..", "manifest.json"), encoding="utf-8") as f:
        m = json.load(f)
    with open(os.path.join(path, "variant.json"), encoding="utf-8") as f:
        return {**m, **json.load(f)}


@needs_lld
@pytest.mark.parametrize("spec", SAMPLED_SPECS)
def test_code_object_symbols_match_the_manifest(spec, built):
    if spec in NEEDS_OCML and rocm.rocm_path() is None:
        with pytest.raises(BuildError, match=r"pow on float64: .*no float64 exp, log or "
                                             r"pow; ROCm's device library \(ocml\)"):
            built(spec)
        return
    path = built(spec)
    m = _manifest(path)
    assert m["binaries"] == {"gfx942": {"hsaco": "kernels.gfx942.hsaco"}}
    assert m["sources"]["rocm"] == "kernels.ll" and "kernels.gfx942.hsaco" in m["files"]
    with open(os.path.join(path, "kernels.gfx942.hsaco"), "rb") as f:
        data = f.read()
    machine, = struct.unpack_from("<H", data, 18)
    flags, = struct.unpack_from("<I", data, 48)
    assert data[:4] == b"\x7fELF" and machine == EM_AMDGPU and flags & 0xFF == GFX942
    symbols = rocm.elf_symbols(data)
    listed = {k["name"] for d in m["device_kernels"].values() for k in d["kernels"]}
    functions = {n for n, kind in symbols.items() if kind == 2 and "_kernel" in n}
    assert functions == listed, (f"code object only: {sorted(functions - listed)}; "
                                 f"manifest only: {sorted(listed - functions)}")
    assert all(symbols.get(f"{n}.kd") == 1 for n in listed), "a kernel without descriptor"
    for n in listed:          # (and the names really are in the file's string table)
        assert b"\0" + n.encode() + b"\0" in data
    for d in m["device_kernels"].values():
        for k in d["kernels"]:
            kinds = [next(iter(p)) for p in k["params"]]
            assert set(kinds) <= {"buffer", "scalars", "dim"} and "buffer" in kinds, k


@needs_lld
def test_code_object_missing_a_kernel_is_a_build_error(built, tmp_path):
    path = built("sgd")
    with open(os.path.join(path, "kernels.ll"), encoding="utf-8") as f:
        ir = f.read()
    first = next(ln for ln in ir.splitlines() if "amdgpu_kernel" in ln)
    renamed = ir + "\n" + first.replace("_kernel(", "_kernel_extra(", 1) + "\n"
    with pytest.raises(BuildError, match=r"no kernel sgd_\w+_kernel_extra"):
        rocm.TARGET.signatures({"rocm": renamed}, path)
    found = rocm.TARGET.signatures({"rocm": ir}, path)
    assert found and all(b == 256 for b, _ in found.values())


@needs_lld
def test_elf_reader_refuses_a_host_library(built):
    with open(os.path.join(built("sgd"), "kernels.so"), "rb") as f:
        with pytest.raises(ValueError, match="not AMDGPU"):
            rocm.elf_symbols(f.read())


@needs_lld
def test_rocm_artifact_loads_and_says_it_cannot_run(built):
    art = Artifact.load(os.path.dirname(built("adam")))   # (built: its variant's folder)
    with pytest.raises(ArtifactError, match=r"cannot run rocm kernels; the artifact has "
                                            r"their source only"):
        art.function(art.kernels[0].symbol)


def test_without_a_linker_the_build_names_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(rocm, "linker", lambda: None)
    assert targets.rocm_path() is None
    with pytest.raises(BuildError) as err:
        pipeline.build(catalog.resolve("adam"), "rocm", out=str(tmp_path))
    assert "ROCm toolchain" in str(err.value) and "ROCM_PATH" in str(err.value)
    assert "pip install ziglang" in str(err.value)
    assert not os.listdir(tmp_path), "a failed rocm build left files behind"

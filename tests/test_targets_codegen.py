"""What optgen generates for the GPU targets, checked for every catalog spec, without a GPU.

* cuda: nvcc and ptxas built PTX and a cubin for sm_80 and sm_90; the device ABI in the
  manifest (``device_kernels``) is the one the PTX and the cubin really have (entry names,
  parameter count and PTX parameter types); the golden structure of ``kernels.cu``: one
  device kernel per update pass, two per whole-tensor reduction, one per row or column
  reduction; warp shuffles in exactly the block reductions; no kernel parameter that the
  launcher cannot bind (the stray ``*_ptr`` accumulator pitfall, tvm-notes §2d); every
  kernel ``__launch_bounds__(256)``.
* webgpu: every WGSL module validates in wgpu (naga, in a child process: see WGSL_CHILD);
  a broken module is rejected.
* metal: one ``kernel void`` per device kernel, no doubles, threadgroup barriers in the
  block reductions, float32 accumulators.
* rocm: without a toolchain, a BuildError (and a one-line CLI error) naming what is missing.

Each spec is built once per target per session (``get_artifact`` into the session cache,
memoized here), and the checks read a few of its variants' libraries that hold every
parameter dtype and every flag value (helpers.covering_variants; every variant with
--exhaustive). Nothing here is timed.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from collections import Counter

import pytest

import optgen
from optgen.compiler import pipeline, targets
from optgen.errors import BuildError
from optgen.core import catalog
from helpers import EXHAUSTIVE, covering_variants, exhaustive, family_sampled, matrix_specs, \
    variant_views

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# matrix rules (THOR, Muon) build for llvm only: test_matrix_specs_build_for_llvm_only
SPECS = sorted(set(catalog.list_specs()) - matrix_specs())
# adafactor builds 8 flag variants per target (the costliest by far: ~60 s of the run on
# a 2-core machine); torch_adafactor keeps its factored row/column reductions in the
# default run, --exhaustive adds adafactor and came (the same reductions) themselves
SAMPLED_SPECS = [pytest.param(s, marks=EXHAUSTIVE) if s in ("adafactor", "came") else
                 pytest.param(s, marks=family_sampled(s, "targets_codegen", keep=0))
                 for s in SPECS]   # (the families: --exhaustive; a CUDA build is ~15 s)
BASE = {"lars": "adam"}                 # wrapper specs need a base optimizer
ARCHS = ("sm_80", "sm_90")              # the cuda target's default --arch
THREADS = 256                           # threads per block of every GPU kernel
# Which reductions each spec's passes make (golden): "whole" = whole-tensor (two kernels,
# both block all-reduces), "rows" = along the innermost axis (a block per output, block
# all-reduce), "cols" = along an outer axis (a thread per output, serial, no shuffles).
REDUCTIONS = {"adafactor": {"whole", "rows", "cols"}, "lamb": {"whole"}, "lars": {"whole"},
              "torch_adafactor": {"whole", "rows", "cols"}, "cautious_adamw": {"whole"},
              "mars_adamw": {"whole"}, "dadapt_adam": {"whole"}, "prodigy": {"whole"},
              "came": {"whole", "rows", "cols"}}

needs_nvcc = pytest.mark.skipif(targets.nvcc() is None,
                                reason="the cuda target needs nvcc on PATH to build")


# -- artifacts, built once per (spec, target) per session --------------------------------
_BUILT: dict[tuple[str, str], list[tuple[str, dict]] | BaseException] = {}


@pytest.fixture
def artifact(request):
    """``artifact(spec, target)``: (variant folder, its manifest with its own kernels:
    helpers.variant_views) of the variants checked (a covering set; every one with
    --exhaustive) of a catalog spec for a target; a failed build is remembered and
    re-raised, not rebuilt by every test."""
    every = exhaustive(request.config)

    def get(spec: str, target: str) -> list[tuple[str, dict]]:
        key = (spec, target)
        if key not in _BUILT:
            try:
                art = optgen.get_artifact(spec, target, base=BASE.get(spec))
                names = list(art.variants) if every else covering_variants(art)
                _BUILT[key] = variant_views(art, names)
            except Exception as e:  # noqa: BLE001 - re-raised below, in every test needing it
                _BUILT[key] = e
        got = _BUILT[key]
        if isinstance(got, BaseException):
            raise got
        return got
    return get


def read(path: str, name: str, mode: str = "r"):
    encoding = None if "b" in mode else "utf-8"
    with open(os.path.join(path, name), mode, encoding=encoding) as f:
        return f.read()


def launches(manifest: dict) -> list[dict]:
    """Every launch of every kernel variant, the row-sparse (lazy) one and the
    multi-tensor ones (issue 31: an update launch each, under its ``mt_symbol``) included."""
    out = []
    for k in manifest["kernels"]:
        out += k["launches"]
        out += [{**ln, "symbol": ln["mt_symbol"]} for ln in k["launches"] if "mt_symbol" in ln]
        if k["lazy"] is not None:
            out.append(k["lazy"])
    return out


def reduction_shape(ln: dict) -> str:
    """How schedule_gpu.schedule lays out a reduce launch: "whole", "rows" or "cols"."""
    if not ln["out_axes"]:
        return "whole"
    space = "" if ln["view"] == "flat" else ln["space"]
    reduced = ln["reduced"] if ln["view"] == "3d" else ""
    return "rows" if space.endswith("c") and "c" in reduced else "cols"


def expected_kernels(ln: dict) -> list[str]:
    """The device kernels TVM must make of one launch: <symbol>_kernel[, _kernel_1]."""
    n = 2 if ln["kind"] == "reduce" and reduction_shape(ln) == "whole" else 1
    return [f"{ln['symbol']}_kernel" + (f"_{j}" if j else "") for j in range(n)]


def block_reduction_kernels(manifest: dict) -> set[str]:
    """Device kernels that the schedule makes block all-reduces."""
    return {name for ln in launches(manifest) if ln["kind"] == "reduce"
            and reduction_shape(ln) in ("whole", "rows") for name in expected_kernels(ln)}


def column_reduction_kernels(manifest: dict) -> set[str]:
    return {name for ln in launches(manifest) if ln["kind"] == "reduce"
            and reduction_shape(ln) == "cols" for name in expected_kernels(ln)}


def device_kernel_names(manifest: dict) -> list[str]:
    return [k["name"] for dk in manifest["device_kernels"].values() for k in dk["kernels"]]


def check_device_kernels_cover_launches(manifest: dict) -> None:
    """device_kernels has one entry per launch symbol, with the kernels the schedule makes."""
    lns = launches(manifest)
    assert sorted(manifest["device_kernels"]) == sorted(ln["symbol"] for ln in lns)
    for ln in lns:
        got = [k["name"] for k in manifest["device_kernels"][ln["symbol"]]["kernels"]]
        assert got == expected_kernels(ln), (ln["symbol"], ln["kind"], got)
        for k in manifest["device_kernels"][ln["symbol"]]["kernels"]:
            assert k["grid"]["threads"] == THREADS, k


# -- CUDA: parsing kernels.cu, PTX and the cubin ----------------------------------------
_CU_KERNEL = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\((\d+)\) )?(\w+)'
                        r'\(([^)]*)\)\s*([;{])')


def cu_kernels(text: str) -> tuple[dict, dict]:
    """kernels.cu -> (declarations, definitions): name -> {"bounds", "params", "body"}; a
    param is (C type, name). Each definition's body runs to the next kernel."""
    decls, defs = {}, {}
    matches = list(_CU_KERNEL.finditer(text))
    assert len(matches) == text.count("__global__"), "a __global__ the parser does not read"
    for i, m in enumerate(matches):
        params = []
        for raw in (p.strip() for p in m.group(3).split(",") if p.strip()):
            params.append((" ".join(raw.split()[:-1]), raw.split()[-1].lstrip("*")))
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        entry = {"bounds": m.group(1), "params": params, "body": text[m.end():end]}
        table = decls if m.group(4) == ";" else defs
        assert m.group(2) not in table, f"{m.group(2)} is declared or defined twice"
        table[m.group(2)] = entry
    return decls, defs


_PTX_ENTRY = re.compile(r"^[ \t]*((?:\.\w+[ \t]+)*)\.entry[ \t]+(\w+)[ \t]*\(([^)]*)\)", re.M)


def ptx_entries(text: str) -> dict[str, dict]:
    """PTX -> entry name -> {"directives": linkage before .entry, "types": [param type]}."""
    out = {}
    for m in _PTX_ENTRY.finditer(text):
        types = []
        for p in (p.strip() for p in m.group(3).split(",") if p.strip()):
            pm = re.match(r"\.param\s+(?:\.align\s+\d+\s+)?(\.\w+)", p)
            assert pm, f"unreadable PTX parameter {p!r} of {m.group(2)}"
            types.append(pm.group(1))
        assert m.group(2) not in out, f"PTX entry {m.group(2)} twice"
        out[m.group(2)] = {"directives": m.group(1).split(), "types": types}
    assert len(out) == len(re.findall(r"\.entry\s", text)), "a .entry the parser does not read"
    return out


def ptx_types_for(ctype: str) -> set[str]:
    """The PTX parameter types nvcc may give a kernel parameter of this C type (64-bit
    pointers are .u64; nvcc writes .u64 for int64_t as well)."""
    c = ctype.replace("__restrict__", "").replace("const", "").strip()
    if c.endswith("*"):
        return {".u64", ".b64"}
    table = {"int64_t": {".u64", ".s64", ".b64"}, "uint64_t": {".u64", ".b64"},
             "long long": {".u64", ".s64", ".b64"}, "int": {".u32", ".s32", ".b32"},
             "int32_t": {".u32", ".s32", ".b32"}, "uint32_t": {".u32", ".b32"},
             "unsigned int": {".u32", ".b32"}, "float": {".f32", ".b32"},
             "double": {".f64", ".b64"}}
    assert c in table, f"no PTX type known for C type {ctype!r}: extend ptx_types_for"
    return table[c]


def cubin_entries(data: bytes) -> tuple[set[str], int]:
    """The kernel entry symbols of a cubin (64-bit ELF: STT_FUNC, STB_GLOBAL,
    STO_CUDA_ENTRY) and its e_flags, read from the symbol table without CUDA tools."""
    assert data[:4] == b"\x7fELF" and data[4] == 2, "not a 64-bit ELF"
    assert data[7] == 0x41, f"ELF OS/ABI {data[7]:#x} is not ELFOSABI_CUDA (0x41)"
    end = "<" if data[5] == 1 else ">"
    (e_flags,) = struct.unpack_from(end + "I", data, 0x30)
    (shoff,) = struct.unpack_from(end + "Q", data, 0x28)
    shentsize, shnum = struct.unpack_from(end + "HH", data, 0x3A)
    sections = [struct.unpack_from(end + "IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    names = set()
    for _name, sh_type, _fl, _addr, off, size, link, _info, _al, entsize in sections:
        if sh_type != 2:    # SHT_SYMTAB
            continue
        stroff = sections[link][4]
        for j in range(size // entsize):
            st_name, st_info, st_other = struct.unpack_from(end + "IBB", data, off + j * entsize)
            if st_info & 0xF == 2 and st_info >> 4 == 1 and st_other & 0x10:
                start = stroff + st_name
                names.add(data[start:data.index(b"\0", start)].decode())
    return names, e_flags


def cuda_tool(name: str) -> str | None:
    """A CUDA binary tool on PATH, or in the toolkit of nvcc (or CUDA_HOME/CUDA_PATH)."""
    found = shutil.which(name)
    if found:
        return found
    dirs = [os.path.join(os.environ[v], "bin") for v in ("CUDA_HOME", "CUDA_PATH")
            if os.environ.get(v)]
    nv = targets.nvcc()
    if nv:
        dirs.append(os.path.dirname(os.path.realpath(nv)))
        with contextlib.suppress(OSError):  # nvcc may be a wrapper script that execs
            with open(nv, encoding="utf-8", errors="replace") as f:   # the toolkit's nvcc
                dirs += [os.path.dirname(p) for p in re.findall(r"(/\S+)/nvcc\b", f.read(4096))]
    for d in dirs:
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


# -- CUDA tests -------------------------------------------------------------------------
@needs_nvcc
@pytest.mark.parametrize("spec", SAMPLED_SPECS)
def test_cuda_builds_ptx_and_cubin_for_sm80_and_sm90(spec, artifact):
    for path, m in artifact(spec, "cuda"):
        assert m["binaries"] == {a: {"ptx": f"kernels.{a}.ptx", "cubin": f"kernels.{a}.cubin"}
                                 for a in ARCHS}
        assert m["target_detail"]["archs"] == list(ARCHS)
        assert m["target_detail"]["threads_per_block"] == THREADS
        assert os.path.getsize(os.path.join(path, "kernels.cu")) > 0
        for arch in ARCHS:
            ptx = read(path, f"kernels.{arch}.ptx")
            assert ptx.strip(), f"{arch}: empty PTX"
            assert re.search(rf"^\.target {arch}\b", ptx, re.M), f"PTX is not for {arch}"
            cubin = read(path, f"kernels.{arch}.cubin", "rb")
            assert len(cubin) > 0, f"{arch}: empty cubin"
            _, e_flags = cubin_entries(cubin)
            sm = int(arch[3:])   # the SM number sits in e_flags: bits 0-7 (older ABI) or 8-15
            assert sm in (e_flags & 0xFF, (e_flags >> 8) & 0xFF), \
                f"{arch}: cubin e_flags {e_flags:#x} name another architecture"


@needs_nvcc
@pytest.mark.parametrize("spec", SAMPLED_SPECS)
def test_cuda_manifest_abi_matches_ptx(spec, artifact):
    for path, m in artifact(spec, "cuda"):
        check_device_kernels_cover_launches(m)
        expected = {k["name"]: k["params"] for dk in m["device_kernels"].values()
                    for k in dk["kernels"]}
        for arch in ARCHS:
            entries = ptx_entries(read(path, f"kernels.{arch}.ptx"))
            assert sorted(entries) == sorted(expected), (
                f"{arch}: PTX entries not in the manifest: "
                f"{sorted(set(entries) - set(expected))}; "
                f"manifest kernels not in the PTX: {sorted(set(expected) - set(entries))}")
            for name, params in expected.items():
                e = entries[name]
                assert ".visible" in e["directives"], f"{arch}: {name} is not .visible"
                assert len(e["types"]) == len(params), (
                    f"{arch}: {name} has {len(e['types'])} PTX params, the manifest {len(params)}")
                for j, (ptype, p) in enumerate(zip(e["types"], params)):
                    assert ptype in ptx_types_for(p["type"]), (
                        f"{arch}: {name} param {j} {p} is {ptype} in the PTX")


@needs_nvcc
@pytest.mark.parametrize("spec", SAMPLED_SPECS)
def test_cuda_cubin_has_exactly_the_manifest_kernels(spec, artifact):
    for path, m in artifact(spec, "cuda"):
        expected = set(device_kernel_names(m))
        for arch in ARCHS:
            names, _ = cubin_entries(read(path, f"kernels.{arch}.cubin", "rb"))
            assert names == expected, (f"{arch}: cubin extra {sorted(names - expected)}, "
                                       f"missing {sorted(expected - names)}")


@needs_nvcc
def test_cuda_cubin_symbols_by_cuda_tools(artifact):
    """The cubin check above, through NVIDIA's own tools where the toolkit has them."""
    cuobjdump, nvdisasm = cuda_tool("cuobjdump"), cuda_tool("nvdisasm")
    if cuobjdump is None and nvdisasm is None:
        pytest.skip("neither cuobjdump nor nvdisasm is installed (the ELF symbol-table "
                    "check of every cubin still ran)")
    if cuobjdump is not None:
        cmd, entry = [cuobjdump, "-symbols"], re.compile(r"STO_ENTRY\s+(\w+)\s*$")
    else:
        cmd, entry = [nvdisasm], re.compile(r'\.other\s+(\w+)\s*,\s*@"STO_CUDA_ENTRY')
    for spec in SPECS:
        for path, m in artifact(spec, "cuda"):
            expected = set(device_kernel_names(m))
            for arch in ARCHS:
                out = subprocess.run([*cmd, os.path.join(path, f"kernels.{arch}.cubin")],
                                     capture_output=True, text=True, timeout=300)
                assert out.returncode == 0, f"{spec} {arch}: {out.stderr}"
                listed = {mm.group(1) for line in out.stdout.splitlines()
                          if (mm := entry.search(line))}
                words = set(re.findall(r"\w+", out.stdout))
                assert expected <= words, f"{spec} {arch}: not listed {sorted(expected - words)}"
                assert not listed or listed == expected, (
                    f"{spec} {arch}: entries {sorted(listed - expected)} are not in the manifest")


@needs_nvcc
@pytest.mark.parametrize("spec", SAMPLED_SPECS)
def test_cuda_kernels_per_launch_and_launch_bounds(spec, artifact):
    """Golden structure: an update launch (every launch of an elementwise spec) is one
    kernel <symbol>_kernel and no <symbol>_kernel_1; a whole-tensor reduction exactly two;
    a row or column reduction one. Every kernel has __launch_bounds__(256)."""
    for path, m in artifact(spec, "cuda"):
        decls, defs = cu_kernels(read(path, "kernels.cu"))
        names = device_kernel_names(m)
        assert sorted(defs) == sorted(names), (
            f"kernels.cu defines {sorted(set(defs) - set(names))} beyond, "
            f"{sorted(set(names) - set(defs))} short of the manifest")
        for what, table in (("declaration", decls), ("definition", defs)):
            for name, d in table.items():
                assert d["bounds"] == str(THREADS), \
                    f"{what} of {name}: __launch_bounds__({d['bounds']})"
        for ln in launches(m):
            want = expected_kernels(ln)
            assert [n for n in want if n in defs] == want, (ln["symbol"], want)
            extra = f"{ln['symbol']}_kernel_{len(want)}"
            assert extra not in defs, f"{ln['kind']} launch {ln['symbol']} also made {extra}"
        if not any(ln["kind"] == "reduce" for ln in launches(m)):   # one kernel per launch
            assert len(defs) == len(launches(m)), "an elementwise spec made more kernels"


@needs_nvcc
@pytest.mark.parametrize("spec", SAMPLED_SPECS)
def test_cuda_block_reductions_use_warp_shuffles(spec, artifact):
    """Whole-tensor reductions (both kernels) and row reductions are block all-reduces:
    warp shuffles and __syncthreads; column reductions and updates are not."""
    shapes = set()
    for path, m in artifact(spec, "cuda"):
        _, defs = cu_kernels(read(path, "kernels.cu"))
        shapes |= {reduction_shape(ln) for ln in launches(m) if ln["kind"] == "reduce"}
        block = block_reduction_kernels(m)
        for name, d in defs.items():
            body = d["body"]
            if name in block:
                assert "__shfl_down_sync" in body, f"{name}: block reduction without shuffles"
                assert "__syncthreads()" in body, f"{name}: block reduction without a barrier"
            else:
                assert "__shfl_down_sync" not in body, f"{name}: unexpected warp shuffles"
        for name in column_reduction_kernels(m):   # serial per thread, in a register
            assert "__syncthreads" not in defs[name]["body"], name
    assert shapes == REDUCTIONS.get(spec, set()), \
        f"{spec} reductions {sorted(shapes)}; update REDUCTIONS if the spec changed"


@needs_nvcc
@pytest.mark.parametrize("spec", SAMPLED_SPECS)
def test_cuda_kernel_params_are_buffers_scalars_or_dims(spec, artifact):
    """No parameter the launcher cannot bind (a stray global accumulator such as
    ``in_thread_S_ptr``, tvm-notes §2d), and the manifest's params are the .cu's."""
    for path, m in artifact(spec, "cuda"):
        _, defs = cu_kernels(read(path, "kernels.cu"))
        for sym, dk in m["device_kernels"].items():
            allowed = {f"B_{b}_ptr" for b in dk["buffers"]} | {"S_ptr"} | set(dk["dims"])
            for k in dk["kernels"]:
                params = defs[k["name"]]["params"]
                stray = [f"{t} {n}" for t, n in params if n not in allowed]
                assert not stray, f"{k['name']}: parameters {stray} are not buffers, S or dims"
                assert len(params) == len({n for _, n in params}), k["name"]
                want = [(p["type"], f"B_{p['buffer']}_ptr" if "buffer" in p else
                         "S_ptr" if p.get("scalars") else p["dim"]) for p in k["params"]]
                assert params == want, k["name"]
                scalars = [p for p in k["params"] if p.get("scalars")]
                assert len(scalars) <= 1, k["name"]


# -- WebGPU ------------------------------------------------------------------------------
def wgsl_modules(text: str) -> dict[str, str]:
    """kernels.wgsl -> kernel name -> its module: the section after a `// Function: name`
    line that has the @compute entry point (each name heads two sections)."""
    parts = re.split(r"^// Function: (\w+)[ \t]*$", text, flags=re.M)
    assert not parts[0].strip(), "text before the first // Function: line"
    out: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if "@compute" in body:
            assert name not in out, f"two @compute modules for {name}"
            out[name] = body
    return out


# wgpu runs in a child process: its software adapter (Mesa's lavapipe) loads the system's
# libLLVM into the process it runs in, and an LLVM loaded that way binds in place of the
# copy inside Oclgrind (the OpenCL simulator of test_targets_run), whose next program build
# then crashes the whole test run (seen: libLLVM-15 under Oclgrind 19.10, SIGSEGV).
WGSL_CHILD = r"""
import json, sys
def reply(obj):
    print("@@" + json.dumps(obj), flush=True)
try:
    import wgpu
except ImportError:
    reply({"skip": "wgpu is not installed (pip install wgpu): the WGSL cannot be validated"})
    sys.exit()
adapter, why = None, ""
for kwargs in ({"force_fallback_adapter": True}, {}):
    try:
        adapter = wgpu.gpu.request_adapter_sync(**kwargs)
    except Exception as e:  # no backend or driver on this machine
        why = f"{type(e).__name__}: {e}"
    if adapter is not None:
        break
if adapter is None:
    reply({"skip": f"wgpu found no adapter (not even a software one) {why}".strip()})
    sys.exit()
device = adapter.request_device_sync()
reply({"ready": True})
for line in sys.stdin:
    out = {}
    for name, code in json.loads(line).items():
        try:
            device.create_shader_module(code=code)
            out[name] = None
        except Exception as e:  # every invalid module is reported
            out[name] = str(e)[:600] or type(e).__name__
    reply(out)
"""


def _child_reply(proc) -> dict:
    for line in proc.stdout:
        if line.startswith("@@"):
            return json.loads(line[2:])
    raise RuntimeError(f"the wgpu child process ended (exit code {proc.wait()})")


@pytest.fixture(scope="module")
def wgsl_errors():
    """``validate({name: wgsl}) -> {name: error text or None}``, by wgpu (naga) in a
    child process (see WGSL_CHILD); skips without wgpu or an adapter."""
    proc = subprocess.Popen([sys.executable, "-c", WGSL_CHILD], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    first = _child_reply(proc)
    if "skip" in first:
        proc.wait()
        pytest.skip(first["skip"])

    def validate(codes: dict[str, str]) -> dict[str, str | None]:
        proc.stdin.write(json.dumps(codes) + "\n")
        proc.stdin.flush()
        return _child_reply(proc)
    yield validate
    proc.stdin.close()
    proc.wait(timeout=60)


def test_wgsl_validator_rejects_broken_modules(wgsl_errors, artifact):
    """Negative controls: the validator is real, so the check below means something."""
    for path, m in artifact("adam", "webgpu")[:1]:
        name, good = next(iter(wgsl_modules(read(path, "kernels.wgsl")).items()))
        assert "array<f32>" in good
        errors = wgsl_errors({
            "trivial": "@compute @workgroup_size(1) fn main() { }",
            "mistyped": "@compute @workgroup_size(1) fn main() { let x : f32 = 1i; }",
            "real": good,
            "undeclared type": good.replace("array<f32>", "array<f33>", 1),   # in a real module
            "unbalanced brace": good.rstrip().rstrip("}"),
        })
        assert errors["trivial"] is None and errors["real"] is None, errors
        assert re.search(r"(?i)expected|type|error", errors["mistyped"] or ""), errors
        assert errors["undeclared type"] and errors["unbalanced brace"], errors


@pytest.mark.parametrize("spec", SAMPLED_SPECS)
def test_wgsl_modules_validate(spec, request, artifact):
    for path, m in artifact(spec, "webgpu"):
        check_device_kernels_cover_launches(m)
        modules = wgsl_modules(read(path, "kernels.wgsl"))
        assert sorted(modules) == sorted(device_kernel_names(m))
        for name, code in modules.items():
            assert re.search(rf"@compute @workgroup_size\({THREADS}, 1, 1\)\s*fn {name}\(",
                             code), \
                name
        validate = request.getfixturevalue("wgsl_errors")   # skips here without wgpu
        failures = [f"{n}: {e}" for n, e in validate(modules).items() if e]
        assert not failures, f"{len(failures)} of {len(modules)} WGSL modules are invalid:\n" + \
            "\n".join(failures[:5])


# -- Metal -------------------------------------------------------------------------------
def metal_kernels(text: str) -> dict[str, str]:
    """kernels.metal -> kernel name -> its text up to the next kernel."""
    matches = list(re.finditer(r"\bkernel void (\w+)\(", text))
    names = Counter(mm.group(1) for mm in matches)
    assert all(c == 1 for c in names.values()), [n for n, c in names.items() if c > 1]
    return {mm.group(1): text[mm.end():matches[i + 1].start() if i + 1 < len(matches)
                              else len(text)] for i, mm in enumerate(matches)}


@pytest.mark.parametrize("spec", SAMPLED_SPECS)
def test_metal_source_structure(spec, artifact):
    for path, m in artifact(spec, "metal"):
        check_device_kernels_cover_launches(m)
        text = read(path, "kernels.metal")
        kernels = metal_kernels(text)
        assert sorted(kernels) == sorted(device_kernel_names(m))
        assert not re.search(r"\bdouble\b", text), "Metal has no doubles"
        assert m["reduction_dtype"] == "float32"
        block, cols = block_reduction_kernels(m), column_reduction_kernels(m)
        for name, body in kernels.items():
            if name in block:
                assert "threadgroup_barrier" in body, f"{name}: block reduction without a barrier"
            if name in cols:
                assert "threadgroup_barrier" not in body, name
            if name in block or name in cols:
                accs = re.findall(r"\b(thread|threadgroup)\s+(\w+)\s+(acc|red_\w*)\s*\[", body)
                assert any(v == "acc" for _, _, v in accs), f"{name}: no accumulator found"
                wrong = [f"{q} {t} {v}" for q, t, v in accs if t != "float"]
                assert not wrong, f"{name}: accumulators {wrong} are not float32"


# -- ROCm --------------------------------------------------------------------------------
no_rocm = pytest.mark.skipif(targets.rocm_path() is not None,
                             reason=f"a ROCm toolchain is installed ({targets.rocm_path()})")


@no_rocm
def test_rocm_build_without_toolchain_names_it(tmp_path):
    with pytest.raises(BuildError) as err:
        pipeline.build(catalog.resolve("adam"), "rocm", out=str(tmp_path))
    assert "ROCm" in str(err.value) and "ROCM_PATH" in str(err.value), str(err.value)
    assert not os.listdir(tmp_path), "a failed rocm build left files behind"


@no_rocm
def test_rocm_cli_build_is_one_line_error(tmp_path):
    env = {**os.environ, "OPTGEN_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "optgen.cli", "build",
                        os.path.join(ROOT, "specs", "adam.py"), "--target", "rocm"],
                       env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "ROCm" in lines[0] and "ROCM_PATH" in lines[0], lines[0]


@pytest.mark.parametrize("target", ["opencl", "c"])
def test_matrix_specs_build_for_llvm_only(target, tmp_path):
    """A matrix rule on another target is a BuildError that names the spec and the
    targets that build it (cuda too since issue 35: tests/test_matrix_cuda.py)."""
    with pytest.raises(BuildError, match=r"muon uses matrix products .* llvm and cuda "
                                         r"targets only"):
        pipeline.build(os.path.join(ROOT, "specs", "muon.py"), target, out=str(tmp_path))

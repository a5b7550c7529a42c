"""Stage 7, the artifact's files. ``write_artifact`` fills a folder with the manifest
(every kernel and its launches, the variants, hyperparameters, states, ABI, and the size
and sha256 of the spec copy the runtime reads), the TVMScript, the spec source and the
rendered wrapper; ``write_variant`` records one variant's library (its sources, binaries
and their sizes and sha256, and the device ABI of GPU targets) in the variant's folder.
The pipeline publishes each folder (optgen.compiler.pipeline).
"""
from __future__ import annotations

import json
import os

from ..core._version import __version__
from optgen.core import cache
from optgen.core import formats
from optgen.core.manifest import VARIANT_RECORD, runtime_files, variant_files
from . import abi, targets, tvm_backend
from .plan import BuildPlan
from .schedule_llvm import RED_SCALAR_SIZE
from .templates import render

ABI = ("each kernel runs its 'launches' in order; a launch is kernel(*buffers, "
       "scalars): buffers are contiguous arrays, updated in place except grad, viewed "
       "flat (n,) or as [B, R, C] (B = prod(shape[:-2]), R = shape[-2], C = "
       "shape[-1]; [1, 1, n] below 2-D) with row states [B, R] and column states "
       "[B, C]; '_red<k>' buffers are float64 workspaces (per-parameter values have "
       "reduction_buffer_size elements); scalars is one 1-D array of the kernel "
       "dtype holding the values named by 'scalars', in that order; a buffer named "
       "in 'storage' has the dtype given there (read through a cast to the kernel "
       "dtype, rounded to nearest even on store). A matrix rule's launches (view 'matrix') pass "
       "2-D arrays: the parameter (R, C), 'rr'/'cc' states (R, R)/(C, C), "
       "temporaries '_tmp<k>' and loop buffers '_loop<k>' of the shape their "
       "buffer_axes names (kernel dtype); a 'repeat' launch runs the next 'length' "
       "launches 'count' times (a hyperparameter); 'refresh' rules run on the host. "
       "A 'reduce' launch fills its 'red' buffer and those of 'also', and stores "
       "its 'outputs' (states that later launches read back). A launch's 'seg_symbol' "
       "is the same pass over a run of parameters whose buffers lie back to back: "
       "kernel(*buffers, _seg, scalars) with _seg the int64 offsets of the run's "
       "tensors (len = tensors + 1) and each '_red' buffer holding one reduction "
       "buffer per tensor. A launch's 'mt_symbol' is the same pass over a list of "
       "tensors anywhere: kernel(_tab, _chunks, scalars) with _tab (tensors, buffers "
       "+ 1) int64 (each buffer's address, then the element count) and _chunks "
       "(items + 1, 3) int64 (row 0: the total; then tensor, first, end). "
       "A kernel whose param_dtype "
       "(float16, bfloat16) differs from its dtype (float32) is mixed precision: w "
       "is the float32 master, 'w_low' receives the new w rounded to param_dtype and "
       "is read first: where it is not w rounded, its value is the master (a weight "
       "written from outside wins); grad and the extra inputs are param_dtype. A kernel's "
       "functions are in the library of its 'variant' (the folder of that name, whose "
       "variant.json records the library, its files and, GPU targets, the device ABI)")


def write_sources(folder: str, sources: dict[str, str], tg: targets.Target) -> dict[str, str]:
    """Write the generated sources (``kernels.<suffix>``) into ``folder``, as soon as the
    build has them (nvcc compiles ``kernels.cu`` from there). Returns kind -> file."""
    files = {kind: f"kernels.{tg.source}" for kind in sources}
    for kind, name in files.items():
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(sources[kind])
    return files


def write_artifact(folder: str, plan: BuildPlan, key: str, seconds: float,
                   archs: tuple[str, ...]) -> None:
    """Write an artifact's own files into ``folder`` (``plan``: every kernel's): the
    manifest, the TVMScript of every kernel, the spec source and the rendered wrapper;
    manifest.json last (its presence marks a complete folder). No library: each
    variant's is built into a folder of its own (``write_variant``)."""
    spec, tg = plan.spec, plan.target
    kernels = [k.manifest_entry() for k in plan.kernels]
    hypers = [h.info for h in spec.hypers.values()]
    manifest = {
        "format": cache.FORMAT, "name": spec.name, "doc": spec.doc, "reference": spec.reference,
        "spec_file": os.path.basename(spec.file), "base": plan.base, "key": key,
        "target": tg.name, "archs": list(archs),
        "optgen_version": __version__, "tvm_version": cache.tvm_version(),
        "hyperparameters": [h.to_json() for h in hypers],
        "requirements": [r.to_json() for r, _ in spec.requirements],
        "states": [{"name": s.name, "init": s.init, "shape": s.shape, "doc": s.doc,
                    "when": s.when, "half_when": s.half_when} for s in spec.states.values()],
        "shape_flags": {n: {"rule": r, "doc": d} for n, (r, d) in spec.shape_flags.items()},
        "name_flags": {n: {"exclude": list(x), "doc": d} for n, (x, d) in spec.name_flags.items()},
        "inputs": spec.inputs,
        "statistics": {n: {"shape": shape, "doc": doc}
                       for n, (shape, doc) in spec.statistics.items()},
        "accepted": spec.accepted,
        "state_format": formats.expand(spec.name, plan.state_format, spec.states.values()),
        "lazy_update_default": spec.lazy_update_default,
        "reduction_buffer_size": RED_SCALAR_SIZE,
        "reduction_dtype": tg.acc_dtype,
        "abi": ABI,
        "variants": {v: {"param_dtype": pdt, "flags": flags,
                         "kernels": [k["symbol"] for k in kernels if k["variant"] == v]}
                     for v, (pdt, flags) in plan.made.items()},
        "default_variants": plan.defaults,
        "wrapper": f"{spec.name}_optimizer.py",
        "sources": {"tvmscript": "kernels.tvmscript.py"},
        "kernels": kernels, "build_seconds": round(seconds, 3),
    }
    files = {
        "kernels.tvmscript.py": "# TVMScript generated by optgen; one PrimFunc per kernel\n"
                                "from tvm.script import tirx as T\n\n\n"
                                + "\n\n".join(plan.scripts().values()),
        "spec.py": spec.source,
        manifest["wrapper"]: render_wrapper(spec, hypers),
    }
    for name, text in files.items():
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(text)
    # what the runtime reads, with size and sha256: Artifact.load verifies them
    manifest["files"] = {n: cache.file_record(os.path.join(folder, n))
                         for n in runtime_files(manifest)}
    _write_json(os.path.join(folder, "manifest.json"), manifest)


def write_variant(folder: str, plan: BuildPlan, variant: str, sources: dict[str, str],
                  key: str, seconds: float, archs: tuple[str, ...], device: dict | None,
                  binaries: dict[str, dict[str, str]], records: dict[str, dict]) -> None:
    """Write the record of one variant's library into ``folder``, where the library, the
    sources and the binaries are: variant.json (VARIANT_RECORD), last, with the size and
    sha256 of every file of it the runtime reads (``records``: file -> cache.file_record)
    and, GPU targets, the device ABI of its kernels."""
    tg = plan.target
    record = {
        "format": cache.FORMAT, "key": key, "variant": variant, "target": tg.name,
        "target_detail": tg.detail(archs, tvm_backend.host_target()),
        "library": "kernels.so", "sources": {k: f"kernels.{tg.source}" for k in sources},
        "binaries": binaries, "build_seconds": round(seconds, 3),
    }
    if device is not None:
        record["device_abi"] = abi.DOC
        record["device_kernels"] = device
    record["files"] = {n: records[n] for n in variant_files(record)}
    _write_json(os.path.join(folder, VARIANT_RECORD), record)


def _write_json(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=1))  # last: its presence marks completeness


def class_name(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def render_wrapper(spec, hypers) -> str:
    def annotation(h):
        base = {"float": "float", "int": "int", "bool": "bool"}[h.type]
        return f"{base} | None" if h.optional else base
    return render("wrapper.py.j2", spec=spec, cls=class_name(spec.name), hypers=hypers, pyrepr=repr,
                  annotation=annotation)

"""Which kernels a target gets (stages 3-4 of the pipeline, per target): the kernel IRs
of every flag combination, plain and mixed precision (``kernel_irs``), the dtypes each
compiles in (``variants``), the symbol each kernel is exported as (``symbol_for``), and
the variant library each belongs to (``variant_name``; the defaults: ``default_variants``).
The pipeline lowers these; the manifest (optgen.compiler.write_artifact) lists them.

A *variant* is what one user setting selects: a parameter dtype and a value of every
flag hyperparameter (``spec.flags``). It holds the kernels of every value of the flags
set per parameter (shape and name flags: a model has both kinds of parameters) and, with
a state format, the formatted kernels too. Each variant is compiled into a library of its
own, when it is first needed (optgen.compiler.pipeline).
"""
from __future__ import annotations

from ..errors import BuildError
from optgen.core import formats
from . import targets
from .nonneg import nonneg_states
from .kernel_ir import KernelIR
from .lower import DTYPE_TAG
from .specialize import MASTER_DTYPE, specialize

DTYPES = ("float32", "float64")   # plain kernels: parameter, states and compute in one dtype


def symbol_for(name: str, param_dtype: str, flags: dict[str, bool],
               state_format: dict[str, str] | None = None) -> str:
    """``adam_f32_amsgrad``; a kernel with state formats adds them: ``adam_f32_sf_m_bf16``."""
    fmt = [f"{s}_{formats.of(f).symbol}" for s, f in (state_format or {}).items()]
    return "_".join([name, DTYPE_TAG[param_dtype], *(f for f, on in flags.items() if on),
                     *(["sf", *fmt] if fmt else [])])


def variant_name(param_dtype: str, flags: dict[str, bool], user_flags) -> str:
    """``f32``, ``f32-use_nesterov``: the parameter dtype's tag and the flag
    hyperparameters (``user_flags``, in declaration order) that are on."""
    return "-".join([DTYPE_TAG[param_dtype], *(f for f in user_flags if flags.get(f))])


def default_dtype(tg: targets.Target) -> str:
    """The parameter dtype of a target's default variants: float32 where it has it."""
    return "float32" if "float32" in tg.dtypes else tg.dtypes[0]


def default_variants(spec, tg: targets.Target, made: dict[str, tuple[str, dict]]) -> list[str]:
    """The variants ``optgen build`` makes without ``--all-variants``: the default flag
    values in the target's default dtype (``made``: variant -> (parameter dtype, flags));
    where a requirement rules the defaults out, the first variant of that dtype."""
    dtype, want = default_dtype(tg), {n: h.default for n, h in spec.flags.items()}
    mine = [v for v, (pdt, flags) in made.items() if pdt == dtype]
    return [v for v in mine if made[v][1] == want] or mine[:1] or list(made)[:1]


def variants(kirs: list[KernelIR], dtypes: tuple[str, ...] = DTYPES
             ) -> list[tuple[KernelIR, str, str]]:
    """(IR, compute dtype, parameter dtype) of every kernel: a plain IR compiles once per
    ``dtypes``, a mixed-precision IR or one with state formats once, in float32
    (MASTER_DTYPE: formats round from float32)."""
    return [(kir, dt, kir.param_dtype or dt) for kir in kirs
            for dt in ((MASTER_DTYPE,) if kir.param_dtype or kir.state_format else dtypes)]


def kernel_irs(spec, traces, tg: targets.Target,
               state_format: str | dict[str, str] | None = None) -> list[KernelIR]:
    """The IRs a target gets: every flag combination, plain and in each mixed dtype the
    target has; without float16 on the target, no IR that stores float16; without
    64-bit integers, no row-sparse variant. A ``state_format`` request (see
    optgen.core.formats) adds, for every elementwise flag combination, the same IRs
    with those states in the format (matrix rules get none); its ``formats.PARAM`` entry
    (stochastic_rounding, or a split ``master_format``) adds IRs for bfloat16 parameters
    without a master copy, with plain and with formatted states."""
    if not tg.matrix:
        matrix = next((tr for tr in traces if tr.matrix), None)
        if matrix is not None:
            with_matrix = " and ".join(n for n, t in targets.TARGETS.items() if t.matrix)
            raise BuildError(f"{spec.name} uses matrix products (flags {matrix.flags}), which "
                             f"optgen compiles for the {with_matrix} targets only so far, "
                             f"not {tg.name}")
    fmt = formats.expand(spec.name, state_format, spec.states.values())
    quantized = sorted({formats.of(fmt[n]).name for n in formats.quantized(fmt)},
                       reverse=True)
    if quantized and not tg.quant:
        with_quant = ", ".join(n for n, t in targets.TARGETS.items() if t.quant)
        raise BuildError(f"state_format {' and '.join(map(repr, quantized))} builds for the "
                         f"targets {with_quant} so far, not {tg.name}")
    maps = quant_maps(spec, traces, {n: formats.of(fmt[n]) for n in formats.quantized(fmt)})
    split = formats.master(fmt)
    if split is not None and split.dtype not in tg.mixed:
        raise BuildError(f"master_format {split.name!r} steps {split.dtype} parameters, which "
                         f"the {tg.name} target cannot store (it has "
                         f"{', '.join(tg.mixed) or 'none'})")
    if fmt and not set(formats.dtypes(fmt).values()) <= set(tg.mixed):
        raise BuildError(f"state_format {formats.key(state_format)!r} stores states as "
                         f"{', '.join(sorted(set(formats.dtypes(fmt).values())))}, which the "
                         f"{tg.name} target cannot store (it has {', '.join(tg.mixed) or 'none'})")
    param_format = fmt.pop(formats.PARAM, None)   # bfloat16 w without a master
    sr_params = param_format is not None
    # matrix rules: mixed precision, bf16 states and split masters (not q8/q4 states,
    # which need one elementwise pass; not stochastic rounding) on the CPU targets
    lowered = tg.family == "cpu"
    mfmt = fmt if lowered and not quantized and not formats.stochastic(fmt) else None
    made = [(f, specialize(spec, tr, low, merge=tg.family == "cpu", state_format=f, maps=maps))
            for tr in traces for f in ([None, fmt] if fmt and not tr.matrix else
                                       [None, mfmt] if mfmt else [None])
            for low in (None, *(tg.mixed if not tr.matrix else
                                ("bfloat16",) if lowered and "bfloat16" in tg.mixed else ()))]
    made += [(f, specialize(spec, tr, "bfloat16", merge=tg.family == "cpu", state_format=f,
                            maps=maps, master=False, param_format=param_format))
             for tr in traces if sr_params and (not tr.matrix or (
                 lowered and formats.master({formats.PARAM: param_format}) is not None))
             for f in ([{}, fmt] if fmt and (not tr.matrix or mfmt) else [{}])]
    # no format IR where none of the formatted states is active: it is the plain one
    # (or, without a master, the one with plain states)
    kirs, seen = [], set()
    for f, k in made:
        key = (tuple(k.flags.items()), k.param_dtype, tuple(k.state_format.items()))
        if (f is None or k.state_format) and key not in seen:
            seen.add(key)
            kirs.append(k)
    kirs = [k for k in kirs if tg.half_states or "float16" not in k.storage.values()]
    if not tg.lazy:
        for k in kirs:
            k.lazy = None
    return kirs


def quant_maps(spec, traces, names: dict[str, formats.Format]) -> dict[str, str]:
    """The map of each block-quantized state (``names``: state -> its Format): the finer
    one where it is proven non-negative under every flag combination that has it
    (optgen.compiler.nonneg; q8 "unsigned", q4 the zero-free "linear4"), else the
    signed one ("signed", "signed4")."""
    proven = set(names)
    for tr in traces:
        active = [n for n in names if n in tr.updates or
                  any(s.name == n for s in spec.active_states(tr.flags))]
        proven &= nonneg_states(spec, tr.updates, active) | (set(names) - set(active))
    return {n: f.map_for(n in proven) for n, f in names.items()}

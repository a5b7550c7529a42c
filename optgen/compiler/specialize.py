"""Stage 3 — IR: one traced update becomes a ``KernelIR``.

The pass splits the update into what runs where:

* host scalars: maximal compound scalar sub-expressions, such as the bias correction
  ``lr * sqrt(1 - beta2**t) / (1 - beta1**t)`` or ``1 - beta1``. The runtime evaluates
  them once per step in float64 and passes them as kernel arguments (rounded once to
  the kernel dtype), so they cost nothing per element and never trigger a rebuild;
* scalar-state updates: evaluated on the host after the kernel, like host scalars;
* tensor updates (the parameter, per-element states, row/column states): kernel bodies;
* reductions (``reduce`` nodes): each becomes a pass of its own that writes a small
  float64 buffer (``_red<k>``) before the passes that read it. A reduction's *level* is
  1 + the highest level among the reductions inside its operand, and passes run level by
  level; every pass recomputes its values from the old parameter and states, which are
  only written by the final update passes (``plan``; on CPU targets the first pass may
  store states early, ``KernelIR.early``).

A *mixed-precision* IR (``param_dtype`` float16 or bfloat16, multi_precision) is the
same update with ``w`` as the float32 master copy: its gradients (``grad`` and the
spec's extra inputs) are stored in the low dtype and read through a cast, and one more
output, ``w_low``, receives the new master rounded to the low dtype; it is read too: where
it is not the master rounded (written from outside the optimizer), its value is the master.

The IR's types (``KernelIR``, ``Launch``) and its JSON form live in
optgen.compiler.kernel_ir, below this module and the matrix planner
(optgen.compiler.plan_matrix), which this module calls for matrix rules.
"""
from __future__ import annotations

from ..declarations import SHAPE_NAMES, Spec
from ..ir import Expr, apply, global_sums, matrix_shape, to_python, walk
from ..tracing import Trace
from optgen.core import formats, rounding, scalar_expr
from optgen.core.reference import LOW_COPY
from optgen.core.dtypes import LOW_PRECISION as MIXED_DTYPES  # float32-master dtypes
from .kernel_ir import KernelIR, Launch, serialize
from .plan_matrix import plan_matrix

MASTER_DTYPE = "float32"                 # the compute dtype of mixed-precision kernels


def _needs_host(e: Expr) -> bool:
    """Every compound scalar goes to the host. Scalars reading ``t`` or a scalar state
    must; the others (``1 - beta2``) should, because the host computes in float64 and
    rounds once, where a float32 kernel would round ``beta2`` first and then subtract
    (a 1.3e-5 relative error in Adam's ``v``, found by the oracle tests). A scalar
    state read bare (ASGD's ``eta * g``) goes too: the kernel has no buffer for it."""
    return e.kind == "scalar" and (bool(e.args) or e.op == "state")


def specialize(spec: Spec, trace: Trace, param_dtype: str | None = None,
               merge: bool = False, state_format: dict[str, str] | None = None,
               maps: dict[str, str] | None = None, master: bool = True,
               param_format: str = str(formats.cast.STOCHASTIC)) -> KernelIR:
    """The IR of one traced update; ``param_dtype`` (one of MIXED_DTYPES) makes the
    mixed-precision variant (see the module docstring); ``merge`` plans for the CPU
    family's reduction template (``plan``); ``state_format`` (state -> format,
    optgen.core.formats) stores those of the active tensor states that the spec
    keeps in the kernel dtype in the format's dtype (loads widen, stores round), or as
    q8 codes with the dynamic map ``maps`` names ("signed"/"unsigned"; ``quantize``).
    ``master=False`` (with ``param_dtype`` bfloat16): no float32 master; ``w`` itself
    is stored as bfloat16, rounded stochastically (``formats.PARAM``), or with a split
    ``param_format`` ("split16", "split8") decoded from and encoded into ``w`` and its
    correction ``w__corr`` (optgen/core/formats/split.py)."""
    host: dict[str, str] = {}            # python text -> host scalar name
    memo: dict[int, Expr] = {}

    def host_leaf(e: Expr) -> Expr:
        if e.dtype == "bool":  # pass conditions as 1.0 / 0.0 and compare in the kernel
            text = to_python(apply("where", e, 1.0, 0.0))
        else:
            text = to_python(e)
        name = host.setdefault(text, f"_host{len(host)}")
        leaf = Expr("hyper", name=name, kind="scalar", loc=e.loc)
        return apply("ne", leaf, 0.0) if e.dtype == "bool" else leaf

    def rewrite(e: Expr) -> Expr:
        if id(e) in memo:
            return memo[id(e)]
        if _needs_host(e) or (e.op == "hyper" and e.name in SHAPE_NAMES):
            out = host_leaf(e)
        elif not e.args:
            out = e
        else:
            args = tuple(rewrite(a) for a in e.args)
            out = e if all(a is b for a, b in zip(args, e.args)) else \
                Expr(e.op, args, value=e.value, name=e.name, dtype=e.dtype, kind=e.kind,
                     axes=e.axes, loc=e.loc, mat=e.mat)
        memo[id(e)] = out
        return out

    active = spec.active_states(trace.flags)
    tensor_states = [s.name for s in active if s.shape != "scalar"]
    scalar_states = [s.name for s in active if s.shape == "scalar"]
    by_name = {s.name: s for s in active}
    tensor_updates = {name: rewrite(trace.updates[name]) if name in trace.updates
                      else by_name[name].node       # refreshed only: unchanged by the step
                      for name in ["w", *tensor_states]}
    scalar_updates = {name: trace.updates[name] for name in scalar_states}
    axes = {"w": "brc", "grad": "brc", **{n: "brc" for n in spec.inputs},
            **{s.name: s.node.mat or s.node.axes for s in active}}   # rr/cc: "RR"/"CC"
    matrix = trace.matrix
    if matrix:   # (no inputs: the verifier)
        axes = {n: matrix_shape(by_name[n].node) if n in by_name and a else a
                for n, a in axes.items()}   # param-shaped states: "RC"
        axes.update(w="RC", grad="RC")
    storage = {s.name: "float16" for s in active if s.shape != "scalar" and s.half_when
               and scalar_expr.evaluate(s.half_when, trace.flags)}
    formatted = {n: f for n, f in (state_format or {}).items()
                 if n in tensor_states and n not in storage}
    storage.update(formats.dtypes(formatted))
    low_copy, corr = [], []
    if param_dtype is not None and not master:   # bfloat16 w, stored stochastically
        storage.update({n: param_dtype for n in ["w", "grad", *spec.inputs]})
        formatted[formats.PARAM] = param_format
        split = formats.master(formatted)        # (or a split master)
        if split is not None:
            corr = [formats.CORRECTION]
            storage[corr[0]] = split.family.corr_dtypes[split.name]
            axes[corr[0]] = "RC" if matrix else "brc"
    elif param_dtype is not None:
        assert param_dtype in MIXED_DTYPES, param_dtype
        low_copy = [LOW_COPY]
        tensor_updates[LOW_COPY] = tensor_updates["w"]   # the same value, rounded on store
        axes[LOW_COPY] = "RC" if matrix else "brc"
        storage.update({n: param_dtype for n in [LOW_COPY, "grad", *spec.inputs]})
    kir = KernelIR(
        flags=dict(trace.flags),
        buffers=["w", *corr, *low_copy, "grad", *spec.inputs, *tensor_states],
        hypers=list(spec.numeric_hypers),
        host_scalars={name: text for text, name in host.items()},
        scalar_state_updates={},
        tensor_updates=tensor_updates,
        scalar_states=scalar_states,
        buffer_axes=axes,
        storage=storage,
        param_dtype=param_dtype,
        refresh=_refresh(spec, trace),
        state_format=formatted,
    )
    if matrix:
        plan_matrix(kir)
    else:
        gathered = global_sums(list(scalar_updates.values()))   # (the same nodes as the
        plan(kir, merge, [rewrite(e) for e in gathered])        # kernels' sums: rewrite)
    red = {id(e): r for r, e in kir.reductions.items()}
    names = {id(e): red[id(memo[id(e)])] for e in global_sums(list(scalar_updates.values()))}
    kir.scalar_state_updates = {n: to_python(e, names) for n, e in scalar_updates.items()}
    if corr:     # every pass that reads or writes w reads and writes its correction
        for ln in [*kir.launches, *([kir.lazy] if kir.lazy else [])]:
            if corr[0] not in ln.buffers:
                ln.buffers = [x for b in ln.buffers for x in ([b, *corr] if b == "w" else [b])]
    if low_copy:   # every pass that reads w reads w_low: a weight written from outside
        for ln in [*kir.launches, *([kir.lazy] if kir.lazy else [])]:   # wins (lower_bits.py)
            if "w" in ln.buffers and low_copy[0] not in ln.buffers:
                ln.buffers = [x for b in ln.buffers for x in ([b, *low_copy] if b == "w" else [b])]
    if formats.block(spec.name, formatted):    # (one block size for all)
        quantize(spec, kir, {n: formats.of(formatted[n]).with_map((maps or {})[n])
                             for n in formats.quantized(formatted)})
    sr = formats.stochastic(formatted) + ([] if master or corr else ["w"])
    if sr:
        stochastic(spec, kir, sr)
    return kir


def stochastic(spec: Spec, kir: KernelIR, names: list[str]) -> None:
    """Round the stores of states ``names`` (bfloat16) stochastically: each gets its
    salt, and the kernel two more scalars, the step's key (optgen/core/rounding.py). The
    hash reads the element's index in the flat view, so those states must be stored
    by flat (or q8) passes: elementwise states, not row/column statistics."""
    for ln in kir.launches:
        bad = [n for n in ln.outputs if n in names and ln.view not in formats.FLAT_VIEWS]
        if bad:
            raise ValueError(f"{spec.name} (flags {kir.flags}): state {bad[0]!r} is stored by "
                             f"a {ln.view} pass; stochastic rounding (bf16sr) applies to "
                             "states stored element by element (use 'bf16' for it)")
    kir.stochastic = {n: rounding.salt(n) for n in names}
    kir.hypers = kir.hypers + list(rounding.KEY_SCALARS)
    kir.lazy = None


def quantize(spec: Spec, kir: KernelIR, fmts: dict[str, formats.Format]) -> None:
    """Store the states ``fmts`` names block-quantized (q8, q4: optgen/core/formats/
    blocked.py), each with the map its Format carries: the one update pass becomes the
    blocked view, which also takes each such state's companions (``<state>__absmax``,
    one float32 per block) and the formats' table arguments (maps; 8-bit maps also their
    bucket midpoints and code table).
    Only a single elementwise pass can: the block's new values, their absmax and their
    codes are computed in one loop nest, and nothing else reads the states."""
    ln = kir.launches[0] if len(kir.launches) == 1 else None
    if ln is None or ln.kind != "update" or ln.view != "flat" or spec.inputs:
        what = "reductions or row/column passes" if len(kir.launches) > 1 else \
            "extra inputs" if spec.inputs else f"a {ln.view if ln else '?'} pass"
        fmt = " and ".join(sorted({f.name for f in fmts.values()}))
        raise ValueError(f"{spec.name} (flags {kir.flags}): state_format '{fmt}' applies to "
                         "elementwise rules (one pass over the elements), and this rule has "
                         f"{what}; use 'bf16' for it (docs/state-formats.md)")
    kir.quant = {n: f.map for n, f in fmts.items()}
    kir.quant_block, = {f.block for f in fmts.values()}   # (formats.block: one size)
    companions = {n: list(f.companions(n, 0)) for n, f in fmts.items()}
    by_map = {f.map: f.tables() for f in fmts.values()}
    tables = [t for m in sorted(by_map) for t in by_map[m]]
    for b in [c for cs in companions.values() for c in cs] + tables:
        kir.buffer_axes[b] = ""
    kir.buffers = [x for b in kir.buffers for x in [b, *companions.get(b, [])]] + tables
    ln.view = formats.BLOCKED_VIEW
    ln.buffers = [x for b in ln.buffers for x in [b, *companions.get(b, [])]] + tables
    kir.lazy = None


def _refresh(spec: Spec, trace: Trace) -> dict | None:
    """The refresh rule of one flag combination as the runtime evaluates it (host)."""
    if not trace.refresh:
        return None
    ir, _ = serialize(trace.refresh)
    nodes = list(walk(trace.refresh.values()))
    reads = sorted({n.name for n in nodes if n.op == "stat"})
    out = {"every": spec.refresh_rule.every, "start": spec.refresh_rule.start, "ir": ir,
           "reads": reads}
    if spec.refresh_rule.dtype != "float64":
        out["dtype"] = spec.refresh_rule.dtype   # "kernel": evaluated in the kernel's dtype
    if any(n.op == "grad" for n in nodes):
        out["grad"] = True     # reads the step's gradient: runs on steps every, 2 every, ...
    return out


def _reads(roots: list[Expr], stop: set[int]) -> tuple[list[str], list[Expr]]:
    """Buffers (leaves) and reduce nodes a pass reads, not looking inside reductions."""
    nodes = list(walk(roots, stop=stop))
    names = list(dict.fromkeys(e.name for e in nodes if e.op in ("param", "grad")
                               or (e.op == "state" and e.kind == "tensor")))
    return names, [e for e in nodes if id(e) in stop]


def plan(kir: KernelIR, merge: bool = False, gathered: list[Expr] = ()) -> None:
    """Split the update into passes: reductions level by level, then the updates.
    ``gathered``: global sums read only by scalar-state updates, computed too.

    ``merge`` (the CPU family's reduction template) plans fewer bytes: whole-tensor
    reductions of one level over the flat view share one pass (LAMB's ||w|| and ||r||
    read w once), and when that is the only pass of the first level it also stores
    every per-element state whose new value it computes anyway and that later passes
    read only as that new value (LAMB's m and v, ``KernelIR.early``): the update pass
    then reads m and v instead of recomputing them from the gradient. LAMB moves 40
    bytes per parameter instead of 48 (docs/performance.md)."""
    level: dict[int, int] = {}
    reduces: list[Expr] = []
    for e in walk([*kir.tensor_updates.values(), *gathered]):
        inner = max((level[id(a)] for a in e.args), default=0)
        if e.op == "reduce":
            reduces.append(e)
            level[id(e)] = inner + 1
        else:
            level[id(e)] = inner
    red_ids = {id(e) for e in reduces}
    red_name = {id(e): f"_red{k}" for k, e in enumerate(reduces)}
    kir.reductions = {red_name[id(e)]: e for e in reduces}
    kir.buffers += list(kir.reductions)
    for name, e in kir.reductions.items():
        kir.buffer_axes[name] = e.axes

    def view(roots: list[Expr], space: str, stop: set[int] = red_ids,
             early: dict[int, str] | None = None) -> tuple[str, list[str]]:
        names, reds = _reads(roots, stop)
        reds = [r for r in reds if id(r) in red_ids]   # (not the values stored early)
        names += [s for s in _early_reads(roots, stop, early or {}) if s not in names]
        used = [kir.buffer_axes[n] for n in names] + [r.axes for r in reds] + [space]
        flat = all(a in ("brc", "") for a in used) and space in ("brc", "")
        order = [b for b in kir.buffers if b in names or b in {red_name[id(r)] for r in reds}]
        return ("flat" if flat else "3d"), order

    launches: list[Launch] = []
    for lvl in sorted({level[id(e)] for e in reduces}):
        group = [e for e in reduces if level[id(e)] == lvl]
        whole = [e for e in group if merge and not e.axes and e.args[0].axes == "brc"
                 and view([e.args[0]], "brc")[0] == "flat"]
        if len(whole) > 1:
            _, bufs = view([e.args[0] for e in whole], "brc")
            launches.append(Launch("reduce", "brc", "flat", bufs + [red_name[id(e)] for e in whole],
                                   node=whole[0], red=red_name[id(whole[0])],
                                   also=[(e, red_name[id(e)]) for e in whole[1:]]))
        for e in group:
            if len(whole) > 1 and e in whole:
                continue
            v, bufs = view([e.args[0]], e.args[0].axes)
            if e.axes:  # a partial reduction writes rows/columns: nested loops
                v = "3d"
            launches.append(Launch("reduce", e.args[0].axes, v, bufs + [red_name[id(e)]],
                                   node=e, red=red_name[id(e)]))
    early = _early_states(kir, launches, level, red_ids) if merge else {}
    if early:
        first = launches[0]
        first.outputs = list(early)
        first.buffers = [b for b in kir.buffers if b in first.buffers or b in early]
        kir.early = early
    early_ids = {id(e): s for s, e in early.items()}
    stop = red_ids | set(early_ids)
    for ln in launches[1:] if early else ():   # later reductions read the stored states
        roots = [node.args[0] for node, _ in ln.reduced_pairs]
        _, bufs = view(roots, ln.space, stop, early_ids)
        ln.buffers = bufs + [r for _, r in ln.reduced_pairs]
    for space in ("brc", "br", "bc"):
        outs = [n for n in kir.tensor_updates if kir.buffer_axes[n] == space and n not in early]
        if not outs:
            continue
        v, bufs = view([kir.tensor_updates[n] for n in outs], space, stop, early_ids)
        bufs = [b for b in kir.buffers if b in bufs or b in outs]
        launches.append(Launch("update", space, v, bufs, outputs=outs))
    kir.launches = launches
    # row-wise elementwise rules also get a lazy (row-sparse) variant: the same body over
    # the rows named by an index array (MXNet lazy_update, MindSpore LazyAdam)
    has_inputs = any(b not in ("w", formats.CORRECTION, "grad")
                     and b not in kir.tensor_updates
                     for b in kir.buffers if not b.startswith("_red"))
    if not reduces and not has_inputs and all(a in ("brc", "") for a in kir.buffer_axes.values()):
        kir.lazy = Launch("update", "brc", "lazy", [*kir.buffers, "_indices"],
                          outputs=list(kir.tensor_updates))


def _early_reads(roots: list[Expr], stop: set[int], early: dict[int, str]) -> list[str]:
    """The states a pass reads back as stored by the first pass (``KernelIR.early``)."""
    return [early[id(e)] for e in walk(roots, stop=stop) if id(e) in early]


def _early_states(kir: KernelIR, launches: list[Launch], level: dict[int, int],
                  red_ids: set[int]) -> dict[str, Expr]:
    """state -> new value, for the states the first pass can store (``plan``): it must be
    the only pass of the first level, over the flat view; the state per element, stored
    in the kernel dtype (a float16 state would be read back rounded); its new value free
    of reductions and computed by that pass anyway; and no later pass may read the old
    state other than through that value."""
    if not launches or launches[0].view != "flat" or \
            sum(1 for ln in launches if level[id(ln.node)] == 1) != 1:
        return {}
    computed = {id(e) for e in walk([n.args[0] for n, _ in launches[0].reduced_pairs],
                                    stop=red_ids)}
    cand = {s: e for s, e in kir.tensor_updates.items()
            if s in kir.buffers and s not in ("w", LOW_COPY) and kir.buffer_axes[s] == "brc"
            and s not in kir.storage and not (e.op == "state" and e.name == s)
            and level[id(e)] == 0 and id(e) in computed}
    later = [n.args[0] for ln in launches[1:] for n, _ in ln.reduced_pairs]
    while cand:   # drop a state whose old value a later pass still reads; recheck the rest
        stop = red_ids | {id(e) for e in cand.values()}
        roots = later + [e for s, e in kir.tensor_updates.items() if s not in cand]
        old = {e.name for e in walk(roots, stop=stop) if e.op == "state"}
        if not old & set(cand):
            break
        cand = {s: e for s, e in cand.items() if s not in old}
    return cand

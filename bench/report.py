"""The suite's report, apart from the measurement: the bandwidth limit of a run, the
derived columns of every row (medians, GB/s, % of the limit, x reference, the weight
check), the goals judged MET / MISSED, the printed tables and the PNG plot."""
from __future__ import annotations


import numpy as np

from optgen.benchmark import goal_line
from contenders import state_row
from goals import med
from workloads import STATE_FORMATS, WORKLOADS

DIFF_TOL = 1e-4        # max |w - w_ref| after all steps; a wrong rule is off by ~1e-3
STATE_TOL = 1e-3       # ... for low-bit states, whose rounding moves w by ~1e-4 in 10 steps
Q4_TOL = 3e-2          # ... 4-bit: an element far below its block's absmax barely moves (its
                       # v reads as absmax / 16, its m as 0): up to lr (1e-3) a step
TOLERANCE = {state_row(f): Q4_TOL if f == "q4" else STATE_TOL for f in STATE_FORMATS}


def is_memory(wl: dict) -> bool:
    return wl["name"].startswith("memory")


def limits(workloads: list[dict]) -> dict:
    """The limit: the best STREAM-counted rate of any copy or triad anchor in the run
    (the axpy's, Adam's own access pattern, is reported beside it)."""
    best: dict[str, tuple[float, str]] = {}
    for wl in workloads:
        for r in wl["rows"]:
            if r.get("kind") == "anchor":
                kind = r["contender"].split()[0]
                bw = r["bytes"] / min(r["times_s"])
                if bw > best.get(kind, (0.0, ""))[0]:
                    best[kind] = (bw, f"{wl['name']}: {r['contender']}")
    limit = max((best[k] for k in ("copy", "triad") if k in best), default=(None, None))
    return {"limit_Bps": limit[0], "limit_from": limit[1],
            **{f"{k}_best_Bps": v[0] for k, v in best.items()},
            **{f"{k}_best_from": v[1] for k, v in best.items()}}


def summarize(workloads: list[dict], lim: dict) -> None:
    """Adds median/min ms, GB/s, % of the limit and x reference to every timed row."""
    for wl in workloads:
        if is_memory(wl):
            continue
        ref = next((r for r in wl["rows"] if r["contender"] == wl["reference"]), None)
        for r in wl["rows"]:
            m = med(r)
            r["median_ms"], r["min_ms"] = m * 1e3, min(r["times_s"]) * 1e3
            r["gbps"] = r["bytes"] / m / 1e9 if r["bytes"] else None
            r["pct_limit"] = (100 * r["bytes"] / m / lim["limit_Bps"]
                              if r["bytes"] and wl["bandwidth"] and lim["limit_Bps"] else None)
            r["x_ref"] = m / med(ref) if ref is not None and r["kind"] != "anchor" else None
            tol = TOLERANCE.get(r["contender"], DIFF_TOL)
            r["check"] = (None if r["max_abs_diff"] is None
                          else "ok" if r["max_abs_diff"] <= tol else "MISMATCH")


def goals(by: dict, lim: dict, suffix: str = "") -> list[dict]:
    """Every goal of the workload table with its measured value (None where its
    workload, with ``suffix`` appended to the name, was not run)."""
    return [goal.record(measure.value(by.get(wl.name + suffix), lim), suffix)
            for wl in WORKLOADS for goal, measure in wl.goals]


def fmt(x, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if x is None else f"{format(x, spec):>{width}}"


def print_table(workloads: list[dict], lim: dict) -> None:
    head = (f"{'workload':<24} {'contender':<32} {'median ms':>10} {'min ms':>10} {'GB/s':>6} "
            f"{'% limit':>7} {'x ref':>6} {'max|dw|':>8} check")
    print(head)
    print("-" * len(head))
    for wl in workloads:
        if is_memory(wl):
            continue
        for i, r in enumerate(wl["rows"]):
            name = wl["name"] if i == 0 else ""
            print(f"{name:<24} {r['contender'][:32]:<32} {r['median_ms']:>10.3f} "
                  f"{r['min_ms']:>10.3f} {fmt(r['gbps'], '.1f', 6)} "
                  f"{fmt(r['pct_limit'], '.0f', 7)} {fmt(r['x_ref'], '.2f', 6)} "
                  f"{fmt(r['max_abs_diff'], '.1e', 8)} {r['check'] or ''}".rstrip())
        extra = f"; {wl['note']}" if wl["note"] else ""
        print(f"{'':<24} ({wl['title']}; ref: {wl['reference'] or '-'}; {wl['reps']} reps; "
              f"loadavg {wl['loadavg_1min'][0]:.1f}->{wl['loadavg_1min'][1]:.1f}{extra})")
    if lim["limit_Bps"]:
        axpy = lim.get("axpy_best_Bps")
        print(f"limit: {lim['limit_Bps'] / 1e9:.1f} GB/s ({lim['limit_from']}, best rep, STREAM "
              f"bytes){f'; axpy best {axpy / 1e9:.1f} GB/s' if axpy else ''}. GB/s and "
              "% limit use the median; Adam and LAMB counted at 28 B/param, bf16 "
              "states at 20, q8 states at 16.")


def print_memory(workloads: list[dict]) -> None:
    for wl in workloads:
        if not is_memory(wl):
            continue
        print(f"\n{wl['name']}: {wl['title']} ({wl['note']})")
        print(f"  {'contender':<22} {'first step MB':>14} {'later step MB':>14} "
              f"{'% of params':>11}   (optgen allocates its states at construction, "
              "torch in its first step)")
        for r in wl["rows"]:
            print(f"  {r['contender']:<22} {r['first_step_bytes'] / 2**20:>14.1f} "
                  f"{r['step_bytes'] / 2**20:>14.1f} "
                  f"{100 * r['step_bytes'] / r['param_bytes']:>11.2f}")


def print_goals(gs: list[dict], quick: bool) -> None:
    print("\nGOALS (ratios of medians)"
          + (" -- QUICK run: sizes are below the workloads' names, not the goals' own"
             if quick else ""))
    for g in gs:
        print(goal_line(g))


def mismatches(workloads: list[dict]) -> list[str]:
    """The rows whose weights differ from their workload's reference."""
    return [f"{wl['name']}: {r['contender']}" for wl in workloads for r in wl["rows"]
            if r.get("check") == "MISMATCH"]


# -- plot --------------------------------------------------------------------------------
FAMILIES = (("optgen", "tab:blue"), ("torch fused", "tab:orange"),
            ("torch foreach", "tab:red"), ("numpy", "tab:green"), ("optax", "tab:purple"),
            ("torch.compile", "tab:brown"))


def _color(name: str) -> str:
    return next((c for prefix, c in FAMILIES if name.startswith(prefix)), "tab:gray")


def plot(workloads: list[dict], lim: dict, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels, meds, pcts, colors, seps = [], [], [], [], []
    for wl in (w for w in workloads if not is_memory(w)):
        seps.append(len(labels))
        for r in wl["rows"]:
            labels.append(f"{wl['name']}: {r['contender']}")
            meds.append(r["median_ms"])
            pcts.append(r["pct_limit"])
            colors.append(_color(r["contender"]))
    y = np.arange(len(labels))
    fig, (ax1, ax2) = plt.subplots(1, 2, sharey=True, figsize=(12, 0.19 * len(labels) + 1.6),
                                   gridspec_kw={"width_ratios": [3, 2]})
    ax1.barh(y, meds, color=colors)
    ax1.set_xscale("log")
    ax1.set_xlabel("median time per call, ms (log)")
    ax1.set_yticks(y, labels, fontsize=7)
    ax1.set_ylim(len(labels) - 0.5, -0.5)      # first workload on top, no empty margin
    ax2.barh(y, [p or 0 for p in pcts], color=colors)
    for yi, p in zip(y, pcts):
        if p is not None:
            ax2.text(p + 1, yi, f"{p:.0f}", va="center", fontsize=6)
    ax2.axvline(100, color="black", lw=0.8)
    ax2.set_xlabel(f"% of the limit ({(lim['limit_Bps'] or 0) / 1e9:.1f} GB/s triad/copy)")
    for ax in (ax1, ax2):
        for s in seps[1:]:
            ax.axhline(s - 0.5, color="0.8", lw=0.6)
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)

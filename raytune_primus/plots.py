"""Every picture the project draws, in one style (matplotlib, Agg backend, PNG/SVG/PDF by suffix).

The CLI (``project --gantt``, ``validate --plot``, ``compare --plot``), the end of ``tune``/``compare``
and the HTML report (:mod:`raytune_primus.html_report`) all call these functions, so the same figure
looks the same wherever it appears. Inputs are the project's result objects or their JSON forms
(``summary.json``, ledger rows, ``Projection.to_dict()``); nothing here imports ray.

==========================  =====================================================================
:func:`best_so_far`         best tokens/s/GPU after each trial, one line per searcher run
:func:`compare_curves`      median best-so-far (% of the exhaustive optimum) per searcher, min-max band
:func:`validation_scatter`  projected vs measured, one marker per published row, +-10% / +-30% bands
:func:`gantt`               a simulated pipeline schedule: one row per rank, F/B/W ops
:func:`memory_stages`       memory per pipeline stage, stacked by bucket, against the cap
:func:`time_breakdown`      where one iteration goes: exposed terms, and the hidden (overlapped) comm
:func:`throughput_memory`   every scored trial, tokens/s/GPU vs peak memory, with the Pareto front
:func:`prefilter`           candidates the memory pre-filter rejected (peak vs cap) and the scored ones
==========================  =====================================================================
"""
from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from oracle.units import GIB

DPI = 120
PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974",
           "#64B5CD")
"""One qualitative palette for every figure (seaborn 'deep')."""
OP_COLOURS = {"F": PALETTE[0], "B": PALETTE[1], "W": PALETTE[2], "BW": PALETTE[3]}
"""Pipeline ops: forward blue, input-gradient orange, weight-gradient green, fused backward red."""
MEMORY_BUCKETS = (("params", "parameters", PALETTE[0]), ("grads", "gradients", PALETTE[1]),
                  ("optimizer", "optimizer state", PALETTE[2]), ("activations", "activations", PALETTE[3]),
                  ("other", "other (buffers)", PALETTE[7]))
"""(key, label, colour) of the per-stage memory buckets, bottom to top."""
OFF_SCALE = 4.0
"""A memory cap more than this many times the largest value is named in the legend instead of drawn
(the data would shrink to a sliver under it)."""
_RC = {"font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8, "axes.grid": True,
       "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False, "figure.dpi": DPI,
       "savefig.dpi": DPI, "savefig.bbox": "tight"}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _styled(fn: Callable[..., Path]) -> Callable[..., Path]:
    """Draw ``fn``'s figure under the one style (fonts, grid, spines, dpi are read while drawing)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Path:
        with _plt().rc_context(_RC):
            return fn(*args, **kwargs)
    return wrapper


def _figure(width_in: float, height_in: float, ncols: int = 1):
    plt = _plt()
    fig, ax = plt.subplots(1, ncols, figsize=(width_in, height_in))
    return plt, fig, ax


def _save(plt, fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


# ------------------------------------------------------------------------------------------ search curves
@_styled
def best_so_far(curves: Mapping[str, Sequence[float | None]], path: str | Path, *, title: str = "") -> Path:
    """Best tokens/s/GPU after each counted trial (pre-filter rejections count), one step line per run."""
    plt, fig, ax = _figure(7.5, 4.2)
    for i, (name, ys) in enumerate(curves.items()):
        vals = [math.nan if v is None else float(v) for v in ys]
        ax.step(range(1, len(vals) + 1), vals, where="post", lw=2, color=_colour(i), label=name)
    ax.set_xlabel("trials (pre-filter rejections count)")
    ax.set_ylabel("best tokens/s/GPU so far")
    ax.set_title(title)
    if len(curves) > 1:
        ax.legend(loc="lower right")
    return _save(plt, fig, path)


def tune_best_so_far(summary: Mapping[str, Any], path: str | Path) -> Path:
    """:func:`best_so_far` of a tune summary (``summary['best_so_far']``)."""
    name = f"{summary.get('searcher', '')} seed {summary.get('seed', '')}"
    return best_so_far({name: summary.get("best_so_far") or []}, path,
                       title=f"{summary.get('experiment', '')}: {name} ({summary.get('driver', '')})")


@_styled
def compare_curves(summary: Mapping[str, Any], path: str | Path,
                   curves: Mapping[str, Sequence[Sequence[float | None]]] | None = None) -> Path:
    """Median best-so-far (% of the exhaustive optimum) per searcher vs trials, min-max band shaded.

    ``curves`` (searcher -> one best-so-far list per seed) defaults to ``summary['curves']``.
    """
    from searchers.driver import WITHIN

    curves = curves if curves is not None else summary.get("curves") or {}
    optimum = (summary.get("optimum") or {}).get("tokens_per_s_per_gpu") or 1.0
    budget = int(summary.get("budget") or max((len(r) for runs in curves.values() for r in runs), default=1))
    plt, fig, ax = _figure(7.5, 4.5)
    xs = list(range(1, budget + 1))
    for i, (name, runs) in enumerate(curves.items()):
        grid = []
        for r in runs:
            row = [(v / optimum * 100.0) if v is not None else 0.0 for v in r]
            row += [row[-1] if row else 0.0] * (budget - len(row))
            grid.append(row[:budget])
        if not grid:
            continue
        med = [statistics.median(col) for col in zip(*grid)]
        proposer = (summary.get("searchers") or {}).get(name, {}).get("proposer")
        label = f"{name}: {proposer}" if name == "seed_llm" and proposer else name
        ax.plot(xs, med, label=label, lw=2 if name == "seed_llm" else 1.3, color=_colour(i))
        ax.fill_between(xs, [min(c) for c in zip(*grid)], [max(c) for c in zip(*grid)], alpha=0.12, color=_colour(i))
    ax.axhline(100.0, color="k", lw=0.8, ls="--", label="exhaustive optimum")
    ax.axhline(100.0 * (1 - WITHIN), color="grey", lw=0.6, ls=":", label="within 2%")
    ax.set_xlabel("trials (pre-filter rejections count)")
    ax.set_ylabel("best tokens/s/GPU so far (% of optimum)")
    ax.set_title(f"{summary.get('experiment', '')}: median over {len(summary.get('seeds') or [])} seeds "
                 f"({summary.get('oracle_mode', '')})")
    ax.set_ylim(bottom=max(0.0, ax.get_ylim()[0]))
    ax.legend(loc="lower right")
    return _save(plt, fig, path)


# ------------------------------------------------------------------------------------------ validation
@_styled
def validation_scatter(results: Iterable[Any], path: str | Path) -> Path:
    """Projected vs measured (``oracle.validate`` rows), coloured by group, with +-10% / +-30% bands."""
    done = [r for r in results if r.skipped is None and r.projected is not None]
    plt, fig, axes = _figure(13, 5.5, ncols=2)
    for ax, quantity, label in ((axes[0], "tokens_per_s_per_gpu", "tokens/s/GPU"),
                                (axes[1], "tflops_per_gpu", "TFLOP/s/GPU")):
        rows = [r for r in done if r.quantity == quantity]
        if not rows:
            ax.set_visible(False)
            continue
        for i, g in enumerate(sorted({r.group for r in rows})):
            rs = [r for r in rows if r.group == g]
            ax.scatter([r.measured for r in rs], [r.projected for r in rs], s=28, color=_colour(i),
                       label=(g or "(no group)")[:45], alpha=0.85)
        lo = min(min(r.measured for r in rows), min(r.projected for r in rows)) * 0.8
        hi = max(max(r.measured for r in rows), max(r.projected for r in rows)) * 1.2
        xs = [lo, hi]
        ax.plot(xs, xs, "k-", lw=1)
        for f, style in ((0.1, "--"), (0.3, ":")):
            ax.plot(xs, [x * (1 + f) for x in xs], "k" + style, lw=0.7)
            ax.plot(xs, [x * (1 - f) for x in xs], "k" + style, lw=0.7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel(f"projected {label}")
        ax.set_title(f"{label}: dashed ±10%, dotted ±30%")
        ax.legend(fontsize=6, loc="upper left")
    return _save(plt, fig, path)


@_styled
def calibration_scatter(runs: Sequence[Any], fit: Any, path: str | Path) -> Path:
    """Measured vs projected for the user's runs (``oracle.offset.MeasuredRun``), with the fitted
    offset line projected = k x measured and its prediction band."""
    plt, fig, ax = _figure(6.0, 5.0)
    meas = [r.measured_tokens_per_s_per_gpu for r in runs]
    proj = [r.projected_tokens_per_s_per_gpu for r in runs]
    lo, hi = min(meas + proj) * 0.9, max(meas + proj) * 1.1
    ax.plot([lo, hi], [lo, hi], color="k", lw=0.8, label="projected = measured")
    ax.plot([lo, hi], [lo * fit.k, hi * fit.k], color=PALETTE[3], lw=1.5, label=f"k = {fit.k:.3f} (cv {100 * fit.cv:.1f}%)")
    if fit.k_low is not None:
        ax.fill_between([lo, hi], [lo * fit.k_low, hi * fit.k_low], [lo * fit.k_high, hi * fit.k_high],
                        color=PALETTE[3], alpha=0.12, label=f"{100 * fit.level:.0f}% band of k")
    ax.scatter(meas, proj, color=PALETTE[0], zorder=3)
    for r, x, y in zip(runs, meas, proj):
        ax.annotate(r.tag, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured tokens/s/GPU")
    ax.set_ylabel("projected tokens/s/GPU")
    ax.set_title(f"calibration against {len(runs)} measured run(s)")
    ax.legend(loc="upper left")
    return _save(plt, fig, path)


# ------------------------------------------------------------------------------------------ one projection
@_styled
def gantt(result: Any, path: str | Path, *, width_in: float = 14.0) -> Path:
    """Gantt chart of a simulated pipeline (``oracle.pipeline.PipelineResult``): one row per rank,
    F/B/W coloured, micro-batch ids in the boxes; chunk c > 0 drawn lighter so interleaved/V chunks
    can be told apart; the title carries the schedule, makespan and mean bubble share."""
    from matplotlib.patches import Patch

    span = result.makespan_s if result.makespan_s > 0 else 1.0
    plt, fig, ax = _figure(width_in, 0.55 * result.pp + 1.4)
    min_label_w = span * 0.012
    for r, ops, starts, ends in zip(range(result.pp), result.order, result.start_s, result.end_s):
        for op, s, e in zip(ops, starts, ends):
            alpha = 1.0 if op.chunk == 0 else max(0.35, 1.0 - 0.3 * op.chunk)
            ax.barh(r, e - s, left=s, height=0.8, color=OP_COLOURS[op.kind], alpha=alpha, edgecolor="white",
                    linewidth=0.4)
            if e - s >= min_label_w * max(1, len(str(op.mb))):
                ax.text((s + e) / 2, r, str(op.mb), ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(result.pp))
    ax.set_yticklabels([f"rank {r}" for r in range(result.pp)])
    ax.invert_yaxis()
    ax.set_xlim(0, span)
    ax.set_xlabel("time (s)")
    ax.grid(False)
    approx = " (approximate)" if result.approximate else ""
    ax.set_title(f"{result.schedule}{approx}: pp={result.pp}, vpp={result.vpp}, m={result.num_microbatches}, "
                 f"makespan {result.makespan_s:.4g} s, bubble {100 * result.bubble_fraction:.1f}%")
    kinds = sorted({op.kind for ops in result.order for op in ops}, key="F B W BW".split().index)
    ax.legend(handles=[Patch(color=OP_COLOURS[k], label=k) for k in kinds], loc="upper right", ncol=len(kinds))
    return _save(plt, fig, path)


def _stage_buckets(memory: Any) -> tuple[list[tuple[int, dict[str, float]]], float, int | None]:
    """([(rank, {bucket: GiB})], cap GiB, worst rank) from a MemoryBreakdown or its to_dict() form."""
    if isinstance(memory, Mapping):
        stages = []
        for s in memory.get("stages") or []:
            if "params_gib" in s:
                stages.append((int(s["rank"]), {k: float(s.get(f"{k}_gib") or 0.0) for k, _, _ in MEMORY_BUCKETS}))
        if not stages:  # older summaries: only the worst stage has buckets
            stages = [(int(memory.get("worst_stage") or 0),
                       {k: float(memory.get(f"{k}_gib") or 0.0) for k, _, _ in MEMORY_BUCKETS})]
        return stages, float(memory["cap_gib"]), memory.get("worst_stage")
    stages = [(s.rank, {"params": s.params_bytes / GIB, "grads": s.grads_bytes / GIB,
                        "optimizer": s.optimizer_bytes / GIB, "activations": s.activations_bytes / GIB,
                        "other": s.other_bytes / GIB}) for s in memory.stages]
    return stages, memory.cap_bytes / GIB, memory.worst.rank


@_styled
def memory_stages(memory: Any, path: str | Path, *, title: str = "") -> Path:
    """Per-GPU memory of each pipeline stage (``MemoryBreakdown`` or its JSON), stacked by bucket,
    against the fits cap (dashed); the worst stage, which decides ``fits``, is marked."""
    stages, cap, worst = _stage_buckets(memory)
    plt, fig, ax = _figure(max(5.0, 1.0 + 0.75 * len(stages)), 4.2)
    xs = list(range(len(stages)))
    bottom = [0.0] * len(stages)
    for key, label, colour in MEMORY_BUCKETS:
        vals = [b[key] for _, b in stages]
        if any(vals):
            ax.bar(xs, vals, bottom=bottom, color=colour, label=label, width=0.7)
            bottom = [a + v for a, v in zip(bottom, vals)]
    top = max(bottom) if bottom else 0.0
    cap_shown = cap <= OFF_SCALE * top or top == 0.0
    if cap_shown:
        ax.axhline(cap, color="k", ls="--", lw=1.2, label=f"cap {cap:,.1f} GiB")
    else:  # a tiny model on a big GPU: bars drawn to scale, the cap named but off the axis
        ax.plot([], [], color="k", ls="--", lw=1.2, label=f"cap {cap:,.1f} GiB (off scale: peak is "
                                                          f"{100 * top / cap:.1f}% of it)")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"stage {r}" + (" *" if r == worst and len(stages) > 1 else "") for r, _ in stages])
    for x, total in zip(xs, bottom):
        ax.text(x, total, f"{total:,.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("GiB per GPU")
    ax.set_ylim(0, (max(top, cap) if cap_shown else top) * 1.15 or 1.0)
    ax.set_title(title or "memory per pipeline stage (* = worst stage)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(plt, fig, path)


def _time_terms(breakdown: Any) -> tuple[list[tuple[str, float, float]], float]:
    """([(term, exposed s, hidden s)], sum of exposed) from a TimeBreakdown or its to_dict() form."""
    def val(name: str) -> float:
        return float(_get(breakdown, name, 0.0) or 0.0)

    terms = [("compute (fwd+bwd)", val("compute_s"), 0.0), ("recompute", val("recompute_s"), 0.0),
             ("pipeline bubble", val("bubble_s"), 0.0), ("MoE host sync", val("host_sync_s"), 0.0)]
    for c in _get(breakdown, "comm", ()) or ():
        total, exposed = float(_get(c, "total_s", 0.0)), float(_get(c, "exposed_s", 0.0))
        terms.append((f"comm {_get(c, 'kind', '?')}", exposed, max(0.0, total - exposed)))
    terms += [("optimizer step", val("optimizer_s"), 0.0), ("other", val("other_s"), 0.0)]
    terms = [t for t in terms if t[1] > 0 or t[2] > 0]
    return terms, sum(t[1] for t in terms)


@_styled
def time_breakdown(breakdown: Any, path: str | Path, *, iteration_time_s: float | None = None,
                   title: str = "") -> Path:
    """Where one iteration goes on the critical rank (``TimeBreakdown`` or its JSON): exposed time per
    term (solid) and the communication hidden under compute (hatched, not on the critical path)."""
    terms, exposed = _time_terms(breakdown)
    plt, fig, ax = _figure(8.0, 0.32 * len(terms) + 1.6)
    ys = list(range(len(terms)))
    ax.barh(ys, [t[1] for t in terms], color=[_colour(i) for i in ys], label="exposed (critical path)")
    ax.barh(ys, [t[2] for t in terms], left=[t[1] for t in terms], color="none", edgecolor="grey", hatch="///",
            lw=0.6, label="hidden under compute")
    total = iteration_time_s if iteration_time_s else exposed
    for y, t in zip(ys, terms):
        if t[1] > 0:
            ax.text(t[1] + t[2], y, f" {t[1]:.3g} s ({100 * t[1] / total:.0f}%)", va="center", fontsize=7)
    ax.set_yticks(ys)
    ax.set_yticklabels([t[0] for t in terms])
    ax.invert_yaxis()
    ax.set_xlabel("seconds per iteration")
    ax.set_xlim(0, max((t[1] + t[2] for t in terms), default=1.0) * 1.3)
    ax.set_title(title or (f"time breakdown: iteration {total:.3g} s" if total else "time breakdown"))
    ax.legend(loc="lower right")
    return _save(plt, fig, path)


# ------------------------------------------------------------------------------------------ trials
def _cap_line(ax, rows: Sequence[Mapping[str, Any]], values: Sequence[float]) -> None:
    """The ledger's memory cap as a vertical line, or named in the legend when far off the data."""
    caps = sorted({float(r["cap_gib"]) for r in rows if r.get("cap_gib") is not None})
    if not caps:
        return
    cap, top = caps[-1], max(values, default=0.0)
    if top == 0.0 or cap <= OFF_SCALE * top:
        ax.axvline(cap, color="k", ls="--", lw=1.0, label=f"cap {cap:,.1f} GiB")
        ax.set_xlim(0, max(cap, top) * 1.08)
    else:
        ax.plot([], [], color="k", ls="--", lw=1.0, label=f"cap {cap:,.1f} GiB (off scale)")
        ax.set_xlim(0, top * 1.15)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (memory, throughput) points no other point beats on both (less memory and more
    throughput), ordered by memory."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def _scored(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in rows if r.get("status") == "ok" and r.get("tokens_per_s_per_gpu") is not None
            and r.get("memory_gib") is not None]


@_styled
def throughput_memory(rows: Iterable[Mapping[str, Any]], path: str | Path, *,
                      winner_key: str | None = None, title: str = "") -> Path:
    """Every scored trial (ledger rows): tokens/s/GPU vs projected peak memory, one colour per searcher,
    the Pareto front (no trial has both less memory and more throughput) and the cap."""
    rows = list(rows)
    ok = _scored(rows)
    plt, fig, ax = _figure(7.5, 4.8)
    searchers = sorted({str(r.get("searcher")) for r in ok})
    for i, s in enumerate(searchers):
        rs = [r for r in ok if str(r.get("searcher")) == s]
        ax.scatter([r["memory_gib"] for r in rs], [r["tokens_per_s_per_gpu"] for r in rs], s=22, alpha=0.75,
                   color=_colour(i), label=s)
    if ok:
        pts = [(float(r["memory_gib"]), float(r["tokens_per_s_per_gpu"])) for r in ok]
        front = pareto_front(pts)
        ax.step([pts[i][0] for i in front], [pts[i][1] for i in front], where="post", color="k", lw=1.2,
                label=f"Pareto front ({len(front)})")
        if winner_key:
            w = [r for r in ok if r.get("config_key") == winner_key]
            if w:
                ax.scatter([w[0]["memory_gib"]], [w[0]["tokens_per_s_per_gpu"]], marker="*", s=220,
                           color=PALETTE[8], edgecolor="k", zorder=4, label="winner")
    _cap_line(ax, rows, [float(r["memory_gib"]) for r in ok])
    ax.set_xlabel("projected peak memory per GPU (GiB)")
    ax.set_ylabel("tokens/s/GPU")
    ax.set_title(title or f"{len(ok)} scored trials")
    ax.legend(loc="lower right")
    return _save(plt, fig, path)


@_styled
def prefilter(rows: Iterable[Mapping[str, Any]], path: str | Path, *, title: str = "") -> Path:
    """What the memory pre-filter did (ledger rows): every candidate's projected peak memory against
    the cap, rejected ones (never scored, no GPU time) as red crosses, scored ones as dots, one row per
    searcher; the legend counts illegal proposals too."""
    rows = list(rows)
    cands = [r for r in rows if r.get("status") in ("ok", "rejected") and r.get("memory_gib") is not None]
    searchers = sorted({str(r.get("searcher")) for r in cands}) or ["-"]
    plt, fig, ax = _figure(7.5, 0.45 * len(searchers) + 2.2)
    for status, marker, colour, label in (("ok", "o", PALETTE[0], "scored"),
                                          ("rejected", "x", PALETTE[3], "rejected by the pre-filter")):
        rs = [r for r in cands if r.get("status") == status]
        ys = [searchers.index(str(r.get("searcher"))) + (0.12 if status == "rejected" else -0.12) for r in rs]
        ax.scatter([r["memory_gib"] for r in rs], ys, marker=marker, color=colour, s=26, alpha=0.8,
                   label=f"{label} ({len(rs)})")
    illegal = sum(1 for r in rows if r.get("status") == "illegal")
    _cap_line(ax, rows, [float(r["memory_gib"]) for r in cands])
    ax.set_yticks(range(len(searchers)))
    ax.set_yticklabels(searchers)
    ax.set_ylim(-0.6, len(searchers) - 0.4)
    ax.set_xlabel("projected peak memory per GPU (GiB)")
    ax.set_title(title or f"memory pre-filter: {sum(1 for r in cands if r.get('status') == 'rejected')} rejected "
                          f"at zero GPU cost, {illegal} illegal proposals")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(plt, fig, path)

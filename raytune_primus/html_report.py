"""``raytune-primus report RESULTS_DIR``: one self-contained HTML page for a tune or compare run.

Written automatically at the end of ``tune`` and ``compare`` (next to ``ledger.parquet`` and
``summary.json``) and again on demand. The page embeds every figure as a ``data:`` PNG and loads
nothing else (no script, font or style sheet from anywhere), so it opens offline, attached to an
issue or e-mailed; the PNGs are also written beside it for docs and slides. Figures come from
:mod:`raytune_primus.plots`. Sections (each only when its data exists):

* the winner (tune) or the exhaustive optimum (compare) with its projection and how to launch it
  (Megatron-LM / Primus / TorchTitan exports, :mod:`raytune_primus.export`), and which numerics-changing
  axes the search could change and whether the winner changed them (``summary['numerics']``);
* its memory per pipeline stage against the cap, its pipeline timeline and its time breakdown;
* best-so-far curves (one run, or every searcher over seeds against the optimum);
* every scored trial's throughput vs memory with the Pareto front;
* what the memory pre-filter rejected (and the illegal proposals);
* calibration against measured runs (``calibration.json``, written by ``calibrate-runs --results``).
"""
from __future__ import annotations

import base64
import collections
import html
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from oracle.errors import InvalidConfigError, clip
from oracle.units import GIB

REPORT_NAME = "report.html"
CALIBRATION_NAME = "calibration.json"
REAL_ORACLE_MODES = ("simulate", "benchmark", "both")
"""Runs scored by the projector (their winner can be re-projected for the per-stage pictures)."""
TOP_TRIALS = 10
"""Rows of the best-trials and Pareto tables."""
FIGURES = ("best_so_far.png", "compare.png", "memory_stages.png", "pipeline.png", "time_breakdown.png",
           "throughput_memory.png", "prefilter.png", "calibration.png")
"""The PNGs a report may write beside it."""


def report_files(results_dir: str | Path) -> list[Path]:
    """Everything a report (and a calibration) wrote into ``results_dir``: what ``tune --fresh`` deletes."""
    results = Path(results_dir)
    return [results / n for n in (REPORT_NAME, CALIBRATION_NAME, *FIGURES)]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportFiles:
    """What :func:`write_report` wrote."""

    html: Path
    """The page."""
    plots: tuple[Path, ...]
    """The PNGs (also embedded in the page)."""
    notes: tuple[str, ...] = ()
    """Sections left out, and why (e.g. the winner could not be re-projected)."""


def _esc(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _num(v: Any, nd: int = 0) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:,.{nd}f}"


def _gib(v: Any) -> str:
    """GiB with enough digits for tiny test models and big ones alike."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "-"
    return f"{v:,.1f}" if abs(v) >= 10 else (f"{v:.2f}" if abs(v) >= 0.1 else f"{v:.3f}")


def _table(rows: list[list[Any]], header: list[str], *, cls: str = "") -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td{'' if _numeric(c) else ' class=t'}>{_esc(c)}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f'<div class="scroll"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _numeric(cell: Any) -> bool:
    """Numbers (also '1,234', '12.5%', '0.1 / 70 GiB') are right-aligned; text is left-aligned."""
    text = str(cell).replace(",", "").replace("%", "").replace("/", "").replace(" ", "").strip()
    try:
        float(text)
    except ValueError:
        return text == "-"
    return True


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{_esc(alt)}">'
            f'<figcaption>{_esc(alt)} (<a href="{_esc(path.name)}">{_esc(path.name)}</a>)</figcaption></figure>')


_CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;max-width:1150px;margin:24px auto;padding:0 16px;
color:#222;line-height:1.4}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;border-bottom:1px solid #ddd;padding-bottom:3px;margin-top:28px}
.sub{color:#666;font-size:13px}table{border-collapse:collapse;font-size:12px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 7px;text-align:right}th{background:#f3f3f3}td.t{text-align:left}
.scroll{overflow-x:auto}
figure{margin:10px 0}img{max-width:100%;height:auto;border:1px solid #eee}figcaption{font-size:11px;color:#666}
pre{background:#f6f8fa;border:1px solid #e3e3e3;padding:8px;font-size:11.5px;overflow-x:auto}
.kpi{display:inline-block;margin:4px 18px 4px 0}.kpi b{font-size:18px;display:block}.kpi span{font-size:11px;color:#666}
.fit{color:#1a7f37}.nofit{color:#c62828}.note{font-size:12px;color:#8a6d3b;background:#fcf8e3;padding:4px 8px}
details{margin:6px 0}summary{cursor:pointer;font-size:13px}
"""


# ------------------------------------------------------------------------------------------ inputs
def _read_summary(results: Path) -> dict[str, Any]:
    path = results / "summary.json"
    if not results.is_dir():
        raise InvalidConfigError(f"results directory {str(results)!r} does not exist (run `raytune-primus tune` "
                                 f"or `compare --results DIR` first)")
    if not path.exists():
        raise InvalidConfigError(f"{str(path)!r} does not exist: {str(results)!r} is not the results directory of "
                                 f"a tune or compare run")
    from raytune_primus.summary_file import read_summary
    return read_summary(path)


def _ledger_rows(results: Path, summary: dict[str, Any]) -> list[dict[str, Any]]:
    from searchers.ledger import read_rows

    # the folder's own ledger first: summary.json records where the ledger was written, and a results folder
    # copied or moved elsewhere would otherwise report the original's trials
    path = results / "ledger.parquet"
    if not path.exists() and summary.get("ledger"):
        path = Path(summary["ledger"])
    rows = read_rows(path)
    exp = summary.get("experiment")
    return [r for r in rows if not exp or r.get("experiment") == exp]


def _kind(summary: dict[str, Any]) -> str:
    return "compare" if "searchers" in summary and "optimum" in summary else "tune"


def _reproject(projection: dict[str, Any] | None, training: dict[str, Any] | None,
               experiment: str | None, oracle_mode: str | None) -> tuple[Any, Any, Any, str | None]:
    """(RunConfig, Projection, PipelineResult) of a winner, re-projected in simulate mode for the
    per-stage memory and the timeline; (None, None, None, why) when that is not possible."""
    if oracle_mode not in REAL_ORACLE_MODES:
        return None, None, None, f"the {oracle_mode!r} oracle is not the projector (a test oracle)"
    try:
        from oracle.config import RunConfig
        from oracle.projector import pipeline_result, project

        if projection and isinstance(projection.get("config"), dict):
            run = RunConfig.from_dict(projection["config"])
        elif training and experiment:
            from searchers.experiment import load_experiment
            exp = load_experiment(experiment)
            run = exp.space.baseline.with_training(**training)
        else:
            return None, None, None, "no full configuration in the summary"
        return run, project(run, mode="simulate"), pipeline_result(run), None
    except Exception as exc:  # a synthetic oracle, a card path that moved: the rest of the report stands
        return None, None, None, f"{type(exc).__name__}: {exc}"


def _source(summary: dict[str, Any]) -> str | None:
    """Where the run's experiment loads from: the file it was read from (a derived experiment's
    ``experiment.yaml``), else its name (a bundled one)."""
    f = summary.get("experiment_file")
    return f if f and Path(f).exists() else summary.get("experiment")


# ------------------------------------------------------------------------------------------ sections
def _numerics(out: list[str], summary: dict[str, Any]) -> None:
    """Which numerics-changing axes the search could change, and whether the winner (optimum) did."""
    if summary.get("numerics"):
        from raytune_primus.report import numerics_note
        changed = bool(summary["numerics"].get("changed"))
        out.append(f"<p class='{'note' if changed else 'sub'}'>{_esc(numerics_note(summary['numerics']))}</p>")


def _projection_section(out: list[str], plots: list[Path], results: Path, label: str,
                        proj_dict: dict[str, Any] | None, run: Any, proj: Any, pipe: Any, why: str | None) -> None:
    from raytune_primus import plots as P

    p = proj_dict or (proj.to_dict() if proj is not None else {})
    if p.get("error"):
        out.append(f'<p class="note">projection failed: {_esc(p["error"])}</p>')
    mem = p.get("memory") or {}
    kpis = [("tokens/s/GPU", _num(p.get("tokens_per_s_per_gpu"))), ("TFLOP/s/GPU", _num(p.get("tflops_per_gpu"), 1)),
            ("MFU", "-" if p.get("mfu") is None else f"{100 * p['mfu']:.1f}%"),
            ("iteration", "-" if p.get("iteration_time_s") is None else f"{p['iteration_time_s']:.3f} s"),
            ("peak memory", "-" if mem.get("peak_gib") is None else
             f"{_gib(mem['peak_gib'])} / {_gib(mem.get('cap_gib'))} GiB")]
    out.append("".join(f'<div class="kpi"><b>{_esc(v)}</b><span>{_esc(k)}</span></div>' for k, v in kpis))
    if mem:
        cls, word = ("fit", "fits in memory") if mem.get("fits") else ("nofit", "does NOT fit in memory")
        out.append(f'<p class="{cls}">{word} (oracle mode {_esc(p.get("mode", "?"))})</p>')
    cfg = p.get("config") or {}
    training = cfg.get("training") or {}
    if cfg:
        cl = cfg.get("cluster") or {}
        out.append(f"<p>model <b>{_esc(cfg.get('model'))}</b> on {_esc(cl.get('num_gpus'))} x "
                   f"<b>{_esc(cl.get('hardware'))}</b></p>")
    if training:
        keys = [k for k, v in training.items() if v is not None]
        out.append(_table([[training[k] for k in keys]], keys, cls="cfg"))
    for w in p.get("warnings") or []:
        out.append(f'<p class="note">warning: {_esc(w)}</p>')
    if run is not None:
        _export_block(out, run)
    if why:
        out.append(f'<p class="note">per-stage memory and pipeline timeline not drawn: {_esc(why)}</p>')
    # without a re-projection only a full Projection.to_dict() has the buckets (a synthetic oracle has none)
    memory = proj.memory if proj is not None else (mem if "params_gib" in mem and "cap_gib" in mem else None)
    if memory is not None:
        plots.append(P.memory_stages(memory, results / "memory_stages.png",
                                     title=f"{label}: memory per pipeline stage (* = worst stage, decides fits)"))
        out.append("<h2>Memory per pipeline stage</h2>" + _img(plots[-1], "memory per pipeline stage vs the cap"))
        if proj is not None:
            rows = [[f"stage {s.rank}", _gib(s.params_bytes / GIB), _gib(s.grads_bytes / GIB),
                     _gib(s.optimizer_bytes / GIB), _gib(s.activations_bytes / GIB),
                     _gib(s.other_bytes / GIB), _gib(s.total_bytes / GIB), f"{s.in_flight_microbatches:g}"]
                    for s in proj.memory.stages]
            out.append(_table(rows, ["stage", "params GiB", "grads GiB", "optimizer GiB", "activations GiB",
                                     "other GiB", "total GiB", "micro-batches in flight"]))
    if pipe is not None:
        plots.append(P.gantt(pipe, results / "pipeline.png", width_in=12.0))
        out.append("<h2>Pipeline timeline</h2>" + _img(plots[-1], f"{pipe.schedule} schedule (simulate mode)"))
    bd = p.get("breakdown_s") or (proj.breakdown.to_dict() if proj is not None and proj.breakdown else None)
    if bd:
        plots.append(P.time_breakdown(bd, results / "time_breakdown.png", iteration_time_s=p.get("iteration_time_s"),
                                      title=f"{label}: time per iteration on the critical rank"))
        out.append("<h2>Time breakdown</h2>" + _img(plots[-1], "exposed time per term and hidden communication"))
        rows = [[c["kind"], f"{c['exposed_s']:.4f}", f"{c['total_s']:.4f}", c.get("algorithm", ""),
                 c.get("source", "")] for c in bd.get("comm", [])]
        if rows:
            out.append(_table(rows, ["communication", "exposed s", "total s", "algorithm", "source"]))


def _export_block(out: list[str], run: Any) -> None:
    try:
        from raytune_primus.export import TARGETS, export_run
    except ImportError:
        return
    out.append("<details><summary>launch it: Megatron-LM arguments, Primus overrides, TorchTitan overrides "
               "(<code>raytune-primus export RESULTS_DIR --to TARGET</code>)</summary>")
    for target in TARGETS:
        try:
            text = export_run(run, target)
        except Exception as exc:  # an export bug must not cost the whole report
            text = f"# export failed: {type(exc).__name__}: {exc}"
        out.append(f"<p><b>{_esc(target)}</b></p><pre>{_esc(text)}</pre>")
    out.append("</details>")


def _trials_section(out: list[str], plots: list[Path], results: Path, rows: list[dict[str, Any]],
                    winner_key: str | None) -> None:
    from raytune_primus import plots as P

    scored = [r for r in rows if r.get("status") == "ok" and r.get("tokens_per_s_per_gpu") is not None]
    if scored and any(r.get("memory_gib") is not None for r in scored):
        plots.append(P.throughput_memory(rows, results / "throughput_memory.png", winner_key=winner_key))
        out.append("<h2>Every scored trial: throughput vs memory</h2>"
                   + _img(plots[-1], "tokens/s/GPU vs projected peak memory, Pareto front"))
        pts = [(float(r["memory_gib"]), float(r["tokens_per_s_per_gpu"])) for r in scored
               if r.get("memory_gib") is not None]
        with_mem = [r for r in scored if r.get("memory_gib") is not None]
        front = [with_mem[i] for i in P.pareto_front(pts)]
        out.append("<p>Pareto front (no other trial has both less memory and more throughput):</p>")
        out.append(_table([[r.get("config_key"), _gib(r["memory_gib"]), _num(r["tokens_per_s_per_gpu"]),
                            _config_text(r.get("config"))] for r in front[:TOP_TRIALS * 2]],
                          ["config", "peak GiB", "tokens/s/GPU", "training"]))
    best: dict[str, dict[str, Any]] = {}
    for r in scored:
        k = r.get("config_key") or r.get("config")
        if k not in best or r["tokens_per_s_per_gpu"] > best[k]["tokens_per_s_per_gpu"]:
            best[k] = r
    top = sorted(best.values(), key=lambda r: -r["tokens_per_s_per_gpu"])[:TOP_TRIALS]
    if top:
        out.append(f"<h2>Best {len(top)} configurations</h2>")
        out.append(_table([[r.get("config_key"), r.get("searcher"), _num(r["tokens_per_s_per_gpu"]),
                            _gib(r.get("memory_gib")), "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%",
                            _config_text(r.get("config"))] for r in top],
                          ["config", "searcher", "tokens/s/GPU", "peak GiB", "MFU", "training"]))
    cands = [r for r in rows if r.get("status") in ("ok", "rejected") and r.get("memory_gib") is not None]
    rejected = [r for r in rows if r.get("status") == "rejected"]
    illegal = [r for r in rows if r.get("status") == "illegal"]
    if cands:
        plots.append(P.prefilter(rows, results / "prefilter.png"))
        out.append("<h2>Memory pre-filter</h2>"
                   f"<p>{len(rejected)} candidate(s) rejected before scoring (no GPU time), {len(illegal)} illegal "
                   f"proposal(s), {len(scored)} scored.</p>" + _img(plots[-1], "pre-filter rejections vs the cap"))
    reasons = collections.Counter(_reason_kind(r.get("reason") or "") for r in rejected + illegal)
    if reasons:
        out.append(_table([[k, n] for k, n in reasons.most_common()], ["reason", "count"]))
        detail = [[r.get("status"), r.get("searcher"), _config_text(r.get("config")), r.get("reason") or ""]
                  for r in (rejected + illegal)[:40]]
        out.append("<details><summary>every rejected or illegal candidate</summary>"
                   + _table(detail, ["status", "searcher", "training", "reason"]) + "</details>")


def _reason_kind(reason: str) -> str:
    """A reason without its numbers, so equal causes count together."""
    head = reason.split(";")[0]
    return "".join("#" if c.isdigit() else c for c in head).replace("#.#", "#").replace("##", "#")[:90]


def _config_text(config: Any) -> str:
    if not config:
        return ""
    try:
        d = json.loads(config) if isinstance(config, str) else dict(config)
    except (TypeError, ValueError):
        return str(config)
    keys = ("tp", "pp", "vpp", "ep", "etp", "cp", "mbs", "gbs", "pp_schedule", "recompute", "recompute_num_layers",
            "precision", "fsdp", "moe_a2a_backend")
    return " ".join(f"{k}={d[k]}" for k in keys if d.get(k) not in (None, False))


def _calibration_section(out: list[str], plots: list[Path], results: Path) -> None:
    path = results / CALIBRATION_NAME
    if not path.exists():
        return
    from oracle.offset import MeasuredRun, OffsetFit
    from raytune_primus import plots as P

    try:  # what calibrate-runs wrote: a file edited or cut short is named, not a traceback
        cal = json.loads(path.read_text(encoding="utf-8"))
        runs = [MeasuredRun(**r["run"]) for r in cal["runs"]]
        fit = OffsetFit(**cal["fit"])
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # JSONDecodeError and UnicodeDecodeError too
        raise InvalidConfigError(f"{str(path)!r} is not a calibration as calibrate-runs writes it ({type(exc).__name__}:"
                                 f" {clip(str(exc), 100)}): run calibrate-runs again or move the file aside") from None
    out.append("<h2>Calibration against measured runs</h2>")
    band = "" if fit.k_low is None else f", {100 * fit.level:.0f}% band of k [{fit.k_low:.3f}, {fit.k_high:.3f}]"
    out.append(f"<p>workload offset k = projected / measured = <b>{fit.k:.3f}</b> (median {fit.k_median:.3f}, "
               f"cv {100 * fit.cv:.1f}%, n = {fit.n}{band}); calibrated projection = projected / k.</p>")
    plots.append(P.calibration_scatter(runs, fit, results / "calibration.png"))
    out.append(_img(plots[-1], "projected vs measured with the fitted offset"))
    ra = cal.get("rank_agreement")
    if ra:
        flips = ", ".join(f"{f['a']}-{f['b']} ({100 * f['measured_gap']:.1f}%)" for f in ra["discordant"]) or "none"
        out.append(_table([[ra["n"], _num(ra["spearman"], 3), _num(ra["kendall"], 3),
                            f"{ra['concordant']}/{ra['pairs']}", flips,
                            f"{ra['concordant_above']}/{ra['pairs_above']}",
                            f"{100 * ra['top1_regret']:.1f}% / {100 * ra['topk_regret']:.1f}%"]],
                          ["n", "Spearman", "Kendall", "concordant", "discordant (measured gap)",
                           f"concordant > {100 * ra['threshold']:.0f}%", f"top-1 / top-{ra['top_k']} regret"]))
    if cal.get("calibrated"):
        out.append(_table([[c["tag"], _num(c["projected_tokens_per_s_per_gpu"]), _num(c["tokens_per_s_per_gpu"]),
                            _num(c["low_tokens_per_s_per_gpu"]), _num(c["high_tokens_per_s_per_gpu"])]
                           for c in cal["calibrated"]],
                          ["configuration", "projected", "calibrated", "band low", "band high"]))


# ------------------------------------------------------------------------------------------ the page
def write_report(results_dir: str | Path, summary: dict[str, Any] | None = None) -> ReportFiles:
    """Draw the figures of the run in ``results_dir`` and write ``results_dir/report.html``.

    ``summary`` defaults to ``results_dir/summary.json`` (a caller that has not written it yet passes
    it). Raises InvalidConfigError when the directory holds no run.
    """
    from raytune_primus import plots as P

    results = Path(results_dir)
    summary = summary if summary is not None else _read_summary(results)
    rows = _ledger_rows(results, summary)
    kind = _kind(summary)
    plots: list[Path] = []
    notes: list[str] = []
    out: list[str] = []
    exp = summary.get("experiment", "")
    if kind == "tune":
        title = f"{exp}: {summary.get('searcher', '')} search"
        out.append(f"<h1>{_esc(title)}</h1><p class='sub'>searcher {_esc(summary.get('searcher'))} "
                   f"({_esc(summary.get('proposer', ''))}), seed {_esc(summary.get('seed'))}, budget "
                   f"{_esc(summary.get('budget'))}, driver {_esc(summary.get('driver'))}, oracle "
                   f"{_esc(summary.get('oracle_mode'))}; trials {_esc(summary.get('trials_run'))}, rejected by the "
                   f"pre-filter {_esc(summary.get('rejected'))}, illegal {_esc(summary.get('illegal'))}, failed "
                   f"{_esc(summary.get('failed'))}; wall {_num(summary.get('wall_s'), 1)} s</p>")
        w = summary.get("winner")
        if w:
            out.append(f"<h2>Winner: {_num(w.get('tokens_per_s_per_gpu'))} tokens/s/GPU "
                       f"<span class='sub'>(config {_esc(w.get('key', ''))})</span></h2>")
            _numerics(out, summary)
            run, proj, pipe, why = _reproject(w.get("projection"), w.get("config"), _source(summary),
                                              summary.get("oracle_mode"))
            if why:
                notes.append(why)
            _projection_section(out, plots, results, "winner", w.get("projection"), run, proj, pipe, why)
        else:
            out.append("<h2>No winner</h2><p>no candidate fits in memory.</p>")
        if summary.get("best_so_far"):
            plots.append(P.tune_best_so_far(summary, results / "best_so_far.png"))
            out.append("<h2>Search progress</h2>" + _img(plots[-1], "best tokens/s/GPU after each trial"))
    else:
        opt = summary.get("optimum") or {}
        title = f"{exp}: searcher comparison"
        out.append(f"<h1>{_esc(title)}</h1><p class='sub'>budget {_esc(summary.get('budget'))} trials, seeds "
                   f"{_esc(summary.get('seeds'))}, oracle {_esc(summary.get('oracle_mode'))}, driver "
                   f"{_esc(summary.get('driver', ''))}; space {_esc(summary.get('space_size'))} legal points, "
                   f"{_esc(summary.get('space_fitting'))} fit; wall {_num(summary.get('wall_s'), 1)} s</p>")
        rows_t = [[n, _num(s.get("median_best")), "-" if s.get("median_regret") is None else
                   f"{100 * s['median_regret']:.1f}%", _num(s.get("median_trials_to_2pct")) if
                   s.get("median_trials_to_2pct") is not None else "never", _num(s.get("prefilter_rejections")),
                   s.get("proposer", "")] for n, s in (summary.get("searchers") or {}).items()]
        out.append(_table(rows_t, ["searcher", "median best tok/s/GPU", "median regret", "trials to 2%",
                                   "rejections (median)", "proposer"]))
        if summary.get("curves"):
            plots.append(P.compare_curves(summary, results / "compare.png"))
            out.append("<h2>Best so far per searcher</h2>" + _img(plots[-1], "median best-so-far vs the optimum"))
        if opt.get("config"):
            out.append(f"<h2>Exhaustive optimum: {_num(opt.get('tokens_per_s_per_gpu'))} tokens/s/GPU</h2>")
            _numerics(out, summary)
            run, proj, pipe, why = _reproject(None, opt["config"], _source(summary), summary.get("oracle_mode"))
            if why:
                notes.append(why)
            _projection_section(out, plots, results, "optimum", None, run, proj, pipe, why)
    winner_key = (summary.get("winner") or {}).get("key")
    _trials_section(out, plots, results, rows, winner_key)
    _calibration_section(out, plots, results)
    files = ["summary.json"] + [n for n in ("ledger.parquet", CALIBRATION_NAME) if (results / n).exists()]
    out.append("<h2>Files</h2><p>" + " &middot; ".join(f'<a href="{_esc(n)}">{_esc(n)}</a>' for n in files)
               + "</p>")
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>'
            f"<style>{_CSS}</style></head><body>{''.join(out)}"
            f"<p class='sub'>written by raytune-primus report, {stamp}</p></body></html>\n")
    results.mkdir(parents=True, exist_ok=True)
    target = results / REPORT_NAME
    tmp = target.with_suffix(".html.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(target)
    return ReportFiles(html=target, plots=tuple(plots), notes=tuple(notes))


def attach_report(results_dir: str | Path, summary: dict[str, Any]) -> None:
    """Write the report of a run that just finished and record it in ``summary`` (``plots``,
    ``report``). Never raises: a broken matplotlib costs the pictures, not the run; the error is kept
    in ``summary['plot_error']``."""
    try:
        rep = write_report(results_dir, summary)
    except Exception as exc:
        summary["plots"] = []
        summary["plot_error"] = f"{type(exc).__name__}: {exc}"
        return
    summary["plots"] = [str(p) for p in rep.plots]
    summary["report"] = str(rep.html)

"""The ``report``, ``export`` and ``calibrate-runs`` commands of ``raytune-primus`` (added by ``cli.build_parser``).

None of them imports ray. Bad input raises a PrimusError, which ``cli.main`` prints as one line per
problem with exit code 2.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from oracle.errors import InvalidConfigError

MEASURED_COLUMNS = ("measured_tokens_per_s_per_gpu", "measured")
PROJECTED_COLUMNS = ("projected_tokens_per_s_per_gpu", "projected")
CALIBRATE_TOP = 10
"""``calibrate-runs --results``: the best scored configurations of the run that get a calibrated projection."""


def add_report_commands(sub: Any) -> None:
    """Add ``report``, ``export`` and ``calibrate-runs`` to the ``raytune-primus`` sub-command parser."""
    re = sub.add_parser("report", help="write RESULTS_DIR/report.html: winner, memory, timeline, search, trials",
                        description="Draw the figures of a tune/compare run and write a self-contained HTML page "
                                    "(images embedded, nothing loaded from the network). tune and compare do this "
                                    "at their end; run it again after calibrate-runs --results.")
    re.add_argument("results", metavar="RESULTS_DIR", help="results directory of a tune or compare run")
    re.set_defaults(func=cmd_report)

    ex = sub.add_parser("export", help="print a config (or a run's winner) as Megatron-LM / Primus / TorchTitan options",
                        description="Options the target lacks are listed in a comment block, never dropped.")
    ex.add_argument("config", metavar="CONFIG", help="config YAML/JSON, or a results directory (its winner)")
    ex.add_argument("--to", required=True, choices=["megatron", "primus", "torchtitan"], dest="target",
                    help="the training framework whose options to print")
    ex.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key (repeatable)")
    ex.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    ex.set_defaults(func=cmd_export)

    ca = sub.add_parser("calibrate-runs", help="fit the workload offset k to your measured runs (paper Sec. 4.8)",
                        description="Fit k = projected/measured over measured runs of one workload; print calibrated "
                                    "projections with a band from the spread of k, and rank agreement (Spearman, "
                                    "Kendall, concordance, top-1/top-k regret) when several runs are given.")
    ca.add_argument("csv", nargs="?", help="CSV with measured_tokens_per_s_per_gpu (or measured) and either config "
                                           "(a config path, relative to the CSV) or projected_tokens_per_s_per_gpu; "
                                           "optional tag, and training-key columns that override the config")
    ca.add_argument("--measured", action="append", default=[], metavar="CONFIG=TOKENS",
                    help="a measured run: config path and its tokens/s/GPU (repeatable)")
    ca.add_argument("--config", metavar="BASE", help="config for CSV rows without a config cell")
    ca.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of every projected config (repeatable)")
    ca.add_argument("--mode", default="simulate", choices=["simulate", "benchmark"], help="oracle mode")
    ca.add_argument("--project", action="append", default=[], metavar="CONFIG",
                    help="also print the calibrated projection of this config (repeatable)")
    ca.add_argument("--results", metavar="DIR", help="calibrate the best configurations of a tune/compare run; "
                                                     "writes DIR/calibration.json and refreshes DIR/report.html")
    ca.add_argument("--threshold", type=float, default=None, help="concordance gap (default 0.09, paper Table 21)")
    ca.add_argument("--top-k", type=int, default=3, help="top-k regret (default 3)")
    ca.add_argument("--format", default="table", choices=["table", "json"], help="output format (default table)")
    ca.set_defaults(func=cmd_calibrate_runs)


# ---------------------------------------------------------------------- report / export
def cmd_report(args: argparse.Namespace) -> int:
    from raytune_primus.html_report import write_report

    rep = write_report(args.results)
    for note in rep.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"report written to {rep.html} ({len(rep.plots)} figures)")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from raytune_primus.export import export_run, load_config_or_winner

    text = export_run(load_config_or_winner(args.config, args.set), args.target)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


# ---------------------------------------------------------------------- calibrate-runs
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Row:
    tag: str
    measured: float
    projected: float | None
    run: Any
    """RunConfig to project (None when the projected value was given)."""


def _number(text: str, what: str) -> float:
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise InvalidConfigError(f"{what}={text!r} is not a number (tokens/s/GPU)") from None
    if not v > 0:
        raise InvalidConfigError(f"{what}={text!r} must be a positive number (tokens/s/GPU)")
    return v


def _load_run(path: str | Path, overrides: list[str]) -> Any:
    from oracle.config import RunConfig
    return RunConfig.load(path, overrides)


def _csv_rows(path: Path, base: str | None, overrides: list[str]) -> list[_Row]:
    from oracle.config import TrainingConfig
    if not path.exists():
        raise InvalidConfigError(f"CSV {str(path)!r} does not exist")
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        rows = list(reader)
    mcol = next((c for c in MEASURED_COLUMNS if c in header), None)
    pcol = next((c for c in PROJECTED_COLUMNS if c in header), None)
    if mcol is None:
        raise InvalidConfigError(f"CSV {str(path)!r} needs a measured_tokens_per_s_per_gpu (or measured) column; "
                                 f"header is: {', '.join(header) or '(empty)'}")
    keys = {f.name for f in dataclasses.fields(TrainingConfig)}
    out = []
    for i, r in enumerate(rows, start=2):
        tag = (r.get("tag") or "").strip() or f"row{i}"
        measured = _number((r.get(mcol) or "").strip(), f"{path.name} line {i} {mcol}")
        projected_text = (r.get(pcol) or "").strip() if pcol else ""
        if projected_text:
            out.append(_Row(tag=tag, measured=measured, run=None,
                            projected=_number(projected_text, f"{path.name} line {i} {pcol}")))
            continue
        cell = (r.get("config") or "").strip()
        if not cell and not base:
            raise InvalidConfigError(f"{path.name} line {i} ({tag}): no projected value, no config cell and no "
                                     f"--config BASE to project")
        cfg_path = Path(base) if not cell else (Path(cell) if Path(cell).is_absolute() else path.parent / cell)
        row_overrides = [f"training.{k}={v.strip()}" for k, v in r.items() if k in keys and (v or "").strip()]
        out.append(_Row(tag=tag, measured=measured, projected=None,
                        run=_load_run(cfg_path, overrides + row_overrides)))
    return out


def _flag_rows(flags: list[str], overrides: list[str]) -> list[_Row]:
    out = []
    for f in flags:
        cfg, sep, tokens = f.rpartition("=")
        if not sep or not cfg:
            raise InvalidConfigError(f"--measured {f!r}: expected CONFIG=TOKENS, e.g. run1.yaml=4213")
        out.append(_Row(tag=Path(cfg).stem, measured=_number(tokens, f"--measured {cfg}"), projected=None,
                        run=_load_run(cfg, overrides)))
    return out


def _project(run: Any, mode: str) -> float:
    from oracle.projector import project
    p = project(run, mode=mode)
    if p.tokens_per_s_per_gpu is None:
        raise InvalidConfigError(f"the oracle gave no throughput for config {run.key()} in mode {mode}")
    return float(p.tokens_per_s_per_gpu)


def _workloads(rows: list[_Row]) -> set[tuple]:
    return {(r.run.model_ref or r.run.model.name, r.run.cluster.hardware.name, r.run.cluster.num_gpus,
             r.run.training.seq_len) for r in rows if r.run is not None}


def _results_candidates(results: Path) -> list[tuple[str, float]]:
    """(config key + knobs, projected tokens/s/GPU) of the best scored configurations of a run."""
    from raytune_primus.html_report import _config_text, _read_summary
    from searchers.ledger import read_rows

    summary = _read_summary(results)
    best: dict[str, dict[str, Any]] = {}
    for r in read_rows(results / "ledger.parquet"):
        if r.get("status") != "ok" or r.get("tokens_per_s_per_gpu") is None:
            continue
        k = r.get("config_key") or ""
        if k not in best or r["tokens_per_s_per_gpu"] > best[k]["tokens_per_s_per_gpu"]:
            best[k] = r
    top = sorted(best.values(), key=lambda r: -r["tokens_per_s_per_gpu"])[:CALIBRATE_TOP]
    if not top:
        raise InvalidConfigError(f"{str(results)!r} ({summary.get('experiment', '?')}) has no scored trial to calibrate")
    return [(f"{r['config_key']} {_config_text(r.get('config'))}", float(r["tokens_per_s_per_gpu"])) for r in top]


def cmd_calibrate_runs(args: argparse.Namespace) -> int:
    from oracle.offset import CONCORDANCE_THRESHOLD, MeasuredRun, fit_offset, rank_agreement
    from raytune_primus.report import table

    rows = _csv_rows(Path(args.csv), args.config, args.set) if args.csv else []
    rows += _flag_rows(args.measured, args.set)
    if not rows:
        raise InvalidConfigError("calibrate-runs needs measured runs: a CSV and/or --measured CONFIG=TOKENS")
    runs = [MeasuredRun(tag=r.tag, measured_tokens_per_s_per_gpu=r.measured,
                        projected_tokens_per_s_per_gpu=r.projected if r.projected is not None
                        else _project(r.run, args.mode)) for r in rows]
    workloads = _workloads(rows)
    if len(workloads) > 1:
        print("warning: k is a workload-level offset (paper Sec. 4.8) but these runs span "
              f"{len(workloads)} workloads (model, hardware, GPUs, seq_len): "
              + "; ".join(", ".join(map(str, w)) for w in sorted(workloads, key=str)), file=sys.stderr)
    fit = fit_offset(runs)
    ra = None
    if len(runs) >= 2:
        ra = rank_agreement(runs, threshold=CONCORDANCE_THRESHOLD if args.threshold is None else args.threshold,
                            top_k=args.top_k)
    extra = [(Path(c).stem, _project(_load_run(c, args.set), args.mode)) for c in args.project]
    if args.results:
        extra += _results_candidates(Path(args.results))
    calibrated = [{"tag": tag, **fit.calibrate(p).to_dict()} for tag, p in extra]
    out = {"fit": fit.to_dict(), "rank_agreement": ra.to_dict() if ra else None,
           "runs": [{"run": dataclasses.asdict(r), "k": r.k, **{k: v for k, v in
                     fit.calibrate(r.projected_tokens_per_s_per_gpu).to_dict().items() if k != "projected_tokens_per_s_per_gpu"}}
                    for r in runs],
           "calibrated": calibrated, "mode": args.mode}
    if args.results:
        from raytune_primus.html_report import CALIBRATION_NAME, write_report
        from raytune_primus.jobs import write_json
        write_json(Path(args.results) / CALIBRATION_NAME, out)
        out["report"] = str(write_report(args.results).html)
    if args.format == "json":
        print(json.dumps(out, indent=2))
        return 0
    band = ("one run: no spread, so no band (measure two or more)" if fit.k_low is None else
            f"{100 * fit.level:.0f}% band of k [{fit.k_low:.3f}, {fit.k_high:.3f}]")
    print(f"workload offset k = projected/measured = {fit.k:.3f}  (median {fit.k_median:.3f}, cv {100 * fit.cv:.1f}%, "
          f"range {fit.k_min:.3f}-{fit.k_max:.3f}, n={fit.n}; {band})")
    print()
    print(table([[e["run"]["tag"], f"{e['run']['projected_tokens_per_s_per_gpu']:,.0f}",
                  f"{e['run']['measured_tokens_per_s_per_gpu']:,.0f}", f"{e['k']:.3f}",
                  f"{e['tokens_per_s_per_gpu']:,.0f}",
                  f"{100 * (e['tokens_per_s_per_gpu'] / e['run']['measured_tokens_per_s_per_gpu'] - 1):+.1f}%"]
                 for e in out["runs"]],
                ["run", "projected", "measured", "k", "calibrated", "calibrated err"], "lrrrrr"))
    if ra is not None:
        flips = ", ".join(f"{f.a}-{f.b} ({100 * f.measured_gap:.1f}%)" for f in ra.discordant) or "none"
        rho = "-" if ra.spearman is None else f"{ra.spearman:.3f}"
        tau = "-" if ra.kendall is None else f"{ra.kendall:.3f}"
        print(f"\nrank agreement: Spearman {rho}  Kendall {tau}  concordant {ra.concordant}/{ra.pairs}  "
              f"discordant (measured gap) {flips}")
        print(f"  concordant among pairs > {100 * ra.threshold:.0f}% apart: {ra.concordant_above}/{ra.pairs_above}  "
              f"top-1 regret {100 * ra.top1_regret:.1f}%  top-{ra.top_k} regret {100 * ra.topk_regret:.1f}%  "
              f"max |k - median| {ra.max_k_deviation:.3f} ({ra.max_k_deviation_tag})")
    if calibrated:
        print("\ncalibrated projections (projected / k):")
        print(table([[c["tag"], f"{c['projected_tokens_per_s_per_gpu']:,.0f}", f"{c['tokens_per_s_per_gpu']:,.0f}",
                      "-" if c["low_tokens_per_s_per_gpu"] is None else f"{c['low_tokens_per_s_per_gpu']:,.0f}",
                      "-" if c["high_tokens_per_s_per_gpu"] is None else f"{c['high_tokens_per_s_per_gpu']:,.0f}"]
                     for c in calibrated], ["configuration", "projected", "calibrated", "band low", "band high"],
                    "lrrrr"))
    if args.results:
        print(f"\nwrote {Path(args.results) / 'calibration.json'}; report {out['report']}")
    return 0

"""Experiments as Ray jobs: ``python -m raytune_primus.jobs EXPERIMENT [--compare] [--results DIR]``.

Its arguments are those of ``raytune-primus tune`` and ``compare`` (one definition:
raytune_primus.search_cli). Submitted with ``ray job submit --working-dir . -- python -m
raytune_primus.jobs ...`` it joins the cluster it runs in (the job supervisor sets ``RAY_ADDRESS``);
run by hand it starts an embedded Ray (``--address auto`` joins the cluster running on this machine).
It then runs ``tune`` (Ray Tune trials on oracle actors) or, with ``--compare``,
every searcher over several seeds against the exhaustive optimum (searches and the sweep spread over
the cluster), and writes into the results directory:

=====================  ================================================================================
``ledger.parquet``     every candidate touched (scored, rejected by the pre-filter, illegal, failed)
``summary.json``       tune: the winner's config and projection, trials run, rejected, errored, retried;
                       compare: the issue-4 comparison object
``best_so_far.png``    tune: best tokens/s/GPU after each trial; compare: ``compare.png``, the curves
``report.html``        the self-contained report (raytune_primus.html_report) and its other figures
``tune/``              Ray Tune's experiment state (``Tuner.restore`` resumes from it)
=====================  ================================================================================

The exit status is 0 on success, 1 when every trial errored (Tune reports such a job SUCCEEDED: we do
not), 2 on bad input (one line per problem, no traceback).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from oracle.config import training_defaults
from oracle.errors import InvalidConfigError, PrimusError
from oracle.units import GIB
from raytune_primus.search_args import (add_compare_arguments, add_derive_arguments, add_experiment_argument,
                                        add_run_arguments, add_suite_arguments, add_tune_arguments,
                                        experiment_from_args)

EXIT_OK, EXIT_ALL_ERRORED, EXIT_USAGE = 0, 1, 2


def default_results_dir(experiment_name: str) -> Path:
    return Path("results") / experiment_name


def _json_safe(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {str(k): _json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_json_safe(v) for v in o]
    if hasattr(o, "isoformat"):
        return o.isoformat()
    return o


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_json_safe(obj), indent=2, default=str) + "\n")
    tmp.replace(path)


# ---------------------------------------------------------------------------------- the winner
def winner_projection(exp: Any, training: dict[str, Any] | None, evaluator: Any) -> dict[str, Any] | None:
    """The winner's full projection as JSON (the oracle's ``Projection.to_dict()`` when available)."""
    if not training:
        return None
    from raytune_primus.trainable import build_run

    run = build_run(exp.space.baseline, training)
    try:
        proj = evaluator.score(run)
    except Exception as exc:  # reported, never fatal: the ledger already holds the number
        return {"error": f"{type(exc).__name__}: {exc}"}
    if hasattr(proj, "to_dict"):
        return proj.to_dict()
    mem = proj.memory
    return {"mode": getattr(evaluator, "mode", "?"), "tokens_per_s_per_gpu": proj.tokens_per_s_per_gpu,
            "iteration_time_s": getattr(proj, "iteration_time_s", None), "mfu": getattr(proj, "mfu", None),
            "memory": {"peak_gib": mem.peak_bytes / GIB, "cap_gib": mem.cap_bytes / GIB,
                       "fits": mem.peak_bytes <= mem.cap_bytes}}


def _evaluator_for(exp: Any, evaluator: Any = None) -> Any:
    if evaluator is not None:
        return evaluator
    from searchers.driver import default_evaluator
    return default_evaluator(exp.oracle_mode)


def _connect(connect_timeout_s: float | None) -> dict[str, Any]:
    """init_ray's bound on joining a cluster (its default when None)."""
    return {} if connect_timeout_s is None else {"connect_timeout_s": float(connect_timeout_s)}


def _ray_info(how: str) -> dict[str, Any]:
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return {"connection": how, "nodes": len(nodes),
            "cpus": sum(n["Resources"].get("CPU", 0) for n in nodes),
            "gpus": sum(n["Resources"].get("GPU", 0) for n in nodes)}


# ---------------------------------------------------------------------------------- tune
def tune_experiment(exp: Any, results_dir: str | Path, *, driver: str = "ray", searcher: str | None = None,
                    budget: int | None = None, seed: int | None = None, address: str | None = None,
                    max_concurrent: int | None = None, max_failures: int = 2, benchmark_gpus: int | None = None,
                    evaluator: Any = None, fresh: bool = False, progress: bool = True,
                    timer: Any = None, hook: Any = None, connect_timeout_s: float | None = None) -> dict[str, Any]:
    """Run one search and write ledger.parquet, summary.json and best_so_far.png; return the summary.

    ``driver='ray'`` runs it as Ray Tune trials (joining ``address``, see
    :func:`raytune_primus.runtime.init_ray`); ``'inprocess'`` as the plain loop of
    :func:`searchers.driver.run_search`. An earlier run in ``results_dir`` is resumed (``fresh``
    deletes it first).
    """
    if budget is not None and budget < 1:
        raise InvalidConfigError(f"budget={budget} must be a positive integer (trials)")
    results = Path(results_dir).resolve()
    if fresh:
        from raytune_primus.html_report import report_files
        for p in (results / "ledger.parquet", results / "summary.json", results / "tune", results / "tune_spec.json",
                  *report_files(results)):
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    make_results_folder(results)
    ledger_path = results / "ledger.parquet"
    ev = _evaluator_for(exp, evaluator)
    t0 = time.perf_counter()
    ray_info = None
    if driver == "inprocess":
        from searchers.driver import run_search
        result = run_search(exp, searcher, budget, seed, ledger_path, evaluator=ev)
    elif driver == "ray":
        from raytune_primus.runtime import init_ray
        from raytune_primus.tuner import run_tune

        how = init_ray(address, **_connect(connect_timeout_s))
        result = run_tune(exp, results, searcher=searcher, budget=budget, seed=seed, evaluator=ev,
                          max_concurrent=max_concurrent, max_failures=max_failures, benchmark_gpus=benchmark_gpus,
                          timer=timer, progress=progress, hook=hook)
        ray_info = _ray_info(how)
    else:
        raise InvalidConfigError(f"driver={driver!r} is not one of ray | inprocess")
    summary: dict[str, Any] = {**result.summary(), "ray": ray_info}  # the same keys whichever driver ran it
    summary["experiment_file"] = exp.source or None
    summary["numerics"] = exp.space.numerics((summary.get("winner") or {}).get("config"))
    summary["software"] = exp.space.software()
    if summary.get("winner"):
        summary["winner"]["projection"] = winner_projection(exp, summary["winner"]["config"], ev)
    summary["ledger"] = str(ledger_path)
    summary["wall_s"] = time.perf_counter() - t0
    summary["ok"] = not (summary.get("errored", 0) and summary.get("errored") >= summary.get("tune_trials", 0))
    from raytune_primus.html_report import attach_report
    attach_report(results, summary)  # best_so_far.png, the other figures and report.html
    summary["summary"] = str(results / "summary.json")
    write_json(results / "summary.json", summary)
    return _json_safe(summary)


WINNER_KEYS = ("seq_len", "gbs", "mbs", "tp", "pp", "vpp", "cp", "ep", "etp", "precision", "pp_schedule", "recompute")
"""The winner's training keys the tune summary prints whatever their values (the others where not at their default)."""


def make_results_folder(path: Path) -> Path:
    """``path`` made a folder (with its parents) for a run's ledger, summary and report; a clear error where a file
    stands there."""
    if path.exists() and not path.is_dir():
        raise InvalidConfigError(f"results folder {str(path)!r} is a file: give a folder (made if missing), or move "
                                 f"the file")
    path.mkdir(parents=True, exist_ok=True)
    return path


def format_tune_summary(s: dict[str, Any]) -> str:
    """The tune summary for people: counts, the winner with its projection, where the files are."""
    lines = [f"experiment {s['experiment']}: searcher {s['searcher']} ({s.get('proposer', '')}), seed {s['seed']}, "
             f"budget {s['budget']}, driver {s['driver']}, oracle {s.get('oracle_mode', '?')}",
             f"trials {s['trials_run']} (rejected by the pre-filter {s['rejected']}, failed {s['failed']}), "
             f"illegal proposals {s['illegal']}, Tune errors {s.get('errored', 0)}, retries {s.get('retries', 0)}"
             + (f", resumed {s['resumed']}" if s.get("resumed") else "")]
    if s.get("proposer_trials"):
        lines.append("trials by proposer: " + ", ".join(f"{k} {v}" for k, v in s["proposer_trials"].items())
                     + ("; budget spent" if s.get("budget_spent") else "; budget NOT spent (nothing left to propose)"))
    w = s.get("winner")
    if not w:
        lines.append("no candidate fits in memory: no winner")
    else:
        lines.append(f"winner: {w['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU  (config {w.get('key', '')})")
        t = w["config"]
        defaults = training_defaults()
        shown = [k for k, v in t.items() if v is not None and (k in WINNER_KEYS or k not in defaults or v != defaults[k])]
        rest = sum(1 for v in t.values() if v is not None) - len(shown)
        lines.append("  " + " ".join(f"{k}={t[k]}" for k in shown)
                     + (f"  (the other {rest} training keys at their defaults: summary.json lists every key)" if rest else ""))
        proj = w.get("projection") or {}
        if s.get("numerics"):
            from raytune_primus.report import numerics_note
            lines.append("  " + numerics_note(s["numerics"]))
        if (s.get("software") or {}).get("more"):
            lines.append("  software settings held at the experiment's: --allow software also searches "
                         + ", ".join(s["software"]["more"]))
        if "error" in proj:
            lines.append(f"  projection failed: {proj['error']}")
        elif proj:
            mem = proj.get("memory") or {}
            peak = mem.get("peak_gib", mem["peak_bytes"] / GIB if "peak_bytes" in mem else None)
            cap = mem.get("cap_gib", mem["cap_bytes"] / GIB if "cap_bytes" in mem else None)
            extra = []
            if peak is not None:
                extra.append(f"memory {peak:,.1f} GiB" + (f" of {cap:,.1f}" if cap is not None else ""))
            if proj.get("mfu") is not None:
                extra.append(f"MFU {100 * proj['mfu']:.1f}%")
            if proj.get("iteration_time_s") is not None:
                extra.append(f"iteration {proj['iteration_time_s']:.3f} s")
            if extra:
                lines.append("  " + "   ".join(extra))
    lines.append(f"ledger: {s['ledger']}")
    lines.append(f"summary: {s.get('summary', '')}")
    if s.get("report"):
        lines.append(f"report: {s['report']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- compare
def compare_experiment(exp: Any, results_dir: str | Path | None, *, driver: str = "inprocess", budget: int = 30,
                       seeds: int = 5, searchers: list[str] | None = None, plot: str | Path | None = None,
                       address: str | None = None, evaluator: Any = None,
                       connect_timeout_s: float | None = None) -> dict[str, Any]:
    """Compare searchers (issue 4) in-process or spread over Ray; write ledger/summary/plot when asked."""
    results = Path(results_dir) if results_dir is not None else None
    ledger = None
    if results is not None:
        make_results_folder(results)
        ledger = results / "ledger.parquet"
    ev = _evaluator_for(exp, evaluator)
    if driver == "inprocess":
        from searchers.driver import compare
        summary = compare(exp, budget, seeds, searchers, evaluator=ev, ledger_path=ledger)
        summary["driver"] = "inprocess"
    elif driver == "ray":
        from raytune_primus.runtime import init_ray
        from raytune_primus.tuner import compare_on_ray
        how = init_ray(address, **_connect(connect_timeout_s))
        summary = compare_on_ray(exp, budget, seeds, searchers, evaluator=ev, ledger_path=ledger)
        summary["driver"] = "ray"
        summary["ray"] = _ray_info(how)
    else:
        raise InvalidConfigError(f"driver={driver!r} is not one of inprocess | ray")
    summary["experiment_file"] = exp.source or None
    summary["numerics"] = exp.space.numerics((summary.get("optimum") or {}).get("config"))
    summary["software"] = exp.space.software()
    if plot is not None:
        from raytune_primus.plots import compare_curves
        summary["plot"] = str(compare_curves(summary, plot))
    if results is not None:
        summary["ledger"] = str(ledger)
        from raytune_primus.html_report import attach_report
        attach_report(results, summary)  # compare.png, the other figures and report.html
        write_json(results / "summary.json", summary)
    return _json_safe(summary)


# ---------------------------------------------------------------------------------- the commands
def run_tune_command(args: argparse.Namespace, *, results_default: bool = True) -> tuple[int, dict[str, Any]]:
    """Run ``tune`` as parsed; (exit status, summary). Exit 1 when every Tune trial errored."""
    exp = experiment_from_args(args, results=lambda name: args.results or default_results_dir(name))
    results = Path(args.results) if args.results else default_results_dir(exp.name)
    summary = tune_experiment(exp, results, driver=args.driver, searcher=args.searcher, budget=args.budget,
                              seed=args.seed, address=args.address, max_concurrent=args.max_concurrent,
                              max_failures=args.max_failures, benchmark_gpus=args.benchmark_gpus,
                              fresh=args.fresh, progress=not args.quiet, connect_timeout_s=args.connect_timeout)
    if args.format == "json":
        print(json.dumps(summary, indent=2, default=str))
    else:
        print(format_tune_summary(summary))
        table = _projection_table(exp, summary)
        if table:
            print()
            print(table)
    if not summary.get("ok", True):
        print(f"error: all {summary.get('tune_trials', 0)} Tune trials errored (see {results / 'tune'})",
              file=sys.stderr)
        return 1, summary
    return 0, summary


def _projection_table(exp, summary: dict[str, Any]) -> str | None:
    """The winner's projection table (real oracle modes only; the synthetic one has no table)."""
    w = summary.get("winner")
    if not w or exp.oracle_mode not in ("simulate", "benchmark", "both"):
        return None
    import dataclasses

    from oracle.projector import project
    from raytune_primus.report import projection_table
    run = dataclasses.replace(exp.space.baseline, training=exp.space.baseline.training.replace(**w["config"]))
    try:
        return projection_table(project(run, mode="simulate" if exp.oracle_mode != "benchmark" else "benchmark"))
    except PrimusError as exc:  # the search result stands; say why its table is missing
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"(no projection table for the winner: {type(exc).__name__}: {first})"


def run_compare_command(args: argparse.Namespace, *, results: Path | None = None) -> tuple[int, dict[str, Any]]:
    """Run ``compare`` as parsed (``results`` overrides --results); (exit status, summary)."""
    if results is None and args.results:
        results = Path(args.results)
    exp = experiment_from_args(args, results=lambda name: results, command="compare")
    if args.searchers:
        from searchers.base import available
        names = available()
        bad = [s for s in args.searchers if s not in names]
        if bad:
            raise InvalidConfigError([f"--searchers: unknown searcher {s!r}; valid: {', '.join(names)}" for s in bad])
    seeds: int | list[int] = list(args.seed_list) if args.seed_list else args.seeds
    summary = compare_experiment(exp, results, driver=args.driver, budget=args.budget or 30, seeds=seeds,
                                 searchers=args.searchers, plot=args.plot, address=args.address,
                                 connect_timeout_s=args.connect_timeout)
    if args.format == "json":
        json.dump(summary, sys.stdout, indent=2, default=str)
        print()
    else:
        from searchers.driver import format_table
        print(format_table(summary))
        if args.plot:
            print(f"\nplot written to {args.plot}")
        if results is not None:
            print(f"ledger: {(results / 'ledger.parquet').resolve()}\nsummary: {(results / 'summary.json').resolve()}")
    return 0, summary


def run_suite_command(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """``compare --suite``: every searcher on every suite experiment; one table (or JSON with compare's keys
    per experiment). The optima come from the on-disk cache (searchers.suite.DEFAULT_OPTIMA_CACHE)."""
    from searchers.suite import SUITES, format_suite_table, run_suite

    if args.experiment:
        raise InvalidConfigError(f"--suite takes no experiment argument (got {args.experiment!r}); "
                                 f"use --experiments NAME... to choose a subset")
    if args.suite not in SUITES:  # e.g. `--suite EXPERIMENT`: the experiment was read as the suite's name
        raise InvalidConfigError(f"--suite takes a suite name ({', '.join(SUITES)}), not {args.suite!r}; it takes no "
                                 f"experiment argument: use --experiments NAME... to choose a subset")
    if args.plot:
        raise InvalidConfigError("--plot draws one experiment's curves; it does not apply with --suite")
    derive = [f"--{f.replace('_', '-')}" for f in ("model", "hardware", "num_gpus", "seq_len", "gbs", "precision", "set",
                                                   "allow") if getattr(args, f, None)]
    if derive:
        raise InvalidConfigError(f"{', '.join(derive)} derive one experiment; they do not apply with --suite")
    if args.searchers:
        from searchers.base import available
        names = available()
        bad = [s for s in args.searchers if s not in names]
        if bad:
            raise InvalidConfigError([f"--searchers: unknown searcher {s!r}; valid: {', '.join(names)}" for s in bad])
    seeds: int | list[int] = list(args.seed_list) if args.seed_list else args.seeds
    if args.driver == "ray":
        from raytune_primus.runtime import init_ray
        from raytune_primus.tuner import compare_on_ray
        init_ray(args.address, **_connect(args.connect_timeout))

        def compare_fn(exp, budget, seeds, searchers, *, evaluator, optimum):
            return compare_on_ray(exp, budget, seeds, searchers, evaluator=evaluator, optimum=optimum)
    else:
        from searchers.driver import compare as compare_fn

    def say(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    summary = run_suite(compare_fn, experiments=args.experiments, suite=args.suite, budget=args.budget or 30,
                        seeds=seeds, searchers=args.searchers, progress=say)
    summary["driver"] = args.driver
    if args.results:
        out = make_results_folder(Path(args.results))
        write_json(out / "suite.json", summary)
    if args.format == "json":
        json.dump(_json_safe(summary), sys.stdout, indent=2, default=str)
        print()
    else:
        print(format_suite_table(summary))
    return 0, summary


# ---------------------------------------------------------------------------------- entry point
def build_parser() -> argparse.ArgumentParser:
    """The job's arguments: those of ``raytune-primus tune`` and ``compare`` (one definition, in
    raytune_primus.search_args) plus ``--compare``; the driver is always Ray."""
    p = argparse.ArgumentParser(prog="python -m raytune_primus.jobs", description=__doc__.splitlines()[0])
    add_experiment_argument(p, suite=True)
    p.add_argument("--compare", action="store_true", help="compare searchers instead of running one")
    add_run_arguments(p, driver=False)
    add_derive_arguments(p)
    add_tune_arguments(p)
    add_compare_arguments(p)
    add_suite_arguments(p)
    p.set_defaults(driver="ray")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from raytune_primus.runtime import apply_ray_environment

        apply_ray_environment()
        if args.suite:  # every suite experiment; results (suite.json) only where --results says
            return run_suite_command(args)[0]
        exp = experiment_from_args(args, command="compare" if args.compare else "tune")  # derived again below
        results = Path(args.results) if args.results else default_results_dir(exp.name)
        if not results.is_absolute() and "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ:
            print(f"note: the results go to {results.resolve()}, inside this job's copy of the working directory; "
                  f"pass an absolute --results path to keep them", file=sys.stderr)
        args.results = str(results)
        if args.compare:
            return run_compare_command(args, results=results)[0]
        code, _ = run_tune_command(args)
        return EXIT_ALL_ERRORED if code else EXIT_OK
    except PrimusError as exc:
        for line in str(exc).splitlines() or [type(exc).__name__]:
            print(f"error: {line}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())

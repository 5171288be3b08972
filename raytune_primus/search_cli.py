"""The ``tune`` and ``compare`` commands of ``raytune-primus`` (added by ``cli.build_parser``).

Ray is imported only when a command runs with ``--driver ray``. Bad input (a missing experiment
file, a budget of 0, an unknown searcher) raises a PrimusError, which ``cli.main`` prints as one
line per problem with exit code 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from oracle.errors import InvalidConfigError


def _positive(name: str):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {text!r}") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {v}")
        return v
    return parse


def _seconds(name: str):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = float("nan")
        if not (v > 0 and v < float("inf")):
            raise argparse.ArgumentTypeError(f"{name} must be a positive number of seconds, got {text!r}")
        return v
    return parse


def add_search_commands(sub: Any) -> None:
    """Add ``tune`` and ``compare`` to the ``raytune-primus`` sub-command parser."""
    tu = sub.add_parser("tune", help="run one searcher on an experiment and print the winner",
                        description="Run one searcher on an experiment (a bundled name or a YAML path) behind "
                                    "the memory pre-filter; print the winner with its projection and the ledger.")
    tu.add_argument("experiment", help="experiment YAML, or the name of a bundled one (experiments/NAME.yaml)")
    tu.add_argument("--budget", type=_positive("--budget"), help="trials (default: the experiment's)")
    tu.add_argument("--seed", type=int, help="searcher seed (default: the experiment's)")
    tu.add_argument("--searcher", help="seed_llm | tpe | gp | random | grid (default: the experiment's)")
    tu.add_argument("--driver", default="ray", choices=["ray", "inprocess"],
                    help="ray: trials as Ray Tune trials on oracle actors (default); inprocess: a plain loop")
    tu.add_argument("--results", metavar="DIR", help="results directory (default results/EXPERIMENT)")
    tu.add_argument("--format", default="table", choices=["table", "json"])
    tu.add_argument("--address", help="Ray cluster to join (default: an embedded local Ray; 'auto' = the "
                                      "cluster running on this machine)")
    tu.add_argument("--connect-timeout", type=_seconds("--connect-timeout"), default=60.0, metavar="S",
                    help="give up joining the cluster named by --address after S seconds (default 60)")
    tu.add_argument("--max-concurrent", type=_positive("--max-concurrent"),
                    help="concurrent trials (default: 1, so the sequence equals the in-process driver's)")
    tu.add_argument("--benchmark-gpus", type=_positive("--benchmark-gpus"),
                    help="benchmark mode: GPUs each trial holds")
    tu.add_argument("--fresh", action="store_true", help="ignore (delete) an earlier run in the results directory")
    tu.add_argument("--quiet", action="store_true", help="no progress lines")
    tu.set_defaults(func=cmd_tune)

    co = sub.add_parser("compare", help="run several searchers over several seeds against the exhaustive optimum")
    co.add_argument("experiment")
    co.add_argument("--budget", type=_positive("--budget"), default=30)
    co.add_argument("--seeds", type=_positive("--seeds"), default=5)
    co.add_argument("--searchers", nargs="+", metavar="NAME", help="default: seed_llm tpe gp random grid")
    co.add_argument("--format", default="table", choices=["table", "json"])
    co.add_argument("--plot", metavar="FILE.png", help="best-so-far curves")
    co.add_argument("--driver", default="inprocess", choices=["inprocess", "ray"],
                    help="ray: searches and the exhaustive sweep spread over a Ray cluster")
    co.add_argument("--results", metavar="DIR", help="also write DIR/ledger.parquet and DIR/summary.json")
    co.add_argument("--address", help="Ray cluster to join with --driver ray (default: embedded)")
    co.add_argument("--connect-timeout", type=_seconds("--connect-timeout"), default=60.0, metavar="S",
                    help="give up joining the cluster named by --address after S seconds (default 60)")
    co.set_defaults(func=cmd_compare)


def _load(name: str):
    from searchers.experiment import load_experiment

    return load_experiment(name)


def cmd_tune(args: argparse.Namespace) -> int:
    from raytune_primus.jobs import default_results_dir, format_tune_summary, tune_experiment

    exp = _load(args.experiment)
    results = Path(args.results) if args.results else default_results_dir(exp.name)
    summary = tune_experiment(exp, results, driver=args.driver, searcher=args.searcher, budget=args.budget,
                              seed=args.seed, address=args.address or "local", max_concurrent=args.max_concurrent,
                              benchmark_gpus=args.benchmark_gpus, fresh=args.fresh,
                              progress=not args.quiet, connect_timeout_s=args.connect_timeout)
    if args.format == "json":
        print(json.dumps(summary, indent=2, default=str))
    else:
        print(format_tune_summary(summary))
        table = _projection_table(exp, summary)
        if table:
            print()
            print(table)
    return 0 if summary.get("ok", True) else 1


def _projection_table(exp, summary: dict[str, Any]) -> str | None:
    """The winner's projection table (real oracle modes only; the synthetic one has no table)."""
    w = summary.get("winner")
    if not w or exp.oracle_mode not in ("simulate", "benchmark", "both"):
        return None
    import dataclasses

    from oracle.errors import PrimusError
    from oracle.projector import project
    from raytune_primus.report import projection_table
    run = dataclasses.replace(exp.space.baseline, training=exp.space.baseline.training.replace(**w["config"]))
    try:
        return projection_table(project(run, mode="simulate" if exp.oracle_mode != "benchmark" else "benchmark"))
    except PrimusError as exc:  # the search result stands; say why its table is missing
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"(no projection table for the winner: {type(exc).__name__}: {first})"


def cmd_compare(args: argparse.Namespace) -> int:
    from raytune_primus.jobs import compare_experiment

    exp = _load(args.experiment)
    if args.searchers:
        from searchers.base import available
        names = available()
        bad = [s for s in args.searchers if s not in names]
        if bad:
            raise InvalidConfigError([f"--searchers: unknown searcher {s!r}; valid: {', '.join(names)}" for s in bad])
    summary = compare_experiment(exp, Path(args.results) if args.results else None, driver=args.driver,
                                 budget=args.budget, seeds=args.seeds, searchers=args.searchers, plot=args.plot,
                                 address=args.address or "local", connect_timeout_s=args.connect_timeout)
    if args.format == "json":
        json.dump(summary, sys.stdout, indent=2, default=str)
        print()
    else:
        from searchers.driver import format_table
        print(format_table(summary))
        if args.plot:
            print(f"\nplot written to {args.plot}")
    return 0

"""The search commands, defined once: ``raytune-primus tune|compare|experiments`` and the Ray job entry
point ``python -m raytune_primus.jobs`` build their arguments from the same functions below and run
the same :func:`run_tune_command` / :func:`run_compare_command`, so the two cannot drift.

Defaults that matter: ``--driver ray`` for both commands; the Ray cluster is ``--address``, else
``RAY_ADDRESS`` (what ``ray job submit`` sets for a job), else an embedded local Ray. Ray is imported
only when a command runs with ``--driver ray``. Bad input (a missing experiment file, a budget of 0,
an unknown searcher) raises a PrimusError or an argparse error: one line per problem, exit code 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from oracle.errors import InvalidConfigError

DRIVERS = ("ray", "inprocess")
DEFAULT_DRIVER = "ray"


def _integer(name: str, least: int):
    what = "a positive integer" if least == 1 else f"an integer >= {least}" if least else "a non-negative integer"

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be {what}, got {text!r}") from None
        if v < least:
            raise argparse.ArgumentTypeError(f"{name} must be {what}, got {v}")
        return v
    return parse


def _positive(name: str):
    return _integer(name, 1)


def _non_negative(name: str):
    return _integer(name, 0)


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


def _searcher_names() -> str:
    from searchers.base import available
    return " | ".join(available())


# ---------------------------------------------------------------------------------- the arguments, once
def add_experiment_argument(p: argparse.ArgumentParser, *, optional: bool = False) -> None:
    p.add_argument("experiment", nargs="?" if optional else None,
                   help="experiment YAML, or the name of a bundled one (raytune-primus experiments list)"
                        + ("; omit with --suite" if optional else ""))


def add_run_arguments(p: argparse.ArgumentParser, *, driver: bool = True) -> None:
    """Where and how a search runs (tune and compare alike)."""
    if driver:
        p.add_argument("--driver", default=DEFAULT_DRIVER, choices=DRIVERS,
                       help="ray: trials on a Ray cluster (default); inprocess: a plain loop in this process")
    p.add_argument("--results", metavar="DIR",
                   help="results directory: ledger.parquet, summary.json, report.html (tune default: "
                        "results/EXPERIMENT; compare: none unless given)")
    p.add_argument("--address", help="Ray cluster to join: host:port, ray://host:port, 'auto' (the one running "
                                     "on this machine) or 'local' (embedded); default: RAY_ADDRESS, else embedded")
    p.add_argument("--connect-timeout", type=_seconds("--connect-timeout"), default=60.0, metavar="S",
                   help="give up joining the cluster after S seconds (default 60)")
    p.add_argument("--budget", type=_positive("--budget"), metavar="N",
                   help="trials per search (default: the experiment's; compare: 30)")
    p.add_argument("--format", default="table", choices=["table", "json"], help="output format (default table)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def add_tune_arguments(p: argparse.ArgumentParser) -> None:
    """One searcher, one seed."""
    p.add_argument("--searcher", metavar="NAME", help=f"{_searcher_names()} (default: the experiment's)")
    p.add_argument("--seed", type=int, help="the searcher's seed, a value (default: the experiment's)")
    p.add_argument("--max-concurrent", type=_positive("--max-concurrent"), metavar="N",
                   help="ray: concurrent trials (default 1, so the sequence equals the in-process driver's)")
    p.add_argument("--max-failures", type=_non_negative("--max-failures"), default=2, metavar="N",
                   help="ray: retries of a trial whose worker crashed (default 2)")
    p.add_argument("--benchmark-gpus", type=_positive("--benchmark-gpus"), metavar="N",
                   help="benchmark mode: GPUs each trial holds")
    p.add_argument("--fresh", action="store_true", help="delete an earlier run in the results directory first")


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    """Several searchers over several seeds."""
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=_positive("--seeds"), default=5, metavar="N",
                       help="how many seeds per searcher: 0..N-1 (default 5)")
    seeds.add_argument("--seed-list", type=int, nargs="+", metavar="SEED",
                       help="these seeds per searcher instead of 0..N-1")
    p.add_argument("--searchers", nargs="+", metavar="NAME",
                   help=f"searchers to compare, of {_searcher_names()} (default: seed_llm tpe gp random grid)")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the best-so-far curves here")


def add_suite_arguments(p: argparse.ArgumentParser) -> None:
    """``compare --suite``: every searcher on every suite experiment (searchers.suite)."""
    p.add_argument("--suite", action="store_true",
                   help="compare on every experiment of the suite (searchers.suite.SUITE, 8 to 1,024 GPUs) and print "
                        "one table; the optima are computed once and cached under results/optima")
    p.add_argument("--experiments", nargs="+", metavar="NAME",
                   help="--suite: only these experiments (bundled names or YAML paths), in this order")


def add_search_commands(sub: Any) -> None:
    """Add ``tune``, ``compare`` and ``experiments`` to the ``raytune-primus`` sub-command parser."""
    commands = (
        ("tune", "run one searcher on an experiment and print the winner",
         "Run one searcher on an experiment (a bundled name or a YAML path) behind the memory pre-filter; print "
         "the winner with its projection and the ledger.", add_tune_arguments, cmd_tune),
        ("compare", "run several searchers over several seeds against the exhaustive optimum",
         "Run every searcher on equal budgets over several seeds and compare them with the exhaustive optimum of "
         "the space (paper Sec. 5); with --suite, on every experiment of the suite.", add_compare_arguments,
         cmd_compare))
    for name, short, description, add_own, func in commands:
        p = sub.add_parser(name, help=short, description=description)
        add_experiment_argument(p, optional=name == "compare")
        add_run_arguments(p)
        add_own(p)
        if name == "compare":
            add_suite_arguments(p)
        p.set_defaults(func=func)

    ex = sub.add_parser("experiments", help="list the bundled experiments, or show one",
                        description="List the bundled experiment specs (experiments/*.yaml), or show one: its "
                                    "model, cluster, baseline, searched axes and searcher.")
    ex.add_argument("action", choices=["list", "show"], help="list: every bundled spec; show: one spec")
    ex.add_argument("name", nargs="?", help="show: a bundled experiment name or a YAML path")
    ex.add_argument("--format", default="table", choices=["table", "json"], help="output format (default table)")
    ex.set_defaults(func=cmd_experiments)


def build_job_parser() -> argparse.ArgumentParser:
    """``python -m raytune_primus.jobs``: tune (or, with --compare, compare) on Ray, same arguments."""
    from raytune_primus import jobs
    p = argparse.ArgumentParser(prog="python -m raytune_primus.jobs", description=jobs.__doc__.splitlines()[0])
    add_experiment_argument(p, optional=True)
    p.add_argument("--compare", action="store_true", help="compare searchers instead of running one")
    add_run_arguments(p, driver=False)
    add_tune_arguments(p)
    add_compare_arguments(p)
    add_suite_arguments(p)
    p.set_defaults(driver="ray")
    return p


# ---------------------------------------------------------------------------------- running them
def _load(name: str):
    from searchers.experiment import load_experiment

    return load_experiment(name)


def run_tune_command(args: argparse.Namespace, *, results_default: bool = True) -> tuple[int, dict[str, Any]]:
    """Run ``tune`` as parsed; (exit status, summary). Exit 1 when every Tune trial errored."""
    from raytune_primus.jobs import default_results_dir, format_tune_summary, tune_experiment

    exp = _load(args.experiment)
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


def cmd_tune(args: argparse.Namespace) -> int:
    return run_tune_command(args)[0]


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


def run_compare_command(args: argparse.Namespace, *, results: Path | None = None) -> tuple[int, dict[str, Any]]:
    """Run ``compare`` as parsed (``results`` overrides --results); (exit status, summary)."""
    from raytune_primus.jobs import compare_experiment

    if getattr(args, "suite", False):
        return run_suite_command(args)
    if getattr(args, "experiments", None):
        raise InvalidConfigError("--experiments only applies with --suite")
    if not args.experiment:
        raise InvalidConfigError("compare needs an experiment (a bundled name or a YAML path), or --suite")
    exp = _load(args.experiment)
    if args.searchers:
        from searchers.base import available
        names = available()
        bad = [s for s in args.searchers if s not in names]
        if bad:
            raise InvalidConfigError([f"--searchers: unknown searcher {s!r}; valid: {', '.join(names)}" for s in bad])
    if results is None and args.results:
        results = Path(args.results)
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


def cmd_compare(args: argparse.Namespace) -> int:
    return run_compare_command(args)[0]


def run_suite_command(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """``compare --suite``: every searcher on every suite experiment; one table (or JSON with compare's keys
    per experiment). The optima come from the on-disk cache (searchers.suite.DEFAULT_OPTIMA_CACHE)."""
    from searchers.suite import format_suite_table, run_suite

    if args.experiment:
        raise InvalidConfigError(f"--suite takes no experiment argument (got {args.experiment!r}); "
                                 f"use --experiments NAME... to choose a subset")
    if args.plot:
        raise InvalidConfigError("--plot draws one experiment's curves; it does not apply with --suite")
    if args.searchers:
        from searchers.base import available
        names = available()
        bad = [s for s in args.searchers if s not in names]
        if bad:
            raise InvalidConfigError([f"--searchers: unknown searcher {s!r}; valid: {', '.join(names)}" for s in bad])
    seeds: int | list[int] = list(args.seed_list) if args.seed_list else args.seeds
    if args.driver == "ray":
        from raytune_primus.jobs import _connect
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

    summary = run_suite(compare_fn, experiments=args.experiments, budget=args.budget or 30, seeds=seeds,
                        searchers=args.searchers, progress=say)
    summary["driver"] = args.driver
    if args.results:
        from raytune_primus.jobs import write_json
        out = Path(args.results)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "suite.json", summary)
    if args.format == "json":
        from raytune_primus.jobs import _json_safe
        json.dump(_json_safe(summary), sys.stdout, indent=2, default=str)
        print()
    else:
        print(format_suite_table(summary))
    return 0, summary


def cmd_experiments(args: argparse.Namespace) -> int:
    from searchers.experiment import bundled

    if args.action == "list":
        if args.name:
            raise InvalidConfigError(f"experiments list takes no name, got {args.name!r}")
        rows = []
        for name in bundled():
            exp = _load(name)
            rows.append({"name": name, "model": exp.baseline.model.name, "num_gpus": exp.baseline.cluster.num_gpus,
                         "hardware": exp.baseline.cluster.hardware.name, "searcher": exp.searcher,
                         "budget": exp.budget, "description": exp.description})
        if args.format == "json":
            print(json.dumps(rows, indent=2))
        else:
            from raytune_primus.report import table
            print(table([[r["name"], r["model"], f"{r['num_gpus']} x {r['hardware']}", r["searcher"],
                          str(r["budget"]), r["description"][:60]] for r in rows],
                        ["experiment", "model", "cluster", "searcher", "budget", "description"], "llllrl"))
        return 0
    if not args.name:
        raise InvalidConfigError(f"experiments show needs a name; bundled: {', '.join(bundled())}")
    exp = _load(args.name)
    space = exp.space
    info = {"name": exp.name, "description": exp.description, "source": exp.source,
            "model": exp.baseline.model.name, "cluster": exp.baseline.to_dict()["cluster"],
            "baseline": {k: v for k, v in exp.baseline.to_dict()["training"].items() if v is not None},
            "axes": {a: list(space.values[a]) for a in space.axes}, "pins": dict(exp.pins),
            "searcher": exp.searcher, "options": dict(exp.options), "budget": exp.budget, "seed": exp.seed,
            "oracle_mode": exp.oracle_mode}
    if args.format == "json":
        print(json.dumps(info, indent=2, default=str))
        return 0
    hw = info["cluster"]["hardware"]
    print(f"{exp.name}: {exp.description}")
    print(f"  model {info['model']} on {info['cluster']['num_gpus']} x {hw if isinstance(hw, str) else hw['name']}; "
          f"searcher {exp.searcher}, budget {exp.budget}, seed {exp.seed}, oracle {exp.oracle_mode}")
    print("  baseline: " + " ".join(f"{k}={v}" for k, v in info["baseline"].items()))
    print("  searched axes:")
    for a, vals in info["axes"].items():
        print(f"    {a:<26} {', '.join(map(str, vals))}")
    return 0

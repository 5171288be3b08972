"""The search commands of ``raytune-primus``: ``tune``, ``compare`` (also ``--suite``) and ``experiments``.

Their arguments come from raytune_primus.search_args and ``tune``/``compare`` run
:func:`raytune_primus.jobs.run_tune_command` / :func:`~raytune_primus.jobs.run_compare_command`, the
code the Ray job entry point ``python -m raytune_primus.jobs`` runs too, so the two cannot drift. Ray
is imported only when a command runs with ``--driver ray``. Bad input (a missing experiment file, a
budget of 0, an unknown searcher) raises a PrimusError or an argparse error: one line per problem,
exit code 2.
"""
from __future__ import annotations

import argparse
import json
from typing import Any

from oracle.errors import InvalidConfigError
from raytune_primus.search_args import (add_compare_arguments, add_experiment_argument, add_run_arguments,
                                        add_suite_arguments, add_tune_arguments)


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


# ---------------------------------------------------------------------------------- running them
def _load(name: str):
    from searchers.experiment import load_experiment

    return load_experiment(name)


def cmd_tune(args: argparse.Namespace) -> int:
    from raytune_primus.jobs import run_tune_command
    return run_tune_command(args)[0]


def cmd_compare(args: argparse.Namespace) -> int:
    from raytune_primus.jobs import run_compare_command, run_suite_command
    if args.suite:
        return run_suite_command(args)[0]
    if args.experiments:
        raise InvalidConfigError("--experiments only applies with --suite")
    return run_compare_command(args)[0]


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

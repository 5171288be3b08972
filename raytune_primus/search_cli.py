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
from oracle.units import GIB
from raytune_primus.search_args import (DERIVE_FLAGS, add_compare_arguments, add_derive_arguments,
                                        add_experiment_argument, add_run_arguments, add_suite_arguments,
                                        add_tune_arguments, derive_from_args)


def add_search_commands(sub: Any) -> None:
    """Add ``tune``, ``compare`` and ``experiments`` to the ``raytune-primus`` sub-command parser."""
    commands = (
        ("tune", "run one searcher on an experiment and print the winner",
         "Run one searcher on an experiment (a bundled name or a YAML path, or one derived from --model --hardware "
         "--num-gpus --seq-len --gbs) behind the memory pre-filter; print the winner with its projection and the "
         "ledger.", add_tune_arguments, cmd_tune),
        ("compare", "run several searchers over several seeds against the exhaustive optimum",
         "Run every searcher on equal budgets over several seeds and compare them with the exhaustive optimum of "
         "the space (paper Sec. 5); with --suite, on every experiment of the suite.", add_compare_arguments,
         cmd_compare))
    for name, short, description, add_own, func in commands:
        p = sub.add_parser(name, help=short, description=description)
        add_experiment_argument(p, suite=name == "compare")
        add_run_arguments(p)
        add_own(p)
        add_derive_arguments(p)
        if name == "compare":
            add_suite_arguments(p)
        p.set_defaults(func=func)

    ex = sub.add_parser("experiments", help="list the bundled experiments, show one, or derive one (init)",
                        description="List the bundled experiment specs (experiments/*.yaml), show one (its model, "
                                    "cluster, baseline, searched axes and searcher), or write the experiment that "
                                    "`tune --model M --hardware H --num-gpus N --seq-len S --gbs G` derives (init).")
    ex.add_argument("action", choices=["list", "show", "init"],
                    help="list: every bundled spec; show: one spec; init: derive one from --model ... and write it")
    ex.add_argument("name", nargs="?", help="show: a bundled experiment name or a YAML path")
    ex.add_argument("--format", default="table", choices=["table", "json"], help="output format (default table)")
    ex.add_argument("-o", "--output", metavar="FILE", help="init: write the experiment YAML here (default: print it)")
    ex.add_argument("--name", dest="spec_name", metavar="NAME", help="init: the experiment's name (default: derived "
                                                                       "from the model, cluster and batch)")
    add_derive_arguments(ex)
    ex.set_defaults(func=cmd_experiments)


def _init(args: argparse.Namespace) -> int:
    """experiments init: derive the experiment (searchers.derive) and write (or print) its YAML."""
    from pathlib import Path

    from searchers.experiment import Experiment

    if args.name:
        raise InvalidConfigError(f"experiments init takes no positional name (got {args.name!r}); "
                                 f"give --model M --hardware H --num-gpus N --seq-len S --gbs G [-o FILE]")
    derived = derive_from_args(args)
    text = derived.yaml()
    exp = Experiment.from_dict(derived.spec, name=derived.spec["name"])  # what the file will load as
    if not args.output:
        print(text, end="")
        return 0
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    t = exp.baseline.training
    print(f"wrote {out}: experiment {exp.name}; baseline TP{t.tp} CP{t.cp} PP{t.pp}"
          + (f" EP{t.ep}" if exp.baseline.model.is_moe else "")
          + f" recompute {t.recompute}{' FSDP' if t.fsdp else ''} MBS {t.mbs} "
          f"({derived.baseline_peak_bytes / GIB:,.1f} of {derived.cap_bytes / GIB:,.1f} GiB); "
          f"{len(exp.space.axes)} searched axes; numerics open: {', '.join(exp.space.numerics()['open']) or 'none'}")
    print(f"run it: raytune-primus tune {out}")
    return 0


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

    derive = [f for f in DERIVE_FLAGS if getattr(args, f) is not None]
    if args.action == "init":
        return _init(args)
    if derive or args.set or args.precision or args.allow or args.output or args.spec_name:
        raise InvalidConfigError(f"experiments {args.action} takes no --model, --hardware, --num-gpus, --seq-len, "
                                 f"--gbs, --precision, --set, --allow, --name or -o (those are for init)")
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
            "numerics": space.numerics(),
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
    from raytune_primus.report import numerics_note
    print("  " + numerics_note(info["numerics"]))
    print("  searched axes:")
    for a, vals in info["axes"].items():
        print(f"    {a:<26} {', '.join(map(str, vals))}")
    return 0

"""The arguments of the search commands, defined once: ``raytune-primus tune|compare`` (raytune_primus.
search_cli) and the Ray job entry point ``python -m raytune_primus.jobs`` build their parsers from these
functions, so the two cannot drift. Defaults that matter: ``--driver ray`` for both commands; the Ray
cluster is ``--address``, else ``RAY_ADDRESS`` (what ``ray job submit`` sets for a job), else an embedded
local Ray.
"""
from __future__ import annotations

import argparse

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

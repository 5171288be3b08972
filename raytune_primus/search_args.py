"""The arguments of the search commands, defined once: ``raytune-primus tune|compare`` (raytune_primus.
search_cli) and the Ray job entry point ``python -m raytune_primus.jobs`` build their parsers from these
functions, so the two cannot drift. Defaults that matter: ``--driver ray`` for both commands; the Ray
cluster is ``--address``, else ``RAY_ADDRESS`` (what ``ray job submit`` sets for a job), else an embedded
local Ray.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
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


def _seed(name: str):
    """A searcher seed: an integer in 0..MAX_SEED (searchers.experiment), as an experiment file's seed."""
    from searchers.experiment import MAX_SEED
    whole = _integer(name, 0)

    def parse(text: str) -> int:
        v = whole(text)
        if v > MAX_SEED:
            raise argparse.ArgumentTypeError(f"{name} must be in 0..{MAX_SEED} (the searchers' generators take "
                                             f"32-bit seeds), got {v}")
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


def _searcher_names() -> str:
    from searchers.base import available
    return " | ".join(available())


def add_experiment_argument(p: argparse.ArgumentParser, *, suite: bool = False) -> None:
    p.add_argument("experiment", nargs="?",
                   help="experiment YAML, or the name of a bundled one (raytune-primus experiments list); omit with "
                        "--model ... (derive one)" + (" or --suite" if suite else ""))


DERIVE_FLAGS = ("model", "hardware", "num_gpus", "seq_len", "gbs")
"""What deriving an experiment needs (searchers.derive)."""


def add_derive_arguments(p: argparse.ArgumentParser) -> None:
    """An experiment from a model and a cluster instead of a file (searchers.derive), and --allow."""
    g = p.add_argument_group("derive the experiment from a model and a cluster (instead of an experiment file)")
    g.add_argument("--model", metavar="M", help="bundled card name, card YAML path or Hugging Face config.json path")
    g.add_argument("--hardware", metavar="H", help="bundled hardware profile name or profile YAML path")
    g.add_argument("--num-gpus", type=_positive("--num-gpus"), metavar="N", help="GPUs in the job")
    g.add_argument("--seq-len", type=_positive("--seq-len"), metavar="S", help="sequence length in tokens")
    g.add_argument("--gbs", type=_positive("--gbs"), metavar="G", help="global batch in sequences")
    g.add_argument("--precision", metavar="P", help="GEMM number format: bf16 (default), fp8 or nvfp4; held "
                                                   "unless --allow precision")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="hold a training key at a value, e.g. --set fp8_recipe=mxfp8 or --set cp=1 (repeatable; "
                        "cluster.memory_margin=0.05 too)")
    g.add_argument("--bridge-recipe", metavar="NAME", help="search around a Megatron-Bridge performance recipe (e.g. "
                   "deepseek_v3_pretrain_256gpu_gb300_fp8mx_config): its model, GPUs, hardware, sequence, global "
                   "batch and number format instead of those flags, its software settings (dispatcher, CUDA graphs, "
                   "overlaps, fused kernels) held with --set (searched with --allow software), the layout, "
                   "micro-batch, recompute, schedule and sharding searched. Needs scripts/install-frameworks.sh")
    p.add_argument_group("numerics and software settings (an experiment file's or a derived one's)").add_argument(
        "--allow", metavar="GROUPS", help="what else the search may change (held otherwise): numerics: precision "
                                          "(format and FP8 recipe), fp8_activations, token_drop (capacity factor, "
                                          "padding), optimizer, mtp; software: the MoE dispatcher and its overlaps, "
                                          "fused router and grouped MLP, CUDA graphs, FP8 weight gathers (what the "
                                          "part and framework run); comma-separated, e.g. --allow precision,software")


def experiment_from_args(args: argparse.Namespace, *, results: Callable[[str], Any] | None = None,
                         command: str = "tune"):
    """The experiment a tune/compare command line names: a file or bundled name, or one derived from --model
    --hardware --num-gpus --seq-len --gbs. A derived one is written to ``DIR/experiment.yaml`` and loaded from
    there when ``results(name)`` gives a folder DIR, so the run is that file's. --allow opens numerics groups
    either way."""
    from searchers.derive import parse_allow
    from searchers.experiment import Experiment, load_experiment

    if getattr(args, "bridge_recipe", None) and args.experiment:
        raise InvalidConfigError(f"give an experiment ({args.experiment!r}) or --bridge-recipe, not both")
    bridge_recipe_into(args)
    derive = [f for f in DERIVE_FLAGS if getattr(args, f, None) is not None]
    extra = [flag for flag, given in (("--precision", getattr(args, "precision", None) is not None),
                                      ("--set", bool(getattr(args, "set", None)))) if given]
    allow = parse_allow(getattr(args, "allow", None))
    if args.experiment and derive:
        raise InvalidConfigError(f"give an experiment ({args.experiment!r}) or --model/--hardware/--num-gpus/"
                                 f"--seq-len/--gbs, not both")
    if extra and not derive:
        raise InvalidConfigError(f"{' and '.join(extra)} {'apply' if len(extra) > 1 else 'applies'} only to a derived "
                                 f"experiment (--model ...); an experiment file states its own training keys")
    if not args.experiment and not derive:
        raise InvalidConfigError(f"{command} needs an experiment (a bundled name or a YAML path), or --model M "
                                 f"--hardware H --num-gpus N --seq-len S --gbs G to derive one"
                                 + (", or --suite" if command == "compare" else ""))
    if args.experiment:
        exp = load_experiment(args.experiment)
        if allow:
            exp = exp.with_changes(allow=tuple(dict.fromkeys([*exp.allow, *allow])))
        return exp
    derived = derive_from_args(args, allow)
    folder = results(derived.spec["name"]) if results is not None else None
    if folder is None:
        return Experiment.from_dict(derived.spec, name=derived.spec["name"])
    from pathlib import Path
    path = Path(folder) / "experiment.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(derived.yaml())
    return load_experiment(str(path))


def bridge_recipe_into(args: argparse.Namespace) -> None:
    """--bridge-recipe NAME: the derive flags from a Megatron-Bridge performance recipe (raytune_primus.bridge_recipes):
    its card, hardware profile, GPU count, sequence length, global batch and number format, and every other setting
    it makes held with --set (RECIPE_SEARCHED: what stays free). Given with any of the derive flags it is an error
    naming them; a --set of the user's outranks the recipe's. Applied once."""
    name = getattr(args, "bridge_recipe", None)
    if not name or getattr(args, "_bridge_applied", False):
        return
    given = [f for f in (*DERIVE_FLAGS, "precision") if getattr(args, f, None) is not None]
    if given:
        raise InvalidConfigError(f"--bridge-recipe states the model, cluster, batch and number format: give it "
                                 f"without {', '.join('--' + f.replace('_', '-') for f in given)} (hold other "
                                 f"training keys with --set)")
    from oracle.config import RunConfig, non_default_training
    from oracle.recipe import show_value
    from raytune_primus.bridge_recipes import load_recipe_config
    from searchers.derive import parse_allow, set_key
    from searchers.space import SOFTWARE
    cfg = load_recipe_config(name)
    run = RunConfig.from_dict(cfg, where=name)
    if not isinstance(run.to_dict()["model"], str):  # the recipe edits the card (oracle.recipe: vocab_size)
        raise InvalidConfigError(f"{name} changes the model card ({run.model.name}): derive from a card YAML with "
                                 f"those values (a YAML with based_on: {cfg['model']} and the fields that differ) via "
                                 f"--model and the other flags")
    t = run.training
    args.model, args.hardware, args.num_gpus = cfg["model"], run.cluster.hardware.name, run.cluster.num_gpus
    args.seq_len, args.gbs, args.precision = t.seq_len, t.gbs, t.precision
    # the recipe's software settings are held (its dispatcher, CUDA graphs, overlaps, fused kernels, FP8 options);
    # what the derived space searches stays free: the layout, micro-batch, recompute, schedule and sharding
    user_sets = list(args.set or [])
    held = {set_key(x) for x in user_sets}
    searched = set(RECIPE_SEARCHED)
    allow = parse_allow(getattr(args, "allow", None))
    software = "software" in allow
    if software:  # --allow software: the recipe's software settings are where the search starts, not held
        searched |= {*SOFTWARE, "delay_wgrad_compute"}  # the latter then follows moe_a2a_overlap (its default)
    elif t.moe_a2a_backend not in ("alltoall", "deepep"):  # a dispatcher the space's axis does not list: held
        searched.discard("moe_a2a_backend")
    recipe = {k: v for k, v in sorted(non_default_training(t).items()) if k not in held and v is not None}
    args.set = [*user_sets, *(f"{k}={show_value(v)}" for k, v in recipe.items() if k not in searched)]
    args._bridge_starts = [f"{k}={show_value(v)}" for k, v in recipe.items() if software and k in SOFTWARE]
    if software:
        args._bridge_command = " ".join(["raytune-primus experiments init --bridge-recipe", name,
                                         *(f"--set {s}" for s in user_sets), "--allow", ",".join(allow)])
    args._bridge_applied = True


RECIPE_SEARCHED = ("tp", "cp", "pp", "vpp", "pp_schedule", "ep", "etp", "mbs", "gbs", "seq_len", "precision",
                   "recompute", "recompute_num_layers", "recompute_modules", "use_distributed_optimizer", "fsdp",
                   "moe_a2a_backend", "moe_sync_free", "sequence_parallel", "decoder_first_pipeline_num_layers",
                   "decoder_last_pipeline_num_layers", "pipeline_model_parallel_layout",
                   "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
"""Training keys of a recipe a search derived from it (--bridge-recipe) leaves free: the derived space's axes (the
dispatcher only where the recipe's is one of the space's), what a layout derives, and the batch and number format
the derivation holds itself. Every other key the recipe sets is held at its value."""


def derive_from_args(args: argparse.Namespace, allow: list[str] | None = None):
    """searchers.derive.derive_spec for the --model ... flags (one line naming the missing ones)."""
    from searchers.derive import derive_spec, parse_allow

    bridge_recipe_into(args)
    missing = [f for f in DERIVE_FLAGS if getattr(args, f, None) is None]
    if missing:
        def flags(names):
            return ", ".join("--" + f.replace("_", "-") for f in names)
        raise InvalidConfigError(f"deriving an experiment needs {flags(DERIVE_FLAGS)}; missing: {flags(missing)}")

    return derive_spec(model=args.model, hardware=args.hardware, num_gpus=args.num_gpus, seq_len=args.seq_len,
                       gbs=args.gbs, precision=args.precision, sets=list(args.set or []),
                       name=getattr(args, "spec_name", None),
                       allow=parse_allow(getattr(args, "allow", None)) if allow is None else allow,
                       starts=getattr(args, "_bridge_starts", None) or (),
                       command=getattr(args, "_bridge_command", None))


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
    p.add_argument("--seed", type=_seed("--seed"), help="the searcher's seed, 0..2**32-1 (default: the experiment's)")
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
    seeds.add_argument("--seed-list", type=_seed("--seed-list"), nargs="+", metavar="SEED",
                       help="these seeds per searcher instead of 0..N-1")
    p.add_argument("--searchers", nargs="+", metavar="NAME",
                   help=f"searchers to compare, of {_searcher_names()} (default: seed_llm tpe gp random grid)")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the best-so-far curves here")


def add_suite_arguments(p: argparse.ArgumentParser) -> None:
    """``compare --suite``: every searcher on every suite experiment (searchers.suite)."""
    p.add_argument("--suite", nargs="?", const="bundled", default=None, metavar="NAME",
                   help="compare on every experiment of a suite and print one table: bundled (the default, 7 "
                        "experiments the search was developed on) or generalise (15 more, written from models and "
                        "clusters; searchers.suite.SUITES); the optima are computed once and cached under results/optima")
    p.add_argument("--experiments", nargs="+", metavar="NAME",
                   help="--suite: only these experiments (shipped names or YAML paths), in this order")

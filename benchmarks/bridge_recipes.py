"""Every Megatron-Bridge performance recipe, read from the package and projected (docs/recipe.md).

    .venv/bin/python benchmarks/bridge_recipes.py [--family gpt_oss] [--format table|json] [--out FILE.json]

Reads every ``*_config()`` of ``megatron/bridge/perf_recipes`` (:mod:`raytune_primus.bridge_recipes`: how) and projects
each one whose model has a bundled card and whose GPU has a hardware profile, including the families no validation
row measures (GPT-OSS, Kimi-K2, Qwen3-235B, Qwen3-Next, Nemotron-H, Nemotron 3 Nano, Llama 3 70B). It checks the
product where a new user would meet it first: a published recipe must be read whole (``ignored:`` lists every setting
it carries that the projection does not price), must not be refused, and should fit in the memory it ran in. No
published number is read and nothing is compared: this finds refusals, memory verdicts and unread settings.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raytune_primus.bridge_recipes import HARDWARE, card_of, num_gpus_of, read_recipes, recipe_config  # noqa: E402


def project_recipe(rec: dict[str, Any]) -> dict[str, Any]:
    """One recipe: what it is, and its projection or why there is none."""
    from oracle.config import RunConfig
    from oracle.errors import PrimusError
    from oracle.projector import project
    from oracle.recipe import UNKNOWN_WHY

    row: dict[str, Any] = {"recipe": rec["function"], "family": rec["family"], "gpu": rec["gpu"]}
    if rec.get("error"):
        return {**row, "status": "not read", "why": rec["error"]}
    row.update(model=card_of(rec), hardware=HARDWARE.get(rec["gpu"]), num_gpus=num_gpus_of(rec))
    if row["model"] is None:
        return {**row, "status": "no card", "why": f"no bundled card for {rec.get('hf_id') or rec['provider']}"}
    if row["hardware"] is None:
        return {**row, "status": "no profile", "why": f"no hardware profile for {rec['gpu']}"}
    data = recipe_config(rec)
    try:
        run = RunConfig.from_dict(data, where=rec["function"])
        p = project(run, memory_tree=False)
    except PrimusError as exc:
        return {**row, "status": "refused", "why": str(exc).replace("\n", " ")}
    t = run.training
    unknown = sorted(e.key for e in run.recipe
                     if e.status == "ignored" and e.why == UNKNOWN_WHY)
    ignored = sorted(e.describe() for e in run.recipe if e.status == "ignored"
                     and e.why != UNKNOWN_WHY and not e.key.startswith("env."))
    return {**row, "status": "projected",
            "layout": f"tp{t.tp} pp{t.pp} vpp{t.vpp} cp{t.cp} ep{t.ep} etp{t.etp} mbs{t.mbs} gbs{t.gbs} s{t.seq_len}",
            "precision": t.precision + (f"/{t.fp8_recipe}" if t.precision == "fp8" else ""),
            "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu, "tflops_per_gpu": p.tflops_per_gpu, "mfu": p.mfu,
            "peak_gib": p.memory.peak_bytes / 2**30, "cap_gib": p.memory.cap_bytes / 2**30,
            "fits": p.memory.fits, "unknown_settings": unknown, "ignored": ignored}


def search_recipe(name: str, budget: int, seed: int = 0) -> dict[str, Any]:
    """``tune --bridge-recipe NAME --driver inprocess``'s search (the recipe's software held, its layout searched):
    the winner against the recipe's own projection."""
    import argparse as _argparse

    from oracle.config import RunConfig
    from oracle.projector import project
    from raytune_primus.bridge_recipes import load_recipe_config
    from raytune_primus.search_args import experiment_from_args
    from searchers.driver import run_search

    recipe = project(RunConfig.from_dict(load_recipe_config(name), where=name), memory_tree=False)
    ns = _argparse.Namespace(bridge_recipe=name, experiment=None, model=None, hardware=None, num_gpus=None,
                             seq_len=None, gbs=None, precision=None, set=[], allow=None, spec_name=None)
    exp = experiment_from_args(ns)
    res = run_search(exp, budget=budget, seed=seed)
    best = res.best_tokens_per_s_per_gpu
    return {"recipe": name, "space": exp.space.size, "recipe_tokens_per_s_per_gpu": recipe.tokens_per_s_per_gpu,
            "recipe_fits": recipe.memory.fits, "best_tokens_per_s_per_gpu": best, "best": res.best_training,
            "ratio": best / recipe.tokens_per_s_per_gpu if best else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", action="append", help="only these perf_recipes/<family> folders (repeatable)")
    ap.add_argument("--format", choices=("table", "json"), default="table")
    ap.add_argument("--out", help="also write every row as JSON here")
    ap.add_argument("--search", nargs="+", metavar="RECIPE", help="instead: search around these recipes "
                    "(tune --bridge-recipe, in process) and print each winner against the recipe's projection")
    ap.add_argument("--budget", type=int, default=30, help="--search: trials per recipe (default 30)")
    args = ap.parse_args(argv)
    if args.search:
        print(f"{'recipe':58s} {'legal points':>12s} {'recipe tok/s':>12s} {'found tok/s':>12s} {'found/recipe':>12s}")
        for name in args.search:
            r = search_recipe(name, args.budget)
            print(f"{name[:58]:58s} {r['space']:12,d} {r['recipe_tokens_per_s_per_gpu']:12,.0f} "
                  f"{(r['best_tokens_per_s_per_gpu'] or 0):12,.0f} {(r['ratio'] or 0):12.3f}"
                  + ("" if r["recipe_fits"] else "   (the recipe itself projects over its memory cap)"))
        return 0
    recs = [r for r in read_recipes() if not args.family or r["family"] in args.family]
    rows = [project_recipe(r) for r in recs]
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    if args.format == "json":
        print(json.dumps(rows, indent=1))
        return 0
    done = [r for r in rows if r["status"] == "projected"]
    print(f"{'recipe':58s} {'layout':48s} {'prec':12s} {'tok/s/GPU':>9s} {'MFU':>6s} {'GiB':>6s} {'cap':>6s} fits")
    for r in done:
        print(f"{r['recipe'][:58]:58s} {r['layout'][:48]:48s} {r['precision']:12s} {r['tokens_per_s_per_gpu']:9,.0f} "
              f"{r['mfu']:6.1%} {r['peak_gib']:6.1f} {r['cap_gib']:6.1f} {'yes' if r['fits'] else 'NO'}")
    others = [r for r in rows if r["status"] != "projected"]
    if others:
        print("\nnot projected:")
        for r in others:
            print(f"  {r['recipe'] or r['family'] + '/' + r['gpu']}: {r['status']}: {r['why'][:300]}")
    unknown = Counter(k for r in done for k in r["unknown_settings"])
    if unknown:
        print("\nsettings the recipes carry that no projection setting knows (recipes carrying each):")
        for k, n in unknown.most_common():
            print(f"  {k}: {n}")
    print(f"\n{len(rows)} recipes: {len(done)} projected, "
          f"{sum(not r['fits'] for r in done)} of them over their memory cap; "
          + ", ".join(f"{n} {s}" for s, n in Counter(r['status'] for r in others).most_common()))
    if done:
        print(f"median MFU {statistics.median(r['mfu'] for r in done):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

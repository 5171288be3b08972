"""``raytune-primus`` command line (also ``python -m raytune_primus``).

Bad input never shows a traceback: every PrimusError is printed one problem per line on stderr
and the command exits 2. Ray is imported only by the commands that need it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from oracle.collector import tune_bulk_process
from oracle.errors import InvalidConfigError, PrimusError, clip
from oracle.units import GIB
from raytune_primus.search_args import _non_negative, _positive

EXIT_USAGE = 2
EXIT_NOT_VALID = 3
"""e2e-cpu measured under other load (--allow-busy): the numbers are no check either way."""
MAX_ERROR_LINE = 1000
"""Error lines longer than this lose their middle (oracle.errors.clip): a 5,000-character value echoed
back stays one readable line."""


def _json_default(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    return str(o)


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=_json_default))


# ---------------------------------------------------------------------- project
def cmd_project(args: argparse.Namespace) -> int:
    from oracle.projector import project
    from raytune_primus.report import projection_table

    run = _project_run(args)
    if args.mode != "simulate":
        return _project_benchmark(args, run)
    proj = project(run, mode=args.mode)
    if args.compare_schedules or args.gantt:
        from raytune_primus.schedules import compare_schedules_table, draw_run_gantt
        if args.gantt:
            draw_run_gantt(run, args.gantt)
        if args.compare_schedules:
            rows, text = compare_schedules_table(run)
            if args.format == "json":
                _print_json({"projection": proj.to_dict(), "schedules": rows})
                return 0
            print(projection_table(proj))
            print()
            print(text)
            return 0
    hints = None
    if not proj.fits and not args.no_hints:  # what to change so it fits (searchers.fit_hints)
        from searchers.fit_hints import fit_hints, hints_text
        hints = fit_hints(run)
    if args.format == "json":
        out = proj.to_dict()
        if run.recipe:
            out["recipe"] = [{"key": e.key, "value": e.value, "status": e.status, "why": e.why} for e in run.recipe]
        if hints is not None:
            out["fit_hints"] = [h.to_dict() for h in hints[0]]
        _print_json(out)
    else:
        print(projection_table(proj))
        _print_recipe(run)
        if hints is not None:
            print()
            print(hints_text(run, *hints))
        if args.gantt:
            print(f"\ngantt chart written to {args.gantt}")
    return 0


def _project_run(args: argparse.Namespace):
    """The run ``project`` prices: a config file, or --model/--hardware/--num-gpus; a --megatron-args launch line is
    read onto its training (oracle.recipe: Megatron-LM flags, NAME=value environment words), the file's own
    training keys and --set winning."""
    from oracle.config import RunConfig, apply_overrides
    from oracle.recipe import split_megatron_args
    from oracle.yamlio import load_mapping
    if args.bridge_recipe:
        if args.config or args.model or args.hardware or args.num_gpus or args.megatron_args:
            raise _usage("--bridge-recipe states the model, cluster and recipe: give it without a config file, "
                         "--model/--hardware/--num-gpus or --megatron-args (override with --set)")
        from raytune_primus.bridge_recipes import load_recipe_config
        data = load_recipe_config(args.bridge_recipe)
    elif args.config:
        if args.model or args.hardware or args.num_gpus:
            raise _usage("project takes a config file or --model/--hardware/--num-gpus, not both")
        data = load_mapping(args.config, "config file")
    else:
        missing = [f for f, v in (("--model", args.model), ("--hardware", args.hardware), ("--num-gpus", args.num_gpus))
                   if v is None]
        if missing:
            raise _usage(f"project needs a config file, or --model M --hardware H --num-gpus N (missing "
                         f"{', '.join(missing)}) with the batch from --seq-len S --gbs G, --megatron-args or --set")
        data = {"model": args.model, "cluster": {"hardware": args.hardware, "num_gpus": args.num_gpus}, "training": {}}
    if args.megatron_args:
        pairs = split_megatron_args(args.megatron_args)
        if isinstance(data, dict) and data.get("recipe") is not None:
            raise _usage("the config file has a recipe section and --megatron-args gives another: use one")
        data = {**data, "recipe": dict(pairs)}
    # --seq-len/--gbs/--precision are training keys set as --set sets them (an explicit --set after them wins)
    sets = [f"training.{k}={v}" for k, v in (("seq_len", args.seq_len), ("gbs", args.gbs),
                                              ("precision", args.precision)) if v is not None]
    try:
        return RunConfig.from_dict(apply_overrides(data, sets + args.set), where="config")
    except InvalidConfigError as exc:
        batch = [k for k in ("seq_len", "gbs") if any(f"missing required key {k!r}" in p for p in exc.problems)]
        if args.config or args.bridge_recipe or not batch:
            raise
        # no file: the flags name the model and the cluster, the batch is the user's to give
        flags = {"seq_len": "--seq-len S", "gbs": "--gbs G"}
        raise InvalidConfigError(exc.problems + [
            f"give the batch with {' '.join(flags[k] for k in batch)} (e.g. --seq-len 4096 --gbs 256), "
            f"{' '.join(f'--set {k}=...' for k in batch)} or --megatron-args \"--seq-length 4096 "
            f"--global-batch-size 256 ...\""]) from None


def _print_recipe(run) -> None:
    """What a config's recipe set and what it ignored (every key accounted for)."""
    if not run.recipe:
        return
    priced = [e for e in run.recipe if e.status == "priced"]
    ignored = [e for e in run.recipe if e.status != "priced"]
    print(f"\nrecipe: {len(priced)} settings priced" + (f", {len(ignored)} ignored:" if ignored else ""))
    for e in ignored:
        print(f"  ignored: {e.describe()}")


def benchmark_source(args: argparse.Namespace):
    """The BenchmarkSource the --benchmark-gpus/--cache-dir/--no-cache/--repeats flags ask for."""
    from oracle.benchmark import default_benchmark_gpus
    from oracle.benchmark.source import BenchmarkSource
    gpus = args.benchmark_gpus or default_benchmark_gpus()
    return BenchmarkSource(benchmark_gpus=gpus, bencher_options={
        "cache_dir": args.cache_dir, "use_cache": not args.no_cache, "repeats": args.repeats, "dtype": args.dtype})


def _project_benchmark(args: argparse.Namespace, run) -> int:
    """--mode benchmark | both: measured layers (and, for both, simulate beside them per layer and op)."""
    from oracle.benchmark.compare import side_by_side, side_by_side_text, upscale_text
    from oracle.projector import project
    from raytune_primus.report import projection_table

    src = benchmark_source(args)
    proj = src.project(run)
    if args.mode == "benchmark":
        if args.format == "json":
            _print_json(proj.to_dict())
        else:
            print(projection_table(proj))
            print()
            print(upscale_text(proj.details["benchmark"]))
        return 0
    sim = project(run, mode="simulate")
    rows = side_by_side(run, src)
    if args.format == "json":
        _print_json({"simulate": sim.to_dict(), "benchmark": proj.to_dict(), "layers": rows})
        return 0
    print("== simulate")
    print(projection_table(sim))
    print("\n== benchmark")
    print(projection_table(proj))
    print()
    print(upscale_text(proj.details["benchmark"]))
    print("\n== per layer and op at the target layout (benchmark upscaled), one micro-batch")
    print(side_by_side_text(rows))
    bt, st = proj.tokens_per_s_per_gpu, sim.tokens_per_s_per_gpu
    print(f"\ntokens/s/GPU: simulate {st:,.1f}  benchmark {bt:,.1f}  (simulate/benchmark {st / bt:.2f})")
    return 0


# ---------------------------------------------------------------------- validate
def cmd_validate(args: argparse.Namespace) -> int:
    from oracle.validate import read_rows, summarize, validate_rows
    from raytune_primus.report import table

    results = validate_rows(read_rows(args.csv), base_dir=Path(args.csv).parent, jobs=args.jobs)
    agg = summarize(results)
    if args.plot:
        from raytune_primus.plots import validation_scatter
        validation_scatter(results, args.plot)
    if args.format == "json":
        _print_json({"rows": [r.to_dict() for r in results], **agg})
        return 0
    rows = []
    for r in results:
        if r.skipped:
            continue
        rows.append([r.id, r.group[:28], r.quality, "tok/s" if r.quantity == "tokens_per_s_per_gpu" else "TFLOP/s",
                     f"{r.measured:,.0f}", f"{r.projected:,.0f}", f"{100 * r.error:+.1f}%",
                     "yes" if r.fits else "NO", f"{r.projected_peak_gib:,.1f}", ",".join(r.assumed)[:40]])
    print(table(rows, ["id", "group", "q", "quantity", "measured", "projected", "error", "fits", "peak GiB",
                       "assumed (defaults)"], "lllrrrrrrl"))
    skipped = [r for r in results if r.skipped]
    if skipped:
        print(f"\nrows not projected ({len(skipped)}):")
        for r in skipped:
            print(f"  {r.id}: {r.skipped}")
    print("\nper group:")
    grows = []
    for g, s in agg["groups"].items():
        def pct(x):
            return "-" if x is None else f"{100 * x:.1f}%"

        def f3(x):
            return "-" if x is None else f"{x:.3f}"
        grows.append([g[:50], s["quality"], str(s["n"]), pct(s["median_abs_error"]), pct(s["mean_abs_error"]),
                      pct(s["max_abs_error"]), f3(s["spearman"]), f3(s["kendall"]), pct(s["regret"])])
    print(table(grows, ["group", "q", "n", "median|err|", "mean|err|", "max|err|", "spearman", "kendall", "regret"],
                "llrrrrrrr"))
    if agg["contrasts"]:
        print("\nbatch contrasts (rows of one group that differ only in mbs/gbs; ratio of the larger mbs to the smaller):")
        crows = [[c["a"], c["b"], f"{100 * c['measured']:+.1f}%", f"{100 * c['projected']:+.1f}%",
                  f"{100 * (c['projected'] - c['measured']):+.1f}", "yes" if c["fits"] else "NO"]
                 for c in agg["contrasts"]]
        print(table(crows, ["larger mbs", "smaller mbs", "measured", "projected", "diff (points)", "both fit"],
                    "llrrrr"))
    s = agg["summary"]
    for key, label in (("quality_AB", "quality A/B rows"), ("all", "all projected rows")):
        x = s[key]
        if x["n"]:
            print(f"\n{label}: n={x['n']}  median |error| {100 * x['median_abs_error']:.1f}%  "
                  f"mean |error| {100 * x['mean_abs_error']:.1f}%  max |error| {100 * x['max_abs_error']:.1f}%")
    h = s["headline"]
    if h["projected"]:
        n = h["newest"]
        line = (f"\nheadline: {h['projected']}/{h['rows']} rows projected ({100 * h['projected_share']:.0f}%); "
                f"newest release of each configuration: n={n['n']}  median |error| {100 * n['median_abs_error']:.1f}%  "
                f"within 10%: {100 * n['within_10pct']:.0f}%  worst {h['worst_newest']['id']} "
                f"{100 * h['worst_newest']['error']:+.1f}%")
        for key, label in (("newest_A", "newest release, quality A"), ("every_A", "every quality-A row")):
            x, w = h[key], h[f"worst_{key}"]
            if x["n"]:
                line += (f"\n          {label}: n={x['n']}  median |error| {100 * x['median_abs_error']:.1f}%  within 10%: "
                         f"{100 * x['within_10pct']:.0f}%  worst {w['id']} {100 * w['error']:+.1f}%")
        if h["spearman_median"] is not None:
            line += (f"\n          per-table Spearman over {h['tables_ranked']} tables: median {h['spearman_median']:.3f}"
                     f"  min {h['spearman_min']:.3f}")
        print(line)
        models = s.get("by_model") or {}
        if models:
            mrows = []
            for m, x in models.items():
                a, na = x["every_A"], x["newest_A"]
                if not a["n"]:
                    continue
                mrows.append([m, str(a["n"]), f"{100 * a['median_abs_error']:.1f}%", f"{100 * a['within_10pct']:.0f}%",
                              f"{100 * x['median_signed_every_A']:+.1f}%",
                              f"[{na['n']}: {100 * na['median_abs_error']:.1f}%]" if na["n"] else "-"])
            if mrows:
                print("\nper model (quality A rows; newest release in brackets):")
                print(table(mrows, ["model", "n", "median|err|", "within 10%", "median signed", "newest"], "lrrrrl"))
            else:  # a CSV of one's own runs often has no quality column: the figures above cover every row
                print("\nper model: no row is rated quality A (the CSV's quality column), so no per-model table")
    if args.plot:
        print(f"\nplot written to {args.plot}")
    return 0


# ---------------------------------------------------------------------- hardware / models
def cmd_hardware(args: argparse.Namespace) -> int:
    from oracle.hardware import bundled_hardware, load_hardware
    from raytune_primus.report import table

    if args.action == "calibrate":
        return _calibrate(args)
    if args.action == "list":
        rows = []
        for name in bundled_hardware():
            h = load_hardware(name)
            rows.append([name, h.vendor, f"{h.peak_flops_per_s['bf16'] / 1e12:,.0f}",
                         f"{h.peak_flops_per_s['fp8'] / 1e12:,.0f}" if h.supports("fp8") else "-",
                         f"{h.hbm_capacity_bytes / GIB:,.0f}", f"{h.hbm_bandwidth_bytes_per_s / 1e9:,.0f}",
                         str(h.gpus_per_node), str(h.scale_up_domain_size)])
        print(table(rows, ["name", "vendor", "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM GiB", "HBM GB/s", "GPUs/node",
                           "scale-up"], "llrrrrrr"))
        return 0
    if not args.name:
        raise _usage("hardware show needs a NAME (see `raytune-primus hardware list`)")
    h = load_hardware(args.name)
    info = {"name": h.name, "vendor": h.vendor, "arch": h.arch, "description": h.description,
            "peak_tflops": {k: v / 1e12 for k, v in h.peak_flops_per_s.items()},
            "num_compute_units": h.num_compute_units, "hbm_capacity_gib": h.hbm_capacity_bytes / GIB,
            "hbm_bandwidth_gb_per_s": h.hbm_bandwidth_bytes_per_s / 1e9,
            "runtime_reserved_gib": h.runtime_reserved_bytes / GIB, "memory_cap_gib": h.memory_cap_bytes() / GIB,
            "gpus_per_node": h.gpus_per_node, "scale_up_domain_size": h.scale_up_domain_size,
            "scale_up_gb_per_s": h.scale_up_bandwidth_bytes_per_s / 1e9,
            "scale_out_gb_per_s": h.scale_out_bandwidth_bytes_per_s / 1e9,
            "efficiency": {k: {"value": getattr(h.efficiency, k), "source": h.efficiency_sources.get(k, "")}
                           for k in h.efficiency_sources}, "sources": h.sources}
    _print_json(info)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from oracle.model_card import bundled_models, load_model
    from raytune_primus.report import table

    if args.action == "list":
        rows = []
        for name in bundled_models():
            c = load_model(name)
            kind = ("hybrid-moe" if c.is_moe else "hybrid") if c.is_hybrid else "moe" if c.is_moe else "dense"
            rows.append([name, kind, c.attention, str(c.num_layers), str(c.hidden_size),
                         f"{c.total_params() / 1e9:,.1f}", f"{c.active_params() / 1e9:,.1f}",
                         "-" if c.published_params_billion is None else f"{c.published_params_billion:,.1f}"])
        print(table(rows, ["name", "type", "attn", "layers", "hidden", "params B", "active B", "published B"],
                    "lllrrrrr"))
        return 0
    if args.action == "import":
        if not args.name:
            raise _usage("models import needs a path to a Hugging Face config.json")
        from oracle.hf_import import card_from_hf_config, card_to_yaml, hf_card_name
        from oracle.yamlio import load_mapping
        path = Path(args.name)
        data = load_mapping(path, "Hugging Face config")
        card = card_from_hf_config(data, name=args.card_name or hf_card_name(path, data))
        text = card_to_yaml(card)
        if args.output:
            Path(args.output).write_text(text)
            print(f"wrote {args.output}: {card.name}, {card.total_params() / 1e9:,.2f} B parameters")
        else:
            print(text)
        return 0
    if not args.name:
        raise _usage("models show needs a NAME (see `raytune-primus models list`)")
    c = load_model(args.name)
    d = c.to_dict()
    d["total_params_billion"] = c.total_params() / 1e9
    d["active_params_billion"] = c.active_params() / 1e9
    _print_json(d)
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    """hardware calibrate: measure this machine and write a profile (see oracle.benchmark.calibrate)."""
    import yaml

    from oracle.benchmark.calibrate import calibrate, need_cores
    from oracle.benchmark.load import LoadMonitor
    from oracle.hardware import load_hardware
    name = args.name or "calibrated"
    mon = LoadMonitor(limit_cores=args.busy_limit, need_cores=need_cores(args.world, args.threads))
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731 - stdout may carry the profile
    seen, _ = mon.wait_for_quiet(args.wait, log=log)
    if seen is not None and seen.busy and not args.allow_busy:
        raise _usage(f"machine busy: {seen.text()} after waiting up to {args.wait:.0f} s; a profile measured under "
                     f"other load describes that load, not this machine - rerun when it is idle, or pass --allow-busy")
    data, raw = calibrate(base=args.base, name=name, world=args.world, threads=args.threads, dtype=args.dtype,
                          monitor=mon)
    log(raw["compute_dtype"]["note"])
    if raw["busy"]:
        if not args.allow_busy:
            raise _usage(f"machine busy while calibrating ({data['sources']['load']}): nothing written - rerun when "
                         f"the machine is idle, or pass --allow-busy (the profile then says it was measured under load)")
        log(f"warning: measured under other load ({data['sources']['load']}); the profile says so")
    text = yaml.safe_dump(data, sort_keys=False)
    if args.output:
        Path(args.output).write_text(text)
        load_hardware(args.output)  # the written profile must load
        e = data["efficiency"]
        print(f"wrote {args.output}: {raw['device']}; {raw['kernels']['dtype']} GEMM "
              f"{raw['kernels']['gemm_flops'] / 1e9:,.1f} GFLOP/s, gemm_bf16 {e['gemm_bf16']['value']}, hbm {e['hbm']['value']}, "
              f"attention {e['attention_fwd']['value']}/{e['attention_bwd']['value']}"
              + (f"; link {raw['links']['latency_s'] * 1e6:,.0f} us, "
                 f"{raw['links']['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s" if raw["links"] else ""))
    else:
        print(text)
    return 0


def cmd_e2e_cpu(args: argparse.Namespace) -> int:
    from raytune_primus.e2e.runner import BusyMachine, e2e_text, run_e2e
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.format == "json" else \
        (lambda *a: print(*a, flush=True))
    try:
        res = run_e2e(profile=args.profile, cache_dir=args.cache_dir, use_cache=not args.no_cache,
                      repeats=args.repeats, iterations=args.iterations, rounds=args.rounds, budget_s=args.budget,
                      wait_s=args.wait, allow_busy=args.allow_busy, busy_limit_cores=args.busy_limit,
                      dtype=args.dtype, log=log)
    except BusyMachine as exc:
        print(f"error: {clip(str(exc), MAX_ERROR_LINE)}", file=sys.stderr)
        return EXIT_NOT_VALID
    if args.format == "json":
        _print_json(res)
    else:
        print(e2e_text(res))
    return {"PASS": 0, "FAIL": 1}.get(res["verdict"], EXIT_NOT_VALID)


# ---------------------------------------------------------------------- plumbing
class _UsageError(PrimusError):
    pass


def _usage(msg: str) -> _UsageError:
    return _UsageError(msg)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return v


def add_benchmark_flags(p: argparse.ArgumentParser) -> None:
    """Flags of benchmark mode (project --mode benchmark|both, e2e-cpu, hardware calibrate)."""
    p.add_argument("--benchmark-gpus", type=_positive_int, metavar="N",
                   help="devices the benchmark measures on (default: the GPUs present, 1 on a CPU-only machine)")
    p.add_argument("--cache-dir", help="measurement cache folder (default ~/.cache/raytune-primus/bench)")
    p.add_argument("--no-cache", action="store_true", help="re-measure every layer (neither read nor write the cache)")
    p.add_argument("--repeats", type=_positive_int, default=7, help="timed repeats per layer (median; default 7)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"],
                   help="dtype the layers are timed in (default auto: bf16 where the device runs it natively, else "
                        "fp32, priced as the target's bf16 by the profile's throughput ratio)")


def add_load_flags(p: argparse.ArgumentParser, wait_s: float) -> None:
    """Flags of the busy-machine check (e2e-cpu, hardware calibrate)."""
    from oracle.benchmark.load import BUSY_LIMIT_CORES
    p.add_argument("--wait", type=float, default=wait_s, metavar="S",
                   help=f"seconds to wait, in all, for a machine without other load (default {wait_s:.0f})")
    p.add_argument("--allow-busy", action="store_true",
                   help="measure even while other processes use the machine (the results say so)")
    p.add_argument("--busy-limit", type=float, default=BUSY_LIMIT_CORES, metavar="CORES",
                   help=f"others' CPU use, in cores, above which the machine counts as busy (default {BUSY_LIMIT_CORES})")


def version_line() -> str:
    """The version, the Python, and the pipeline replay this install runs (oracle/pipeline/_jit.py) under the
    environment's ``RAYTUNE_PRIMUS_JIT``: the C extension where it was built from the source beside it, else numba
    once a process has replayed enough, else the Python loop. Imports neither numba nor the oracle's models."""
    import importlib.metadata
    import importlib.util
    import platform

    from oracle.pipeline import _jit
    try:
        version = importlib.metadata.version("raytune-primus")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    mode = _jit.mode()  # InvalidConfigError on a bad RAYTUNE_PRIMUS_JIT, naming the valid values
    built = _jit.extension() is not None
    numba = importlib.util.find_spec("numba") is not None
    if mode == "off":
        replay = "the Python loop"
    elif mode != "numba" and built:
        replay = "the C extension (oracle.pipeline._native)"
    elif numba:
        replay = "numba" + (" once a process has replayed 5M steps (Python before)" if mode == "auto" else "")
    else:
        replay = "the Python loop (numba is not installed)"
    if not built:
        replay += "; the C extension is not built here (no C compiler at install, or a stale build: reinstall)"
    return (f"raytune-primus {version} (Python {platform.python_version()}, {platform.machine()}); "
            f"pipeline replay: {replay} [RAYTUNE_PRIMUS_JIT={mode}]")


class _VersionAction(argparse.Action):
    """``--version``: :func:`version_line`, computed when asked (not at every start)."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001
        try:
            line = version_line()
        except PrimusError as exc:
            parser.exit(EXIT_USAGE, f"error: {exc}\n")
        print(line)
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raytune-primus", description="Project memory and throughput of distributed "
                                "LLM training configurations, and search for the fastest memory-legal one.")
    p.add_argument("--version", action=_VersionAction, nargs=0,
                   help="print the version, the Python and which pipeline replay this install runs, and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    pj = sub.add_parser("project", help="project memory and throughput of one config file")
    pj.add_argument("config", nargs="?", help="YAML or JSON config (sections model, cluster, training, optional recipe); "
                    "or give --model/--hardware/--num-gpus")
    pj.add_argument("--model", metavar="M", help="bundled card name, card YAML path or Hugging Face config.json path")
    pj.add_argument("--hardware", metavar="H", help="hardware profile name or YAML path")
    pj.add_argument("--num-gpus", type=_positive("--num-gpus"), metavar="N", help="GPUs in the job")
    pj.add_argument("--seq-len", type=_positive("--seq-len"), metavar="S",
                    help="sequence length in tokens (training.seq_len), as tune takes it")
    pj.add_argument("--gbs", type=_positive("--gbs"), metavar="G", help="global batch in sequences (training.gbs)")
    pj.add_argument("--precision", metavar="P", help="GEMM number format: bf16, fp8 or nvfp4 (training.precision)")
    pj.add_argument("--megatron-args", metavar="TEXT", help="a Megatron-LM launch line (flags and NAME=value environment "
                    "words) read onto the training config; every flag is priced or listed as ignored. Write "
                    "--megatron-args=\"--tensor-model-parallel-size 4 ...\" when the line starts with a flag")
    pj.add_argument("--bridge-recipe", metavar="NAME", help="a Megatron-Bridge performance recipe function (e.g. "
                    "deepseek_v3_pretrain_256gpu_gb300_fp8mx_config): its model card, GPU count, hardware and every "
                    "setting it makes, read from the installed megatron-bridge (scripts/install-frameworks.sh); "
                    "--set and the batch flags override it")
    pj.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key, e.g. training.tp=8 (repeatable)")
    pj.add_argument("--mode", default="simulate", choices=["simulate", "benchmark", "both"],
                    help="simulate: analytical layer times; benchmark: torch layers timed on this machine's "
                    "device (downscale-measure-upscale); both: side by side per layer and op")
    add_benchmark_flags(pj)
    pj.add_argument("--format", default="table", choices=["table", "json"], help="output format (default table)")
    pj.add_argument("--compare-schedules", action="store_true", help="project every applicable pipeline schedule")
    pj.add_argument("--no-hints", action="store_true",
                    help="do not look for the one-change neighbours that fit when the config does not fit in memory "
                         "(memory savers, a smaller micro-batch, twice the TP/PP/CP/EP: a few projections)")
    pj.add_argument("--gantt", metavar="FILE.png", help="draw the pipeline schedule")
    pj.set_defaults(func=cmd_project)

    va = sub.add_parser("validate", help="project every row of a measurement CSV and score the errors")
    va.add_argument("csv", help="measurement CSV; model/hardware cells may be bundled names or .yaml paths "
                    "relative to the CSV's folder")
    va.add_argument("--format", default="table", choices=["table", "json"], help="output format (default table)")
    va.add_argument("--plot", metavar="FILE.png", help="also plot projected against measured here")
    va.add_argument("--jobs", type=_non_negative("--jobs"), default=1, metavar="N",
                    help="processes to project the rows in (0: every core; default 1); same results")
    va.set_defaults(func=cmd_validate)

    hw = sub.add_parser("hardware", help="list or show hardware profiles, or calibrate one for this machine")
    hw.add_argument("action", choices=["list", "show", "calibrate"],
                    help="list: bundled profiles; show: one profile; calibrate: measure this machine")
    hw.add_argument("name", nargs="?", help="show: profile name; calibrate: name of the new profile")
    hw.add_argument("--base", default="cpu-host", help="calibrate: profile whose peaks and citations are kept "
                    "(default cpu-host; on a GPU machine the bundled profile of that GPU)")
    hw.add_argument("--world", type=_positive_int, default=1,
                    help="calibrate: local processes (devices) whose links are measured (default 1: none)")
    hw.add_argument("--threads", type=_positive_int, help="calibrate on a CPU: cores per device (default: all)")
    hw.add_argument("-o", "--output", help="calibrate: write the profile YAML here (default: print it)")
    hw.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"],
                    help="calibrate: dtype of the kernels (default auto: bf16 where the device runs it natively, else "
                         "fp32, whose peak then stands for bf16)")
    add_load_flags(hw, wait_s=30)
    hw.set_defaults(func=cmd_hardware)

    e2 = sub.add_parser("e2e-cpu", help="CPU end-to-end proof: real multi-process gloo runs (DP, PP, EP) vs "
                        "projections from a 1-process benchmark")
    e2.add_argument("--format", default="table", choices=["table", "json"], help="output format (default table)")
    e2.add_argument("--profile", help="hardware profile of one core per device (default: calibrate one first)")
    e2.add_argument("--iterations", type=_positive_int, default=8,
                    help="most timed trainer iterations per run (fewer when the budget asks; default 8)")
    e2.add_argument("--rounds", type=_positive_int, default=3,
                    help="most rounds of (benchmark a run's layers, then the run), per run reporting the median over "
                         "its quiet rounds of the measured and of the projected tokens/s (default 3; fewer when "
                         "the budget asks)")
    e2.add_argument("--budget", type=float, default=240.0, metavar="S",
                    help="seconds for calibration and the rounds, waits for quiet not included (default 240)")
    add_benchmark_flags(e2)
    add_load_flags(e2, wait_s=120)
    e2.set_defaults(func=cmd_e2e_cpu)

    mo = sub.add_parser("models", help="list, show or import model cards")
    mo.add_argument("action", choices=["list", "show", "import"],
                    help="list: bundled cards; show: one card; import: a Hugging Face config.json as a card")
    mo.add_argument("name", nargs="?", help="card name (show) or config.json path (import)")
    mo.add_argument("-o", "--output", help="import: write the card YAML here")
    mo.add_argument("--card-name", help="import: name of the new card")
    mo.set_defaults(func=cmd_models)

    from raytune_primus.search_cli import add_search_commands
    add_search_commands(sub)
    from raytune_primus.report_cli import add_report_commands
    add_report_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        tune_bulk_process()  # a command projects in bulk (oracle/collector.py)
        return int(args.func(args) or 0)
    except PrimusError as exc:
        for line in str(exc).splitlines() or [type(exc).__name__]:
            print(f"error: {clip(line, MAX_ERROR_LINE)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a file the command writes or reads (a --plot under /proc, a full disk): which, and why
        where = f"{clip(str(exc.filename), MAX_ERROR_LINE // 2)}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())

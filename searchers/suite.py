"""The experiment suites: every searcher on every experiment of a suite, against each space's optimum.

:data:`SUITES` names them. ``bundled`` (:data:`SUITE`, issue 14) lists seven experiments (``experiments/NAME.yaml``)
from 8 to 1,024 GPUs, dense and MoE, on H100, B200, GB200-NVL72 and MI355X, most with published baselines; the search
was developed on them. ``generalise`` (:data:`SUITE_GENERALISE`, issue 26) lists fifteen more
(``experiments/suite2/``), written as a user would before any searcher change was made on them: fourteen derived from
a model and a cluster by ``raytune-primus experiments init`` (the planner's first memory-legal point as baseline, the
default space, a number format opened where a user would ask for it, ``--set cp=1`` on two short-sequence MoE runs to
keep the space enumerable) and one user recipe (NVIDIA's published GPT-3 175B row): dense, MoE and MLA models from
8 to 1,024 GPUs on A100, H100, H200, B200, GB200, MI300X, MI325X and MI355X. :func:`run_suite` runs ``compare`` on
each (the caller passes
the compare function: the in-process :func:`searchers.driver.compare`, or the Ray one) with the
exhaustive optimum computed once per space and oracle and cached on disk
(:func:`searchers.driver.exhaustive_optimum`: keyed by the space fingerprint, the oracle mode and the
oracle fingerprint, so an edit to the oracle or to a spec recomputes it and nothing else does).

The optimum is exact: the real oracle offers a provable throughput bound per point, and the sweep
projects points best bound first and stops when no remaining bound can beat the best (branch and
bound), so even the 100k-point DeepSeek-V3 space is solved exactly; the space's upper bound (the
largest per-point bound) is reported next to it, and every searcher's regret against both.

Nothing here imports Ray; nothing here knows an experiment by name except the suite lists.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from oracle.errors import InvalidConfigError
from searchers.experiment import Experiment, load_experiment, shipped

SUITE: tuple[str, ...] = (
    "qwen3-30b-a3b-b200-8",
    "mixtral-8x22b-mi355x-4node",
    "llama3.1-70b-h100-64",
    "gpt-oss-120b-b200-64",
    "qwen3-235b-a22b-gb200-256",
    "llama3.1-405b-h100-512",
    "deepseek-v3-h100-1024",
)
"""The bundled suite's experiments, smallest cluster first (issue 14)."""
SUITE_GENERALISE: tuple[str, ...] = (
    "llama3.1-8b-h100-8",
    "qwen3-30b-a3b-mi300x-8",
    "deepseek-v2-lite-h200-16",
    "mistral-nemo-12b-mi325x-16",
    "gpt-oss-20b-a100-16",
    "mixtral-8x7b-h100-32",
    "qwen3-32b-b200-32",
    "deepseek-v2-mi300x-64",
    "dbrx-h200-64",
    "qwen2.5-72b-mi355x-128",
    "gpt3-175b-h100-128",
    "mistral-large-2-h100-256",
    "llama4-maverick-gb200-256",
    "nemotron4-340b-b200-512",
    "kimi-k2-mi355x-1024",
)
"""The generalisation suite's experiments (``experiments/suite2/``), smallest cluster first (issue 26)."""
SUITES: dict[str, tuple[str, ...]] = {"bundled": SUITE, "generalise": SUITE_GENERALISE}
"""Suites by name (``compare --suite NAME``; ``--suite`` alone is ``bundled``)."""
DEFAULT_OPTIMA_CACHE = Path(__file__).resolve().parents[1] / "results" / "optima"
"""Where computed optima are kept (``optimum-SPACE-MODE-ORACLE.json``); results/ is not versioned."""
BAR_REGRET = 0.01
"""The bar: seed_llm's median regret at most 1% on every experiment at the full budget, and below GP's and TPE's."""
BAR_EARLY_TRIALS = 15
"""... and at most :data:`BAR_EARLY_REGRET` after this many trials (issue 26)."""
BAR_EARLY_REGRET = 0.02
BAR_RIVALS: tuple[str, ...] = ("gp", "tpe")

CompareFn = Callable[..., dict[str, Any]]
"""``compare(exp, budget, seeds, searchers, *, evaluator, optimum) -> summary`` (driver.compare's shape)."""


def suite_names(suite: str = "bundled") -> tuple[str, ...]:
    """The experiments of a named suite; one-line error naming the valid suites."""
    if suite not in SUITES:
        raise InvalidConfigError(f"--suite: unknown suite {suite!r}; valid: {', '.join(SUITES)}")
    return SUITES[suite]


def suite_experiments(names: Sequence[str] | None = None, suite: str = "bundled") -> list[Experiment]:
    """A suite's experiments, or the named subset (shipped names or YAML paths), in the given order."""
    chosen = list(names) if names else list(suite_names(suite))
    problems = []
    known = shipped()
    for n in chosen:
        if not n.endswith((".yaml", ".yml", ".json")) and "/" not in n and n not in known:
            problems.append(f"--experiments: unknown experiment {n!r}; shipped: {', '.join(known)}")
    if problems:
        raise InvalidConfigError(problems)
    return [load_experiment(n) for n in chosen]


def _regret(best: float | None, ref: float | None) -> float | None:
    if best is None or not ref:
        return None
    return max(0.0, 1.0 - best / ref)


def _median(values: Sequence[float | None]) -> float | None:
    vals = [math.inf if v is None else float(v) for v in values]
    if not vals:
        return None
    m = statistics.median(vals)
    return None if math.isinf(m) else m


def run_suite(compare_fn: CompareFn, *, experiments: Sequence[str] | None = None, suite: str = "bundled",
              budget: int = 30,
              seeds: int | Sequence[int] = 5, searchers: Sequence[str] | None = None,
              evaluator_for: Callable[[Experiment], Any] | None = None,
              optimum_fn: Callable[[Experiment, Any], dict[str, Any]] | None = None,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``compare_fn`` on every suite experiment with its cached optimum; the suite summary.

    ``optimum_fn(exp, evaluator)`` returns the optimum in :func:`searchers.driver.exhaustive_optimum`'s
    shape (default: that function with the on-disk cache). Returns ``{"experiments": {NAME: compare
    summary + "gpus", "model", "hardware", "optimum_wall_s", "optimum_method", "upper_bound"}, "bar":
    {...}, "wall_s", "budget", "seeds", "suite", "oracle"}``; each searcher entry also gets
    ``median_regret_vs_bound`` and ``median_regret_at_15`` (regret after :data:`BAR_EARLY_TRIALS` trials, from the
    best-so-far curves; ``regrets_at_15`` per seed). ``oracle`` is the oracle fingerprint the numbers were taken under.
    """
    from searchers.driver import default_evaluator, exhaustive_optimum
    from searchers.evaluator import oracle_fingerprint

    exps = suite_experiments(experiments, suite)
    if optimum_fn is None:
        def optimum_fn(exp: Experiment, ev: Any) -> dict[str, Any]:
            return exhaustive_optimum(exp.space, ev, cache_dir=DEFAULT_OPTIMA_CACHE)
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    out: dict[str, Any] = {"suite": suite if not experiments else f"{suite} (subset)", "oracle": oracle_fingerprint(),
                           "budget": budget, "seeds": list(range(seeds)) if isinstance(seeds, int) else list(seeds),
                           "experiments": {}}
    for exp in exps:
        ev = evaluator_for(exp) if evaluator_for is not None else default_evaluator(exp.oracle_mode)
        t1 = time.perf_counter()
        say(f"{exp.name}: optimum of {exp.space.size} points ...")
        opt = optimum_fn(exp, ev)
        say(f"{exp.name}: optimum {opt['tokens_per_s_per_gpu'] or 0:,.0f} tokens/s/GPU "
            f"({time.perf_counter() - t1:.0f} s; computed in {opt.get('wall_s', 0):.0f} s); searching ...")
        summary = compare_fn(exp, budget, seeds, searchers, evaluator=ev, optimum=opt)
        bound = opt.get("upper_bound_tokens_per_s_per_gpu")
        optimum = opt.get("tokens_per_s_per_gpu")
        for name, s in summary["searchers"].items():
            early = [_regret(_best_within(c, BAR_EARLY_TRIALS), optimum) for c in summary["curves"].get(name, [])]
            s["regrets_at_15"] = early
            s["median_regret_at_15"] = _median([1.0 if r is None else r for r in early]) if early else None
            s["median_regret_vs_bound"] = _median([1.0 if r is None else r
                                                  for r in (_regret(b, bound) for b in s["bests"])]) \
                if bound else None
        summary.update(gpus=exp.baseline.cluster.num_gpus, model=exp.baseline.model.name,
                       hardware=exp.baseline.cluster.hardware.name, optimum_method=opt.get("method", "sweep"),
                       optimum_projected=opt.get("projected"), upper_bound=bound,
                       optimum_computed_s=opt.get("wall_s"), experiment_wall_s=time.perf_counter() - t1)
        out["experiments"][exp.name] = summary
        say(f"{exp.name}: done in {time.perf_counter() - t1:.0f} s")
    out["wall_s"] = time.perf_counter() - t0
    out["bar"] = bar(out)
    return out


def _best_within(curve: Sequence[float | None], trials: int) -> float | None:
    """Best value after ``trials`` trials of a best-so-far curve (the last value when the run stopped earlier)."""
    vals = [v for v in list(curve)[:trials] if v is not None]
    return max(vals) if vals else None


def bar(suite: dict[str, Any]) -> dict[str, Any]:
    """Where seed_llm meets the issue's bar per experiment: median regret <= 1% at the full budget and <= 2% after
    15 trials (where the run recorded it), and below GP's and TPE's."""
    per: dict[str, dict[str, Any]] = {}
    for name, s in suite["experiments"].items():
        sl = s["searchers"].get("seed_llm")
        if sl is None:
            continue
        r = sl["median_regret"]
        early = sl.get("median_regret_at_15")
        rivals = {k: s["searchers"][k]["median_regret"] for k in BAR_RIVALS if k in s["searchers"]}
        within = r is not None and r <= BAR_REGRET
        early_ok = "median_regret_at_15" not in sl or (early is not None and early <= BAR_EARLY_REGRET)
        beats = {k: (r is not None and (v is None or r < v or (r == 0.0 and v == 0.0))) for k, v in rivals.items()}
        per[name] = {"seed_llm_median_regret": r, "seed_llm_median_regret_at_15": early, "within_1pct": within,
                     "within_2pct_at_15": early_ok, "beats": beats, "met": within and early_ok and all(beats.values())}
    return {"per_experiment": per, "met_on": sum(v["met"] for v in per.values()), "of": len(per)}


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def format_suite_table(suite: dict[str, Any]) -> str:
    """One table: per experiment and searcher, median regret (against the exact optimum and against the
    space's upper bound), trials to within 2%, median pre-filter rejections, wall time."""
    head = ["experiment", "GPUs", "points", "optimum tok/s/GPU", "searcher", "median regret", "vs bound",
            f"regret @{BAR_EARLY_TRIALS}", "trials to 2%", "rejections", "wall s"]
    rows: list[list[str]] = []
    for name, s in suite["experiments"].items():
        opt = s["optimum"]["tokens_per_s_per_gpu"]
        first = True
        for sname, r in s["searchers"].items():
            t2 = r["median_trials_to_2pct"]
            rows.append([name if first else "", str(s["gpus"]) if first else "",
                         f"{s['space_size']:,}" if first else "",
                         (f"{opt:,.0f}" if opt else "none fits") if first else "", sname, _pct(r["median_regret"]),
                         _pct(r.get("median_regret_vs_bound")), _pct(r.get("median_regret_at_15")),
                         "never" if t2 is None else f"{t2:.0f}",
                         f"{r['prefilter_rejections']:g}", f"{r['wall_s']:.0f}"])
            first = False
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    left = {0, 4}  # "trials to 2%": the median run's first trial within 2% of the optimum

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    out = [f"suite {suite.get('suite', 'bundled')}: {len(suite['experiments'])} experiments, budget {suite['budget']}, "
           f"seeds {suite['seeds']}, oracle {suite.get('oracle', '?')}; wall {suite['wall_s']:.0f} s",
           line(head), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    b = suite.get("bar") or {}
    if b.get("of"):
        missed = [n for n, v in b["per_experiment"].items() if not v["met"]]
        out.append(f"bar (seed_llm median regret <= {100 * BAR_REGRET:.0f}% at the budget and <= "
                   f"{100 * BAR_EARLY_REGRET:.0f}% after {BAR_EARLY_TRIALS} trials, below {', '.join(BAR_RIVALS)}): "
                   f"met on {b['met_on']} of {b['of']}" + (f"; missed on {', '.join(missed)}" if missed else ""))
    return "\n".join(out)

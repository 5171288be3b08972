"""The in-process driver: a plain loop over the oracle (for the CLI and tests), and the comparison.

:func:`run_search` runs one searcher on an experiment behind the memory pre-filter, records every
candidate in the ledger, and resumes from it: a run whose ledger already holds trials replays the
searcher and answers known configurations from the ledger, so nothing is scored twice.

:func:`compare` runs several searchers over several seeds on equal budgets, computes the
exhaustive optimum of the same space with the same oracle, and reports per searcher the median
best tokens/s/GPU, the regret (1 - best/optimum), the trials needed to come within 2% of the
optimum and the pre-filter rejections, with every run's best-so-far curve (``curves``) for
``raytune_primus.plots.compare_curves`` to draw.
"""
from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from oracle.units import GIB
from searchers.base import make_searcher
from searchers.book import TrialBook
from searchers.evaluator import (Evaluator, OracleEvaluator, evaluator_version, memory_results,
                                 oracle_fingerprint, score_result, score_results)
from searchers.experiment import Experiment, load_experiment
from searchers.ledger import Ledger
from searchers.prefilter import PreFilter
from searchers.space import SearchSpace

log = logging.getLogger(__name__)
DEFAULT_SEARCHERS: tuple[str, ...] = ("seed_llm", "tpe", "gp", "random", "grid")
WITHIN = 0.02
"""'Reached the optimum' means best >= (1 - WITHIN) * optimum."""


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """Outcome of one search run, whichever driver ran it (``run_search`` here, Ray Tune trials in
    ``raytune_primus.tuner.run_tune``); :meth:`summary` is what ``summary.json`` holds."""

    experiment: str
    searcher: str
    seed: int
    proposer: str
    """Which proposer produced the suggestions (e.g. 'seed-planner + cross-axis (offline)')."""
    budget: int
    trials: int
    """Trials counted against the budget (scored + rejected + failed), resumed ones included."""
    resumed: int
    """Trials read back from the ledger instead of being run again."""
    best_tokens_per_s_per_gpu: float | None
    best_training: dict[str, Any] | None
    best_key: str
    best_memory_gib: float | None
    best_so_far: list[float | None]
    prefilter_rejections: int
    illegal: int
    failed: int
    repeats: int
    oracle_mode: str
    ledger_path: str | None
    wall_s: float
    proposer_stats: dict[str, Any] = field(default_factory=dict)
    proposer_trials: dict[str, int] = field(default_factory=dict)
    """Counted trials per proposer (the ledger's ``proposer`` column), e.g. {'seed-planner': 12,
    'llm:openai/x': 3, 'cross-axis (offline)': 15}."""
    budget_spent: bool = False
    """Whether the whole budget was used (False: the searcher or the space ran out first)."""
    driver: str = "inprocess"
    """'inprocess' (a plain loop) or 'ray' (Ray Tune trials on oracle actors)."""
    tune: Any = None
    """The Ray driver's own record (``raytune_primus.tuner.TuneRecord``: Tune trials, errors, retries,
    where Tune's state lives); None in process."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def winner(self) -> dict[str, Any] | None:
        """The best fitting trial: tokens/s/GPU, config key, peak memory and training values."""
        if self.best_training is None:
            return None
        return {"tokens_per_s_per_gpu": self.best_tokens_per_s_per_gpu, "key": self.best_key,
                "memory_gib": self.best_memory_gib, "config": dict(self.best_training)}

    def summary(self) -> dict[str, Any]:
        """``summary.json``'s search part: the same keys whichever driver ran it (``tune`` is None and
        ``tune_trials``/``errored``/``retries`` are 0 in process)."""
        tune = asdict(self.tune) if self.tune is not None else None
        return {
            "driver": self.driver, "experiment": self.experiment, "searcher": self.searcher, "seed": self.seed,
            "proposer": self.proposer, "budget": self.budget, "oracle_mode": self.oracle_mode,
            "trials_run": self.trials, "resumed": self.resumed, "rejected": self.prefilter_rejections,
            "illegal": self.illegal, "failed": self.failed, "repeats": self.repeats,
            "tune_trials": tune["tune_trials"] if tune else 0, "errored": tune["errored"] if tune else 0,
            "retries": tune["retries"] if tune else 0, "proposer_trials": dict(self.proposer_trials),
            "budget_spent": self.budget_spent, "proposer_stats": dict(self.proposer_stats),
            "best_so_far": list(self.best_so_far), "winner": self.winner, "search_wall_s": self.wall_s,
            "tune": tune}


def searcher_stats(searcher: Any) -> dict[str, Any]:
    """A searcher's own counters (``stats()``, e.g. the LLM proposer's rounds), {} when it keeps none."""
    stats_fn = getattr(searcher, "stats", None)
    return dict(stats_fn()) if callable(stats_fn) else {}


def default_evaluator(mode: str) -> Evaluator:
    if mode == "synthetic":
        from searchers.testing import SyntheticEvaluator
        return SyntheticEvaluator()
    if mode == "benchmark":  # torch layers measured on this machine's device (oracle.benchmark, docs/benchmark.md)
        from oracle.benchmark.source import BenchmarkSource
        return BenchmarkSource()
    return OracleEvaluator(mode)


def _as_experiment(experiment: Experiment | str | Path) -> Experiment:
    return experiment if isinstance(experiment, Experiment) else load_experiment(experiment)


def run_search(experiment: Experiment | str | Path, searcher_name: str | None = None, budget: int | None = None,
               seed: int | None = None, ledger_path: str | Path | None = None, *,
               evaluator: Evaluator | None = None, options: dict[str, Any] | None = None,
               run_id: str | None = None, max_stale: int = 40) -> SearchResult:
    """Run one searcher on ``experiment`` (a spec, a bundled name or a path) and return the outcome.

    ``searcher_name``, ``budget`` and ``seed`` default to the spec's. ``options`` replace the spec's
    searcher options (an ``lm`` object may be passed here for tests). With ``ledger_path`` every
    candidate is appended to that parquet file and a previous run with the same run id
    (``EXPERIMENT/SEARCHER/seedN``) is resumed from it. The search stops early when the searcher
    has nothing left, or after ``max_stale`` suggestions in a row that bring nothing new.
    """
    exp = _as_experiment(experiment)
    name = searcher_name or exp.searcher
    budget = exp.budget if budget is None else int(budget)
    seed = exp.seed if seed is None else int(seed)
    evaluator = evaluator or default_evaluator(exp.oracle_mode)
    opts = exp.searcher_options(name) if options is None else dict(options)
    ledger = Ledger(ledger_path, experiment=exp.name) if ledger_path is not None else None
    run_id = run_id or f"{exp.name}/{name}/seed{seed}"
    book = TrialBook(budget=budget, run_id=run_id, searcher=name, seed=seed, oracle_mode=evaluator.mode,
                     experiment=exp.name, ledger=ledger,
                     oracle_version=evaluator_version(evaluator, exp.baseline))
    t0 = time.perf_counter()
    inner = make_searcher(name, exp.space, seed=seed, **opts)
    gate = PreFilter(inner, evaluator, book, max_stale=max_stale)
    try:
        while not book.exhausted:
            c = gate.suggest()
            if c is None:
                break
            res = score_result(evaluator, c.meta["run"], c.meta["key"])
            book.record(c, res, started_at=c.meta.get("started_at"))
            gate.observe(c, res)
    finally:
        gate.close()
        if ledger is not None:
            ledger.close()
    best = book.best
    return SearchResult(
        experiment=exp.name, searcher=name, seed=seed, proposer=gate.proposer, budget=budget, trials=book.used,
        resumed=book.resumed, best_tokens_per_s_per_gpu=best.value if best else None,
        best_training=dict(best.training) if best and best.training else None, best_key=best.key if best else "",
        best_memory_gib=best.peak_bytes / GIB if best and best.peak_bytes else None,
        best_so_far=book.best_so_far(), prefilter_rejections=book.count("rejected"),
        illegal=book.count("illegal"), failed=book.count("failed"), repeats=gate.repeats,
        oracle_mode=evaluator.mode, ledger_path=str(ledger_path) if ledger_path is not None else None,
        wall_s=time.perf_counter() - t0, proposer_stats=searcher_stats(inner),
        proposer_trials=book.proposer_trials(), budget_spent=book.budget_spent)


# ---------------------------------------------------------------------------------------------- optimum
_OPTIMA: dict[tuple[str, str], dict[str, Any]] = {}


SWEEP_BATCH = 256
"""Points a sweep memory-checks and bounds before projecting the survivors together (``score_results``)."""
BNB_BATCH = 16
"""Candidates the branch and bound projects together, best bound first (a few more than a one-by-one loop
may project: they cannot beat the best, so the optimum and its tie order are the same)."""


def _score_chunk(args: tuple[SearchSpace, Evaluator, Sequence[tuple]]) -> tuple[float | None, tuple | None, int]:
    space, evaluator, points = args
    best, best_p, fitting = None, None, 0
    bound = getattr(evaluator, "upper_bound", None)
    for lo in range(0, len(points), SWEEP_BATCH):
        todo: list[tuple[tuple, Any]] = []
        batch = points[lo:lo + SWEEP_BATCH]
        runs = [space.run_of(p) for p in batch]
        for p, run, rejected in zip(batch, runs, memory_results(evaluator, runs, [""] * len(runs))):
            if rejected is not None:
                continue
            ub = bound(run) if (bound is not None and best is not None) else None
            if ub is not None and ub < best:
                fitting += 1  # fits, and provably cannot beat the best: skip the expensive projection
                continue
            todo.append((p, run))
        results = score_results(evaluator, [run for _, run in todo], [""] * len(todo))
        for (p, _), res in zip(todo, results):
            if res.value is None:
                continue
            fitting += 1
            if best is None or res.value > best:
                best, best_p = res.value, p
    return best, best_p, fitting


_BOUND_STATE: dict[str, Any] = {}
"""What the forked bound workers read (the space, the evaluator): inherited through fork, never pickled."""
PARALLEL_MIN_POINTS = 2000
"""Fewest points a sweep splits over processes (below this the pool's start-up costs more than it saves)."""


def cpu_jobs(jobs: int | None) -> int:
    """``jobs`` processes, ``0``/None meaning every core this process may run on."""
    if jobs:
        return max(1, int(jobs))
    import os
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def memory_and_bounds(evaluator: Evaluator, bound: Any, runs: Sequence[Any]) -> list[float | None]:
    """The first phase of a branch and bound, per run: None where the memory check rejects it, else its
    throughput bound (``math.inf`` where ``bound`` has none for it: it must be projected). In-process
    (:func:`_bound_range`) and on a Ray pool's actors (``raytune_primus.actors.Scorer.bounds_batch``) alike."""
    verdicts: list[Any] = []
    for j in range(0, len(runs), SWEEP_BATCH):
        chunk = runs[j:j + SWEEP_BATCH]
        verdicts += memory_results(evaluator, chunk, [""] * len(chunk))
    out: list[float | None] = []
    for run, rejected in zip(runs, verdicts):
        if rejected is not None:
            out.append(None)
            continue
        try:
            out.append(float(bound(run)))
        except Exception as exc:  # noqa: BLE001 - no bound for this point: it must be projected
            log.debug("no throughput bound for %s: %s", run.key(), exc)
            out.append(math.inf)
    return out


def _bound_range(rng: tuple[int, int]) -> list[float | None]:
    """:func:`memory_and_bounds` of points ``lo..hi-1`` of the space (in order)."""
    space, evaluator, bound = _BOUND_STATE["space"], _BOUND_STATE["evaluator"], _BOUND_STATE["bound"]
    order = space.points
    lo, hi = rng
    return memory_and_bounds(evaluator, bound, [space.run_of(order[i]) for i in range(lo, hi)])


def best_by_bound(bounds: Sequence[float | None], project: Callable[[list[int]], Sequence[float | None]],
                  block: int = BNB_BATCH) -> tuple[float | None, int | None, int, int, float | None]:
    """The second phase of a branch and bound: ``bounds[i]`` is point i's throughput bound (None: it does not
    fit); ``project(indices)`` gives their projected values (None: no value). Points are projected ``block`` at a
    time, best bound first, skipping those whose bound is below the best value so far, until the next bound is
    below it. Exact whatever ``block`` (a skipped or unprojected point's value is at most its bound, below the
    best); ties go to the lowest index, as in a plain sweep. Returns (best value, its index, candidates (points
    that fit), points projected, the largest bound where every candidate has a finite one, else None)."""
    cands = sorted((-b, i) for i, b in enumerate(bounds) if b is not None)
    best: float | None = None
    best_i: int | None = None
    projected = 0
    k = 0
    while k < len(cands):
        if best is not None and -cands[k][0] < best:
            break
        todo = [i for neg_b, i in cands[k:k + block] if best is None or -neg_b >= best]
        k += block
        projected += len(todo)
        for i, v in zip(todo, project(todo)):
            if v is None:
                continue
            if best is None or v > best or (v == best and best_i is not None and i < best_i):
                best, best_i = v, i
    finite = [-nb for nb, _ in cands if math.isfinite(nb)]
    top = max(finite) if cands and len(finite) == len(cands) else None
    return best, best_i, len(cands), projected, top


def _branch_and_bound(space: SearchSpace, evaluator: Evaluator,
                      bound: Any, jobs: int = 1) -> tuple[float | None, tuple | None, int, dict[str, Any]]:
    """Exact best point of ``space``: memory-check every point, bound every fitting one
    (``evaluator.throughput_bound``, provable), project them best bound first and stop at the first bound
    below the best projected value (ties go to the first point in space order, as in the plain sweep):
    :func:`memory_and_bounds` then :func:`best_by_bound`.
    ``jobs`` > 1: the memory checks and bounds (the bulk of the work) run in that many forked processes over
    contiguous ranges of the points, concatenated in order, so the candidates, and the result, are the
    same as in one process."""
    order = space.points
    n = len(order)
    t0 = time.perf_counter()
    _BOUND_STATE.update(space=space, evaluator=evaluator, bound=bound)
    try:
        if jobs > 1 and n >= PARALLEL_MIN_POINTS:
            import concurrent.futures as cf
            import multiprocessing as mp
            k = jobs * 4  # a few ranges per process: ranges differ in cost (pp, shapes)
            edges = [n * j // k for j in range(k + 1)]
            with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork")) as pool:
                parts = list(pool.map(_bound_range, zip(edges[:-1], edges[1:])))
        else:
            parts = [_bound_range((0, n))]
    finally:
        _BOUND_STATE.clear()
    bounds = [b for part in parts for b in part]
    t1 = time.perf_counter()

    def project(block: list[int]) -> list[float | None]:
        return [r.value for r in score_results(evaluator, [space.run_of(order[i]) for i in block], [""] * len(block))]

    best, best_i, fitting, projected, top = best_by_bound(bounds, project)
    extra = {"method": "branch-and-bound", "projected": projected, "jobs": jobs,
             "phase_wall_s": {"memory_and_bounds": t1 - t0, "projections": time.perf_counter() - t1},
             "upper_bound_tokens_per_s_per_gpu": top}
    return best, (order[best_i] if best_i is not None else None), fitting, extra


def _costly_schedules() -> frozenset[str]:
    from oracle.pipeline import SCHEDULES
    return frozenset(n for n, spec in SCHEDULES.items() if spec.cost_aware)


def optimum_record(space: SearchSpace, best: float | None, point: tuple | None, scored: int, wall_s: float,
                   extra: dict[str, Any]) -> dict[str, Any]:
    """What :func:`exhaustive_optimum` returns (and ``raytune_primus.pool.sweep_optimum``, the same on a Ray pool):
    the best value, its point (axis -> value) and training section, the space's size, the points that fit."""
    return {"tokens_per_s_per_gpu": best, "space_size": len(space.points), "scored": scored,
            "point": dict(zip(space.axes, point)) if point is not None else None,
            "config": space.run_of(point).to_dict()["training"] if point is not None else None,
            "wall_s": wall_s, **extra}


def exhaustive_optimum(space: SearchSpace, evaluator: Evaluator, *, jobs: int | None = 0,
                       cache_dir: str | Path | None = None) -> dict[str, Any]:
    """Best memory-legal point of ``space`` by scoring every point (memory first, then throughput).

    Exact: points on an expensive (cost-aware) schedule whose provable throughput bound
    (``evaluator.upper_bound``) is below the best found so far are not projected. An evaluator with
    ``throughput_bound`` (any point; the real oracle has one) is swept by branch and bound instead
    (:func:`_branch_and_bound`; ``method``, ``projected`` and the space's ``upper_bound_tokens_per_s_per_gpu``
    are added), which makes a 100k-point space such as DeepSeek-V3 on 1,024 GPUs tractable.

    Returns ``{"tokens_per_s_per_gpu", "config" (training section), "point", "space_size",
    "scored", "wall_s"}``; memoised per (space, oracle mode) within the process and, with
    ``cache_dir`` and the real oracle, on disk (keyed by the space and the oracle's code and data).
    ``jobs``: processes for the memory checks and bounds (or the plain sweep); 0 or None = every core
    (:func:`cpu_jobs`); the result does not depend on it.
    """
    import json
    mode = getattr(evaluator, "mode", "?")
    memo_key = (space.fingerprint, mode, repr(evaluator))  # evaluators with other caps must not collide
    if memo_key in _OPTIMA:
        return _OPTIMA[memo_key]
    cache_file = None
    if cache_dir is not None and isinstance(evaluator, OracleEvaluator):
        cache_file = Path(cache_dir) / f"optimum-{space.fingerprint}-{mode}-{oracle_fingerprint()}.json"
        if cache_file.exists():
            _OPTIMA[memo_key] = json.loads(cache_file.read_text())
            return _OPTIMA[memo_key]
    t0 = time.perf_counter()
    points = space.points
    if hasattr(evaluator, "upper_bound") and "pp_schedule" in space.axes:
        # cheap schedules first, so the incumbent is strong before the bound prunes expensive ones
        i = space.axes.index("pp_schedule")
        costly = _costly_schedules()
        points = tuple(sorted(points, key=lambda p: p[i] in costly))
    extra: dict[str, Any] = {"method": "sweep"}
    bounded = getattr(evaluator, "throughput_bound", None)
    jobs = cpu_jobs(jobs)
    if callable(bounded):
        best_b, best_pb, fitting_b, extra = _branch_and_bound(space, evaluator, bounded, jobs)
        parts = [(best_b, best_pb, fitting_b)]
    elif jobs > 1 and len(points) > PARALLEL_MIN_POINTS:
        import concurrent.futures as cf
        import multiprocessing as mp
        n = jobs * 8
        chunks = [points[i::n] for i in range(n)]
        with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork")) as pool:
            parts = list(pool.map(_score_chunk, [(space, evaluator, c) for c in chunks]))
    else:
        parts = [_score_chunk((space, evaluator, points))]
    best, best_p, fitting = None, None, 0
    order = space.points
    for b, p, f in parts:
        fitting += f
        if b is not None and (best is None or b > best or (b == best and order.index(p) < order.index(best_p))):
            best, best_p = b, p
    out = optimum_record(space, best, best_p, fitting, time.perf_counter() - t0, extra)
    _OPTIMA[memo_key] = out
    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        cache_file.write_text(json.dumps(out, default=str, indent=1))
    return out


# ---------------------------------------------------------------------------------------------- compare
def trials_to_within(best_so_far: Sequence[float | None], optimum: float, within: float = WITHIN) -> int | None:
    """1-based number of trials after which the best is within ``within`` of ``optimum`` (None = never)."""
    for i, v in enumerate(best_so_far):
        if v is not None and v >= (1.0 - within) * optimum:
            return i + 1
    return None


def _median_or_none(values: Iterable[float | None]) -> float | None:
    vals = [math.inf if v is None else float(v) for v in values]
    if not vals:
        return None
    m = statistics.median(vals)
    return None if math.isinf(m) else m


def compare(experiment: Experiment | str | Path, budget: int = 30, seeds: int | Sequence[int] = 5,
            searchers: Sequence[str] | None = None, *, evaluator: Evaluator | None = None,
            ledger_path: str | Path | None = None, jobs: int | None = 0,
            options: dict[str, dict[str, Any]] | None = None,
            cache_dir: str | Path | None = None, optimum: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run every searcher on equal budgets over ``seeds`` and compare them with the exhaustive optimum.

    Returns ``{"optimum": {"tokens_per_s_per_gpu", "config"}, "space_size", "searchers": {NAME:
    {"median_best", "median_regret", "regrets", "median_trials_to_2pct", "prefilter_rejections",
    "proposer", ...}}, "curves": {NAME: [best-so-far per seed]}, ...}`` with regret as a fraction
    (1 - best/optimum).
    """
    exp = _as_experiment(experiment)
    evaluator = evaluator or default_evaluator(exp.oracle_mode)
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    names = list(searchers or DEFAULT_SEARCHERS)
    t0 = time.perf_counter()
    # ``optimum``: an exhaustive optimum computed elsewhere (e.g. on a Ray scoring pool), same shape
    opt = optimum if optimum is not None else exhaustive_optimum(exp.space, evaluator, jobs=jobs, cache_dir=cache_dir)
    optimum = opt["tokens_per_s_per_gpu"]
    out: dict[str, Any] = {
        "experiment": exp.name, "oracle_mode": evaluator.mode, "budget": budget, "seeds": seed_list,
        "optimum": {"tokens_per_s_per_gpu": optimum, "config": opt["config"]},
        "space_size": opt["space_size"], "space_fitting": opt["scored"], "searchers": {}}
    curves: dict[str, list[list[float | None]]] = {}
    for name in names:
        runs: list[SearchResult] = []
        for s in seed_list:
            opts = None
            if options and name in options:
                opts = {**exp.searcher_options(name), **options[name]}
            runs.append(run_search(exp, name, budget, s, ledger_path, evaluator=evaluator, options=opts))
        bests = [r.best_tokens_per_s_per_gpu for r in runs]
        regrets = [None if (b is None or not optimum) else max(0.0, 1.0 - b / optimum) for b in bests]
        t2 = [trials_to_within(r.best_so_far, optimum) if optimum else None for r in runs]
        curves[name] = [r.best_so_far for r in runs]
        out["searchers"][name] = {
            "median_best": _median_or_none(bests),
            "median_regret": _median_or_none([1.0 if r is None else r for r in regrets]),
            "regrets": regrets, "bests": bests,
            "median_trials_to_2pct": _median_or_none(t2), "trials_to_2pct": t2,
            "prefilter_rejections": statistics.median([r.prefilter_rejections for r in runs]),
            "prefilter_rejections_total": sum(r.prefilter_rejections for r in runs),
            "median_trials": statistics.median([r.trials for r in runs]),
            "budget_spent_runs": sum(r.budget_spent for r in runs),
            "proposer": runs[0].proposer if len({r.proposer for r in runs}) == 1
            else sorted({r.proposer for r in runs}),
            "wall_s": sum(r.wall_s for r in runs),
        }
    out["wall_s"] = time.perf_counter() - t0
    out["optimum_wall_s"] = opt["wall_s"]
    out["curves"] = curves
    return out


def format_table(summary: dict[str, Any]) -> str:
    """The compare summary as a text table."""
    opt = summary["optimum"]["tokens_per_s_per_gpu"]
    lines = [f"experiment {summary['experiment']} ({summary['oracle_mode']}), budget {summary['budget']}, "
             f"seeds {summary['seeds']}",
             f"space: {summary['space_size']} legal points, {summary['space_fitting']} fit in memory; "
             f"exhaustive optimum {opt:,.0f} tokens/s/GPU" if opt else "exhaustive optimum: none fits",
             f"{'searcher':<10} {'median best':>12} {'median regret':>14} {'trials to 2%':>13} "
             f"{'rejections':>11}  proposer"]
    for name, s in summary["searchers"].items():
        mb = f"{s['median_best']:,.0f}" if s["median_best"] is not None else "-"
        mr = f"{100 * s['median_regret']:.1f}%" if s["median_regret"] is not None else "-"
        t2 = f"{s['median_trials_to_2pct']:.0f}" if s["median_trials_to_2pct"] is not None else "never"
        lines.append(f"{name:<10} {mb:>12} {mr:>14} {t2:>13} {s['prefilter_rejections']:>11g}  {s['proposer']}")
    return "\n".join(lines)

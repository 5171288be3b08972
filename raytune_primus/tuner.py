"""A Ray Tune experiment from an experiment spec, and its resumption after an interruption.

:func:`run_tune` builds, per experiment::

    Tuner(with_resources(make_trainable(service), {"cpu": trial_cpus}),
          tune_config=TuneConfig(search_alg=ConcurrencyLimiter(PrimusSearcher(...), max_concurrent),
                                 num_samples=budget, metric="tokens_per_s_per_gpu", mode="max",
                                 reuse_actors=True),
          run_config=RunConfig(storage_path=RESULTS, name="tune", failure_config=FailureConfig(max_failures),
                               callbacks=[ProgressCallback, RetryRecorder]))

:class:`PrimusSearcher` is the Tune face of a search: the registered searcher behind the memory
pre-filter (:class:`searchers.prefilter.PreFilter`) with a :class:`searchers.book.TrialBook` whose
parquet ledger gets a row as each trial completes — exactly the loop of
:func:`searchers.driver.run_search`, so with ``max_concurrent=1`` the Tune path proposes, scores and
records the same sequence as the in-process driver. Pre-filter rejections and illegal proposals
never become Tune trials (they cost no oracle time) but count against the budget as in the paper.

Resuming (``Tuner.restore``): the ledger is the source of truth. The searcher pickles only its recipe
(spec, searcher name, seed, budget, ledger path) and the trials in flight; on restore it re-reads
the ledger (finished trials are answered from it while the fresh searcher replays its sequence), and
Tune re-runs the trials that were in flight. A re-run trial whose result already reached the ledger
is not written twice. Tune's experiment state is saved after every step
(``TUNE_GLOBAL_CHECKPOINT_S=0``), so Tune's list of trials and the ledger agree after a restore.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import pickletools
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune.search import ConcurrencyLimiter, Searcher

from oracle.errors import BenchmarkError, InvalidConfigError
from oracle.units import GIB
from raytune_primus.pool import sweep_optimum  # the exact optimum on a pool (compare_on_ray); also here by name
from raytune_primus.trainable import METRIC, MODE, make_trainable, result_from_metrics
from searchers.base import Candidate, TrialResult, make_searcher
from searchers.book import TrialBook
from searchers.driver import SearchResult, searcher_stats
from searchers.evaluator import evaluator_version
from searchers.ledger import Ledger, now_utc
from searchers.prefilter import PreFilter

TUNE_DIR = "tune"
"""Ray Tune's experiment directory inside the results directory."""


def _candidate_state(c: Candidate) -> dict[str, Any]:
    return {"values": dict(c.values), "phase": c.phase, "round": c.round, "proposer": c.proposer, "note": c.note,
            "key": c.meta.get("key", ""), "training": c.meta.get("training"),
            "started_at": c.meta["started_at"].isoformat() if c.meta.get("started_at") else None}


def _candidate_from_state(s: Mapping[str, Any]) -> Candidate:
    from datetime import datetime
    started = datetime.fromisoformat(s["started_at"]) if s.get("started_at") else None
    return Candidate(values=s["values"], phase=s["phase"], round=s["round"], proposer=s["proposer"], note=s["note"],
                     meta={"key": s["key"], "training": s.get("training"), "started_at": started, "restored": True})


class PrimusSearcher(Searcher):
    """Tune Searcher over a registered searcher + memory pre-filter + ledger (see the module doc).

    Metric and mode are set in the constructor: Tune calls ``set_search_properties`` only when the
    param space is non-empty (``../shared/NOTES-toolchain.md``), and ours is empty.
    """

    def __init__(self, experiment: Any, *, searcher: str | None = None, seed: int | None = None,
                 budget: int | None = None, evaluator: Any = None, ledger_path: str | os.PathLike,
                 options: Mapping[str, Any] | None = None, run_id: str | None = None) -> None:
        super().__init__(metric=METRIC, mode=MODE)
        self.experiment = experiment
        self.searcher_name = searcher or experiment.searcher
        self.seed = experiment.seed if seed is None else int(seed)
        self.budget = experiment.budget if budget is None else int(budget)
        if self.budget < 1:
            raise InvalidConfigError(f"budget={self.budget} must be a positive integer (trials)")
        if evaluator is None:
            from searchers.driver import default_evaluator
            evaluator = default_evaluator(experiment.oracle_mode)
        self.evaluator = evaluator
        self.ledger_path = str(ledger_path)
        self.options = dict(experiment.searcher_options(self.searcher_name) if options is None else options)
        self.run_id = run_id or f"{experiment.name}/{self.searcher_name}/seed{self.seed}"
        self.pending: dict[str, Candidate] = {}
        """Trials in flight: Tune trial id -> candidate."""
        self.waiting: dict[str, list[Candidate]] = {}
        """Re-suggestions of a configuration in flight, answered when it completes (config key -> candidates)."""
        self.retries: list[dict[str, Any]] = []
        self.skipped_rerecord = 0
        """Re-run trials (after a restore) whose result the ledger already had."""
        self._live: dict[str, Any] | None = None

    # ------------------------------------------------------------------ live state (rebuilt after unpickling)
    def _state(self) -> dict[str, Any]:
        if self._live is None:
            exp = self.experiment
            ledger = Ledger(self.ledger_path, experiment=exp.name)
            book = TrialBook(budget=self.budget, run_id=self.run_id, searcher=self.searcher_name, seed=self.seed,
                             oracle_mode=self.evaluator.mode, experiment=exp.name, ledger=ledger,
                             oracle_version=evaluator_version(self.evaluator, exp.baseline))
            inner = make_searcher(self.searcher_name, exp.space, seed=self.seed, **self.options)
            gate = PreFilter(inner, self.evaluator, book)
            book.pending = len(self.pending)
            self._live = {"ledger": ledger, "book": book, "inner": inner, "gate": gate}
        return self._live

    @property
    def book(self) -> TrialBook:
        return self._state()["book"]

    @property
    def inner(self) -> Any:
        """The searcher behind the pre-filter."""
        return self._state()["inner"]

    @property
    def gate(self) -> PreFilter:
        return self._state()["gate"]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_live"] = None  # ledger locks, Optuna studies, LLM clients: rebuilt from the ledger
        state["pending"] = {t: _candidate_state(c) for t, c in self.pending.items()}
        state["waiting"] = {k: [_candidate_state(c) for c in cs] for k, cs in self.waiting.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        state["pending"] = {t: _candidate_from_state(c) for t, c in state["pending"].items()}
        state["waiting"] = {k: [_candidate_from_state(c) for c in cs] for k, cs in state["waiting"].items()}
        self.__dict__.update(state)

    # ------------------------------------------------------------------ Tune's Searcher API
    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        return True  # fixed in __init__ (see the class doc)

    def _pending_keys(self) -> set[str]:
        return {c.meta.get("key", "") for c in self.pending.values()}

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        st = self._state()
        book, gate = st["book"], st["gate"]
        book.pending = len(self.pending)
        if self.pending and getattr(st["inner"], "sequential", False):
            return None  # a sequential proposer (the LLM) needs the last result before the next proposal
        while True:
            if book.exhausted:
                return None if self.pending else Searcher.FINISHED
            c = gate.suggest()
            if c is None:
                # a searcher may be waiting for results in flight; once none are left it is done
                return None if self.pending else Searcher.FINISHED
            key = c.meta["key"]
            if key in self._pending_keys():
                self.waiting.setdefault(key, []).append(c)
                continue
            training = c.meta["run"].to_dict()["training"]
            meta = {k: v for k, v in c.meta.items() if k != "run"}
            self.pending[trial_id] = dataclasses.replace(c, meta={**meta, "training": training})
            book.pending = len(self.pending)
            return {"training": training}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        st = self._state()
        book, gate = st["book"], st["gate"]
        c = self.pending.pop(trial_id, None)
        book.pending = len(self.pending)
        if c is None:
            return  # not ours (a trial re-run after the restore of an older searcher checkpoint)
        key = c.meta.get("key", "")
        if error or not result or "status" not in result:
            retried = sum(1 for r in self.retries if r["trial_id"] == trial_id)
            why = f"Tune trial {trial_id} errored" + (f" after {retried} retries" if retried else "")
            res = TrialResult(status="failed", key=key, training=c.meta.get("training"), reason=why)
        else:
            res = result_from_metrics(result, training=c.meta.get("training"))
        if key and key in book.known:
            self.skipped_rerecord += 1  # a re-run after a restore: the ledger already has it
            res = book.known[key]
        else:
            book.record(c, res, started_at=c.meta.get("started_at"))
        if not c.meta.get("restored"):  # a restored searcher never suggested it: its replay waits below
            gate.observe(c, res)
        for other in self.waiting.pop(key, []):
            gate.observe(other, res)

    # ------------------------------------------------------------------ checkpoints
    def save(self, checkpoint_path: str) -> None:
        st = self._state()
        st["ledger"].flush()
        with open(checkpoint_path, "w") as fh:
            json.dump({"run_id": self.run_id, "ledger_path": self.ledger_path,
                       "pending": {t: _candidate_state(c) for t, c in self.pending.items()},
                       "retries": self.retries, "saved_at": now_utc().isoformat()}, fh, default=str)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path) as fh:
            saved = json.load(fh)
        self.pending = {t: _candidate_from_state(c) for t, c in saved["pending"].items()}
        self.retries = list(saved.get("retries", []))
        self.waiting = {}
        self._live = None  # re-read the ledger and replay the searcher
        st = self._state()
        # trials in flight at the checkpoint that the ledger already holds are done
        for t in [t for t, c in self.pending.items() if c.meta.get("key") in st["book"].known]:
            del self.pending[t]
        st["book"].pending = len(self.pending)

    # ------------------------------------------------------------------ extras for callbacks and reports
    def record_retry(self, trial_id: str, error: str) -> None:
        """A trial failed and Tune will retry it (FailureConfig): one 'retried' event row in the ledger."""
        c = self.pending.get(trial_id)
        self.retries.append({"trial_id": trial_id, "key": c.meta.get("key", "") if c else "", "error": error[:300]})
        self.book.event(status="retried", reason=f"trial {trial_id} ({c.meta.get('key', '') if c else '?'}): "
                                                 f"{error}"[:500],
                        phase=c.phase if c else "", round=c.round if c else 0, proposer=c.proposer if c else "")

    def progress_stats(self) -> dict[str, Any]:
        st = self._state()
        book, gate = st["book"], st["gate"]
        best = book.best
        return {"used": book.used, "budget": book.budget, "prefilter_rejections": book.count("rejected"),
                "illegal": book.count("illegal"), "pending": len(self.pending),
                "best": best.value if best else None,
                "best_config": _describe({"training": best.training}) if best and best.training else "",
                **gate.stats()}

    def close(self) -> None:
        if self._live is not None:
            self._live["gate"].close()
            self._live["ledger"].close()


class RetryRecorder(tune.Callback):
    """Writes a ledger event for every trial Tune retries after a failure (FailureConfig)."""

    def __init__(self, searcher: PrimusSearcher) -> None:
        self.searcher = searcher

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        err = ""
        try:
            path = trial.run_metadata.error_filename
            if path and os.path.exists(path):
                err = Path(path).read_text().strip().splitlines()[-1]
        except Exception:
            pass
        self.searcher.record_retry(trial.trial_id, err or "trial process failed")


def _describe(config: Mapping[str, Any]) -> str:
    t = config.get("training") or {}
    keys = ("tp", "pp", "vpp", "cp", "ep", "mbs", "pp_schedule", "recompute", "precision")
    out = [f"{k}={t[k]}" for k in keys if k in t]
    if t.get("ep", 1) > 1 or t.get("moe_a2a_backend") == "deepep":  # the MoE levers (paper App. H)
        out.append(f"dispatcher={t.get('moe_a2a_backend', 'alltoall')}" + ("+sync-free" if t.get("moe_sync_free") else "")
                   + ("+a2a-overlap" if t.get("moe_a2a_overlap") else ""))
    return " ".join(out)


# ---------------------------------------------------------------------------------- outcome
@dataclass(kw_only=True)
class TuneRecord:
    """What only the Ray driver has: Ray Tune's own account of a search (``SearchResult.tune``)."""

    tune_trials: int
    """Trials Tune ran (pre-filter rejections and illegal proposals never become Tune trials)."""
    errored: int
    """Tune trials that ended in ERROR after their retries."""
    retries: int
    """Trials Tune re-ran after a crash (FailureConfig.max_failures)."""
    experiment_path: str
    """Tune's experiment directory (``Tuner.restore`` resumes from it)."""
    restored: bool
    """This call resumed an earlier Tune run of the same search."""
    set_aside: str | None = None
    """Where an earlier Tune run's state went when a file of it could not be read (the search then resumed
    from the ledger in a fresh Tune run): the folder and the unreadable files."""
    max_concurrent: int
    """Trials in flight at once."""
    scorers: dict[str, Any] = field(default_factory=dict)
    """The scoring service's counters (scorers, alive, busiest)."""
    timing_cache: dict[str, Any] | None = None
    """Benchmark mode: the shared layer-timing cache's counters."""
    progress: list[str] = field(default_factory=list)
    """The progress lines printed during the search."""
    tune_wall_s: float = 0.0
    """Seconds inside ``Tuner.fit``."""


# ---------------------------------------------------------------------------------- building and running
TUNE_STATE_FILES = ("experiment_state-*.json", "search_gen_state-*.json", "searcher-state-*.pkl", "tuner.pkl")
"""The files ``Tuner.restore`` reads (of each pattern the newest by name, as Tune picks it)."""


def _readable(path: Path) -> bool:
    """A state file parses whole. Tune's names do not say the format (``search_gen_state-*.json`` is a pickle,
    our searcher's ``searcher-state-*.pkl`` is JSON): a pickle (protocol >= 2 opens with PROTO) must run its
    opcode stream to the STOP (nothing is unpickled), anything else must load as JSON."""
    try:
        data = path.read_bytes()
        if data[:1] == pickle.PROTO:
            return any(op.name == "STOP" for op, _, _ in pickletools.genops(data))
        json.loads(data)
        return True
    except (OSError, ValueError):  # json.JSONDecodeError and a truncated pickle are ValueErrors
        return False


def unreadable_tune_state(exp_path: Path) -> list[Path]:
    """The state files of the Tune run in ``exp_path`` that ``Tuner.restore`` would read and cannot.

    Ray copies its state into the storage path without an atomic rename, so a driver killed during that copy
    leaves a truncated file (seen: a 0-byte ``search_gen_state-*.json``), and the restore then fails."""
    bad = []
    for pattern in TUNE_STATE_FILES:
        found = sorted(exp_path.glob(pattern))
        if found and not _readable(found[-1]):
            bad.append(found[-1])
    return bad


def _set_aside(exp_path: Path, bad: list[Path]) -> str:
    """Move an unrestorable Tune run out of the way (kept, not deleted); says where and why."""
    n = 1
    while (dest := exp_path.with_name(f"{exp_path.name}.unreadable-{n}")).exists():
        n += 1
    exp_path.rename(dest)
    return f"{dest} (unreadable: {', '.join(p.name for p in bad)})"


SUPPORTED_RAY = ">=2.40,<2.61"
"""The Ray versions ``restored_search_and_callbacks`` is known to work with (pinned in pyproject.toml)."""


def restored_search_and_callbacks(tuner: Any) -> tuple[Any, list[Any]]:
    """The search algorithm and callbacks ``Tuner.restore`` unpickled from the experiment state.

    Ray has no public accessor for them: ``Tuner.restore`` rebuilds both from ``tuner.pkl`` and keeps
    them on its private ``_local_tuner``. This is the one place this package reaches into Tune's
    internals; tests/raytune_primus/test_ray_internals.py fails loudly when a Ray upgrade moves them,
    and pyproject.toml pins the Ray range it was checked on (``SUPPORTED_RAY``).
    """
    try:
        local = tuner._local_tuner
        search = local._tune_config.search_alg
        callbacks = list(local.get_run_config().callbacks or [])
    except AttributeError as exc:
        raise RuntimeError(f"Ray {ray.__version__} keeps a restored Tuner's search algorithm elsewhere than Ray "
                           f"{SUPPORTED_RAY} did ({exc}); resuming a Tune search needs a supported Ray "
                           f"(pyproject.toml)") from exc
    return search, callbacks


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the block and put back what was there (unset ones are removed)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _num_scorers(max_concurrent: int) -> int:
    from raytune_primus.runtime import alive_nodes, cluster_cpus
    return max(1, min(cluster_cpus(), max_concurrent), len(alive_nodes()))


def run_tune(experiment: Any, results_dir: str | os.PathLike, *, searcher: str | None = None,
             seed: int | None = None, budget: int | None = None, evaluator: Any = None,
             max_concurrent: int | None = None, max_failures: int = 2, benchmark_gpus: int | None = None,
             timer: Any = None, num_scorers: int | None = None, trial_cpus: float = 1.0, progress: bool = True,
             hook: Callable[[Mapping[str, Any]], None] | None = None, restore: bool = True,
             checkpoint_period_s: float = 0.0) -> SearchResult:
    """Run (or resume) a Tune search of ``experiment``; Ray must be initialised (see runtime.init_ray).

    Simulate mode (default): ``num_scorers`` CPU scorer actors (``num_cpus=0``, SPREAD). Benchmark mode
    (``timer`` given, or the spec's oracle_mode is 'benchmark'): one device scorer per
    ``benchmark_gpus`` GPUs of the cluster, leased exclusively to one trial at a time, sharing one
    layer-timing cache. ``restore`` resumes ``RESULTS/tune`` when it holds an earlier run of it.
    """
    from ray.util.client import ray as ray_client

    from raytune_primus.actors import kill_all, start_device_scorers, start_scorers, start_service
    from raytune_primus.progress import ProgressCallback
    from raytune_primus.runtime import cluster_gpus

    if ray_client.is_connected():
        raise InvalidConfigError("a ray:// (Ray Client) connection cannot run a Tune search from here (Tune would run "
                                 "it remotely); submit it with `ray job submit ... -- python -m raytune_primus.jobs`")
    exp = experiment
    results = Path(results_dir).resolve()
    results.mkdir(parents=True, exist_ok=True)
    ledger_path = results / "ledger.parquet"
    benchmark = timer is not None or exp.oracle_mode == "benchmark"
    if benchmark and timer is None:  # measured torch layers on each scorer's devices (oracle.benchmark)
        from oracle.benchmark.source import BenchmarkSource
        timer = BenchmarkSource(benchmark_gpus=int(benchmark_gpus or 1))
    if evaluator is None:
        if benchmark:
            evaluator = timer  # the pre-filter only needs .memory(run) and .mode
        else:
            from searchers.driver import default_evaluator
            evaluator = default_evaluator(exp.oracle_mode)
    gpus_per_scorer = int(benchmark_gpus or 1)
    if benchmark:
        devices = cluster_gpus() // gpus_per_scorer
        if devices < 1:
            raise BenchmarkError(f"benchmark mode needs {gpus_per_scorer} GPU(s) per trial; the Ray cluster has "
                                 f"{cluster_gpus()}")
        max_concurrent = min(int(max_concurrent or devices), devices)
    else:
        max_concurrent = int(max_concurrent or 1)
    if max_concurrent < 1:
        raise InvalidConfigError(f"max_concurrent={max_concurrent} must be a positive integer")

    exp_path = results / TUNE_DIR
    spec = {"experiment": exp.name, "space": exp.space.fingerprint, "searcher": searcher or exp.searcher,
            "seed": exp.seed if seed is None else int(seed), "budget": exp.budget if budget is None else int(budget),
            "oracle_mode": evaluator.mode, "oracle_version": evaluator_version(evaluator, exp.baseline)}
    earlier = bool(restore and tune.Tuner.can_restore(str(exp_path)))
    spec_path = results / "tune_spec.json"
    if earlier:
        old = json.loads(spec_path.read_text()) if spec_path.exists() else None
        if old != spec:
            old = old or {}
            changed = sorted(k for k in spec if old.get(k) != spec[k])
            was = ", ".join(f"{k}={old.get(k)!r}" for k in changed)
            now = ", ".join(f"{k}={spec[k]!r}" for k in changed)
            raise InvalidConfigError(f"{results} holds a Tune run of another search ({was}; now {now}): resume it "
                                     f"with the same settings, or use --fresh or another --results directory")
    set_aside = None
    if earlier and (bad := unreadable_tune_state(exp_path)):
        # the ledger is the source of truth: a fresh Tune run over it resumes the search all the same
        set_aside = _set_aside(exp_path, bad)
        warnings.warn(f"Tune's saved state could not be read and was set aside ({set_aside}); the search resumes "
                      f"from the ledger {ledger_path} in a fresh Tune run", stacklevel=2)
    restored = earlier and set_aside is None
    if not restored:  # atomically: a driver killed here leaves the old spec or the new one, never half of one
        tmp = spec_path.with_name(spec_path.name + ".tmp")
        tmp.write_text(json.dumps(spec, indent=1) + "\n")
        os.replace(tmp, spec_path)
    service_name = f"primus-oracle-{uuid.uuid4().hex[:10]}"
    cache = None
    if benchmark:
        scorers, cache = start_device_scorers(timer, exp.space.baseline, devices, gpus_per_scorer=gpus_per_scorer)
    else:
        scorers = start_scorers(evaluator, exp.space.baseline, num_scorers or _num_scorers(max_concurrent))
    service = start_service(service_name, scorers, exclusive=benchmark)
    trainable = tune.with_resources(make_trainable(service_name, hook=hook), {"cpu": trial_cpus})
    t0 = time.perf_counter()
    # read when the controller starts, and put back afterwards: Tune's console tables would interleave
    # with our progress lines (verbose=0 silences only the old engine)
    env = {"TUNE_GLOBAL_CHECKPOINT_S": str(checkpoint_period_s),
           "RAY_AIR_NEW_OUTPUT": os.environ.get("RAY_AIR_NEW_OUTPUT", "0")}
    with _environment(env):
        try:
            if restored:
                tuner = tune.Tuner.restore(str(exp_path), trainable=trainable, resume_unfinished=True,
                                           resume_errored=False, restart_errored=False)
                search, callbacks = restored_search_and_callbacks(tuner)
                primus = search.searcher
                bar = next((c for c in callbacks if isinstance(c, ProgressCallback)), None)
                if bar is not None:
                    bar.enabled = progress
            else:
                primus = PrimusSearcher(exp, searcher=searcher, seed=seed, budget=budget, evaluator=evaluator,
                                        ledger_path=ledger_path)
                search = ConcurrencyLimiter(primus, max_concurrent=max_concurrent)
                bar = ProgressCallback(budget=primus.budget, stats=primus.progress_stats, describe=_describe)
                bar.enabled = progress
                callbacks: list[Any] = [RetryRecorder(primus), bar]
                tuner = tune.Tuner(
                    trainable,
                    tune_config=tune.TuneConfig(search_alg=search, num_samples=primus.budget, metric=METRIC,
                                                mode=MODE, reuse_actors=True,
                                                trial_dirname_creator=lambda t: f"trial_{t.trial_id}"),
                    run_config=tune.RunConfig(name=TUNE_DIR, storage_path=str(results),
                                              failure_config=tune.FailureConfig(max_failures=max_failures),
                                              checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False),
                                              callbacks=callbacks, verbose=0))
            grid = tuner.fit()
            cache_stats = ray.get(cache.stats.remote()) if cache is not None else None
            svc_stats = ray.get(service.stats.remote())
        finally:
            kill_all(service, scorers, cache)
    wall = time.perf_counter() - t0
    book = primus.book
    gate = primus.gate
    best = book.best
    errored = sum(1 for r in grid if r.error is not None)
    primus.close()
    record = TuneRecord(tune_trials=len(grid), errored=errored, retries=len(primus.retries),
                        experiment_path=str(exp_path), restored=restored, set_aside=set_aside,
                        max_concurrent=max_concurrent,
                        scorers=svc_stats, timing_cache=cache_stats, progress=list(bar.lines) if bar else [],
                        tune_wall_s=wall)
    return SearchResult(
        experiment=exp.name, searcher=primus.searcher_name, seed=primus.seed, proposer=gate.proposer,
        budget=primus.budget, trials=book.used, resumed=book.resumed,
        best_tokens_per_s_per_gpu=best.value if best else None,
        best_training=dict(best.training or {}) if best else None, best_key=best.key if best else "",
        best_memory_gib=best.peak_bytes / GIB if best and best.peak_bytes else None,
        best_so_far=book.best_so_far(), prefilter_rejections=book.count("rejected"),
        illegal=book.count("illegal"), failed=book.count("failed"), repeats=gate.repeats,
        oracle_mode=evaluator.mode, ledger_path=str(ledger_path), wall_s=wall,
        proposer_stats=searcher_stats(primus.inner),
        proposer_trials=book.proposer_trials(), budget_spent=book.budget_spent, driver="ray", tune=record)


# ---------------------------------------------------------------------------------- compare on Ray
def _search_job(args: tuple) -> dict[str, Any]:
    """One (searcher, seed) search of a comparison, run on a pool actor with its own ledger file."""
    exp, name, budget, seed, evaluator, opts, ledger_path = args
    from searchers.driver import run_search
    r = run_search(exp, name, budget, seed, ledger_path, evaluator=evaluator, options=opts)
    return r.to_dict()


def compare_on_ray(experiment: Any, budget: int = 30, seeds: int | Sequence[int] = 5,
                   searchers: Sequence[str] | None = None, *, evaluator: Any = None,
                   ledger_path: str | os.PathLike | None = None, plot: str | os.PathLike | None = None,
                   num_actors: int | None = None, batch_size: int = 500,
                   optimum: dict[str, Any] | None = None) -> dict[str, Any]:
    """:func:`searchers.driver.compare`, with the exhaustive sweep and every (searcher, seed) search
    spread over the Ray cluster; the summary is identical to the in-process one.

    The searches run in parallel on pool actors, each with its own ledger; their rows are merged into
    ``ledger_path`` and ``compare`` then replays every run from it (a finished run resumes instantly),
    so the aggregation is the in-process code's. The optimum comes from
    :func:`~raytune_primus.pool.sweep_optimum` on the pool (the in-process branch and bound), unless ``optimum``
    (one computed and cached elsewhere, e.g. by ``compare --suite``) is given.
    """
    from raytune_primus.pool import ScoringPool
    from searchers import driver

    exp = experiment if not isinstance(experiment, (str, os.PathLike)) else driver.load_experiment(experiment)
    evaluator = evaluator or driver.default_evaluator(exp.oracle_mode)
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    names = list(searchers or driver.DEFAULT_SEARCHERS)
    with tempfile.TemporaryDirectory(prefix="primus-compare-") as tmp:
        final = Path(ledger_path) if ledger_path is not None else Path(tmp) / "ledger.parquet"
        # runs already in the ledger are resumed, as the in-process compare does
        earlier = Ledger(final, experiment=exp.name)
        jobs, copied = [], []
        for n in names:
            for s in seed_list:
                part = Path(tmp) / f"{n}-{s}.parquet"
                rows = earlier.rows_of(f"{exp.name}/{n}/seed{s}")  # run_search's run id
                if rows:
                    Ledger(part).extend(rows)
                jobs.append((exp, n, budget, s, evaluator, exp.searcher_options(n), str(part)))
                copied.append(len(rows))
        with ScoringPool(evaluator, exp.space.baseline, num_actors=num_actors, batch_size=batch_size) as pool:
            t0 = time.perf_counter()
            if optimum is None:
                opt = sweep_optimum(pool, exp.space)
                opt["wall_s"] = time.perf_counter() - t0
            else:
                opt = optimum
            pool.map(_search_job, jobs)
        for job, n_old in zip(jobs, copied):
            earlier.extend(Ledger(job[-1]).rows[n_old:])
        earlier.close()
        out = driver.compare(exp, budget, seed_list, names, evaluator=evaluator, ledger_path=final, optimum=opt)
    if plot is not None:
        from raytune_primus.plots import compare_curves
        out["plot"] = str(compare_curves(out, plot))
    return out

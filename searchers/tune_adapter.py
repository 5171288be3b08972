"""Any registered searcher as a ``ray.tune.search.Searcher`` (the only module here that imports ray).

::

    from searchers.tune_adapter import PrimusSearcher
    alg = PrimusSearcher(experiment, "seed_llm", budget=30, seed=0, ledger_path="results/ledger.parquet")
    tuner = tune.Tuner(trainable, tune_config=tune.TuneConfig(search_alg=alg, num_samples=30))

Behind the adapter sit the same memory pre-filter and trial book as in the in-process driver:
over-cap candidates are rejected (and written to the ledger) without ever becoming a Tune trial,
repeats are answered from the ledger, and ``suggest`` returns ``Searcher.FINISHED`` once the budget
(pre-filter rejections included) is spent or the searcher has nothing left.

The trial config is a plain dict: ``{"run": RunConfig.to_dict(), "config_key", "phase", "round",
"proposer", "note"}``; a trainable rebuilds the run with ``RunConfig.from_dict(config["run"])``,
scores it with :func:`searchers.evaluator.score_result` and reports
:func:`searchers.evaluator.trial_metrics`. The adapter turns the reported metrics back into a
:class:`~searchers.base.TrialResult` (a missing or malformed result is a 'failed' trial).

Toolchain notes honoured here: metric and mode are taken in the constructor and
``set_search_properties`` never drops them (Tune calls it only for a non-empty param_space).
Pickling (Tune checkpoints the search algorithm) keeps only the recipe; unpickling rebuilds the
searcher and resumes it from the ledger, so a restored experiment repeats no completed trial.
Sequential searchers (the LLM proposer) get one trial at a time: ``suggest`` returns None while
one is running.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

try:
    from ray.tune.search import Searcher as _TuneSearcher
except ImportError as exc:  # pragma: no cover - ray is a dependency
    raise ImportError(f"searchers.tune_adapter needs ray[tune]: {exc}") from exc

from searchers.base import Candidate, make_searcher
from searchers.book import TrialBook
from searchers.evaluator import Evaluator, result_from_metrics
from searchers.experiment import Experiment, load_experiment
from searchers.ledger import Ledger
from searchers.prefilter import PreFilter

METRIC = "tokens_per_s_per_gpu"


class PrimusSearcher(_TuneSearcher):
    """A registered searcher + memory pre-filter + ledger, driven by Ray Tune (see module doc)."""

    def __init__(self, experiment: Experiment | str | Path, searcher: str | None = None, *,
                 budget: int | None = None, seed: int | None = None, ledger_path: str | Path | None = None,
                 evaluator: Evaluator | None = None, options: dict[str, Any] | None = None,
                 metric: str = METRIC, mode: str = "max", max_stale: int = 40, run_id: str | None = None) -> None:
        super().__init__(metric=metric, mode=mode)
        from searchers.driver import default_evaluator
        exp = experiment if isinstance(experiment, Experiment) else load_experiment(experiment)
        self._recipe = {"experiment": exp, "searcher": searcher, "budget": budget, "seed": seed,
                        "ledger_path": ledger_path, "evaluator": evaluator, "options": options, "metric": metric,
                        "mode": mode, "max_stale": max_stale, "run_id": run_id}
        name = searcher or exp.searcher
        self.experiment, self.searcher_name = exp, name
        self.seed = exp.seed if seed is None else int(seed)
        self.evaluator = evaluator or default_evaluator(exp.oracle_mode)
        opts = exp.searcher_options(name) if options is None else dict(options)
        self.ledger = Ledger(ledger_path) if ledger_path is not None else None
        self.book = TrialBook(budget=exp.budget if budget is None else int(budget),
                              run_id=run_id or f"{exp.name}/{name}/seed{self.seed}", searcher=name, seed=self.seed,
                              oracle_mode=self.evaluator.mode, experiment=exp.name, ledger=self.ledger)
        self.inner = make_searcher(name, exp.space, seed=self.seed, **opts)
        self.gate = PreFilter(self.inner, self.evaluator, self.book, max_stale=max_stale)
        self._live: dict[str, Candidate] = {}
        self._finished = False
        self.sequential = bool(getattr(self.inner, "sequential", False))

    # ------------------------------------------------------------------ Tune API
    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        # keep the constructor's metric/mode (Tune calls this only when param_space is non-empty)
        if self._metric is None and metric:
            self._metric = metric
        if self._mode is None and mode:
            self._mode = mode
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self._finished:
            return _TuneSearcher.FINISHED
        if self.sequential and self._live:
            return None  # one at a time: the proposer needs the last result first
        if self._live and self.book.exhausted:
            return None  # the running trials hold the rest of the budget; one may still fail over
        c = self.gate.suggest()
        if c is None:
            if self._live:
                return None
            self._finished = True
            if self.ledger is not None:
                self.ledger.flush()
            return _TuneSearcher.FINISHED
        self._live[trial_id] = c
        self.book.pending += 1
        return {"run": c.meta["run"].to_dict(), "config_key": c.meta["key"], "phase": c.phase,
                "round": c.round, "proposer": c.proposer, "note": c.note}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        c = self._live.pop(trial_id, None)
        config = (result or {}).get("config") or {}
        if c is not None:
            self.book.pending -= 1
        if c is None:
            # a trial this adapter did not hand out (an experiment restored mid-trial): keep its result
            if not config.get("config_key") or not result or error:
                return
            c = Candidate(values={}, phase=str(config.get("phase", "")), round=int(config.get("round", 0) or 0),
                          proposer=str(config.get("proposer", "")), note="completed after restore")
            res = result_from_metrics(result, key=config["config_key"], training=config["run"]["training"])
            if res.key not in self.book.known:
                self.book.record(c, res)
            return
        run = c.meta["run"]
        training = run.to_dict()["training"]
        if error or not result:
            from searchers.base import TrialResult
            res = TrialResult(status="failed", key=c.meta["key"], training=training,
                              reason="the Tune trial raised or reported no result")
        else:
            res = dataclasses.replace(result_from_metrics(result, key=c.meta["key"], training=training),
                                      key=c.meta["key"], training=training)
        self.book.record(c, res, started_at=c.meta.get("started_at"))
        self.gate.observe(c, res)

    def save(self, checkpoint_path: str) -> None:
        if self.ledger is not None:
            self.ledger.flush()  # the ledger is the state; the recipe rebuilds the rest

    def restore(self, checkpoint_path: str) -> None:
        pass

    # ------------------------------------------------------------------ pickling = recipe + ledger
    def __getstate__(self) -> dict[str, Any]:
        if self.ledger is not None:
            self.ledger.flush()
        return dict(self._recipe)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    @property
    def proposer(self) -> str:
        return self.gate.proposer

"""Baselines behind the same interface: random, Optuna TPE, Optuna GP, and a Galvatron-style grid.

* ``random``: uniform over the legal points of the space, without replacement.
* ``tpe`` / ``gp``: Optuna's TPESampler / GPSampler through the ask-and-tell API, one parameter
  per searched axis (numeric axes as an ordinal index, the rest categorical). A sampled
  combination that is not legal is projected onto the nearest legal point. Every outcome is told
  back: a scored trial with its throughput; a memory-rejected (or illegal) one as a *constraint
  violation* (``Trial.set_constraint``) with the worst feasible value seen so far, so the sampler's
  model learns where the wall is; an oracle failure likewise (violation 1.0), so the sampler moves
  away instead of asking again. Optuna and, for ``gp``, torch and scipy are imported only when such
  a searcher is built.
* ``grid``: a DP-style enumeration in the spirit of Galvatron (paper Appendix G): an outer loop
  over PP ascending, an inner one over (TP, EP) and then the micro-batch, with every other axis at
  the baseline (the schedule falls back to 1F1B when the baseline's does not fit the pipeline).
  It has no precision knob and is deterministic: the seed does not change its order.
"""
from __future__ import annotations

import contextlib
import random
import warnings
from collections.abc import Iterator
from typing import Any

from searchers.base import Candidate, Searcher, TrialResult, register
from searchers.space import ORDINAL_AXES, SearchSpace


@register("random")
class RandomSearch(Searcher):
    """Uniform random order over the legal points (seeded), each point once."""

    def __init__(self, space: SearchSpace, *, seed: int = 0) -> None:
        super().__init__(space, seed=seed)
        self._order: list[int] | None = None
        self._next = 0

    def suggest(self) -> Candidate | None:
        if self._order is None:
            self._order = list(range(self.space.size))
            random.Random(self.seed).shuffle(self._order)
        if self._next >= len(self._order):
            return None
        i = self._order[self._next]
        self._next += 1
        return Candidate(values=self.space.point(i), phase="random", proposer="random")


@register("grid")
class GalvatronGrid(Searcher):
    """Galvatron-style exhaustive enumeration (paper App. G); see the module doc."""

    def __init__(self, space: SearchSpace, *, seed: int = 0) -> None:
        super().__init__(space, seed=seed)
        self._plan: list[dict[str, Any]] | None = None
        self._next = 0

    def _build(self) -> list[dict[str, Any]]:
        sp = self.space
        base = sp.point_of(sp.baseline)
        vals = {a: sorted(sp.values[a]) for a in ("pp", "tp", "ep", "mbs")}
        out, seen = [], set()
        for pp in vals["pp"]:
            for tp in vals["tp"]:
                for ep in vals["ep"]:
                    for mbs in vals["mbs"]:
                        point = {**base, "pp": pp, "tp": tp, "ep": ep, "mbs": mbs}
                        for p in (point, {**point, "vpp": 1, "pp_schedule": "1f1b"}):
                            if sp.contains(p):
                                key = tuple(sorted(sp.point_of(p).items(), key=lambda kv: kv[0]))
                                if key not in seen:
                                    seen.add(key)
                                    out.append(sp.point_of(p))
                                break
        return out

    def suggest(self) -> Candidate | None:
        if self._plan is None:
            self._plan = self._build()
        if self._next >= len(self._plan):
            return None
        p = self._plan[self._next]
        self._next += 1
        return Candidate(values=p, phase="grid", proposer="grid")

    @property
    def size(self) -> int:
        if self._plan is None:
            self._plan = self._build()
        return len(self._plan)


class _OptunaSearcher(Searcher):
    """Optuna ask-and-tell over the space's axes (subclasses choose the sampler).

    A sampled combination that is not a legal point is projected onto the nearest legal one
    (:meth:`SearchSpace.nearest`) and the trial is told that point's outcome: the sampler optimises
    ``f(nearest(x))`` over the full product of the axes. Each trial carries one constraint,
    ``memory`` = peak/cap - 1 (infeasible when > 0; an illegal outcome counts as 1.0).
    """

    def __init__(self, space: SearchSpace, *, seed: int = 0, n_startup_trials: int = 10) -> None:
        super().__init__(space, seed=seed)
        import optuna
        self._optuna = optuna
        with self._quiet():
            self.study = optuna.create_study(direction="maximize",
                                             sampler=self._sampler(seed=seed, n_startup_trials=n_startup_trials))
        self._ordinal = {a: sorted(space.values[a]) for a in space.axes
                         if a in ORDINAL_AXES and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                      for v in space.values[a])}
        self._worst: float | None = None
        self.repaired = 0

    def _sampler(self, *, seed: int, n_startup_trials: int) -> Any:
        raise NotImplementedError

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        """Optuna at WARNING (no per-trial INFO lines) and its experimental warnings off, for this call
        only: Optuna's log level is process-wide, so the caller's setting is put back."""
        level = self._optuna.logging.get_verbosity()
        self._optuna.logging.set_verbosity(self._optuna.logging.WARNING)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield
        finally:
            self._optuna.logging.set_verbosity(level)

    def suggest(self) -> Candidate | None:
        if self.space.size == 0:
            return None
        with self._quiet():
            trial = self.study.ask()
            values: dict[str, Any] = {}
            for a in self.space.axes:
                if a in self._ordinal:
                    vs = self._ordinal[a]
                    values[a] = vs[trial.suggest_int(a, 0, len(vs) - 1)]
                else:
                    vs = list(self.space.values[a])
                    if all(v is None or isinstance(v, (bool, int, float, str)) for v in vs):
                        values[a] = trial.suggest_categorical(a, vs)
                    else:  # e.g. cuda_graph_scope's tuples: Optuna's categorical choices are scalars; by position
                        values[a] = vs[trial.suggest_categorical(a, list(range(len(vs))))]
            legal = self.space.nearest(values)
            assert legal is not None
        if legal != values:
            self.repaired += 1
        return Candidate(values=legal, phase=self.name, proposer=self.name,
                         note="" if legal == values else "nearest legal point", meta={"trial": trial})

    def _constraint_and_value(self, result: TrialResult) -> tuple[float, float]:
        v = result.value
        ratio = result.memory_ratio
        if v is not None:
            self._worst = v if self._worst is None else min(self._worst, v)
            return (0.0 if ratio is None else min(0.0, ratio - 1.0)), v
        # illegal or failed (the oracle raised): as infeasible as it gets, so the sampler moves away
        violation = 1.0 if result.status in ("illegal", "failed") or ratio is None else max(ratio - 1.0, 1e-3)
        return violation, (self._worst if self._worst is not None else 0.0)

    def observe(self, candidate: Candidate, result: TrialResult) -> None:
        trial = candidate.meta.get("trial")
        if trial is None:
            return
        with self._quiet():
            constraint, value = self._constraint_and_value(result)
            trial.set_constraint("memory", constraint)
            self.study.tell(trial, value)


@register("tpe")
class TPESearch(_OptunaSearcher):
    """Optuna TPESampler with the memory/legality constraint."""

    def _sampler(self, *, seed: int, n_startup_trials: int) -> Any:
        return self._optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials)


@register("gp")
class GPSearch(_OptunaSearcher):
    """Optuna GPSampler (needs torch and scipy) with the memory/legality constraint."""

    def _sampler(self, *, seed: int, n_startup_trials: int) -> Any:
        try:
            import scipy  # noqa: F401
            import torch  # noqa: F401
        except ImportError as exc:  # pragma: no cover - both are installed here
            raise ImportError(f"the 'gp' searcher needs torch and scipy: {exc}") from exc
        return self._optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup_trials,
                                               deterministic_objective=True)

    def suggest(self) -> Candidate | None:
        # The GP fit is a few small tensors: one thread is several times faster than torch's default
        # on a busy 2-core machine (3 s vs 16 s for 20 trials). Restored afterwards.
        import torch
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return super().suggest()
        finally:
            torch.set_num_threads(threads)

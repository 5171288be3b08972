"""Bulk scoring over every node of a Ray cluster: exhaustive sweeps, pre-filtering, multi-seed runs.

A simulate-mode projection costs about a millisecond; a Tune trial costs tens of milliseconds to
seconds (``docs/ray.md``). Bulk work therefore goes to a :class:`ScoringPool`: ``num_actors``
:class:`~raytune_primus.actors.Scorer` actors placed with the SPREAD strategy (so every node gets
some) and fed *batches* of candidates (at most ``batch_size``, default 500, and at least two batches per
actor) through an ordered
``ray.util.ActorPool``, one actor call per batch.

Results are exactly what the in-process path computes (the same ``memory_result`` /
``score_result`` helpers, in input order)::

    with ScoringPool(OracleEvaluator(), space.baseline) as pool:
        results = pool.evaluate(list(space.iter_points()))      # pre-filter, then score
        best = pool.optimum(space)                              # the exhaustive optimum
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from oracle.config import RunConfig
from searchers.base import TrialResult

DEFAULT_BATCH = 500


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    """``items`` cut into consecutive pieces of at most ``size``."""
    size = max(1, int(size))
    return [items[i:i + size] for i in range(0, len(items), size)]


class ScoringPool:
    """Scorer actors over the cluster, fed in batches (see the module doc). Use as a context manager."""

    def __init__(self, evaluator: Any, baseline: RunConfig, *, num_actors: int | None = None,
                 batch_size: int = DEFAULT_BATCH, num_cpus: float = 0, strategy: str = "SPREAD") -> None:
        from raytune_primus.actors import start_scorers
        from raytune_primus.runtime import cluster_cpus

        self.evaluator, self.baseline = evaluator, baseline
        self.batch_size = max(1, int(batch_size))
        self.num_actors = int(num_actors) if num_actors else cluster_cpus()
        """Actors in the pool (default: one per logical CPU of the cluster)."""
        self.actors = start_scorers(evaluator, baseline, self.num_actors, num_cpus=num_cpus, strategy=strategy)
        self.calls = 0

    # ------------------------------------------------------------------ generic
    def batch_for(self, n: int) -> int:
        """Candidates per actor call for ``n`` candidates: ``batch_size``, but small enough that every
        actor gets at least two batches (a single big batch would leave the others idle)."""
        return max(1, min(self.batch_size, math.ceil(n / (2 * len(self.actors) or 1))))

    def _map(self, method: str, batches: Sequence[Any], *extra: Any) -> list[Any]:
        from ray.util import ActorPool

        pool = ActorPool(list(self.actors))
        self.calls += len(batches)
        return list(pool.map(lambda a, b: getattr(a, method).remote(b, *extra), list(batches)))

    def map(self, fn: Callable[..., Any], items: Iterable[Any]) -> list[Any]:
        """``[fn(item) for item in items]`` with every call on some pool actor (in input order);
        ``fn`` must be picklable. Used for whole searches of a multi-seed comparison."""
        from ray.util import ActorPool

        items = list(items)
        pool = ActorPool(list(self.actors))
        self.calls += len(items)
        return list(pool.map(lambda a, x: a.call.remote(fn, x), items))

    # ------------------------------------------------------------------ scoring
    def score(self, candidates: Sequence[Mapping[str, Any]], *, prefilter: bool = False) -> list[TrialResult]:
        """Score every candidate (training dicts or points), in order; no pre-filter unless asked."""
        from raytune_primus.trainable import result_from_dict

        out: list[TrialResult] = []
        candidates = list(candidates)
        for part in self._map("score_batch", chunks(candidates, self.batch_for(len(candidates))), prefilter):
            out.extend(result_from_dict(d) for d in part)
        return out

    def evaluate(self, candidates: Sequence[Mapping[str, Any]]) -> list[TrialResult]:
        """Memory pre-filter then score, per candidate (what a driver does with a legal new candidate)."""
        return self.score(candidates, prefilter=True)

    def memory(self, candidates: Sequence[Mapping[str, Any]]) -> list[TrialResult | None]:
        """Pre-filter verdicts: None where a candidate fits under the memory cap, else its result."""
        from raytune_primus.trainable import result_from_dict

        out: list[TrialResult | None] = []
        candidates = list(candidates)
        for part in self._map("memory_batch", chunks(candidates, self.batch_for(len(candidates)))):
            out.extend(None if d is None else result_from_dict(d) for d in part)
        return out

    def optimum(self, space: Any) -> tuple[TrialResult | None, int]:
        """(best scored result over every legal point of ``space``, number of points that fit)."""
        results = self.evaluate(list(space.iter_points()))
        best: TrialResult | None = None
        fitting = 0
        for r in results:
            if r.status == "ok":
                fitting += 1
                if best is None or (r.value or 0.0) > (best.value or 0.0):
                    best = r
        return best, fitting

    # ------------------------------------------------------------------ placement and lifetime
    def placement(self) -> list[dict[str, Any]]:
        """Where each actor runs: node id, pid, calls served."""
        import ray

        return ray.get([a.where.remote() for a in self.actors])

    def close(self) -> None:
        from raytune_primus.actors import kill_all

        kill_all(self.actors)
        self.actors = []

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def score_in_process(evaluator: Any, baseline: RunConfig, candidates: Sequence[Mapping[str, Any]], *,
                     prefilter: bool = False) -> list[TrialResult]:
    """The reference the pool must equal: the same scoring, in this process, one by one."""
    from raytune_primus.actors import Scorer
    from raytune_primus.trainable import result_from_dict

    s = Scorer(evaluator, baseline)
    return [result_from_dict(d) for d in s.score_batch(candidates, prefilter)]

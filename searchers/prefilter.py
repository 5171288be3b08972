"""The memory pre-filter (paper Appendix C.3): a wrapper that stands between any searcher and the oracle.

For every suggestion of the wrapped searcher it, in order:

1. validates it against the space (unknown keys, values outside the space, the oracle's legality
   rules): an illegal candidate is recorded in the ledger with its reasons, told back to the
   searcher as ``illegal``, and costs no budget;
2. answers repeats of a known configuration from the :class:`~searchers.book.TrialBook` (free);
3. projects its memory: a candidate over the cap is recorded as ``rejected`` with the peak and
   the cap, told back to the searcher as infeasible (Optuna sees a constraint violation), and
   counts as a trial, as in the paper, although no throughput projection ran.

Only legal, new, memory-fitting candidates come out of :meth:`PreFilter.suggest`, carrying their
built ``RunConfig`` in ``candidate.meta['run']``.
"""
from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping
from typing import Any

from oracle.units import GIB
from searchers.base import Candidate, Searcher, TrialResult
from searchers.book import TrialBook
from searchers.evaluator import Evaluator, memory_result
from searchers.ledger import now_utc


class PreFilter(Searcher):
    """Legality gate, repeat cache and memory pre-filter around ``inner`` (see module doc)."""

    name = "prefilter"

    def __init__(self, inner: Searcher, evaluator: Evaluator, book: TrialBook, *,
                 max_suggestions: int | None = None, max_stale: int = 40) -> None:
        super().__init__(inner.space, seed=inner.seed)
        self.inner, self.evaluator, self.book = inner, evaluator, book
        self.max_suggestions = max_suggestions if max_suggestions is not None else 50 * book.budget + 500
        """Suggestions (including free ones) after which the search stops: guarantees termination
        for searchers that keep repeating themselves."""
        self.max_stale = max_stale
        """Consecutive suggestions that bring nothing new (repeats, illegal) after which the search stops."""
        self.stale = 0
        self.suggestions = 0
        self.rejected = 0
        self.illegal = 0
        self.repeats = 0
        self.free_probes = 0
        """Memory projections made for the inner searcher's free probes (not trials)."""
        self._probed = _probe_memo(evaluator)
        """Memory verdicts of free probes (``SearchContext.memory_only``) by config key, shared by every
        gate on the same evaluator in this process: a probed candidate that is then suggested is not
        projected twice, and a resumed search does not re-probe what its first run probed."""
        inner.bind(_Context(self))

    def probe(self, run: Any, key: str) -> tuple[TrialResult | None, Any]:
        """(pre-filter verdict: None when it fits, the memory projection or None), memoised by key."""
        hit = self._probed.get(key)
        if hit is None:
            try:
                mem = self.evaluator.memory(run)
            except Exception:  # noqa: BLE001 - memory_result words the failure
                mem = None
            res = memory_result(_Known(mem), run, key) if mem is not None else memory_result(self.evaluator, run, key)
            hit = self._probed[key] = (res, mem)
        return hit

    @property
    def proposer(self) -> str:
        return self.inner.proposer

    def _space_exhausted(self) -> bool:
        # every legal point known: nothing new can come (enumerates the space only when it is cheap)
        if "points" not in vars(self.space) and self.space.raw_size > 200_000:
            return False
        return len(self.book.known) >= self.space.size

    def suggest(self) -> Candidate | None:
        while True:
            if (self.book.exhausted or self.suggestions >= self.max_suggestions or self.stale >= self.max_stale
                    or self._space_exhausted()):
                return None
            c = self.inner.suggest()
            if c is None:
                return None
            self.suggestions += 1
            started = now_utc()
            run, problems = self.space.validate(c.values)
            self.stale += 1
            if problems:
                self.illegal += 1
                key = run.key() if run is not None else ""
                training = run.to_dict()["training"] if run is not None else None
                res = TrialResult(status="illegal", key=key, training=training, reason="; ".join(problems))
                self.book.record(c, res, started_at=started)
                self.inner.observe(c, res)
                continue
            assert run is not None
            key = run.key()
            if key in self.book.known:
                self.repeats += 1
                self.inner.observe(c, self.book.known[key])
                continue
            self.stale = 0
            rejected = self.probe(run, key)[0]
            if rejected is not None:
                if rejected.status == "rejected":
                    self.rejected += 1
                self.book.record(c, rejected, started_at=started)
                self.inner.observe(c, rejected)
                continue
            return dataclasses.replace(c, meta={**c.meta, "run": run, "key": key, "inner": c,
                                                "started_at": started})

    def observe(self, candidate: Candidate, result: TrialResult) -> None:
        self.inner.observe(candidate.meta.get("inner", candidate), result)

    def close(self) -> None:
        self.inner.close()

    def stats(self) -> dict[str, Any]:
        return {"suggestions": self.suggestions, "prefilter_rejections": self.rejected,
                "illegal": self.illegal, "repeats": self.repeats, "free_probes": self.free_probes}


_PROBES: "weakref.WeakKeyDictionary[Any, dict[str, tuple[TrialResult | None, Any]]]" = weakref.WeakKeyDictionary()
_probe_calls = 0
_PROBES_MAX = 200_000
"""Entries kept per evaluator (a memory projection is a few hundred bytes; the memo is dropped when full)."""


def probe_calls() -> int:
    """Memory projections made for free probes (``SearchContext.memory_only``) in this process so far: work
    on configurations that were never trials (drivers and tests account for it apart from trials)."""
    return _probe_calls


def _probe_memo(evaluator: Any) -> dict[str, tuple[TrialResult | None, Any]]:
    try:
        memo = _PROBES.setdefault(evaluator, {})
    except TypeError:  # an evaluator that cannot be weakly referenced gets a memo of its own
        return {}
    if len(memo) > _PROBES_MAX:
        memo.clear()
    return memo


class _Known:
    """An evaluator whose memory projection is already known (lets memory_result word a probe's verdict)."""

    def __init__(self, mem: Any) -> None:
        self._mem = mem

    def memory(self, run: Any) -> Any:
        return self._mem


class _Context:
    """The :class:`~searchers.base.SearchContext` a PreFilter offers its inner searcher."""

    def __init__(self, gate: PreFilter) -> None:
        self.gate = gate

    def budget_status(self) -> dict[str, int]:
        b = self.gate.book
        return {"budget": b.budget, "used": b.used, "remaining": b.remaining}

    def event(self, *, status: str, reason: str, phase: str = "", round: int = 0, proposer: str = "",
              note: str = "") -> None:
        self.gate.book.event(status=status, reason=reason, phase=phase, round=round, proposer=proposer, note=note)

    def memory_only(self, values: Mapping[str, Any]) -> dict[str, Any]:
        run, problems = self.gate.space.validate(values)
        if problems or run is None:
            return {"legal": False, "reason": "; ".join(problems)}
        key = run.key()
        known = self.gate.book.known.get(key)
        res = known if known is not None and known.peak_bytes is not None else None
        mem = None
        if res is None:
            fresh = key not in self.gate._probed
            res, mem = self.gate.probe(run, key)
            if fresh:
                global _probe_calls
                _probe_calls += 1
                self.gate.free_probes += 1
        if res is None:
            return {"legal": True, "fits": True, "memory_gib": round(mem.peak_bytes / GIB, 2),
                    "cap_gib": round(mem.cap_bytes / GIB, 2)}
        return {"legal": True, "fits": bool(res.fits), "status": res.status,
                "memory_gib": None if res.peak_bytes is None else round(res.peak_bytes / GIB, 2),
                "cap_gib": None if res.cap_bytes is None else round(res.cap_bytes / GIB, 2), "reason": res.reason}

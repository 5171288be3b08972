"""What the seed-then-propose searcher has learned so far: one entry per distinct configuration.

Shared by the seed phase and the proposers (deterministic cross-axis or LLM); also rendered as the
ledger summary an LLM planner reads.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from searchers.base import Candidate, TrialResult
from oracle.units import GIB
from searchers.space import SearchSpace


@dataclass(slots=True)
class Entry:
    point: dict[str, Any]
    """Searched-axis values (canonical)."""
    result: TrialResult
    candidate: Candidate
    order: int
    """Position in the history (0 = first observed)."""


@dataclass
class History:
    """Observed configurations in order, keyed by config key (repeats are not added twice)."""

    space: SearchSpace
    entries: list[Entry] = field(default_factory=list)
    by_key: dict[str, Entry] = field(default_factory=dict)
    counted: int = 0
    """Observations that cost a trial (scored, rejected, failed)."""

    def add(self, candidate: Candidate, result: TrialResult) -> bool:
        """Record an observation; False when the configuration was already known (a repeat)."""
        if result.key and result.key in self.by_key:
            return False
        point = self.space.point_of(result.training) if result.training else dict(candidate.values)
        e = Entry(point=point, result=result, candidate=candidate, order=len(self.entries))
        self.entries.append(e)
        if result.key:
            self.by_key[result.key] = e
        if result.status != "illegal":
            self.counted += 1
        return True

    # ------------------------------------------------------------------ views
    def ok(self) -> list[Entry]:
        return [e for e in self.entries if e.result.value is not None]

    def best(self) -> Entry | None:
        best = None
        for e in self.ok():
            if best is None or e.result.value > best.result.value:  # type: ignore[operator]
                best = e
        return best

    def best_value(self) -> float | None:
        b = self.best()
        return b.result.value if b else None

    def baseline(self) -> Entry | None:
        key = self.space.baseline.key()
        return self.by_key.get(key)

    def knows(self, key: str) -> bool:
        return key in self.by_key

    def unseen_run(self, point: Mapping[str, Any], proposed: set[str] | frozenset[str] = frozenset()) -> Any:
        """(run, key) of ``point`` when it is a legal configuration that is neither in ``proposed`` (a proposer's
        keys already handed out) nor observed; None otherwise."""
        run, problems = self.space.validate(point)
        if run is None or problems:
            return None
        key = run.key()
        if key in proposed or self.knows(key):
            return None
        return run, key

    def summary(self, k: int | None = None, *, sort: bool = False) -> list[dict[str, Any]]:
        """Compact rows (config diff vs baseline, tokens/s/GPU, memory, status, reason)."""
        base = self.space.point_of(self.space.baseline)
        rows = []
        entries = self.entries
        if sort:
            entries = sorted(entries, key=lambda e: -(e.result.value or -math.inf))
        for e in entries[-k:] if (k and not sort) else entries[:k] if k else entries:
            r = e.result
            rows.append({
                "trial": e.order, "changes_vs_baseline": {a: v for a, v in e.point.items() if base.get(a) != v},
                "status": r.status, "tokens_per_s_per_gpu": None if r.value is None else round(r.value, 1),
                "memory_gib": None if r.peak_bytes is None else round(r.peak_bytes / GIB, 1),
                "cap_gib": None if r.cap_bytes is None else round(r.cap_bytes / GIB, 1),
                "reason": r.reason[:200], "phase": e.candidate.phase})
        return rows

    def summary_text(self, k: int | None = 40) -> str:
        return json.dumps(self.summary(k), default=str)


def diff(point: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    return {a: v for a, v in point.items() if base.get(a) != v}

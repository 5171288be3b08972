"""The accounting of one search run: budget, known results, best so far, and the ledger rows.

Both drivers (the in-process loop and the Ray Tune adapter) keep one :class:`TrialBook`.

What counts against the budget: a *trial* is a legal candidate that reached the oracle, i.e. it
was scored, rejected by the memory pre-filter (paper Sec. 4.7 counts those: "7 of 30 trials"), or
made the oracle fail. Illegal candidates and re-suggestions of a known configuration cost no oracle
time, so they are free: illegal ones are still written to the ledger (with the reason), repeats are
answered from the book.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from searchers.base import Candidate, TrialResult
from oracle.units import GIB
from searchers.evaluator import read_breakdown
from searchers.ledger import Ledger, LedgerError, now_utc

COUNTED = frozenset({"ok", "rejected", "failed"})


@dataclass(frozen=True, slots=True)
class Trial:
    """One ledger row as the book keeps it."""

    index: int
    """Trial index (0-based, budget order); -1 for free rows (illegal, events)."""
    candidate: Candidate | None
    result: TrialResult
    proposer: str = ""
    """Who proposed it (the ledger's ``proposer`` column; kept for resumed rows too)."""


def result_from_row(row: Mapping[str, Any]) -> TrialResult:
    """Rebuild a TrialResult from a ledger row (for resuming)."""
    cfg = json.loads(row["config"]) if row.get("config") else None
    mem, cap = row.get("memory_gib"), row.get("cap_gib")
    return TrialResult(status=row["status"] if row["status"] in COUNTED | {"illegal"} else "failed",
                       key=row.get("config_key") or "", training=cfg,
                       tokens_per_s_per_gpu=row.get("tokens_per_s_per_gpu"),
                       peak_bytes=None if mem is None else mem * GIB, cap_bytes=None if cap is None else cap * GIB,
                       iteration_time_s=row.get("iteration_time_s"), mfu=row.get("mfu"),
                       reason=row.get("reason") or "", breakdown=read_breakdown(row.get("breakdown")))


class TrialBook:
    """Budget, results by config key, and the ledger writer of one run."""

    def __init__(self, *, budget: int, run_id: str, searcher: str, seed: int, oracle_mode: str,
                 experiment: str = "", ledger: Ledger | None = None, oracle_version: str | None = None) -> None:
        self.budget = int(budget)
        self.run_id, self.searcher, self.seed = run_id, searcher, int(seed)
        self.oracle_mode, self.experiment = oracle_mode, experiment
        self.oracle_version = oracle_version
        """Fingerprint of the oracle that scores this run (None: unversioned); a resume refuses rows
        scored by another one."""
        self.ledger = ledger
        self.known: dict[str, TrialResult] = {}
        """Results by config key (scored, rejected, failed): repeats are answered from here."""
        self.trials: list[Trial] = []
        """Every row of this run in order (counted trials and free rows)."""
        self.used = 0
        """Trials counted against the budget."""
        self.resumed = 0
        """Trials read back from the ledger at start."""
        self.pending = 0
        """Candidates handed out and not yet recorded (concurrent drivers); they hold budget."""
        self._illegal_seen: set[str] = set()
        self._next_row = 0
        if ledger is not None:
            self._resume(ledger.rows_of(run_id))
            self._next_row = ledger.next_row(run_id)

    # ------------------------------------------------------------------ resume
    def _resume(self, rows: list[dict[str, Any]]) -> None:
        if self.oracle_version is not None:
            other = sorted({v for r in rows if (v := r.get("oracle_version")) and v != self.oracle_version})
            if other:
                where = self.ledger.path if self.ledger is not None else "the ledger"
                raise LedgerError(
                    f"run {self.run_id} in {where} was scored by oracle {', '.join(other)}, and this oracle is "
                    f"{self.oracle_version} (its code, model cards or hardware profiles changed): resuming would "
                    f"mix projections of two oracles; start over (--fresh) or use another results directory")
        for r in rows:
            res = result_from_row(r)
            if r["status"] in COUNTED:
                if res.key and res.key not in self.known:
                    self.known[res.key] = res
                self.trials.append(Trial(r["trial_index"], None, res, r.get("proposer") or ""))
                self.used = max(self.used, int(r["trial_index"]) + 1)
            elif r["status"] == "illegal":
                self._illegal_seen.add(r.get("config") or r.get("reason") or "")
                self.trials.append(Trial(-1, None, res))
        self.resumed = self.used

    # ------------------------------------------------------------------ budget
    @property
    def remaining(self) -> int:
        return max(0, self.budget - self.used - self.pending)

    @property
    def exhausted(self) -> bool:
        return self.used + self.pending >= self.budget

    # ------------------------------------------------------------------ recording
    def record(self, candidate: Candidate | None, result: TrialResult, *,
               started_at: datetime | None = None) -> int:
        """Record a result; return its trial index (-1 when free). Repeated illegal rows are skipped."""
        counted = result.status in COUNTED
        if not counted:
            sig = json.dumps(result.training, sort_keys=True, default=str) if result.training else result.reason
            if sig in self._illegal_seen:
                return -1
            self._illegal_seen.add(sig)
        index = self.used if counted else -1
        if counted:
            self.used += 1
            if result.key:
                self.known.setdefault(result.key, result)
        self.trials.append(Trial(index, candidate, result, candidate.proposer if candidate else ""))
        self._write(candidate, result, index, started_at)
        return index

    def event(self, *, status: str, reason: str, phase: str = "", round: int = 0, proposer: str = "",
              note: str = "") -> None:
        """A proposer event with no configuration (LLM timeout, malformed answer, endpoint error)."""
        if self.ledger is None:
            return
        t = now_utc()
        self.ledger.append({
            "run_id": self.run_id, "experiment": self.experiment, "searcher": self.searcher, "seed": self.seed,
            "row": self._take_row(), "trial_index": -1, "status": status, "legal": None, "fits": None,
            "reason": reason, "config": None, "config_key": None, "phase": phase, "round": round,
            "proposer": proposer, "note": note, "oracle_mode": self.oracle_mode, "started_at": t,
            "finished_at": t, "wall_s": 0.0, "oracle_version": self.oracle_version})

    def _take_row(self) -> int:
        r = self._next_row
        self._next_row += 1
        return r

    def _write(self, c: Candidate | None, res: TrialResult, index: int, started_at: datetime | None) -> None:
        if self.ledger is None:
            return
        end = now_utc()
        start = started_at or end
        self.ledger.append({
            "run_id": self.run_id, "experiment": self.experiment, "searcher": self.searcher, "seed": self.seed,
            "row": self._take_row(), "trial_index": index, "status": res.status, "legal": res.legal,
            "fits": res.fits, "reason": res.reason,
            "config": json.dumps(res.training, sort_keys=True, default=str) if res.training else None,
            "config_key": res.key or None, "tokens_per_s_per_gpu": res.tokens_per_s_per_gpu,
            "memory_gib": None if res.peak_bytes is None else res.peak_bytes / GIB,
            "cap_gib": None if res.cap_bytes is None else res.cap_bytes / GIB,
            "iteration_time_s": res.iteration_time_s, "mfu": res.mfu,
            "phase": c.phase if c else "", "round": c.round if c else 0,
            "proposer": c.proposer if c else "", "note": c.note if c else "",
            "oracle_mode": self.oracle_mode, "started_at": start, "finished_at": end,
            "wall_s": (end - start).total_seconds(), "oracle_version": self.oracle_version,
            "breakdown": json.dumps(res.breakdown, sort_keys=True) if res.breakdown else None})

    # ------------------------------------------------------------------ views
    def counted(self) -> list[Trial]:
        return sorted((t for t in self.trials if t.index >= 0), key=lambda t: t.index)

    @property
    def best(self) -> TrialResult | None:
        """The best scored trial (first one on ties)."""
        best = None
        for t in self.counted():
            v = t.result.value
            if v is not None and (best is None or v > best.value):  # type: ignore[operator]
                best = t.result
        return best

    def best_so_far(self) -> list[float | None]:
        """Best tokens/s/GPU after each counted trial (None until the first scored one)."""
        out: list[float | None] = []
        cur: float | None = None
        for t in self.counted():
            v = t.result.value
            if v is not None and (cur is None or v > cur):
                cur = v
            out.append(cur)
        return out

    def proposer_trials(self) -> dict[str, int]:
        """Counted trials per proposer (e.g. seed-planner 12, llm:openai/x 3, cross-axis (offline) 15)."""
        out: dict[str, int] = {}
        for t in self.counted():
            name = t.proposer or "(unknown)"
            out[name] = out.get(name, 0) + 1
        return out

    @property
    def budget_spent(self) -> bool:
        """Whether every trial of the budget was used (a search may stop early when nothing is left)."""
        return self.used >= self.budget

    def count(self, status: str) -> int:
        return sum(1 for t in self.trials if t.result.status == status)

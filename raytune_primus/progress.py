"""Progress people can watch: one line per finished trial with the best so far, counts and an ETA.

Lines go to stderr (stdout stays clean for ``--format json``). A Tune :class:`~ray.tune.Callback`
(it works with Tune's new and old console output alike, which a ``CLIReporter`` does not).
Pre-filter rejections never become Tune trials, so the callback asks the driver-side searcher for
its counts through ``stats()``, a function returning ``{'used', 'budget', 'prefilter_rejections',
'illegal', 'best', 'best_config'}`` (any may be missing; ``best`` covers trials resumed from the ledger)::

    [18/30] best 5,661 tok/s/GPU (tp=1 pp=4 vpp=1 ...) | trials 16 ok | rejected by pre-filter 2 | 27 s, ETA 18 s

The count ``[18/30]`` is the budget spent (rejections included); ETA is the pace of this session. A restored
run says what it found done (``| trials 4 ok this session, 12 resumed |``).
"""
from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from ray.tune import Callback

from raytune_primus.trainable import METRIC


def _fmt_s(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = int(round(s))
    if s < 120:
        return f"{s} s"
    return f"{s // 60} min {s % 60:02d} s" if s < 3600 else f"{s // 3600} h {s % 3600 // 60:02d} min"


def eta_s(elapsed_s: float, used: int, budget: int) -> float:
    """Seconds left at the average pace so far: 0 once the budget is spent, inf before the first trial."""
    if budget - used <= 0:
        return 0.0
    if used <= 0:
        return float("inf")
    return elapsed_s / used * (budget - used)


class ProgressCallback(Callback):
    """Prints a progress line per completed trial, and a last one at the end (see the module doc)."""

    def __init__(self, *, budget: int, stats: Callable[[], Mapping[str, Any]] | None = None,
                 describe: Callable[[Mapping[str, Any]], str] | None = None, out: TextIO | None = None,
                 every: int = 1) -> None:
        self.budget = int(budget)
        self.stats = stats
        self.describe = describe
        self.out = out
        self.every = max(1, int(every))
        self.start = time.monotonic()
        self.base_used = 0
        """Trials already done when this session started (a restore): the pace counts only new ones."""
        self.done = 0
        self.by_status: dict[str, int] = {}
        self.errored = 0
        self.best: float | None = None
        self.best_text = ""
        self.lines: list[str] = []
        self.enabled = True
        """Print the lines (they are kept in :attr:`lines` either way)."""

    def _stream(self) -> TextIO:
        return self.out or sys.stderr  # stdout stays clean for --format json

    def snapshot(self) -> dict[str, Any]:
        """Numbers behind the current line."""
        st = dict(self.stats() if self.stats else {})
        used = int(st.get("used", self.done))
        budget = int(st.get("budget", self.budget))
        elapsed = time.monotonic() - self.start
        best, best_text = self.best, self.best_text
        if st.get("best") is not None and (best is None or st["best"] > best):  # e.g. resumed from the ledger
            best, best_text = float(st["best"]), str(st.get("best_config", ""))
        return {"used": used, "budget": budget, "resumed": self.base_used, "trials_done": self.done,
                "by_status": dict(self.by_status),
                "errored": self.errored, "best": best, "best_config": best_text,
                "prefilter_rejections": int(st.get("prefilter_rejections", 0)),
                "illegal": int(st.get("illegal", 0)), "elapsed_s": elapsed,
                "eta_s": eta_s(elapsed, used - self.base_used, budget - self.base_used)}

    def line(self) -> str:
        s = self.snapshot()
        best = "best -" if s["best"] is None else f"best {s['best']:,.0f} tok/s/GPU"
        if s["best_config"]:
            best += f" ({s['best_config']})"
        parts = [f"{n} {k}" for k, n in sorted(s["by_status"].items())]
        if s["errored"]:
            parts.append(f"{s['errored']} errored")
        if s["resumed"]:  # a restored run: what this session ran, and what it found done
            parts = [f"{', '.join(parts) or '0'} this session, {s['resumed']} resumed"]
        width = len(str(s["budget"]))
        return (f"[{s['used']:>{width}}/{s['budget']}] {best} | trials {', '.join(parts) or '0'} | "
                f"rejected by pre-filter {s['prefilter_rejections']} | {_fmt_s(s['elapsed_s'])}, "
                f"ETA {_fmt_s(s['eta_s'])}")

    def _emit(self) -> None:
        text = self.line()
        self.lines.append(text)
        if self.enabled:
            print(text, file=self._stream(), flush=True)

    # ------------------------------------------------------------------ Tune hooks
    def setup(self, **info: Any) -> None:
        self.start = time.monotonic()  # also after a restore (the pickled clock is another process's)
        self.base_used = int((self.stats() if self.stats else {}).get("used", 0))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        r = trial.last_result or {}
        self.done += 1
        status = str(r.get("status", "?"))
        self.by_status[status] = self.by_status.get(status, 0) + 1
        v = r.get(METRIC)
        if isinstance(v, (int, float)) and math.isfinite(v) and status == "ok" and (self.best is None or v > self.best):
            self.best = float(v)
            self.best_text = self.describe(trial.config) if self.describe else ""
        if self.done % self.every == 0:
            self._emit()

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.errored += 1
        self._emit()

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        if not self.lines or self.lines[-1] != self.line():
            self._emit()


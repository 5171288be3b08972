"""The progress line (raytune_primus.progress), without a Ray cluster: counts, ETA, a restored run."""
from __future__ import annotations

import io
import math
from types import SimpleNamespace

from raytune_primus.progress import ProgressCallback, eta_s
from raytune_primus.trainable import METRIC


def _trial(value: float, status: str = "ok") -> SimpleNamespace:
    return SimpleNamespace(last_result={"status": status, METRIC: value}, config={"tp": 2})


def test_eta_is_zero_once_the_budget_is_spent_and_unknown_before_the_first_trial():
    assert eta_s(10.0, 0, 30) == math.inf
    assert eta_s(10.0, 10, 30) == 20.0
    assert eta_s(10.0, 30, 30) == 0.0 and eta_s(0.0, 0, 0) == 0.0


def test_a_restored_run_says_what_it_resumed_and_what_this_session_ran():
    used = {"used": 30, "budget": 30, "best": 1181.0, "best_config": "tp=1 cp=4"}
    cb = ProgressCallback(budget=30, stats=lambda: used, out=io.StringIO())
    cb.setup()
    cb.on_experiment_end([])
    assert cb.lines[-1].startswith("[30/30] best 1,181 tok/s/GPU (tp=1 cp=4) | trials 0 this session, 30 resumed |")
    assert cb.lines[-1].endswith("ETA 0 s")

    fresh = {"used": 0, "budget": 4}
    cb = ProgressCallback(budget=4, stats=lambda: fresh, describe=lambda c: f"tp={c['tp']}", out=io.StringIO())
    cb.setup()
    fresh["used"] = 1
    cb.on_trial_complete(0, [], _trial(900.0))
    fresh["used"], fresh["prefilter_rejections"] = 3, 1
    cb.on_trial_complete(0, [], _trial(0.0, "failed"))
    assert cb.lines[0].startswith("[1/4] best 900 tok/s/GPU (tp=2) | trials 1 ok | rejected by pre-filter 0 |")
    assert cb.lines[1].startswith("[3/4] best 900 tok/s/GPU (tp=2) | trials 1 failed, 1 ok | rejected by pre-filter 1 |")
    assert "resumed" not in cb.lines[1] and cb.out.getvalue().count("\n") == 2

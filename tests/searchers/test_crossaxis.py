"""The offline cross-axis proposer's layout round: the recompute-trade jump and the replacement of a rejected jump."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from searchers.base import Candidate, TrialResult
from searchers.crossaxis import CrossAxisProposer
from searchers.history import History
from searchers.space import SearchSpace

CAP_BYTES = 80 * 2**30


def _split(p: Mapping[str, Any]) -> int:
    return p["tp"] * p["pp"] * p["ep"]


def _peak_bytes(p: Mapping[str, Any]) -> float:
    """A memory wall in layout terms (tp * pp * ep ways): 8 or more fit, 2 and 4 only with full recompute, 1 nowhere."""
    if _split(p) >= 8:
        return 0.5 * CAP_BYTES
    return 0.9 * CAP_BYTES if _split(p) >= 2 and p["recompute"] == "full" else 2.0 * CAP_BYTES


class _Context:
    """A driver's SearchContext with a rule for memory, and budget for the layout round."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space

    def budget_status(self) -> dict[str, int]:
        return {"budget": 30, "used": 10, "remaining": 20}

    def event(self, **_: Any) -> None:
        pass

    def memory_only(self, values: Mapping[str, Any]) -> dict[str, Any]:
        run, problems = self.space.validate(values)
        if problems or run is None:
            return {"legal": False, "reason": "; ".join(problems)}
        return {"legal": True, "fits": _peak_bytes(self.space.point_of(run)) <= CAP_BYTES}


def _proposer(tiny, recompute: str) -> tuple[CrossAxisProposer, dict[str, Any]]:
    space = tiny.space
    history = History(space)
    inc = space.point_of(space.make({"tp": 2, "pp": 2, "ep": 2, "recompute": recompute}))
    for point, tps in ((space.point_of(space.baseline), 900.0), (inc, 1000.0)):
        run = space.make(point)
        history.add(Candidate(values=point, phase="seed"),
                    TrialResult(status="ok", key=run.key(), training=run.to_dict()["training"],
                                tokens_per_s_per_gpu=tps, peak_bytes=_peak_bytes(point), cap_bytes=CAP_BYTES))
    prop = CrossAxisProposer(space, history, context=_Context(space))
    prop.control.start_round(1000.0)
    prop.control.start_round(1000.0)  # round 2: the layout round
    return prop, inc


def test_layout_round_trades_recompute_for_the_least_split_layout_it_makes_fit(tiny):
    prop, inc = _proposer(tiny, "none")
    jumps = prop._layout_jumps()
    assert len(jumps) == prop.layout_jumps
    trade = [c for c in jumps if c.meta["jump_stream"] == 2]
    assert len(trade) == 1
    t = trade[0].values
    # the least split layout that fits only with more recompute (2-way; of those, the least tp * pp)
    assert (_split(t), t["tp"] * t["pp"], t["recompute"]) == (2, 1, "full")
    assert t["mbs"] == inc["mbs"] and t["precision"] == inc["precision"]  # the trade alone is measured
    # the degree order keeps to layouts that fit without more recompute than the incumbent's
    assert [c.values["recompute"] for c in jumps if c.meta["jump_stream"] == 1] == ["none"]


def test_a_rejected_jump_is_replaced_by_the_next_layout_of_its_order(tiny):
    prop, _ = _proposer(tiny, "none")
    prop._queue = prop._layout_jumps()
    first = next(c for c in prop._queue if c.meta["jump_stream"] == 2)
    prop._queue.remove(first)
    prop._proposed.add(first.meta["key"])
    prop.observe(first, TrialResult(status="rejected", key=first.meta["key"], peak_bytes=1.01 * CAP_BYTES,
                                    cap_bytes=CAP_BYTES, reason="projection: over the cap"), True)
    nxt = prop._queue[0]
    assert nxt.meta["jump_stream"] == 2 and nxt.values["recompute"] == "full" and _split(nxt.values) == 2
    assert nxt.meta["key"] != first.meta["key"]
    assert {a: nxt.values[a] for a in ("tp", "pp", "ep")} != {a: first.values[a] for a in ("tp", "pp", "ep")}
    before = list(prop._queue)
    scored = prop._queue[1]
    prop.observe(scored, TrialResult(status="ok", key=scored.meta["key"], tokens_per_s_per_gpu=1.0), True)
    assert prop._queue == before  # only a rejection brings in a replacement


def test_no_trade_jump_when_the_incumbent_already_recomputes_everything(tiny):
    prop, _ = _proposer(tiny, "full")
    assert all(c.meta["jump_stream"] != 2 for c in prop._layout_jumps())

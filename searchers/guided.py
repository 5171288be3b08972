"""The breakdown-guided proposer: each trial goes to the point the step model predicts fastest among those that fit.

After every scored trial the :class:`~searchers.stepmodel.StepModel` is recalibrated on all measured breakdowns,
and the next candidate is the best-predicted point that no trial has measured and that the memory probe says fits,
taken from

* every legal point with the incumbent's settings on the axes the model cannot carry (number format, dispatcher,
  overlap switches: :func:`flag_axes`): the parallel layout, schedule, micro-batch and memory savers all at once,
  so a point several layout steps away is one trial away when the breakdown says it pays;
* the incumbent with one of those settings changed (the seed planner's single-axis moves on them).

A setting no trial has measured yet is priced by :data:`PRIORS` (a lower number format by the part's peak ratio,
in the model): the breakdown says how much of the step it could act on, so a dispatcher change is tried early on a
step dominated by its all-to-all and late on one dominated by compute. Ties, and points the model predicts alike,
go to values never measured (``novelty_bonus``), then to the enumeration order. Nothing here knows an experiment
or a model by name; the oracle is reached only through trials (throughput and breakdown) and the free memory probe.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from searchers.base import Candidate, TrialResult
from searchers.history import History, diff
from searchers.space import STRUCTURE_AXES, SearchSpace
from searchers.stepmodel import StepModel

LABEL = "breakdown-guided (offline)"
SAVER_AXES = frozenset({"fsdp", "use_distributed_optimizer"})
"""Memory savers outside the structure block that the model carries (ZeRO-1/3 change the data-parallel terms)."""
PRIORS: dict[tuple[str, Any], tuple[str, float]] = {
    ("moe_a2a_backend", "deepep"): ("ep_a2a", 0.6),
    ("moe_sync_free", True): ("host_sync_s", 0.2),
    ("moe_a2a_overlap", True): ("ep_a2a", 0.5),
}
"""(axis, value) never measured -> (term, factor): what the setting is expected to do to the term it acts on until a
trial measures it (DeepEP's fused dispatch moves fewer bytes than the plain all-to-all; a sync-free MoE removes the
dispatcher's device-to-host syncs, paper App. H; the all-to-all overlap hides it behind the other micro-batch's
compute). Estimates: each is replaced by the measured effect as soon as a trial has the value."""


FLAG_TARGETS: dict[str, str] = {"precision": "compute_s", "fp8_recipe": "compute_s", "moe_a2a_backend": "ep_a2a",
                                 "moe_sync_free": "host_sync_s", "moe_a2a_overlap": "ep_a2a",
                                 "cuda_graph_impl": "host_sync_s", "moe_shared_expert_overlap": "ep_a2a",
                                 "moe_router_fusion": "compute_s", "fused_grouped_mlp": "compute_s",
                                 "fp8_param_gather": "dp_param_gather"}
"""The breakdown term a setting acts on: a seed move on it is measured early only when that term takes at least
``min_share`` of the step (a dispatcher cannot gain much where the all-to-all takes 1 % of it)."""


def flag_axes(space: SearchSpace) -> list[str]:
    """Searched axes the step model cannot carry from one point to another (outside the structure block and the
    savers): their effect comes from the trials that changed them."""
    return [a for a in space.axes if a not in STRUCTURE_AXES and a not in SAVER_AXES]


class GuidedProposer:
    """Best predicted fitting point, one trial at a time (see the module doc); ask/tell over a shared History."""

    label = LABEL

    def __init__(self, space: SearchSpace, history: History, *, context: Any = None,
                 novelty_bonus: float = 0.02, min_jump: float = 0.03, max_probes: int = 2000, runners_up: int = 3,
                 min_share: float = 0.03, polish_radius: int = 3, **_: Any) -> None:
        self.space, self.history, self.context = space, history, context
        self.novelty_bonus = novelty_bonus
        self.min_jump = min_jump
        """Least predicted log gain of a jump (raised to the model's median error once trials have measured it)."""
        self.max_probes = max_probes
        self.min_share = min_share
        self.polish_radius = polish_radius
        """Settings a polish move may change at once (the schedule and its VPP count as one)."""
        self._flags = flag_axes(space)
        self.runners_up = runners_up
        self._errors: list[float] = []
        self._over: set[int] = set()
        """Rows of the space the memory probe put over the cap (not asked again)."""
        self.model = StepModel(space)
        self._seen = 0
        self._proposed: set[str] = set()
        self.counts = {"predictions": 0, "probes": 0}

    def bind(self, context: Any) -> None:
        self.context = context

    # ------------------------------------------------------------------ ask / tell
    def observe(self, candidate: Candidate, result: TrialResult, counted: bool) -> None:
        """The shared History holds the result (the model catches up in suggest()); the prediction error is kept."""
        pred, base = candidate.meta.get("predicted_gain"), candidate.meta.get("base_value")
        if pred and base and result.value is not None:
            self._errors.append(abs(math.log(result.value / base) - math.log(pred)))

    def _sync(self) -> None:
        for e in self.history.entries[self._seen:]:
            if e.result.value is not None and e.result.breakdown:
                self.model.observe(e.point, e.result.breakdown)
        self._seen = len(self.history.entries)

    def suggest(self) -> Candidate | None:
        self._sync()
        inc = self.history.best()
        if inc is None or not self.model.ready:
            return None
        inc_codes = self.model.encode(inc.point)
        if inc_codes is None or not len(self.space._index_array):
            return None
        c = self._flag_move(inc)
        if c is not None:
            return c
        here = self._times(inc_codes[None, :])[0]
        # a jump: the best-predicted point of the whole space, when the gain it predicts exceeds the model's own
        # error so far (else the ranking is noise and the neighbourhood is where to look)
        codes = self.space._index_array
        gain = np.log(here / np.maximum(self._times(codes, block="space"), 1e-12))
        self.counts["predictions"] += len(codes)
        c = self._first(codes, gain, inc, floor=self._error(), probes=self.max_probes, kind="jump", rows=True)
        if c is not None:
            return c
        # polish: the points a few settings away from the incumbent (then from the runners-up), best predicted
        # first whatever the sign, values never measured first among equals
        gain = gain + self.novelty_bonus * np.minimum(self._novelty(codes), 1.0)
        for e in self._runners_up():
            enc = self.model.encode(e.point)
            if enc is None:
                continue
            near = self._distance(codes, enc) <= self.polish_radius
            c = self._first(codes, np.where(near, gain, -np.inf), e, floor=-1e9, probes=self.max_probes,
                            kind="polish", rows=True)
            if c is not None:
                return c
        # nothing new near the best points: the best-predicted point of the rest of the space
        return self._first(codes, gain, inc, floor=-np.inf, probes=self.max_probes, kind="explore", rows=True)

    def _distance(self, codes: np.ndarray, at: np.ndarray) -> np.ndarray:
        """Settings in which each point differs from ``at`` (the schedule and its VPP count once)."""
        diff = codes != at[None, :]
        axes = self.space.axes
        if "vpp" in axes and "pp_schedule" in axes:
            i, j = axes.index("vpp"), axes.index("pp_schedule")
            return diff.sum(axis=1) - (diff[:, i] & diff[:, j])
        return diff.sum(axis=1)

    def _flag_move(self, inc: Any) -> Candidate | None:
        """The seed planner's next move on a setting no trial has measured (number format, dispatcher, sync-free
        MoE, ...), laid over the incumbent: the model carries a measured setting everywhere, an unmeasured one only
        by its prior. Moves go by the share of the incumbent's step their term takes (:data:`FLAG_TARGETS`; the
        planner's order among equals); a move whose term takes less than ``min_share`` is left to the ranking."""
        from searchers.seed import _bits, _moves
        b = inc.result.breakdown or {}
        step = inc.result.iteration_time_s or sum(v for k, v in b.items() if not k.endswith("_total_s")) or 1.0
        measured = self._measured_values()
        flags = set(self._flags)
        ranked = []
        for n, (label, move) in enumerate(_moves(self.space, inc.point)):
            if not move or not set(move) <= flags or all((a, v) in measured for a, v in move.items()):
                continue
            if "precision" in move and _bits(move["precision"]) >= _bits(inc.point.get("precision", "")):
                continue  # a wider format is slower: the ranking prices it from the measured ones
            term = FLAG_TARGETS.get(next(iter(move)))
            share = (b.get(term, b.get(f"{term}_exposed_s", 0.0)) / step) if term else 1.0
            if share >= self.min_share:
                ranked.append((-share, n, label, move))
        for _, _, label, move in sorted(ranked):
            found = self.history.unseen_run({**inc.point, **move}, self._proposed)
            if found is None:
                continue
            run, key = found
            values = self.space.point_of(run)
            if self.context is not None and not self._fits(values):
                continue
            self._proposed.add(key)
            on = ", ".join(f"{k}={v}" for k, v in diff(inc.point, self.space.point_of(self.space.baseline)).items())
            return Candidate(values=values, phase="seed", round=0, proposer="seed-planner",
                             note=label + (f" (on {on})" if on else ""), meta={"key": key, "move": move})
        return None

    def _measured_values(self) -> set[tuple[str, Any]]:
        return {(a, self.space.values[a][c]) for i, a in enumerate(self.space.axes)
                for c in np.unique(self.model.codes[:, i])}

    def _runners_up(self) -> list[Any]:
        """The incumbent and the next best entries, one per distinct throughput (a setting that changes nothing,
        e.g. an FP8 recipe of equal speed, does not make a new place to polish around)."""
        out: list[Any] = []
        for e in sorted(self.history.ok(), key=lambda e: -e.result.value):
            if len(out) >= self.runners_up:
                break
            if all(abs(e.result.value / o.result.value - 1.0) > 1e-3 for o in out):
                out.append(e)
        return out

    def _first(self, codes: np.ndarray, gain: np.ndarray, around: Any, *, floor: float, probes: int,
               kind: str, rows: bool = False) -> Candidate | None:
        """The best-gain point of ``codes`` (ties: enumeration order) with gain >= ``floor`` that is new and fits,
        asking the memory probe about at most ``probes`` points not asked before (``rows``: ``codes`` are the space's
        points in order, whose verdicts are remembered by row)."""
        order = np.lexsort((np.arange(len(codes)), -gain))
        asked = 0
        for j in order:
            if gain[j] < floor or asked >= probes:
                return None
            if rows and int(j) in self._over:
                continue
            c = self._candidate(self._point(codes[j]), around, float(gain[j]), kind)
            if c is None:
                continue
            asked += 1
            if self.context is not None and not self._fits(c.values):
                if rows:
                    self._over.add(int(j))
                continue
            self._proposed.add(c.meta["key"])
            return c
        return None

    def _error(self) -> float:
        """The model's typical error so far: median |log(measured / predicted)| of the guided trials (at least
        ``min_jump``; ``min_jump`` x 2 before any)."""
        if not self._errors:
            return 2 * self.min_jump
        return max(self.min_jump, float(np.median(self._errors)))

    # ------------------------------------------------------------------ scoring
    def _times(self, codes: np.ndarray, block: Any = None) -> np.ndarray:
        terms = self.model.predict(codes, block)
        total = terms["total"].copy()
        measured = self._measured_values()
        for (axis, value), (term, factor) in PRIORS.items():
            if axis not in self.space.axes or (axis, value) in measured or term not in terms:
                continue
            col = self.space.axes.index(axis)
            vals = self.space.values[axis]
            if value not in vals:
                continue
            sel = codes[:, col] == vals.index(value)
            total = total - np.where(sel, (1.0 - factor) * terms[term], 0.0)
        return total

    def _novelty(self, codes: np.ndarray) -> np.ndarray:
        out = np.zeros(len(codes))
        for i in range(codes.shape[1]):
            seen = np.unique(self.model.codes[:, i])
            out += ~np.isin(codes[:, i], seen)
        return out

    def _point(self, codes: np.ndarray) -> dict[str, Any]:
        return {a: self.space.values[a][int(c)] for a, c in zip(self.space.axes, codes)}

    def _candidate(self, point: Mapping[str, Any], inc: Any, gain: float, kind: str) -> Candidate | None:
        found = self.history.unseen_run(point, self._proposed)
        if found is None:
            return None
        run, key = found
        values = self.space.point_of(run)
        moved = diff(values, inc.point)
        note = f"{kind} " + ", ".join(f"{k}={v}" for k, v in moved.items()) + f" (predicted x{math.exp(gain):.2f})"
        best = self.history.best()
        return Candidate(values=values, phase="cross-axis", round=1, proposer=self.label, note=note,
                         meta={"key": key, "predicted_gain": math.exp(gain),
                               "base_value": best.result.value if best is not None else None})

    def _fits(self, values: Mapping[str, Any]) -> bool:
        self.counts["probes"] += 1
        try:
            probe = self.context.memory_only(values)
        except Exception:  # noqa: BLE001 - a probe that fails says nothing: do not spend a trial on it
            return False
        return bool(probe.get("legal")) and bool(probe.get("fits"))

    def stats(self) -> dict[str, Any]:
        return dict(self.counts)


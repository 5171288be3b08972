"""The deterministic cross-axis proposer: what runs after the seed phase when no LLM is configured.

It follows the shape of the paper's investigation loop (Sec. 3.2, App. C.2): up to ``rounds``
rounds of at most ``per_round`` candidates, a round ending early once the incumbent has not
improved for ``patience`` trials.

* Round 1 combines the seed phase's single-axis moves (paper: "cross-product axes the seed planner
  treats independently"): pairs first, then triples, of the best moves. A move's predicted gain is
  its measured gain over the baseline; a move the pre-filter rejected has unknown gain (taken as
  neutral) and is only combined with moves that freed enough memory. Predicted memory multiplies
  the measured ratios; combinations predicted over the cap are skipped. As soon as a combination
  becomes the incumbent, the next candidates extend it by one more move at a time (with a
  memory-freeing move added when the extension would cross the cap).
* Round 2 jumps to other parallel layouts (the optimum is often several layout steps from the
  baseline, e.g. folding TP and PP into data parallelism once FSDP or recompute frees the memory they
  were there for). Every distinct (tp, cp, pp, ep, etp) layout of the space is set on the incumbent,
  with its VPP/schedule/micro-batch repaired and with each memory-freeing variant (recompute, FSDP)
  the space allows (every legal schedule/VPP pair and every larger micro-batch too); a variant is kept
  only when the driver's free memory probe (``SearchContext.memory_only``, the pre-filter's estimate, no
  trial spent) says it fits. ``layout_jumps`` layouts are tried, three orders taking turns, each layout with
  its first fitting variant in that order: the ledger's surrogate (plus the novelty bonus, so untried values
  are not ranked at zero); least model parallelism (tp * cp * pp) among variants with no more recompute
  than the incumbent; and the recompute trade, the least split layout (tp * cp * pp * ep * etp, then
  tp * cp * pp) that fits only with more recompute than the incumbent, with that recompute and as few other
  changes as it allows (what recomputing costs at the incumbent's layout says little about a layout with
  fewer collectives to replay and larger GEMMs per GPU, and no other order measures it). The probe is an
  estimate: a jump the full projection still puts over the cap is replaced by the next layout of its own
  order. Then the round goes on polishing. Without a driver context (no memory probe), or with less than
  twice ``layout_jumps`` trials left (no budget to polish a new layout), the round only polishes.
* Later rounds polish the incumbent (the runners-up, best first, once its neighbourhood is known):
  every single-axis move from it (adjacent values of numeric axes, all values of categorical
  ones, with the schedule/VPP and micro-batch repaired when a move breaks legality) and pairs of
  the most promising ones, ranked by a small ridge model of log throughput and log memory over
  the ledger (one-hot + log2 features; rows weighted by closeness to the incumbent, ``locality`` per
  axis that differs, so an effect measured far away counts less), with a bonus for values never tried.
  A PP or MBS move re-opens the schedule/VPP choice (every legal pair is a neighbour), and with a
  driver context the best-ranked candidate that the memory probe says fits is taken.
  It re-ranks after every observation.

Nothing here knows the oracle's formulas: every throughput prediction comes from the ledger, every memory
verdict from the driver's probe (or, without one, from the ledger too).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from searchers.base import Candidate, TrialResult
from searchers.history import Entry, History, diff
from searchers.space import ORDINAL_AXES, PARALLEL_AXES, SearchSpace

LABEL = "cross-axis (offline)"
_REPAIR_AXES = ("vpp", "pp_schedule", "mbs", "recompute_num_layers")
_PIPELINE_SHAPE_AXES = ("pp", "mbs")
"""Axes that change the pipeline's depth or micro-batch count, after which every schedule/VPP is re-tried."""
_MEMORY_FREEING: tuple[tuple[str, Any], ...] = (("recompute", "selective"), ("recompute", "full"), ("fsdp", True))
"""Single-axis changes that trade time for memory; round 2 tries a layout with each (and pairs) when the
incumbent's own values do not fit there."""


def _model_parallel_degree(point: Mapping[str, Any]) -> int:
    """GPUs one model replica spans (tp * cp * pp): the rest is data parallelism, the parallelism with the
    least communication per step, so layouts that fit with the smallest degree are tried first (half of
    the layout jumps; the surrogate's picks are the other half)."""
    return int(point.get("tp", 1)) * int(point.get("cp", 1)) * int(point.get("pp", 1))


def _sharding_degree(point: Mapping[str, Any]) -> int:
    """Ways the model's weights are split (tp * cp * pp, times ep * etp for the experts): the layout jump that
    trades recomputation for a smaller model-parallel layout takes the least split layout that fits, since
    each split adds a collective to every step (TP all-reduces, EP all-to-alls, PP stages) and the
    recomputation replays them. Equals :func:`_model_parallel_degree` for a dense model."""
    return _model_parallel_degree(point) * int(point.get("ep", 1)) * int(point.get("etp", 1))


def _recompute_rank(point: Mapping[str, Any]) -> int:
    """0 none, 1 selective, 2 full: recomputation costs compute on every step, so the degree-ordered layout
    jumps first take the layouts that fit without more of it (FSDP, which costs communication that
    overlaps, is not counted)."""
    return {"none": 0, "selective": 1, "full": 2}.get(str(point.get("recompute", "none")), 0)


def repairs(space: SearchSpace, point: dict[str, Any]) -> list[dict[str, Any]]:
    """``point`` if legal, else the legal points one or two repair-axis changes away (schedule, VPP, micro-batch,
    recompute layers)."""
    if space.contains(point):
        return [point]
    fixes = []
    axes = [a for a in _REPAIR_AXES if a in space.axes]
    for k in (1, 2):
        for combo in itertools.combinations(axes, k):
            for vals in itertools.product(*(space.values[a] for a in combo)):
                p = {**point, **dict(zip(combo, vals))}
                if space.contains(p):
                    fixes.append(p)
        if fixes:
            return fixes
    return fixes


def schedules(space: SearchSpace, point: dict[str, Any]) -> list[dict[str, Any]]:
    """``point`` with every legal (pipeline schedule, VPP) pair: the best schedule depends on the pipeline
    depth and the micro-batch count, so a move that changes either re-opens the schedule choice."""
    if "pp_schedule" not in space.axes or "vpp" not in space.axes:
        return []
    out = []
    for sched in space.values["pp_schedule"]:
        for v in space.values["vpp"]:
            p = {**point, "pp_schedule": sched, "vpp": v}
            if p != point and space.contains(p):
                out.append(p)
    return out


def neighbourhood(space: SearchSpace, point: Mapping[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """Every single-axis move from ``point`` (adjacent values of numeric axes, all values of the others), repaired
    where it breaks legality; a PP or MBS move with every legal schedule/VPP pair too. (point, label) pairs."""
    out = []
    for a in space.axes:
        for v in space.neighbours(point, a):
            for p in repairs(space, {**point, a: v}):
                out.append((p, f"{a}={v}"))
            if a in _PIPELINE_SHAPE_AXES:
                out += [(p, f"{a}={v}") for p in schedules(space, {**point, a: v})]
    return out


class RoundControl:
    """Rounds, per-round cap and patience (shared by the offline and LLM proposers)."""

    def __init__(self, *, rounds: int = 4, per_round: int = 25, patience: int = 5) -> None:
        self.rounds, self.per_round, self.patience = rounds, per_round, patience
        self.round = 0
        self.in_round = 0
        self.since_improvement = 0
        self.best: float | None = None

    def start_round(self, best: float | None) -> bool:
        """Open the next round; False when all rounds are spent."""
        if self.round >= self.rounds:
            return False
        self.round += 1
        self.in_round = 0
        self.since_improvement = 0
        self.best = best
        return True

    def round_over(self) -> bool:
        return self.in_round >= self.per_round or self.since_improvement >= self.patience

    def proposed(self) -> None:
        self.in_round += 1

    def observed(self, result: TrialResult, counted: bool) -> None:
        if not counted:
            return
        v = result.value
        if v is not None and (self.best is None or v > self.best):
            self.best = v
            self.since_improvement = 0
        else:
            self.since_improvement += 1


class Surrogate:
    """Ridge regression of log throughput and log memory on one-hot + log2 features of the axes."""

    def __init__(self, space: SearchSpace, *, ridge: float = 1.0, locality: float = 1.0) -> None:
        self.space, self.ridge, self.locality = space, ridge, locality
        self.cols: list[tuple[str, Any]] = []
        for a in space.axes:
            for v in space.values[a]:
                self.cols.append((a, v))
        self.num_axes = [a for a in space.axes if a in ORDINAL_AXES
                         and all(isinstance(v, (int, float)) and v > 0 for v in space.values[a])]
        self._index = {c: i for i, c in enumerate(self.cols)}

    def features(self, point: Mapping[str, Any]) -> np.ndarray:
        x = np.zeros(len(self.cols) + len(self.num_axes))
        for a in self.space.axes:
            i = self._index.get((a, point.get(a)))
            if i is not None:
                x[i] = 1.0
        for j, a in enumerate(self.num_axes):
            x[len(self.cols) + j] = math.log2(point[a])
        return x

    @staticmethod
    def _fit(X: np.ndarray, y: np.ndarray, ridge: float,
             weights: np.ndarray | None = None) -> tuple[float, np.ndarray]:
        wt = np.ones(len(y)) if weights is None else weights
        mu = float(wt @ y / wt.sum())
        xm = wt @ X / wt.sum()
        Xc = X - xm
        w = np.linalg.solve(Xc.T @ (wt[:, None] * Xc) + ridge * np.eye(X.shape[1]), Xc.T @ (wt * (y - mu)))
        return mu - float(xm @ w), w

    def fit(self, history: History, center: Mapping[str, Any] | None = None) -> "Surrogate":
        """Fit on the ledger; with ``center``, throughput rows are weighted by their closeness to it
        (``locality`` ** axes that differ): an axis effect measured only far from ``center`` (a number
        format at another micro-batch size, recompute on another layout) is weak evidence there, so the
        ridge shrinks it towards neutral instead of carrying it over unchanged."""
        ok = history.ok()
        mem = [e for e in history.entries if e.result.peak_bytes]
        weights = None
        if center is not None and self.locality < 1.0:
            weights = np.array([self.locality ** sum(1 for a in self.space.axes if e.point.get(a) != center.get(a))
                                for e in ok])
        self.tp_model = self._fit(np.array([self.features(e.point) for e in ok]),
                                  np.log([e.result.value for e in ok]), self.ridge, weights) if len(ok) >= 2 else None
        self.mem_model = self._fit(np.array([self.features(e.point) for e in mem]),
                                   np.log([e.result.peak_bytes for e in mem]), self.ridge) if len(mem) >= 2 else None
        caps = [e.result.cap_bytes for e in mem if e.result.cap_bytes]
        self.log_cap = math.log(min(caps)) if caps else None
        self.seen = {(a, e.point.get(a)) for e in ok for a in self.space.axes}
        return self

    def log_tps(self, point: Mapping[str, Any]) -> float:
        if self.tp_model is None:
            return 0.0
        b, w = self.tp_model
        return b + float(self.features(point) @ w)

    def log_mem_margin(self, point: Mapping[str, Any]) -> float:
        """Predicted log(peak / cap); > 0 means predicted over the cap (0 when unknown)."""
        if self.mem_model is None or self.log_cap is None:
            return 0.0
        b, w = self.mem_model
        return b + float(self.features(point) @ w) - self.log_cap

    def novelty(self, point: Mapping[str, Any]) -> int:
        return sum(1 for a in self.space.axes if (a, point.get(a)) not in self.seen)


class CrossAxisProposer:
    """Deterministic proposer (see module doc); ask/tell over a shared :class:`History`."""

    label = LABEL

    def __init__(self, space: SearchSpace, history: History, *, rounds: int = 4, per_round: int = 25,
                 patience: int = 5, top_moves: int = 6, novelty_bonus: float = 0.03,
                 memory_margin: float = 0.0, layout_jumps: int = 4, locality: float = 0.7,
                 context: Any = None) -> None:
        self.space, self.history = space, history
        self.layout_jumps = layout_jumps
        self.locality = locality
        """Surrogate row weight per axis that differs from the point ranked around (:meth:`Surrogate.fit`)."""
        self.context = context
        """The driver's SearchContext (free memory probes), or None."""
        self.control = RoundControl(rounds=rounds, per_round=per_round, patience=patience)
        self.top_moves, self.novelty_bonus, self.memory_margin = top_moves, novelty_bonus, memory_margin
        self._queue: list[Candidate] = []
        self._pool: list[tuple[dict[str, Any], float | None, float | None, str]] = []
        self._good: set[int] = set()
        self._savers: set[int] = set()
        self._proposed: set[str] = set()
        self._jump_streams: list[Iterator[tuple[float, str, Candidate]]] = []
        """Round 2's layout-jump orders (:meth:`_layout_jumps`); a jump the pre-filter rejects is replaced by
        the next layout of its own order (:meth:`observe`)."""
        self._done = False

    # ------------------------------------------------------------------ ask / tell
    def suggest(self) -> Candidate | None:
        while not self._done:
            if self.control.round == 0 or self.control.round_over():
                if not self.control.start_round(self.history.best_value()):
                    self._done = True
                    return None
                if self.control.round == 1:
                    self._queue = self._combinations()
                elif self.control.round == 2:
                    self._queue = self._layout_jumps()
                continue
            if self.control.round == 1:
                c = self._round1()
            else:
                c = (self._next_queued() if self.control.round == 2 else None) or self._polish()
            if c is None:
                self.control.in_round = self.control.per_round  # nothing left this round
                continue
            self.control.proposed()
            return c
        return None

    def observe(self, candidate: Candidate, result: TrialResult, counted: bool) -> None:
        self.control.observed(result, counted)
        stream = candidate.meta.get("jump_stream")
        if result.status == "rejected" and stream is not None and self.control.round == 2:
            # the free probe is the pre-filter's estimate; the full projection can still put a marginal
            # layout over the cap: the jump's order gets its next layout instead of losing its turn
            c = self._next_jump(stream)
            if c is not None:
                self._queue.insert(0, c)

    # ------------------------------------------------------------------ helpers
    def _next_queued(self) -> Candidate | None:
        while self._queue:
            c = self._queue.pop(0)
            if c.meta["key"] not in self._proposed and not self.history.knows(c.meta["key"]):
                return self._take(c)
        return None

    def _candidate(self, point: Mapping[str, Any], note: str, combo: tuple[int, ...] = ()) -> Candidate | None:
        found = self.history.unseen_run(point, self._proposed)
        if found is None:
            return None
        run, key = found
        return Candidate(values=self.space.point_of(run), phase="cross-axis", round=self.control.round,
                         proposer=self.label, note=note, meta={"key": key, "combo": combo})

    def _round1(self) -> Candidate | None:
        """Extend the incumbent when it is a round-1 combination, else the next planned pair/triple."""
        inc = self.history.best()
        if inc is not None and inc.candidate.phase == "cross-axis" and inc.candidate.meta.get("combo"):
            ext = self._extensions(inc)
            return self._take(ext[0][1]) if ext else None  # nothing left to add: on to polishing
        return self._next_queued()

    def _extensions(self, inc: Entry) -> list[tuple[float, Candidate]]:
        """The incumbent combination plus one more improving (or memory-blocked) move, a saver added
        when the predicted memory would cross the cap; best predicted gain first."""
        combo = tuple(inc.candidate.meta["combo"])
        used = set().union(*(self._pool[i][0] for i in combo))
        ratio = inc.result.memory_ratio or 1.0
        out = []
        for i, (ch, gain, mem, label) in enumerate(self._pool):
            if i in combo or used & set(ch) or (gain is not None and gain <= 1.0):
                continue
            extra: tuple[int, ...] = ()
            pred_mem = ratio * (mem or 1.0)
            if pred_mem > 1.0 + self.memory_margin:
                rescue = [j for j in sorted(self._savers) if j not in combo and j != i
                          and not (used | set(ch)) & set(self._pool[j][0])
                          and pred_mem * (self._pool[j][2] or 1.0) <= 1.0 + self.memory_margin]
                if not rescue:
                    continue
                extra = (max(rescue, key=lambda j: self._pool[j][1] or 0.0),)
            point = dict(inc.point)
            point.update(ch)
            for j in extra:
                point.update(self._pool[j][0])
            note = " + ".join([inc.candidate.note, label, *(self._pool[j][3] for j in extra)])
            c = self._candidate(point, note, combo=combo + (i,) + extra)
            if c is not None:
                out.append(((gain or 1.0) * math.prod(self._pool[j][1] or 1.0 for j in extra), c))
        out.sort(key=lambda t: -t[0])
        return out

    def _take(self, c: Candidate | None) -> Candidate | None:
        if c is not None:
            self._proposed.add(c.meta["key"])
        return c

    # ------------------------------------------------------------------ round 1: combinations
    def _moves(self) -> list[tuple[dict[str, Any], float | None, float | None, str]]:
        """Seed moves as (changes, gain vs baseline or None, memory ratio vs baseline or None, label)."""
        base = self.history.baseline()
        ok = self.history.ok()
        if not ok:
            return []
        anchor = base if base is not None and base.result.value is not None else max(ok, key=lambda e: e.result.value)
        bpoint = self.space.point_of(self.space.baseline)
        out = []
        for e in self.history.entries:
            if e.candidate.phase != "seed" or e is anchor:
                continue
            ch = diff(e.point, bpoint)
            if not ch:
                continue
            gain = e.result.value / anchor.result.value if e.result.value is not None else None
            mem = (e.result.peak_bytes / anchor.result.peak_bytes
                   if e.result.peak_bytes and anchor.result.peak_bytes else None)
            if e.result.status == "ok" or e.result.status == "rejected":
                out.append((ch, gain, mem, e.candidate.note or ",".join(f"{k}={v}" for k, v in ch.items())))
        return out

    def _combinations(self) -> list[Candidate]:
        moves = self._moves()
        base = self.history.baseline()
        if not moves:
            return []
        base_ratio = (base.result.memory_ratio if base is not None else None) or 1.0
        good = sorted((m for m in moves if m[1] is not None and m[1] > 1.0), key=lambda m: -m[1])[: self.top_moves]
        savers = sorted((m for m in moves if m[1] is not None and m[2] is not None and m[2] < 1.0),
                        key=lambda m: -m[1])[: self.top_moves]
        blocked = [m for m in moves if m[1] is None and m[2] is not None]
        pool = list({id(m): m for m in good + savers + blocked}.values())
        self._pool = pool
        self._good = {i for i, m in enumerate(pool) if any(m is g for g in good)}
        self._savers = {i for i, m in enumerate(pool) if any(m is g for g in savers)}
        bpoint = self.space.point_of(self.space.baseline)
        planned: set[str] = set()
        out: list[tuple[int, float, Candidate]] = []
        for size in (2, 3):
            for idx in itertools.combinations(range(len(pool)), size):
                combo = [pool[i] for i in idx]
                fields = [set(m[0]) for m in combo]
                if any(a & b for a, b in itertools.combinations(fields, 2)):
                    continue
                gain = math.prod(m[1] if m[1] is not None else 1.0 for m in combo)
                mem = base_ratio * math.prod(m[2] if m[2] is not None else 1.0 for m in combo)
                if mem > 1.0 + self.memory_margin:
                    continue
                if not any(m in good for m in combo) and gain <= 1.0:
                    continue
                point = dict(bpoint)
                for m in combo:
                    point.update(m[0])
                c = self._candidate(point, " + ".join(m[3] for m in combo), combo=idx)
                if c is not None and c.meta["key"] not in planned:
                    planned.add(c.meta["key"])
                    out.append((size, -gain, c))
        out.sort(key=lambda t: (t[0], t[1]))
        return [c for _, _, c in out]

    # ------------------------------------------------------------------ round 2: layout jumps
    def bind(self, context: Any) -> None:
        self.context = context

    def _fits(self, point: Mapping[str, Any]) -> bool:
        try:
            probe = self.context.memory_only(point)
        except Exception:  # noqa: BLE001 - a probe that fails says nothing: do not spend a trial on it
            return False
        return bool(probe.get("legal")) and bool(probe.get("fits"))

    def _layout_jumps(self) -> list[Candidate]:
        """The incumbent moved to each other parallel layout of the space (see the module doc).

        Variants are ranked without touching the oracle; the memory probe is asked in rank order only
        until a layout has its fitting variant, so a round costs a few probes per layout at most."""
        inc = self.history.best()
        if self.context is None or inc is None or self.layout_jumps <= 0:
            return []
        remaining = self.context.budget_status().get("remaining", 0)
        if remaining < 2 * self.layout_jumps:
            return []  # a jump needs budget left to polish the new layout; with less, polish the incumbent
        axes = [a for a in PARALLEL_AXES if a in self.space.axes and a != "vpp"]
        if not axes:
            return []
        idx = [self.space.axes.index(a) for a in axes]
        layouts = sorted({tuple(p[i] for i in idx) for p in self.space.points})
        here = tuple(inc.point[a] for a in axes)
        model = Surrogate(self.space, locality=self.locality).fit(self.history, center=inc.point)
        savers = [(a, v) for a, v in _MEMORY_FREEING if a in self.space.axes and v in self.space.values[a]]
        variants: list[dict[str, Any]] = [{}] + [{a: v} for a, v in savers] + [
            {a: v, b: w} for (a, v), (b, w) in itertools.combinations(savers, 2) if a != b]
        # a layout that frees memory may admit a larger micro-batch, whose gain depends on the layout (the
        # expert GEMMs grow with it): each larger micro-batch of the space is a variant too, ranked with the rest
        larger_mbs: list[dict[str, Any]] = [{}]
        if "mbs" in self.space.axes:
            larger_mbs += [{"mbs": m} for m in self.space.values["mbs"] if m > inc.point["mbs"]]
        per_layout: list[list[tuple[float, str, Candidate]]] = []
        for lay in layouts:
            if lay == here:
                continue
            moved = {**inc.point, **dict(zip(axes, lay))}
            options: list[tuple[float, str, Candidate]] = []
            for extra, mb in itertools.product(variants, larger_mbs):
                point = {**moved, **extra, **mb}
                if extra.get("fsdp"):
                    point["use_distributed_optimizer"] = False
                for p in repairs(self.space, point)[:4] + schedules(self.space, point):
                    c = self._candidate(p, "layout " + ", ".join(f"{k}={v}" for k, v in diff(p, inc.point).items()))
                    if c is not None and all(c.meta["key"] != o[1] for o in options):
                        options.append((self._score(model, c.values), c.meta["key"], c))
            if options:
                options.sort(key=lambda t: (-t[0], t[1]))
                per_layout.append(options)

        flat = [(n, t) for n, options in enumerate(per_layout) for t in options]

        def ordered(key: Any, where: Any = None) -> Iterator[tuple[float, str, Candidate]]:
            """Per layout, its first fitting variant in ``key`` order (among those ``where(layout, variant)``
            keeps); layouts in the order they are found."""
            done: set[int] = set()
            for n, t in sorted(flat, key=lambda nt: key(nt[1])):
                if n not in done and (where is None or where(n, t)) and self._fits(t[2].values):
                    done.add(n)
                    yield t
        here_rank = _recompute_rank(inc.point)
        by_model = ordered(lambda t: (-t[0], t[1]))
        by_degree = ordered(lambda t: (_recompute_rank(t[2].values) - here_rank,
                                       _model_parallel_degree(t[2].values), -t[0], t[1]))
        trades: dict[int, bool] = {}

        def trade(n: int, t: tuple[float, str, Candidate]) -> bool:
            """A variant with more recomputation than the incumbent, of a layout that fits only with more."""
            if _recompute_rank(t[2].values) <= here_rank:
                return False
            if n not in trades:
                opts = [o[2].values for o in per_layout[n]]
                # its least-memory variants first (most recomputation and sharding, the smallest micro-batch): a
                # layout where none of those fits is passed over without probing the rest
                def thrift(v: Mapping[str, Any]) -> tuple[int, int, int]:
                    return (-_recompute_rank(v), -bool(v.get("fsdp")), int(v.get("mbs", 1)))
                frugal = min(thrift(v) for v in opts)
                trades[n] = (any(self._fits(v) for v in opts if thrift(v) == frugal)
                             and not any(self._fits(v) for v in opts if _recompute_rank(v) <= here_rank))
            return trades[n]
        # the trade the other two orders never measure: the least split layout that fits only with more
        # recomputation than the incumbent, with it (what recomputing costs at the incumbent's layout says little
        # about a layout with fewer collectives to replay and larger GEMMs per GPU); the incumbent's other values
        # are kept where they can be, so the trial measures the trade itself
        by_trade = ordered(lambda t: (_sharding_degree(t[2].values), _model_parallel_degree(t[2].values),
                                      _recompute_rank(t[2].values), len(diff(t[2].values, inc.point)), -t[0], t[1]),
                           trade)
        self._jump_streams = [by_model, by_degree, by_trade]
        out: list[Candidate] = []
        live = True
        while live and len(out) < self.layout_jumps:  # orders take turns; one another order took is a lost turn
            live = False
            for stream, it in enumerate(self._jump_streams):
                t = next(it, None) if len(out) < self.layout_jumps else None
                live = live or t is not None
                if t is not None and all(t[1] != c.meta["key"] for c in out):
                    out.append(dataclasses.replace(t[2], meta={**t[2].meta, "jump_stream": stream}))
        return out

    def _next_jump(self, stream: int) -> Candidate | None:
        """The next layout of jump order ``stream`` not yet proposed, queued or known (None when it has none)."""
        for _, key, c in self._jump_streams[stream]:
            if key in self._proposed or self.history.knows(key) or any(key == o.meta["key"] for o in self._queue):
                continue
            return dataclasses.replace(c, meta={**c.meta, "jump_stream": stream})
        return None

    # ------------------------------------------------------------------ later rounds: polish
    def _polish(self) -> Candidate | None:
        """The best-ranked move around the incumbent; around the runners-up (best first) once every
        move around it is known, so a long budget is spent rather than left over."""
        ranked = sorted(self.history.ok(), key=lambda e: -e.result.value)  # type: ignore[operator]
        if not ranked:
            return None
        model = Surrogate(self.space, locality=self.locality).fit(self.history, center=ranked[0].point)
        for inc in ranked:
            c = self._polish_around(inc, model)
            if c is not None:
                return c
        return None

    def _polish_around(self, inc: Entry, model: Surrogate) -> Candidate | None:
        singles = []
        for p, _ in neighbourhood(self.space, inc.point):
            c = self._candidate(p, "polish " + ", ".join(f"{k}={v}" for k, v in diff(p, inc.point).items()))
            if c is not None:
                singles.append((self._score(model, c.values), c))
        singles.sort(key=lambda t: -t[0])
        pairs = []
        top = [c for _, c in singles[:8]]
        for c1, c2 in itertools.combinations(top, 2):
            d1, d2 = diff(c1.values, inc.point), diff(c2.values, inc.point)
            if set(d1) & set(d2):
                continue
            p = {**inc.point, **d1, **d2}
            c = self._candidate(p, "polish " + ", ".join(f"{k}={v}" for k, v in diff(p, inc.point).items()))
            if c is not None:
                pairs.append((self._score(model, c.values), c))
        ranked = sorted(singles + pairs, key=lambda t: -t[0])
        feasible = [t for t in ranked if model.log_mem_margin(t[1].values) <= self.memory_margin]
        if self.context is not None:  # the free memory probe beats the surrogate's memory guess
            for t in ranked:
                if self._fits(t[1].values):
                    return self._take(t[1])
            return None
        pick = (feasible or ranked)[:1]
        return self._take(pick[0][1]) if pick else None

    def _score(self, model: Surrogate, point: Mapping[str, Any]) -> float:
        return model.log_tps(point) + self.novelty_bonus * model.novelty(point)

"""``seed_llm``: the paper's Tuning Agent — the seed planner, then a cross-axis proposer.

Phase 1 emits the seed plan (:mod:`searchers.seed`). With a driver context it asks the free memory
probe (``SearchContext.memory_only``, the pre-filter's own estimate, as the paper's agent does) before
each seed move and skips one that would not fit, taking the next one instead (the baseline itself is
always tried), so a memory wall does not spend the seed budget on rejections. The number-format moves
are measured last, on the best seed point so far (a format's gain depends on the GEMM share of the
step, which the other moves change). When the baseline does not fit and the plan is used up, the
unspent seed moves are planned around the best fitting point found (:meth:`SeedThenPropose._reanchor`).
Phase 2 hands the shared history to the LLM proposer (:mod:`searchers.llm`) when an ``llm`` block is
configured, else to an offline proposer (option ``offline``): by default the breakdown-guided one
(:mod:`searchers.guided`), which takes over from the first trial the oracle scored with a time breakdown and
orders every later trial itself (the seed planner's moves on the settings its step model cannot carry among
them); ``offline: rounds`` keeps the seed plan and then runs the round-based cross-axis proposer
(:mod:`searchers.crossaxis`), as does an oracle that returns no breakdown. :attr:`SeedThenPropose.proposer`
always says which one ran (and whether the LLM fell back to the offline proposer).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from oracle.errors import InvalidConfigError
from searchers.base import Candidate, SearchContext, Searcher, TrialResult, register
from searchers.guided import GuidedProposer
from searchers.history import History, diff
from searchers.offline import OFFLINE, OFFLINE_LABELS, offline_proposer
from searchers.seed import seed_plan
from searchers.space import SearchSpace

__all__ = ["OFFLINE", "OFFLINE_LABELS", "SeedThenPropose", "offline_proposer"]


@register("seed_llm")
class SeedThenPropose(Searcher):
    """Seed planner (about 12 single-axis candidates), then up to ``rounds`` proposer rounds.

    Options: ``max_seed`` (12), ``rounds`` (4), ``per_round`` (25), ``patience`` (5),
    ``llm`` (mapping as in the experiment's ``llm`` block, or an :class:`~searchers.llm.LLMSettings`;
    absent = offline proposer), ``lm`` (a ready ``dspy.LM``-like object, for tests),
    ``extra_guidance`` (free text for the LLM planner), ``offline`` (:data:`OFFLINE`: ``guided``, the
    breakdown-guided proposer of :mod:`searchers.guided`, the default; ``rounds``, the round-based cross-axis
    proposer of :mod:`searchers.crossaxis` that preceded it). The offline proposer is also the LLM's fallback.
    """

    def __init__(self, space: SearchSpace, *, seed: int = 0, max_seed: int = 12, rounds: int = 4,
                 per_round: int = 25, patience: int = 5, llm: Any = None, lm: Any = None,
                 extra_guidance: str = "", offline: str = "guided") -> None:
        super().__init__(space, seed=seed)
        if offline not in OFFLINE:
            raise InvalidConfigError(f"seed_llm option offline={offline!r} is not an offline proposer; valid: "
                                     f"{', '.join(OFFLINE)}")
        self._offline = offline
        self.history = History(space)
        self._seed: list[Candidate] = []
        self._deferred: list[Candidate] = []
        self._plan(seed_plan(space, max_candidates=10 * max_seed))
        self._max_seed = max_seed
        self._seed_emitted = 0
        self._reanchored = False
        self.seed_memory_skips = 0
        """Seed moves skipped because the memory probe said they do not fit."""
        self._round_opts = {"rounds": rounds, "per_round": per_round, "patience": patience}
        self._llm, self._lm, self._guidance = llm, lm, extra_guidance
        self._proposer: Any = None
        self._in_seed = True
        self.sequential = llm is not None or lm is not None
        """The LLM proposer's tool loop waits for each result: one trial at a time under Ray Tune."""

    # ------------------------------------------------------------------ proposer selection
    def _make_proposer(self) -> Any:
        if self._llm is None and self._lm is None:
            return offline_proposer(self._offline, self.space, self.history, self.context, **self._round_opts)
        from searchers.llm import LLMProposer
        return LLMProposer(self.space, self.history, settings=self._llm, lm=self._lm,
                           extra_guidance=self._guidance, context=self.context, offline=self._offline,
                           **self._round_opts)

    @property
    def _guided(self) -> bool:
        """The breakdown-guided proposer drives the search from the first scored point (no LLM)."""
        return self._offline == "guided" and self._llm is None and self._lm is None

    @property
    def proposer(self) -> str:
        if self._proposer is not None:
            return f"seed-planner + {self._proposer.label}"
        if self._llm is None and self._lm is None:
            return f"seed-planner + {OFFLINE_LABELS[self._offline]}"
        from searchers.llm import llm_label
        return f"seed-planner + {llm_label(self._llm, self._lm)}"

    def bind(self, context: SearchContext) -> None:
        super().bind(context)
        if self._proposer is not None and hasattr(self._proposer, "bind"):
            self._proposer.bind(context)

    # ------------------------------------------------------------------ ask / tell
    def suggest(self) -> Candidate | None:
        if (self._guided and not isinstance(self._proposer, GuidedProposer)
                and any(e.result.breakdown for e in self.history.ok())):
            # also after the round-based proposer stood in: a driver that runs trials concurrently (Ray) can use
            # up the seed plan before the first breakdown comes back
            self._proposer = self._make_proposer()
        if self._guided and isinstance(self._proposer, GuidedProposer):
            # from the first scored point on, the guided proposer orders everything: the seed planner's moves on
            # the settings its step model cannot carry, then the model's ranking (searchers.guided); an oracle that
            # returns no time breakdown leaves the seed plan and the round-based proposer in charge
            self._in_seed = False
            return self._proposer.suggest()
        if not self._seed and self._seed_emitted < self._max_seed and not self._reanchored:
            self._reanchor()
        while (self._seed or self._deferred) and self._seed_emitted < self._max_seed:
            if self._seed and self._seed_emitted < self._max_seed - len(self._deferred):
                c = self._seed.pop(0)
            else:
                c = self._on_best(self._deferred.pop(0))
                if c is None:
                    continue
            if self.history.knows(c.meta.get("key", "")):
                continue
            if c.note != "baseline" and not self._fits(c):
                self.seed_memory_skips += 1
                continue
            self._seed_emitted += 1
            return c
        if not self._reanchored and self._seed_emitted < self._max_seed and self._reanchor():
            return self.suggest()
        self._in_seed = False
        if self._proposer is None:
            self._proposer = (offline_proposer("rounds", self.space, self.history, self.context, **self._round_opts)
                              if self._guided else self._make_proposer())
        return self._proposer.suggest()

    def _plan(self, plan: list[Candidate]) -> None:
        """Split a seed plan: number-format moves are measured last, on the best point of the seed phase
        (:meth:`_on_best`); the other moves keep their order."""
        self._seed = [c for c in plan if set(c.meta.get("move", {})) != {"precision"}]
        self._deferred = [c for c in plan if set(c.meta.get("move", {})) == {"precision"}]

    def _on_best(self, c: Candidate) -> Candidate | None:
        """A format move laid over the best point measured so far: a lower-precision GEMM pays off in
        proportion to the GEMM share of the step, which the first-order moves (micro-batch size,
        dispatcher, schedule) change, so at the baseline it can measure as a loss where it wins on
        the better point (None when that point is not legal)."""
        best = self.history.best()
        if best is None:
            return c
        run, problems = self.space.validate({**best.point, **c.meta["move"]})
        if run is None or problems:
            return None
        values = self.space.point_of(run)
        on = ", ".join(f"{k}={v}" for k, v in diff(values, c.values).items())
        return dataclasses.replace(c, values=values, note=f"{c.note} (on {on})" if on else c.note,
                                   meta={**c.meta, "key": run.key()})

    def _reanchor(self) -> bool:
        """Behind a memory wall (the baseline does not fit), plan the unspent seed moves around the best
        fitting point found so far instead; once per search. True when there is a new plan."""
        self._reanchored = True
        base = self.history.baseline()
        best = self.history.best()
        if (base is not None and base.result.value is not None) or best is None:
            return False
        self._plan([dataclasses.replace(c, note=f"{c.note} (around {best.candidate.note})")
                    for c in seed_plan(self.space, max_candidates=10 * self._max_seed, anchor=best.point)
                    if c.note != "anchor"])
        return bool(self._seed or self._deferred)

    def _fits(self, c: Candidate) -> bool:
        """The memory probe's verdict (True without a context, or when the probe itself fails)."""
        if self.context is None:
            return True
        try:
            probe = self.context.memory_only(c.values)
        except Exception:  # noqa: BLE001 - no verdict: let the pre-filter decide
            return True
        return bool(probe.get("fits", True))

    def observe(self, candidate: Candidate, result: TrialResult) -> None:
        counted = self.history.add(candidate, result) and result.status != "illegal"
        if (candidate.phase != "seed" or self._guided) and self._proposer is not None:
            self._proposer.observe(candidate, result, counted)

    def close(self) -> None:
        if self._proposer is not None and hasattr(self._proposer, "close"):
            self._proposer.close()

    def stats(self) -> Mapping[str, Any]:
        fn = getattr(self._proposer, "stats", None)
        out = dict(fn() if callable(fn) else getattr(self._proposer, "counts", {}))
        if self.seed_memory_skips:
            out["seed_memory_skips"] = self.seed_memory_skips
        return out

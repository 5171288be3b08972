"""The offline proposers: what proposes after the seed plan when no LLM is configured, and what finishes the
budget when a configured LLM cannot (``seed_llm``'s option ``offline``, the LLM proposer's fallback)."""
from __future__ import annotations

from typing import Any

from searchers.crossaxis import LABEL as ROUNDS_LABEL
from searchers.crossaxis import CrossAxisProposer
from searchers.guided import LABEL as GUIDED_LABEL
from searchers.guided import GuidedProposer
from searchers.history import History
from searchers.space import SearchSpace

OFFLINE: tuple[str, ...] = ("guided", "rounds")
"""Offline proposers: ``guided`` (breakdown-guided, :mod:`searchers.guided`) and ``rounds`` (round-based cross-axis,
:mod:`searchers.crossaxis`)."""
OFFLINE_LABELS: dict[str, str] = {"guided": GUIDED_LABEL, "rounds": ROUNDS_LABEL}


def offline_proposer(kind: str, space: SearchSpace, history: History, context: Any, *, rounds: int = 4,
                     per_round: int = 25, patience: int = 5) -> Any:
    """The offline proposer ``kind`` (:data:`OFFLINE`) over a shared history, with the driver's context."""
    if kind == "guided":
        return GuidedProposer(space, history, context=context)
    return CrossAxisProposer(space, history, context=context, rounds=rounds, per_round=per_round, patience=patience)

"""The one interface every search strategy implements, and the registry that names them.

A searcher is an ask/tell object over a :class:`~searchers.space.SearchSpace`:

* ``suggest() -> Candidate | None`` proposes the next configuration (None = nothing left to try);
* ``observe(candidate, result)`` tells it what became of that candidate: scored, rejected by the
  memory pre-filter, structurally illegal, or failed.

Searchers never call the oracle themselves; a driver (the in-process loop in
:mod:`searchers.driver`, or Ray Tune through :mod:`raytune_primus.tuner`) does, behind the memory
pre-filter of :mod:`searchers.prefilter`. Given the same seed and the same observations a searcher
suggests the same sequence, in this process or a fresh one (the contract suite checks it).

Registering a new strategy is one module::

    @register("my_searcher")
    class MySearcher(Searcher):
        def suggest(self): ...
"""
from __future__ import annotations

import abc
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from oracle.errors import UnknownComponentError

if TYPE_CHECKING:
    from searchers.space import SearchSpace

Status = Literal["ok", "rejected", "illegal", "failed"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One proposal: training values on top of the space's baseline, and where it came from."""

    values: Mapping[str, Any]
    """Training keys to set (a subset is fine: the rest come from the space's baseline)."""
    phase: str = ""
    """Which stage proposed it: 'seed', 'cross-axis', 'llm', 'tpe', 'grid', ..."""
    round: int = 0
    """Proposer round (0 for the seed phase and for single-phase searchers)."""
    proposer: str = ""
    """Who proposed it, e.g. 'seed-planner', 'cross-axis (offline)', 'llm:openai/gpt-4o'."""
    note: str = ""
    """Why it was proposed (one line, for the ledger)."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """Searcher-private handle (an Optuna trial number, a move description); not persisted."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialResult:
    """What became of one candidate (SI units inside; GiB only in :meth:`memory_gib`)."""

    status: Status
    """'ok' scored; 'rejected' over the memory cap (never scored); 'illegal' failed the space or
    legality checks; 'failed' the oracle raised."""
    key: str = ""
    """``RunConfig.key()`` of the candidate ('' when it could not even be built)."""
    training: Mapping[str, Any] | None = None
    """The full training section evaluated (None when it could not be built)."""
    tokens_per_s_per_gpu: float | None = None
    """Projected throughput; set only when status is 'ok'."""
    peak_bytes: float | None = None
    """Projected peak memory of the worst pipeline stage."""
    cap_bytes: float | None = None
    """Memory cap the peak was held against."""
    iteration_time_s: float | None = None
    mfu: float | None = None
    reason: str = ""
    """Why it is not 'ok' (legality problems, 'peak 91.2 GiB > cap 70.2 GiB', the exception)."""
    breakdown: Mapping[str, float] | None = None
    """Where the iteration's time went, when scored (:func:`searchers.evaluator.breakdown_of`): seconds per term
    (``compute_s``, ``recompute_s``, ``bubble_s``, ``optimizer_s``, ``host_sync_s``, ``other_s``) and per
    communication kind ``KIND_total_s`` / ``KIND_exposed_s``."""

    @property
    def legal(self) -> bool:
        return self.status != "illegal"

    @property
    def fits(self) -> bool | None:
        if self.peak_bytes is None or self.cap_bytes is None:
            return None
        return self.peak_bytes <= self.cap_bytes

    @property
    def value(self) -> float | None:
        """The objective (tokens/s/GPU) when scored and finite, else None (infeasible)."""
        v = self.tokens_per_s_per_gpu
        if self.status != "ok" or v is None or not math.isfinite(v):
            return None
        return float(v)

    @property
    def memory_ratio(self) -> float | None:
        """peak / cap (> 1 means over the cap)."""
        if self.peak_bytes is None or not self.cap_bytes:
            return None
        return self.peak_bytes / self.cap_bytes


class SearchContext(Protocol):
    """What a driver offers a searcher beyond ask/tell (bound by the pre-filter)."""

    def budget_status(self) -> dict[str, int]:
        """{'budget', 'used', 'remaining'} in trials."""

    def event(self, *, status: str, reason: str, phase: str = "", round: int = 0, proposer: str = "",
              note: str = "") -> None:
        """Record a proposer event (LLM timeout, malformed answer) in the ledger."""

    def memory_only(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Validate and project the memory of a candidate without spending a trial."""


class Searcher(abc.ABC):
    """Ask/tell search strategy over a :class:`SearchSpace` (see the module docstring)."""

    name: str = ""
    """Registry name (set by :func:`register`)."""

    def __init__(self, space: "SearchSpace", *, seed: int = 0, **options: Any) -> None:
        self.space = space
        self.seed = int(seed)
        if options:
            raise TypeError(f"{type(self).__name__} got unknown options: {', '.join(sorted(options))}")

    @abc.abstractmethod
    def suggest(self) -> Candidate | None:
        """Next candidate to evaluate, or None when this searcher has nothing left to propose."""

    def observe(self, candidate: Candidate, result: TrialResult) -> None:
        """Learn from the outcome of ``candidate`` (default: ignore)."""

    context: SearchContext | None = None
    """Set by :meth:`bind`; searchers that need the budget or the ledger read it from here."""

    def bind(self, context: SearchContext) -> None:
        """Attach the driver's context (budget, ledger events, free memory probes)."""
        self.context = context

    @property
    def proposer(self) -> str:
        """Which proposer produced (or is producing) the suggestions; every output reports it."""
        return self.name

    def close(self) -> None:
        """Release resources (threads, sessions); idempotent."""


_REGISTRY: dict[str, type[Searcher]] = {}


def register(name: str) -> Callable[[type[Searcher]], type[Searcher]]:
    """Class decorator: register a Searcher subclass under ``name`` (duplicates raise)."""

    def deco(cls: type[Searcher]) -> type[Searcher]:
        if name in _REGISTRY:
            raise ValueError(f"searcher {name!r} is already registered by {_REGISTRY[name].__qualname__}")
        if not (isinstance(cls, type) and issubclass(cls, Searcher)):
            raise TypeError(f"@register({name!r}) needs a Searcher subclass, got {cls!r}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def _load_builtin() -> None:
    # Importing the modules runs their @register decorators; optional backends import lazily inside.
    import searchers.baselines  # noqa: F401
    import searchers.seed_llm  # noqa: F401


def available() -> list[str]:
    """Registered searcher names, sorted."""
    _load_builtin()
    return sorted(_REGISTRY)


def get_searcher(name: str) -> type[Searcher]:
    """The Searcher class registered under ``name`` (UnknownComponentError lists the valid ones)."""
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownComponentError("searcher", name, _REGISTRY) from None


def make_searcher(name: str, space: "SearchSpace", *, seed: int = 0, **options: Any) -> Searcher:
    """Instantiate the searcher ``name`` on ``space``."""
    return get_searcher(name)(space, seed=seed, **options)

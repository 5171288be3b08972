"""What a search needs from the oracle, as a small protocol, and its binding to the real oracle.

Searchers and drivers take any object with ``memory(run)`` and ``score(run)``; the default,
:class:`OracleEvaluator`, imports :mod:`oracle.memory` and :mod:`oracle.projector` only when first
called. Tests pass the synthetic oracle of :mod:`searchers.testing`.

The two helpers turn oracle answers (or exceptions) into :class:`~searchers.base.TrialResult`:
an exception raised by the oracle is a 'failed' trial with its message, never a crashed search.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from oracle.config import RunConfig
from oracle.schema import to_dict as schema_to_dict
from oracle.units import GIB
from searchers.base import TrialResult


@runtime_checkable
class MemoryLike(Protocol):
    """What the pre-filter reads from a memory projection (``oracle.results.MemoryBreakdown``)."""

    @property
    def peak_bytes(self) -> float: ...

    @property
    def cap_bytes(self) -> float: ...


class ProjectionLike(Protocol):
    """What a search reads from a projection (``oracle.results.Projection``)."""

    tokens_per_s_per_gpu: float | None
    memory: Any


class Evaluator(Protocol):
    """The oracle as a search sees it."""

    mode: str
    """Oracle mode recorded in the ledger ('simulate', 'benchmark', 'synthetic', ...)."""

    def memory(self, run: RunConfig) -> MemoryLike:
        """Memory projection only (cheap; the pre-filter)."""

    def score(self, run: RunConfig) -> ProjectionLike:
        """Full projection (throughput and memory)."""


@lru_cache(maxsize=1)
def oracle_fingerprint() -> str:
    """Hash of the oracle's code, model cards and hardware profiles: two projections of one config
    agree when their fingerprints do (ledgers record it; cached optima and resumes check it)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha1()
    for sub, pattern in (("oracle", "**/*.py"), ("oracle", "**/*.yaml"), ("hardware", "*.yaml")):
        for f in sorted((root / sub).glob(pattern)):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:12]


def user_components_tag(run: RunConfig) -> str:
    """Content hash of the model card and hardware profile of ``run`` that are not bundled ('' when both
    are): the oracle fingerprint covers bundled files only, and a user card can change between runs."""
    from oracle.config import hardware_digest, model_digest
    d = run.to_dict()
    parts = [f"model:{model_digest(run.model)}" if isinstance(d["model"], dict) else "",
             f"hardware:{hardware_digest(run.cluster.hardware)}" if isinstance(d["cluster"]["hardware"], dict) else ""]
    if not any(parts):
        return ""
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:8]


def evaluator_version(evaluator: Any, run: RunConfig | None = None) -> str | None:
    """What a ledger row records as ``oracle_version``: the evaluator's ``version`` (None: unversioned,
    e.g. a synthetic test oracle), plus ``+TAG`` for the user cards/profiles ``run`` uses
    (:func:`user_components_tag`), so a resume after editing a custom card refuses the stale rows."""
    v = getattr(evaluator, "version", None)
    if v is None:
        return None
    tag = user_components_tag(run) if run is not None else ""
    return f"{v}+{tag}" if tag else str(v)


class OracleEvaluator:
    """The real oracle: ``oracle.memory.project_memory`` and ``oracle.projector.project`` (lazy).

    Searches never read the per-module memory tree, so it is not built. ``fast_schedules`` (on: a search
    is the oracle's search mode) lets the cost-aware schedules (ILP, greedy V orders) reuse orders solved on
    quantised costs under the solver's search budget (``oracle.pipeline.schedules.ilp.SEARCH_BUDGET``); the
    replay uses the exact costs and the result says the order was built from quantised ones. Fixed-order
    schedules give the same projection either way.
    """

    def __init__(self, mode: str = "simulate", *, fast_schedules: bool = True) -> None:
        self.mode = mode
        self.fast_schedules = fast_schedules

    def memory(self, run: RunConfig) -> MemoryLike:
        from oracle.memory import project_memory
        return project_memory(run, trees="none")  # the verdict reads peak and cap only: no module tree

    def score(self, run: RunConfig) -> ProjectionLike:
        from oracle.projector import project
        return project(run, mode=self.mode, fast_schedules=self.fast_schedules, memory_tree=False)

    def memory_peaks(self, runs: list[RunConfig]) -> tuple[Any, Any]:
        """(peak bytes, cap bytes) of every run, as :meth:`memory` would give them (``oracle.memory.memory_peaks``:
        numpy over the runs)."""
        from oracle.memory import memory_peaks
        return memory_peaks(runs)

    def score_many(self, runs: list[RunConfig]) -> list[Any]:
        """:meth:`score` of every run (``oracle.projector.project_many``: runs that share a pipeline plan are
        replayed together), each failure as its exception in place."""
        from oracle.projector import project_many
        return project_many(runs, mode=self.mode, fast_schedules=self.fast_schedules, memory_tree=False,
                            errors="return")

    def upper_bound(self, run: RunConfig) -> float | None:
        """A provable upper bound on tokens/s/GPU when ``run`` uses an expensive (cost-aware) pipeline
        schedule, else None: exhaustive sweeps skip such points when the bound cannot beat the best."""
        if run.training.pp == 1:
            return None
        from oracle.pipeline import get_schedule
        from oracle.projector import tokens_per_s_per_gpu_upper_bound
        if not get_schedule(run.training.schedule).cost_aware:
            return None
        return float(tokens_per_s_per_gpu_upper_bound(run))

    def throughput_bound(self, run: RunConfig) -> float:
        """A provable upper bound on tokens/s/GPU for any schedule (``tokens_per_s_per_gpu_upper_bound``: the
        pipeline's critical path plus the smallest post-flush terms); a few ms where a projection takes up to
        hundreds, so exhaustive sweeps score points best-bound first and stop when no bound can beat the best."""
        from oracle.projector import tokens_per_s_per_gpu_upper_bound
        return float(tokens_per_s_per_gpu_upper_bound(run))

    @property
    def version(self) -> str:
        """The oracle fingerprint (code + cards + profiles) that a ledger row records."""
        return oracle_fingerprint()

    def __repr__(self) -> str:
        return f"OracleEvaluator(mode={self.mode!r}{'' if self.fast_schedules else ', fast_schedules=False'})"


def _error_text(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500]


def memory_result(evaluator: Evaluator, run: RunConfig, key: str) -> TrialResult | None:
    """None when ``run`` fits under the cap; otherwise a 'rejected' (or 'failed') result."""
    try:
        mem = evaluator.memory(run)
        peak, cap = float(mem.peak_bytes), float(mem.cap_bytes)
    except Exception as exc:  # the oracle must not crash a search
        return TrialResult(status="failed", key=key, training=_training(run),
                           reason=f"memory projection failed: {_error_text(exc)}")
    return _memory_verdict(run, key, peak, cap)


def memory_results(evaluator: Evaluator, runs: list[RunConfig], keys: list[str]) -> list[TrialResult | None]:
    """:func:`memory_result` of each run, through the evaluator's batch ``memory_peaks`` where it has one (one
    failing run sends the batch through the one-by-one path, which words each failure)."""
    many = getattr(evaluator, "memory_peaks", None)
    if many is not None and runs:
        try:
            peaks, caps = many(runs)
        except Exception:  # noqa: BLE001 - each run again alone, with its own error
            pass
        else:
            return [_memory_verdict(r, k, float(p), float(c)) for r, k, p, c in zip(runs, keys, peaks, caps)]
    return [memory_result(evaluator, r, k) for r, k in zip(runs, keys)]


def _memory_verdict(run: RunConfig, key: str, peak: float, cap: float) -> TrialResult | None:
    if not (math.isfinite(peak) and peak <= cap):
        return TrialResult(status="rejected", key=key, training=_training(run), peak_bytes=peak,
                           cap_bytes=cap,
                           reason=f"memory pre-filter: peak {peak / GIB:.1f} GiB > cap {cap / GIB:.1f} GiB")
    return None


def score_result(evaluator: Evaluator, run: RunConfig, key: str) -> TrialResult:
    """Score ``run``: 'ok' with throughput, 'rejected' if the full projection says it does not fit,
    'failed' when the oracle raises or returns no finite positive throughput."""
    try:
        proj = evaluator.score(run)
    except Exception as exc:
        proj = exc
    return _scored(proj, run, key)


def score_results(evaluator: Evaluator, runs: list[RunConfig], keys: list[str]) -> list[TrialResult]:
    """:func:`score_result` of each run, through the evaluator's batch ``score_many`` where it has one."""
    many = getattr(evaluator, "score_many", None)
    if many is None:
        return [score_result(evaluator, r, k) for r, k in zip(runs, keys)]
    try:
        projections = many(runs)
    except Exception as exc:  # noqa: BLE001 - a batch that fails as a whole fails each of its runs
        projections = [exc] * len(runs)
    return [_scored(p, r, k) for p, r, k in zip(projections, runs, keys)]


def _scored(proj: Any, run: RunConfig, key: str) -> TrialResult:
    """The trial result of a projection, or of the exception the oracle raised instead."""
    try:
        if isinstance(proj, BaseException):
            raise proj
        tps = proj.tokens_per_s_per_gpu
        mem = proj.memory
        peak, cap = float(mem.peak_bytes), float(mem.cap_bytes)
    except Exception as exc:
        return TrialResult(status="failed", key=key, training=_training(run),
                           reason=f"projection failed: {_error_text(exc)}")
    extra = {"iteration_time_s": getattr(proj, "iteration_time_s", None), "mfu": getattr(proj, "mfu", None),
             "breakdown": breakdown_of(proj)}
    if peak > cap:
        return TrialResult(status="rejected", key=key, training=_training(run), peak_bytes=peak,
                           cap_bytes=cap, reason=f"projection: peak {peak / GIB:.1f} GiB > cap {cap / GIB:.1f} GiB",
                           **extra)
    if tps is None or not math.isfinite(float(tps)) or float(tps) <= 0:
        return TrialResult(status="failed", key=key, training=_training(run), peak_bytes=peak, cap_bytes=cap,
                           reason=f"projection returned no usable throughput ({tps!r})", **extra)
    return TrialResult(status="ok", key=key, training=_training(run), tokens_per_s_per_gpu=float(tps),
                       peak_bytes=peak, cap_bytes=cap, **extra)


BREAKDOWN_TERMS: tuple[str, ...] = ("compute_s", "recompute_s", "bubble_s", "optimizer_s", "host_sync_s", "other_s")
"""The scalar terms of an oracle time breakdown (``oracle.results.TimeBreakdown``) a trial result carries."""


def breakdown_of(proj: Any) -> dict[str, float] | None:
    """A projection's time breakdown as a flat mapping (None without one): seconds per term of
    :data:`BREAKDOWN_TERMS`, and ``KIND_total_s`` / ``KIND_exposed_s`` per communication kind."""
    b = getattr(proj, "breakdown", None)
    if b is None:
        return None
    try:
        out = {k: float(getattr(b, k, 0.0) or 0.0) for k in BREAKDOWN_TERMS}
        for c in getattr(b, "comm", ()):
            out[f"{c.kind}_total_s"] = out.get(f"{c.kind}_total_s", 0.0) + float(c.total_s)
            out[f"{c.kind}_exposed_s"] = out.get(f"{c.kind}_exposed_s", 0.0) + float(c.exposed_s)
    except (TypeError, ValueError):
        return None
    return out if all(math.isfinite(v) for v in out.values()) else None


def _training(run: RunConfig) -> dict[str, Any]:
    """``run.to_dict()["training"]``, without the card's and profile's names it also resolves."""
    return schema_to_dict(run.training)


# ---------------------------------------------------------------------------------------------- trial metrics
def read_breakdown(data: Any) -> dict[str, float] | None:
    """A breakdown read back from trial metrics or a ledger row (JSON text or a mapping); None when absent or
    unreadable (it informs the search; a trial never fails on it)."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError:
            return None
    if not isinstance(data, Mapping):
        return None
    try:
        return {str(k): float(v) for k, v in data.items()}
    except (TypeError, ValueError):
        return None


def trial_metrics(result: TrialResult) -> dict[str, Any]:
    """The plain metrics dict a Ray Tune trial reports for ``result`` (see :func:`result_from_metrics`).

    ``tokens_per_s_per_gpu`` is always a number (0.0 when not scored) so Tune can rank every trial.
    """
    return {"tokens_per_s_per_gpu": result.value if result.value is not None else 0.0,
            "status": result.status, "fits": result.fits, "config_key": result.key,
            "peak_gib": None if result.peak_bytes is None else result.peak_bytes / GIB,
            "cap_gib": None if result.cap_bytes is None else result.cap_bytes / GIB,
            "iteration_time_s": result.iteration_time_s, "mfu": result.mfu, "reason": result.reason,
            "breakdown": dict(result.breakdown) if result.breakdown else None}


def _breakdown_metric(metrics: Any) -> Any:
    """The ``breakdown`` entry of trial metrics, nested as reported or flattened as Ray Tune hands results to its
    searchers (``breakdown/compute_s``, ...: Tune's ``flatten_dict``)."""
    nested = metrics.get("breakdown")
    if nested is not None:
        return nested
    flat = {k.split("/", 1)[1]: v for k, v in metrics.items() if isinstance(k, str) and k.startswith("breakdown/")}
    return flat or None


def result_from_metrics(metrics: Any, *, key: str = "", training: Any = None) -> TrialResult:
    """Inverse of :func:`trial_metrics` (extra keys Tune adds are ignored; a malformed dict is 'failed')."""
    try:
        status = metrics.get("status", "ok")
        if status not in ("ok", "rejected", "illegal", "failed"):
            raise ValueError(f"unknown status {status!r}")
        tps = metrics.get("tokens_per_s_per_gpu")
        peak, cap = metrics.get("peak_gib"), metrics.get("cap_gib")
        return TrialResult(status=status, key=metrics.get("config_key") or key, training=training,
                           tokens_per_s_per_gpu=float(tps) if status == "ok" and tps is not None else None,
                           peak_bytes=None if peak is None else float(peak) * GIB,
                           cap_bytes=None if cap is None else float(cap) * GIB,
                           iteration_time_s=metrics.get("iteration_time_s"), mfu=metrics.get("mfu"),
                           reason=str(metrics.get("reason") or ""), breakdown=read_breakdown(_breakdown_metric(metrics)))
    except Exception as exc:  # a bad objective value is recorded, never a crash
        return TrialResult(status="failed", key=key, training=training,
                           reason=f"unreadable trial metrics: {_error_text(exc)}")

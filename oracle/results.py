"""Plain result objects every report, ledger and searcher reads (SI units inside).

``Projection.to_dict`` is the JSON the CLI prints: GiB = 2^30 bytes at that boundary only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from oracle.units import GIB

if TYPE_CHECKING:  # annotations only: oracle.config imports this module
    from oracle.config import RunConfig

Source = Literal["analytical", "measured", "scaled"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryNode:
    """One node of the per-module memory tree (per GPU, one pipeline stage)."""

    name: str
    params: float = 0.0
    """Parameters held by this GPU (count, after TP/EP/PP/FSDP sharding of the weights)."""
    activation_bytes: float = 0.0
    """Saved activations for ONE micro-batch in flight."""
    children: tuple["MemoryNode", ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "params": self.params,
                             "activation_gib": self.activation_bytes / GIB}
        if self.children:
            d["children"] = [c.to_dict() for c in self.children]
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class StageMemory:
    """Memory of one pipeline rank."""

    rank: int
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    """Peak saved activations: per-micro-batch activations x in-flight micro-batches."""
    other_bytes: float
    """Transient buffers: communication buffers, FSDP gathered layers, logits scratch, recompute buffer."""
    in_flight_microbatches: float
    """Micro-batches whose activations are alive at the peak, in units of the rank's full
    per-micro-batch activation (all its chunks; schedule-dependent)."""
    tree: MemoryNode | None = None
    other_breakdown: tuple[tuple[str, float], ...] = ()
    """(name, bytes) parts of ``other_bytes``, e.g. ('recompute_buffer', 1.2e9)."""

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes + self.other_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Per-GPU memory projection; the worst pipeline stage decides ``fits``."""

    stages: tuple[StageMemory, ...]
    cap_bytes: float
    runtime_reserved_bytes: float
    hbm_bytes: float

    @property
    def worst(self) -> StageMemory:
        return max(self.stages, key=lambda s: s.total_bytes)

    @property
    def peak_bytes(self) -> float:
        return self.worst.total_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.cap_bytes

    def to_dict(self) -> dict[str, Any]:
        w = self.worst
        return {
            "peak_gib": self.peak_bytes / GIB, "cap_gib": self.cap_bytes / GIB, "fits": self.fits,
            "params_gib": w.params_bytes / GIB, "grads_gib": w.grads_bytes / GIB,
            "optimizer_gib": w.optimizer_bytes / GIB, "activations_gib": w.activations_bytes / GIB,
            "other_gib": w.other_bytes / GIB,
            "other_parts_gib": {k: v / GIB for k, v in w.other_breakdown},
            "worst_stage": w.rank,
            "in_flight_microbatches": w.in_flight_microbatches,
            "hbm_gib": self.hbm_bytes / GIB, "runtime_reserved_gib": self.runtime_reserved_bytes / GIB,
            "stages": [{"rank": s.rank, "total_gib": s.total_bytes / GIB,
                        "activations_gib": s.activations_bytes / GIB,
                        "in_flight_microbatches": s.in_flight_microbatches} for s in self.stages],
            "tree": w.tree.to_dict() if w.tree else None,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class CommTerm:
    """One communication kind: its total time per iteration and the part left exposed."""

    kind: str
    """'tp', 'cp', 'ep_a2a', 'pp_p2p', 'dp_grad', 'dp_param_gather', 'fsdp_ag', 'fsdp_rs', 'expert_grad'."""
    total_s: float
    exposed_s: float
    algorithm: str = ""
    """Algorithm/domain chosen by the collective model, e.g. 'ring/scale_up'."""
    source: Source = "analytical"


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeBreakdown:
    """Where one iteration's time goes (seconds, critical path of the slowest rank)."""

    compute_s: float
    """Forward + backward compute on the critical path (excluding recompute)."""
    recompute_s: float
    bubble_s: float
    """Pipeline idle time of the critical rank (makespan minus its busy time)."""
    optimizer_s: float
    host_sync_s: float = 0.0
    """GPU idle waiting on the host: after the MoE dispatcher's device-to-host syncs (one per MoE-layer
    forward, replayed by full recompute; none with ``moe_sync_free`` or drop-and-pad) and wherever the host issues a
    pass's ops slower than the GPU runs them (host-bound small kernels, docs/kernel-model.md)."""
    comm: tuple[CommTerm, ...] = ()
    other_s: float = 0.0
    sources: dict[str, Source] = field(default_factory=dict)
    """Which terms are analytical, measured or scaled."""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"compute_s": self.compute_s, "recompute_s": self.recompute_s,
                             "bubble_s": self.bubble_s, "optimizer_s": self.optimizer_s,
                             "host_sync_s": self.host_sync_s, "other_s": self.other_s}
        for c in self.comm:
            d[f"{c.kind}_total_s"] = c.total_s
            d[f"{c.kind}_exposed_s"] = c.exposed_s
        d["comm"] = [{"kind": c.kind, "total_s": c.total_s, "exposed_s": c.exposed_s,
                      "algorithm": c.algorithm, "source": c.source} for c in self.comm]
        d["sources"] = dict(self.sources)
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class Projection:
    """The answer for one configuration."""

    run: RunConfig
    """The configuration projected."""
    mode: str
    memory: MemoryBreakdown
    iteration_time_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    breakdown: TimeBreakdown | None = None
    warnings: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)
    """Extra facts for reports (schedule, microbatches, flop formula, per-stage times)."""

    @property
    def fits(self) -> bool:
        return self.memory.fits

    @property
    def config(self) -> dict[str, Any]:
        """The RunConfig as a plain dict (round-trips through RunConfig.from_dict), made when read: a search
        reads the metrics of thousands of projections and the dict of none."""
        return self.run.to_dict()

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu, "iteration_time_s": self.iteration_time_s,
            "memory": self.memory.to_dict(),
            "breakdown_s": self.breakdown.to_dict() if self.breakdown else {},
            "mode": self.mode, "config": self.config, "warnings": list(self.warnings),
            "details": self.details,
        }

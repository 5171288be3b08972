"""A synthetic oracle for searcher tests and benchmarks (deterministic, ~10 us per call).

Not a model of anything real: a smooth, cross-axis landscape with a memory wall, so a searcher can
be tested for behaviour (finds the optimum, respects the cap, learns from rejections) without the
real oracle. Every point of a space is scored by brute force in tests to know the optimum.

Throughput (tokens/s/GPU) is a product of factors: micro-batch efficiency, TP/CP communication,
pipeline bubble per schedule, recompute overhead, FP8 speed-up, expert all-to-all (DeepEP helps,
crossing nodes hurts), FSDP overhead. Memory per GPU is weights + grads + optimizer state (sharded
by the distributed optimizer / FSDP) + activations (micro-batch, schedule's in-flight count,
recompute), held against ``cap = 0.9 * HBM``.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from oracle.config import RunConfig
from oracle.pipeline.schedules import get_schedule
from oracle.units import GIB


@dataclass(frozen=True, slots=True)
class SyntheticMemory:
    peak_bytes: float
    cap_bytes: float

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.cap_bytes


@dataclass(frozen=True, slots=True)
class SyntheticProjection:
    tokens_per_s_per_gpu: float
    memory: SyntheticMemory
    iteration_time_s: float
    mfu: float

    @property
    def fits(self) -> bool:
        return self.memory.fits


def _in_flight(t, micro: int) -> float:
    """Peak in-flight micro-batches: the registered schedule's own formula (rank 0)."""
    return get_schedule(t.schedule).in_flight_microbatches(t.pp, t.vpp, micro, 0)


def _bubble_factor(t, micro: int) -> float:
    """Bubble relative to 1F1B's (pp-1)/(vpp*m), read off the schedule spec: a B/W split fills
    two thirds of it (ZB-H1's (pp-1)/3m, Qi et al. 2023); holding fewer micro-batches in flight than
    1F1B gives some of that back."""
    spec = get_schedule(t.schedule)
    if not spec.splits_bw:
        return 1.0
    one_f_one_b = min(t.pp, micro)
    return min(1.0, (1 / 3) * max(1.0, one_f_one_b / max(_in_flight(t, micro), 1e-9)) ** 2)


class SyntheticEvaluator:
    """Synthetic :class:`~searchers.evaluator.Evaluator` (see module doc).

    ``cap_scale`` scales the memory cap (smaller = more configs rejected), ``cap_bytes`` sets it
    outright; ``fail`` is a predicate
    on the RunConfig that makes :meth:`score` raise (to test failed trials).
    """

    mode = "synthetic"

    def __init__(self, *, cap_scale: float = 1.0, cap_bytes: float | None = None,
                 fail: Callable[[RunConfig], bool] | None = None) -> None:
        self.cap_scale, self.cap_bytes = cap_scale, cap_bytes
        self.fail = fail
        self.memory_calls = 0
        self.score_calls = 0

    def _memory(self, run: RunConfig) -> SyntheticMemory:
        t, m = run.training, run.model
        n = run.cluster.num_gpus
        dp = n // (t.tp * t.pp * t.cp)
        h, layers = m.hidden_size, m.num_layers
        dense = 12 * h * h * layers + 2 * h * m.vocab_size
        experts = 3 * h * m.expert_ffn * max(1, m.num_experts) * layers if m.is_moe else 0
        per_gpu = dense / (t.tp * t.pp) + experts / (t.pp * t.ep * t.etp)
        shard = dp if (t.use_distributed_optimizer or t.fsdp) else 1
        weights = per_gpu * (2 + 2) / (dp if t.fsdp else 1)
        optimizer = per_gpu * 12 / shard
        rec = {"none": 1.0, "selective": 0.55, "full": 0.12}[t.recompute]
        act_bytes = 1 if t.fp8_activations else 2
        act = (t.seq_len / t.cp) * t.mbs * h * 18 * act_bytes * (layers / t.pp) / t.tp * rec
        inflight = _in_flight(t, max(1, t.gbs // (t.mbs * dp)))
        if m.is_moe:
            act *= 1 + 0.5 * m.moe_topk
        peak = weights + optimizer + act * inflight + 1.5 * GIB
        cap = self.cap_bytes or 0.9 * run.cluster.hardware.hbm_capacity_bytes * self.cap_scale
        return SyntheticMemory(peak_bytes=peak, cap_bytes=cap)

    def memory(self, run: RunConfig) -> SyntheticMemory:
        self.memory_calls += 1
        return self._memory(run)

    def score(self, run: RunConfig) -> SyntheticProjection:
        self.score_calls += 1
        if self.fail is not None and self.fail(run):
            raise RuntimeError(f"synthetic failure for {run.key()}")
        t, m = run.training, run.model
        n, per_node = run.cluster.num_gpus, run.cluster.hardware.gpus_per_node
        dp = n // (t.tp * t.pp * t.cp)
        micro = max(1, t.gbs // (t.mbs * dp))
        tokens = t.mbs * t.seq_len / t.cp
        f = tokens / (tokens + 3000.0)                                   # GEMM size efficiency
        f *= 1.0 - 0.07 * math.log2(t.tp) - (0.25 if t.tp > per_node else 0.0)
        f *= 1.0 - 0.05 * math.log2(t.cp)
        bubble = (t.pp - 1) / (micro * t.vpp) * _bubble_factor(t, micro)
        f /= 1.0 + bubble + 0.01 * (t.vpp - 1) * t.pp
        f *= {"none": 1.0, "selective": 0.93, "full": 0.74}[t.recompute]
        f *= 1.35 if t.precision == "fp8" else 1.0
        if m.is_moe and t.ep > 1:
            span = t.ep * t.etp * t.tp > per_node
            f *= (0.80 if span else 0.95) * (1.12 if t.moe_a2a_backend == "deepep" else 1.0)
        f *= 0.93 if t.fsdp else (1.0 if t.use_distributed_optimizer else 0.995)
        f *= 0.97 if (m.is_moe and t.ep == 1) else 1.0
        peak_tokens = 20_000.0 * (4096.0 / max(m.hidden_size, 256)) ** 0.5
        tps = peak_tokens * f
        mem = self._memory(run)
        it = t.gbs * t.seq_len / (tps * n)
        return SyntheticProjection(tokens_per_s_per_gpu=tps, memory=mem, iteration_time_s=it, mfu=min(1.0, f))


def brute_force_optimum(space, evaluator) -> tuple[float, dict] | None:
    """Best (tokens/s/GPU, point) over every legal, fitting point of ``space`` (tests only)."""
    best = None
    for p in space.iter_points():
        run = space.run_of(p)
        if not evaluator.memory(run).fits:
            continue
        pr = evaluator.score(run)
        if not pr.memory.fits:
            continue
        if best is None or pr.tokens_per_s_per_gpu > best[0]:
            best = (pr.tokens_per_s_per_gpu, p)
    return best

"""zbv_greedy: V-shape zero-bubble schedule capped at 1F1B's activation memory (vpp=2, 'v' layout).

The Zero-Bubble paper's ZB-V greedy (Qi et al. 2023) fills W's greedily under a memory limit. Here:
the best (shortest simulated makespan, real costs) of our memory-capped greedy list schedules (see
:mod:`oracle.pipeline.schedules._vshape`) and the formatted ZB-V order, all within 1F1B's peak
activation memory. Our construction, not the published one: results carry ``approximate=True``.
"""
from __future__ import annotations

from oracle.pipeline.schedules import Order, register
from oracle.pipeline.schedules import zbv
from oracle.pipeline.schedules._vshape import best_v_order
from oracle.pipeline.types import StageCosts

MEM_FRACTION = 1.0
"""Activation-memory cap as a fraction of 1F1B's peak (pp micro-batches of a full stage)."""


@register("zbv_greedy", layout="v", splits_bw=True, vpp_rule="two", cost_aware=True, approximate=True,
          position=50, in_flight=lambda pp, vpp, m, r: min(pp, m),  # capped at 1F1B memory, as ZB-V
          summary="best of memory-capped greedy V list schedules and formatted ZB-V, cap = 1F1B memory")
def build(pp: int, vpp: int, num_microbatches: int, costs: StageCosts | None = None) -> Order:
    return best_v_order(pp, num_microbatches, costs, MEM_FRACTION, extra=[zbv.build(pp, 2, num_microbatches)])

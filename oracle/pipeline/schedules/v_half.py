"""v_half: V-shape schedule with at most half of 1F1B's activation memory (vpp=2, 'v' layout).

V-Half of "Pipeline Parallelism with Controllable Memory" (Qi et al. 2024) is a building-block
schedule with ~1/2 of 1F1B's activation memory. Here: the best (shortest simulated makespan, real
costs) of our memory-capped greedy list schedules and the V-Min building block (see
:mod:`oracle.pipeline.schedules._vshape`), under a hard cap of 0.5 x 1F1B's peak per rank. Our
construction, not the published one: results carry ``approximate=True``.

Known gap: in the cases we tried (uniform costs, pp <= 16) the V-Min block, whenever it fits under
the cap, beat every greedy policy, so v_half usually equals v_min; the published V-Half (fewer bubbles
for more memory) is not reproduced.
"""
from __future__ import annotations

from oracle.pipeline.schedules import Order, register
from oracle.pipeline.schedules._vshape import best_v_order, block_order
from oracle.pipeline.types import StageCosts

MEM_FRACTION = 0.5
"""Activation-memory cap as a fraction of 1F1B's peak (pp micro-batches of a full stage)."""


@register("v_half", layout="v", splits_bw=True, vpp_rule="two", cost_aware=True, approximate=True, position=60,
          in_flight=lambda pp, vpp, m, r: min(pp / 2 + 1, m),  # ~1/2 of 1F1B (Qi et al. 2024)
          summary="best memory-capped V schedule (greedy or building block), cap = 1/2 of 1F1B memory")
def build(pp: int, vpp: int, num_microbatches: int, costs: StageCosts | None = None) -> Order:
    return best_v_order(pp, num_microbatches, costs, MEM_FRACTION, extra=[block_order(pp, num_microbatches)])

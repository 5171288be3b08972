"""v_min: V-shape schedule with the shortest activation lifespans, ~1/3 of 1F1B's memory (vpp=2, 'v').

V-Min of "Pipeline Parallelism with Controllable Memory" (Qi et al. 2024): repeat one micro-batch's
minimal-lifespan building block every 6 unit slots. Ours is built by :func:`block_order` (see
:mod:`oracle.pipeline.schedules._vshape`): rank 0 keeps about ``4*pp/6 + O(1)`` chunk activations
against 1F1B's ``2*pp``, i.e. 1/3 of 1F1B plus a constant (uniform stages: 0.75 at pp=2, 0.67 at
pp=3, 0.5 at pp=4-6, 0.44 at pp=8, 0.375 at pp=16), and the steady state is bubble-free at unit costs. The order does
not depend on the costs. Our block, not the paper's exact offsets: results carry ``approximate=True``.
"""
from __future__ import annotations

from oracle.pipeline.schedules import Order, register
from oracle.pipeline.schedules._vshape import block_order


@register("v_min", layout="v", splits_bw=True, vpp_rule="two", approximate=True, position=70,
          in_flight=lambda pp, vpp, m, r: min(pp / 3 + 1, m),  # ~1/3 of 1F1B (Qi et al. 2024)
          summary="minimal-lifespan V building block repeated every 6 slots (~1/3 of 1F1B memory + const)")
def build(pp: int, vpp: int, num_microbatches: int) -> Order:
    return block_order(pp, num_microbatches)

"""ZB-V, the formatted V-shape zero-bubble schedule (Qi et al. 2023, section 6; vpp=2, 'v' layout).

Rank r hosts virtual stage r (chunk 0) and 2*pp - 1 - r (chunk 1); a micro-batch runs down the ranks
on chunk 0, turns on the last rank and comes back on chunk 1, so rank 0 holds both the embedding and
the loss. The order (as in the reference implementation and PyTorch's ScheduleZBVZeroBubble):

- warm-up: ``2*(pp - r) - 1`` chunk-0 F's; then ``r`` pairs (F chunk 1, F chunk 0); then ``pp - r``
  triples (F, B, W) of chunk 1;
- steady: repeat (F0, B0, W0, F1, B1, W1) until all forwards are issued;
- cool-down: ``r`` pairs (B0, B1); ``pp - r`` pairs (B0, W0); then the remaining W's.

The pattern is written for n = max(m, 2*pp - 1) micro-batches; with fewer, the ops of the missing
micro-batches are dropped (a sub-order of a deadlock-free order stays deadlock-free). Peak memory is
``2*pp`` chunk activations on every rank, i.e. 1F1B's rank-0 peak of ``pp`` full-stage activations.
With F = B = W per chunk, zero p2p and m >= 2*pp the steady state has no bubble.
"""
from __future__ import annotations

from oracle.pipeline.schedules import Order, register
from oracle.pipeline.types import Op


def rank_order(pp: int, rank: int, num_microbatches: int) -> list[Op]:
    n = max(num_microbatches, 2 * pp - 1)
    ops: list[Op] = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (pp - rank) - 1):
        ops.append(Op("F", f0, 0)); f0 += 1
    for _ in range(rank):
        ops.append(Op("F", f1, 1)); f1 += 1
        ops.append(Op("F", f0, 0)); f0 += 1
    for _ in range(pp - rank):
        ops += [Op("F", f1, 1), Op("B", b1, 1), Op("W", b1, 1)]
        f1 += 1; b1 += 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            ops.append(Op("F", f0, 0)); f0 += 1
        ops += [Op("B", b0, 0), Op("W", b0, 0), Op("F", f1, 1), Op("B", b1, 1), Op("W", b1, 1)]
        b0 += 1; f1 += 1; b1 += 1
    w0, w1 = b0, b1
    for _ in range(rank):
        ops += [Op("B", b0, 0), Op("B", b1, 1)]
        b0 += 1; b1 += 1
    for _ in range(pp - rank):
        ops += [Op("B", b0, 0), Op("W", w0, 0)]
        b0 += 1; w0 += 1
    ops += [Op("W", j, 1) for j in range(w1, b1)]
    ops += [Op("W", j, 0) for j in range(w0, b0)]
    assert f0 == f1 == b0 == b1 == n, (pp, rank, n, f0, f1, b0, b1)
    return [op for op in ops if op.mb < num_microbatches]


@register("zbv", layout="v", splits_bw=True, vpp_rule="two", position=40, searched_by_default=True,
          # 2pp chunks of 1/2 stage = 1F1B's peak, on every rank (Qi et al. 2023)
          in_flight=lambda pp, vpp, m, r: min(pp, m),
          summary="ZB-V formatted: V layout, fixed warm-up / steady (F B W)x2 / cool-down")
def build(pp: int, vpp: int, num_microbatches: int) -> Order:
    return [rank_order(pp, r, num_microbatches) for r in range(pp)]

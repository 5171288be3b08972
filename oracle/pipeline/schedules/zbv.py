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

import numpy as np

from oracle.pipeline.schedules import Built, Order, native_order, register
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


def _block(pattern: str, mbs: list[np.ndarray]) -> np.ndarray:
    """Repeat ``pattern`` (ops like ``F0 B1``: kind, chunk) once per row of ``mbs`` (one mb column per op)."""
    codes = {"F": 0, "B": 1, "W": 2}
    ops = pattern.split()
    count = len(mbs[0]) if mbs else 0
    out = np.empty((count, len(ops), 3), dtype=np.int64)
    for i, (op, mb) in enumerate(zip(ops, mbs)):
        out[:, i, 0] = codes[op[0]]
        out[:, i, 1] = mb
        out[:, i, 2] = int(op[1])
    return out.reshape(-1, 3)


def rank_array(pp: int, rank: int, num_microbatches: int) -> np.ndarray:
    """:func:`rank_order` in array form (rows of kind code, mb, chunk; see fast_compile), phase by phase."""
    n = max(num_microbatches, 2 * pp - 1)
    a = np.arange
    f0_start = 2 * pp - rank - 1  # chunk-0 forwards issued by the warm-up
    steady = n - pp  # steady iterations; the first n - f0_start also issue a chunk-0 forward
    with_f0 = a(n - f0_start)
    rest = a(n - f0_start, steady)
    blocks = [
        _block("F0", [a(2 * (pp - rank) - 1)]),
        _block("F1 F0", [a(rank), 2 * (pp - rank) - 1 + a(rank)]),
        _block("F1 B1 W1", [rank + a(pp - rank), a(pp - rank), a(pp - rank)]),
        _block("F0 B0 W0 F1 B1 W1", [f0_start + with_f0, with_f0, with_f0, pp + with_f0, pp - rank + with_f0,
                                     pp - rank + with_f0]),
        _block("B0 W0 F1 B1 W1", [rest, rest, pp + rest, pp - rank + rest, pp - rank + rest]),
        _block("B0 B1", [n - pp + a(rank), n - rank + a(rank)]),
        _block("B0 W0", [n - pp + rank + a(pp - rank), n - pp + a(pp - rank)]),
        _block("W1", [a(n - rank, n)]),
        _block("W0", [a(n - rank, n)]),
    ]
    out = np.concatenate(blocks)
    return out[out[:, 1] < num_microbatches]


def build_array(pp: int, vpp: int, num_microbatches: int) -> Built:
    # the same rows built in C where the extension runs (every rank's 6 m ops at once)
    return native_order("zbv_order", pp, num_microbatches, 6) or Built(
        [rank_array(pp, r, num_microbatches) for r in range(pp)], False, "")


@register("zbv", layout="v", splits_bw=True, vpp_rule="two", position=40, searched_by_default=True,
          build_array=build_array,
          # 2pp chunks of 1/2 stage = 1F1B's peak, on every rank (Qi et al. 2023)
          in_flight=lambda pp, vpp, m, r: min(pp, m),
          summary="ZB-V formatted: V layout, fixed warm-up / steady (F B W)x2 / cool-down")
def build(pp: int, vpp: int, num_microbatches: int) -> Order:
    return [rank_order(pp, r, num_microbatches) for r in range(pp)]

"""1F1B (PipeDream-Flush / Megatron non-interleaved): warm-up forwards, steady one-forward-one-backward, cool-down.

Rank r runs ``min(pp - r - 1, m)`` warm-up forwards, then alternates F and a fused backward BW, then
drains the remaining backwards. At most ``min(pp - r, m)`` micro-batches are alive on rank r. With
uniform stages and zero p2p the makespan is ``(m + pp - 1) * (f + b)``, i.e. a bubble of
``(pp - 1) / m`` of the ideal compute (Narayanan et al. 2021, eq. 1).
"""
from __future__ import annotations

import numpy as np

from oracle.pipeline.fast_compile import KIND_CODES, rows, warmup_steady_cooldown
from oracle.pipeline.schedules import Built, Order, register
from oracle.pipeline.types import Op


def fb_sequence(pp: int, rank: int, num_microbatches: int, backward: str = "BW") -> list[Op]:
    """One rank's 1F1B sequence of F and ``backward`` ops (vpp=1)."""
    m = num_microbatches
    warmup = min(pp - rank - 1, m)
    ops = [Op("F", i, 0) for i in range(warmup)]
    for i in range(m - warmup):
        ops.append(Op("F", warmup + i, 0))
        ops.append(Op(backward, i, 0))
    ops.extend(Op(backward, i, 0) for i in range(m - warmup, m))
    return ops


def fb_array(pp: int, rank: int, num_microbatches: int, backward: str = "BW") -> np.ndarray:
    """:func:`fb_sequence` in array form (rows of kind code, mb, chunk; see fast_compile)."""
    mbs = np.arange(num_microbatches)
    return warmup_steady_cooldown(rows(0, mbs), rows(KIND_CODES.index(backward), mbs),
                                  min(pp - rank - 1, num_microbatches))


def build_array(pp: int, vpp: int, num_microbatches: int) -> Built:
    return Built([fb_array(pp, r, num_microbatches) for r in range(pp)], False, "")


# Megatron's non-interleaved schedule calls send_forward_recv_backward & co., which wait on their
# requests before the next op (only the interleaved schedule has overlap_p2p_comm): blocking sends.
@register("1f1b", layout="interleaved", splits_bw=False, vpp_rule="one", blocking_p2p=True, position=0,
          in_flight=lambda pp, vpp, m, r: min(pp - r, m),  # 1F1B warm-up (Narayanan et al. 2021)
          searched_by_default=True, build_array=build_array,
          summary="warm-up pp-r-1 forwards, steady 1F1B, cool-down (fused backward; blocking sends)")
def build(pp: int, vpp: int, num_microbatches: int) -> Order:
    return [fb_sequence(pp, r, num_microbatches) for r in range(pp)]

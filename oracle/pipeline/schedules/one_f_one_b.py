"""1F1B (PipeDream-Flush / Megatron non-interleaved): warm-up forwards, steady one-forward-one-backward, cool-down.

Rank r runs ``min(pp - r - 1, m)`` warm-up forwards, then alternates F and a fused backward BW, then
drains the remaining backwards. At most ``min(pp - r, m)`` micro-batches are alive on rank r. With
uniform stages and zero p2p the makespan is ``(m + pp - 1) * (f + b)``, i.e. a bubble of
``(pp - 1) / m`` of the ideal compute (Narayanan et al. 2021, eq. 1).
"""
from __future__ import annotations

import numpy as np

from oracle.pipeline.fast_compile import KIND_CODES
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
    return fb_rows(pp, np.array([rank]), num_microbatches, backward)


def fb_rows(pp: int, ranks: np.ndarray, num_microbatches: int, backward: str = "BW") -> np.ndarray:
    """:func:`fb_array` of each rank of ``ranks``, one after another (2 m rows each), computed at once: rank r's
    op j is its j-th warm-up forward while j < w = min(pp - r - 1, m), then forwards and backwards alternate
    (F(w + k/2) at even k = j - w, B((k - 1)/2) at odd k) up to j = 2m - w, and the cool-down is B(j - m)."""
    m = num_microbatches
    w = np.repeat(np.minimum(pp - np.asarray(ranks, dtype=np.int64) - 1, m), 2 * m)
    j = np.tile(np.arange(2 * m, dtype=np.int64), len(ranks))
    k = j - w
    steady = (k >= 0) & (j < 2 * m - w)
    is_f = (k < 0) | (steady & (k % 2 == 0))
    out = np.empty((len(j), 3), dtype=np.int64)
    out[:, 0] = np.where(is_f, 0, KIND_CODES.index(backward))
    out[:, 1] = np.where(k < 0, j, np.where(steady, np.where(is_f, w + k // 2, k // 2), j - m))
    out[:, 2] = 0
    return out


def build_array(pp: int, vpp: int, num_microbatches: int) -> Built:
    return Built(np.split(fb_rows(pp, np.arange(pp), num_microbatches), pp), False, "")


# Megatron's non-interleaved schedule calls send_forward_recv_backward & co., which wait on their
# requests before the next op (only the interleaved schedule has overlap_p2p_comm): blocking sends.
@register("1f1b", layout="interleaved", splits_bw=False, vpp_rule="one", blocking_p2p=True, position=0,
          in_flight=lambda pp, vpp, m, r: min(pp - r, m),  # 1F1B warm-up (Narayanan et al. 2021)
          searched_by_default=True, build_array=build_array,
          summary="warm-up pp-r-1 forwards, steady 1F1B, cool-down (fused backward; blocking sends)")
def build(pp: int, vpp: int, num_microbatches: int) -> Order:
    return [fb_sequence(pp, r, num_microbatches) for r in range(pp)]

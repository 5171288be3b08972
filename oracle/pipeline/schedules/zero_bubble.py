"""ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 3.1), vpp=1.

The backward is split into B (input gradient, on the critical path) and W (weight gradient, no
successor). The F/B skeleton is 1F1B's: rank r runs ``min(pp - r - 1, m)`` warm-up forwards, so at
most ``pp - r`` micro-batches are between F and B, as in 1F1B. The W of micro-batch j runs right after
the B of micro-batch ``j + r`` (a lag of r), and the last r + 1 W's fill the cool-down, where 1F1B
idles. Rank 0 lags nothing; the last rank defers pp - 1 W's.

With F = B = W = T, zero p2p and m >= pp the makespan is ``3 m T + (pp - 1) T``, i.e. a bubble of
``(pp - 1)(T_F + T_B - T_W)`` = one third of 1F1B's ``(pp - 1)(T_F + T_B + T_W)``.

Memory: deferred W's keep ``1 - b_release_fraction`` of their activations, so ranks r > 0 hold up to
``r * (1 - b_release_fraction)`` extra micro-batch activations; rank 0, the 1F1B peak, holds none
extra, so the pipeline's peak equals 1F1B's when ``(pp - r) + r*(1 - frac) <= pp``, i.e. always.
"""
from __future__ import annotations

import numpy as np

from oracle.pipeline.schedules import Built, Order, native_order, register
from oracle.pipeline.schedules.one_f_one_b import fb_rows, fb_sequence
from oracle.pipeline.types import Op


def insert_w(fb_ops: list[Op], lag: int) -> list[Op]:
    """Insert W(j) right after B(j + lag) of the same chunk; leftover W's go at the end, in order."""
    out: list[Op] = []
    pending: list[Op] = []
    for op in fb_ops:
        out.append(op)
        if op.kind == "B":
            pending.append(Op("W", op.mb, op.chunk))
            if len(pending) > lag:
                out.append(pending.pop(0))
    out.extend(pending)
    return out


def zb_h1_rank(pp: int, rank: int, num_microbatches: int) -> list[Op]:
    return insert_w(fb_sequence(pp, rank, num_microbatches, backward="B"), lag=rank)


def zb_h1_array(pp: int, rank: int, num_microbatches: int) -> np.ndarray:
    """:func:`zb_h1_rank` in array form: W(j) sorts right after B(j + rank), the rest at the end."""
    return zb_h1_rows(pp, np.array([rank]), num_microbatches)


def zb_h1_rows(pp: int, ranks: np.ndarray, num_microbatches: int) -> np.ndarray:
    """:func:`zb_h1_array` of each rank of ``ranks``, one after another (3 m rows each), computed at once: the
    1F1B rows (:func:`fb_rows`, B for the backward) at even sort keys 2 * position, W(j) at key 2 * (position of
    B(j + rank)) + 1, or 4 m + j where there is no B(j + rank); one stable sort of every rank's keys, each
    rank's lifted above the previous rank's."""
    m = num_microbatches
    ranks = np.asarray(ranks, dtype=np.int64)
    n = len(ranks)
    fb = fb_rows(pp, ranks, m, backward="B")
    w = np.minimum(pp - ranks - 1, m)[:, np.newaxis]  # warm-up forwards per rank
    j = np.arange(m, dtype=np.int64)[np.newaxis, :]
    after = j + ranks[:, np.newaxis]  # W(j) follows B(j + rank): at 1F1B position w + 2i + 1 (steady) or i + m
    b_pos = np.where(after < m - w, w + 2 * after + 1, after + m)
    w_key = np.where(after >= m, 4 * m + j, 2 * b_pos + 1)
    lift = (8 * m * np.arange(n, dtype=np.int64))[:, np.newaxis]
    keys = np.concatenate([(2 * np.arange(2 * m, dtype=np.int64) + lift).reshape(-1), (w_key + lift).reshape(-1)])
    w_rows = np.empty((n * m, 3), dtype=np.int64)
    w_rows[:, 0] = 2
    w_rows[:, 1] = np.tile(j[0], n)
    w_rows[:, 2] = 0
    return np.concatenate([fb, w_rows])[np.argsort(keys, kind="stable")]


def build_array(pp: int, vpp: int, num_microbatches: int) -> Built:
    # the same rows built in C where the extension runs (the op-list builder's loop, every rank at once)
    return native_order("zb_h1_order", pp, num_microbatches, 3) or Built(
        np.split(zb_h1_rows(pp, np.arange(pp), num_microbatches), pp), False, "")


@register("zero_bubble", layout="interleaved", splits_bw=True, vpp_rule="one", position=20,
          in_flight=lambda pp, vpp, m, r: min(pp - r, m),  # ZB-H1 keeps 1F1B's peak (Qi et al. 2023)
          searched_by_default=True, build_array=build_array,
          summary="ZB-H1: 1F1B skeleton with B/W split, W(j) after B(j + rank)")
def build(pp: int, vpp: int, num_microbatches: int) -> Order:
    return [zb_h1_rank(pp, r, num_microbatches) for r in range(pp)]

"""Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021), vpp >= 2 chunks per rank.

Mirrors ``megatron.core.pipeline_parallel.schedules.forward_backward_pipelining_with_interleaving``:
- Virtual micro-batches are walked through the *schedule table*: micro-batches in groups of
  ``pp`` (``microbatch_group_size_per_vp_stage``), each group run chunk 0, then chunk 1, ...; the last
  group takes whatever is left, so num_microbatches need not be a multiple of pp.
- Rank r runs ``2*(pp - r - 1) + (vpp - 1)*pp`` warm-up forwards (all of them when
  num_microbatches == pp), then pairs forward k + warm-up with backward k, then drains backwards.
  Backward k visits the chunks in reverse (chunk ``vpp - 1 - c``).
- Megatron needs num_microbatches >= pp, and rejects a last group smaller than pp ("the remainder of M
  divided by N should be 0, or larger than or equal to the pipeline-parallel size"): with the default
  group size N = pp that means m % pp == 0. For other m we do what a Megatron user does and set
  ``--microbatch-group-size-per-virtual-pipeline-stage`` to the smallest N in [pp, m] with
  m % N == 0 or m % N >= pp (the warm-up grows to ``2*(pp - r - 1) + (vpp - 1)*N``); the result's note
  names N. (An exact-dependency replay shows why Megatron's rule exists: a last group smaller than
  pp deadlocks with that warm-up count.)

With uniform stages (per-chunk f, b), zero p2p and m a multiple of pp, the bubble is
``(pp - 1) / (vpp * m)`` of the ideal compute.
"""
from __future__ import annotations

import numpy as np

from oracle.errors import InvalidConfigError
from oracle.pipeline.fast_compile import rows, warmup_steady_cooldown
from oracle.pipeline.schedules import Built, Order, register
from oracle.pipeline.types import Op


def schedule_table(num_microbatches: int, vpp: int, group: int) -> list[tuple[int, int]]:
    """Megatron's ``get_schedule_table``: virtual micro-batch k -> (micro-batch, chunk)."""
    table = []
    for lo in range(0, num_microbatches, group):
        hi = num_microbatches if lo + group >= num_microbatches else lo + group
        table.extend((mb, c) for c in range(vpp) for mb in range(lo, hi))
    return table


def group_size(pp: int, num_microbatches: int) -> int:
    """Smallest Megatron-legal ``microbatch_group_size_per_vp_stage`` (pp when m % pp == 0)."""
    m = num_microbatches
    for n in range(pp, m + 1):
        if m % n == 0 or m % n >= pp:
            return n
    raise InvalidConfigError(f"interleaved needs num_microbatches >= pp, got num_microbatches={m}, pp={pp}")


def rank_order(pp: int, vpp: int, num_microbatches: int, rank: int, group: int) -> list[Op]:
    m = num_microbatches
    table = schedule_table(m, vpp, group)
    total = m * vpp
    warmup = _warmup(pp, vpp, m, rank, group)
    ops = [Op("F", *table[k]) for k in range(warmup)]
    for k in range(total - warmup):
        ops.append(Op("F", *table[warmup + k]))
        mb, c = table[k]
        ops.append(Op("BW", mb, vpp - 1 - c))
    for k in range(total - warmup, total):
        mb, c = table[k]
        ops.append(Op("BW", mb, vpp - 1 - c))
    return ops


def schedule_table_array(num_microbatches: int, vpp: int, group: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`schedule_table` as (micro-batch, chunk) arrays: full groups of ``group``, then the rest."""
    m = num_microbatches
    n_full = -(-m // group) - 1  # every group but the last is full
    chunk = np.arange(vpp)[None, :, None]
    full_mb = np.broadcast_to(np.arange(n_full)[:, None, None] * group + np.arange(group)[None, None, :],
                              (n_full, vpp, group))
    full_c = np.broadcast_to(chunk, (n_full, vpp, group))
    lo = n_full * group
    last_mb = np.broadcast_to(np.arange(lo, m)[None, :], (vpp, m - lo))
    last_c = np.broadcast_to(np.arange(vpp)[:, None], (vpp, m - lo))
    return (np.concatenate([full_mb.ravel(), last_mb.ravel()]), np.concatenate([full_c.ravel(), last_c.ravel()]))


def _warmup(pp: int, vpp: int, num_microbatches: int, rank: int, group: int) -> int:
    total = num_microbatches * vpp
    return total if num_microbatches == pp else min(2 * (pp - rank - 1) + (vpp - 1) * group, total)


def _note(pp: int, num_microbatches: int, group: int) -> str:
    return "" if group == pp else (f"num_microbatches={num_microbatches} is not a multiple of pp={pp}: "
                                   f"Megatron micro-batch group size {group} (warm-up (vpp-1)*{group})")


def build_detailed(pp: int, vpp: int, num_microbatches: int, costs: object = None) -> Built:
    group = group_size(pp, num_microbatches)
    order = [rank_order(pp, vpp, num_microbatches, r, group) for r in range(pp)]
    return Built(order, False, _note(pp, num_microbatches, group))


def build_array(pp: int, vpp: int, num_microbatches: int) -> Built:
    """:func:`build_detailed` in array form (see fast_compile)."""
    group = group_size(pp, num_microbatches)
    mb, c = schedule_table_array(num_microbatches, vpp, group)
    fwd, bwd = rows(0, mb, c), rows(3, mb, vpp - 1 - c)
    order = [warmup_steady_cooldown(fwd, bwd, _warmup(pp, vpp, num_microbatches, r, group)) for r in range(pp)]
    return Built(order, False, _note(pp, num_microbatches, group))


@register("interleaved", layout="interleaved", splits_bw=False, vpp_rule="at_least_two", position=10,
          # Megatron interleaved warm-up: (pp-r-1)*2 + (vpp-1)*pp forwards + 1 chunks, each 1/vpp stage
          in_flight=lambda pp, vpp, m, r: min((pp - r - 1) * 2 + (vpp - 1) * pp + 1, m * vpp) / vpp,
          searched_by_default=True,
          min_microbatches=lambda pp, vpp: pp, build_detailed=build_detailed, build_array=build_array,
          summary="Megatron interleaved 1F1B (schedule table, warm-up 2(pp-r-1)+(vpp-1)N, N = pp)")
def build(pp: int, vpp: int, num_microbatches: int) -> Order:
    return build_detailed(pp, vpp, num_microbatches).order

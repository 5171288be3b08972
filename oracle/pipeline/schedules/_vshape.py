"""Shared machinery of the V-shape family (vpp=2, 'v' layout): building blocks and a greedy scheduler.

These are OUR constructions in the spirit of Qi et al. 2024 ("Pipeline Parallelism with Controllable
Memory") and the ZB-V greedy of Qi et al. 2023, not their exact published schedules, so every
schedule built here is reported with ``approximate=True``.

Building block (``block_offsets``). At unit cost a rank does 6 passes per micro-batch (F, B, W of
two chunks), so a schedule that repeats one micro-batch's pattern every 6 slots is bubble-free in
the steady state if the 6 passes of every rank sit on distinct slots mod 6. We walk the V (F chunk 0
down the ranks, F chunk 1 back up, B chunk 1 down, B chunk 0 up) placing each pass at the earliest
slot whose residue is free on its rank, then each W at the first free residue after its B. Lifespans
are as short as the residues allow (about 4*pp slots for rank 0's chunk 0), so activation memory is about
``4*pp/6`` chunk activations, i.e. ~1/3 of 1F1B's ``2*pp`` (plus a constant): the V-Min idea.
``block_order`` repeats it m times and sorts each rank's passes by planned slot.

Greedy list scheduler (``greedy_order``). Plays the pipeline forward with the real costs (AMD's tool
derives the order with unit times and only replays real ones). A free rank picks among ready ops by
a policy, never letting a rank's activation bytes exceed its cap:
- ``idle``: oldest ready B first; else ready F (chunk 1 first, finishing a V); else a pending W.
- ``lazy``: as ``idle``, but a W only runs if no F/B becomes ready before it would end.
- ``block``: the ready op planned earliest by the repeated building block.
- ``forward``: chunk-1 F first (finish the V), then the oldest B, then chunk-0 F, then W.
``best_v_order`` simulates every policy (plus any extra candidate orders) and keeps the shortest
makespan that respects the cap. A chunk-0 F (admitting a micro-batch on that rank) needs room for itself AND a chunk-1 F, and
chunk-1 F's run in micro-batch order, so the oldest micro-batch can always advance: with a cap of at
least one micro-batch per rank (``act[r][0] + act[r][1]``) the scheduler never deadlocks.
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable

from oracle.pipeline.schedules import Order
from oracle.pipeline.types import Op, StageCosts

_EPS = 1e-9
BLOCK_INTERVAL = 6
"""Slots per micro-batch per rank in the building block (F, B, W of two chunks at unit cost)."""
POLICIES = ("idle", "lazy", "block", "forward")
"""Greedy decision rules tried by ``best_v_order`` (see the module docstring)."""


def unit_costs(pp: int) -> StageCosts:
    return StageCosts.uniform(pp=pp, vpp=2, f_s=1.0, b_s=1.0, w_s=1.0, act_bytes=1.0)


def memory_caps(costs: StageCosts, mem_fraction: float) -> list[float]:
    """Per-rank cap: ``mem_fraction`` x 1F1B's peak (pp micro-batches of the rank's two chunks),
    but at least one micro-batch."""
    caps = []
    for r in range(costs.pp):
        per_mb = costs.act_bytes[r][0] + costs.act_bytes[r][1]
        caps.append(max(mem_fraction * costs.pp * per_mb, per_mb))
    return caps


def block_offsets(pp: int) -> dict[tuple[int, str, int], int]:
    """Slot of every (rank, kind, chunk) for micro-batch 0 of the repeated building block."""
    used: list[set[int]] = [set() for _ in range(pp)]
    off: dict[tuple[int, str, int], int] = {}

    def place(d: int, kind: str, c: int, earliest: int) -> int:
        t = earliest
        while t % BLOCK_INTERVAL in used[d]:
            t += 1
        used[d].add(t % BLOCK_INTERVAL)
        off[(d, kind, c)] = t
        return t

    t = 0
    for d in range(pp):
        t = place(d, "F", 0, t) + 1
    for d in reversed(range(pp)):
        t = place(d, "F", 1, t) + 1
    for d in range(pp):
        t = place(d, "B", 1, t) + 1
    for d in reversed(range(pp)):
        t = place(d, "B", 0, t) + 1
    for d in range(pp):
        place(d, "W", 1, off[(d, "B", 1)] + 1)
        place(d, "W", 0, off[(d, "B", 0)] + 1)
    return off


def block_order(pp: int, num_microbatches: int) -> Order:
    """The building block repeated every BLOCK_INTERVAL slots, each rank's passes sorted by slot."""
    off = block_offsets(pp)
    order: Order = []
    for r in range(pp):
        events = sorted((slot + BLOCK_INTERVAL * j, kind, j, c)
                        for (d, kind, c), slot in off.items() if d == r for j in range(num_microbatches))
        order.append([Op(kind, j, c) for _, kind, j, c in events])
    return order


def greedy_order(pp: int, m: int, costs: StageCosts, caps: list[float], policy: str) -> Order:
    """One run of the memory-capped list scheduler (see the module docstring)."""
    n_stages = 2 * pp
    stage = [(r, 2 * pp - 1 - r) for r in range(pp)]
    lat = list(costs.boundary_p2p_s())
    lat[pp - 1] = 0.0  # the turn of the V stays on rank pp-1
    frac = costs.b_release_fraction
    plan = block_offsets(pp) if policy == "block" else {}
    f_end = [[-1.0] * m for _ in range(n_stages)]
    b_end = [[-1.0] * m for _ in range(n_stages)]
    next_f = [[0, 0] for _ in range(pp)]
    next_b = [[0, 0] for _ in range(pp)]
    w_queue: list[deque[tuple[int, int]]] = [deque() for _ in range(pp)]
    mem = [0.0] * pp
    order: Order = [[] for _ in range(pp)]
    remaining = [6 * m] * pp
    version = [0] * pp
    idle_since: list[float | None] = [None] * pp
    heap = [(0.0, r, r, 0) for r in range(pp)]
    seq = pp

    def f_ready(r: int, c: int) -> float | None:
        mb = next_f[r][c]
        if mb >= m:
            return None
        v = stage[r][c]
        if v == 0:
            return 0.0
        e = f_end[v - 1][mb]
        return None if e < 0 else e + lat[v - 1]

    def b_ready(r: int, c: int) -> float | None:
        mb = next_b[r][c]
        if mb >= m:
            return None
        v = stage[r][c]
        e = f_end[v][mb]
        if e < 0:
            return None
        if v < n_stages - 1:
            e2 = b_end[v + 1][mb]
            if e2 < 0:
                return None
            e = max(e, e2 + lat[v])
        return e

    def room(r: int, c: int) -> bool:
        act = costs.act_bytes[r]
        return mem[r] + (act[0] + act[1] if c == 0 else act[1]) <= caps[r] + _EPS

    def decide(r: int, t: float) -> tuple[tuple[str, int] | None, list[float]]:
        ready: list[tuple[tuple[float, float], str, int]] = []  # (priority, kind, chunk)
        future: list[float] = []
        for c in (1, 0):
            rt = b_ready(r, c)
            if rt is not None:
                if rt <= t + _EPS:
                    if plan:
                        prio = (0, plan[(r, "B", c)] + BLOCK_INTERVAL * next_b[r][c])
                    else:
                        prio = (1 if policy == "forward" else 0, next_b[r][c])
                    ready.append((prio, "B", c))
                else:
                    future.append(rt)
        for c in (1, 0):
            rt = f_ready(r, c)
            if rt is not None and room(r, c):
                if rt <= t + _EPS:
                    if plan:
                        prio = (0, plan[(r, "F", c)] + BLOCK_INTERVAL * next_f[r][c])
                    elif policy == "forward":
                        prio = (0 if c == 1 else 2, 0)
                    else:
                        prio = (1, 1 - c)
                    ready.append((prio, "F", c))
                else:
                    future.append(rt)
        if w_queue[r]:
            mb, c = w_queue[r][0]
            if plan:
                ready.append(((0, plan[(r, "W", c)] + BLOCK_INTERVAL * mb), "W", c))
            elif not ready:
                w_end = t + costs.w_s[r][c]
                if policy != "lazy" or not future or min(future) >= w_end - _EPS:
                    ready.append(((3, 0), "W", c))
        if not ready:
            return None, future
        _, kind, c = min(ready)
        return (kind, c), future

    while heap:
        t, _, r, ver = heapq.heappop(heap)
        if ver != version[r] or remaining[r] == 0:
            continue
        choice, future = decide(r, t)
        if choice is None:
            idle_since[r] = t
            if future:
                seq += 1
                heapq.heappush(heap, (min(future), seq, r, version[r]))
            elif w_queue[r]:  # lazy W with nothing else coming
                choice = ("W", w_queue[r][0][1])
            if choice is None:
                continue
        idle_since[r] = None
        kind, c = choice
        v = stage[r][c]
        act = costs.act_bytes[r]
        if kind == "B":
            mb = next_b[r][c]
            end = max(t, b_ready(r, c)) + costs.b_s[r][c]  # type: ignore[arg-type]
            b_end[v][mb] = end
            next_b[r][c] += 1
            mem[r] -= frac * act[c]
            w_queue[r].append((mb, c))
        elif kind == "F":
            mb = next_f[r][c]
            end = max(t, f_ready(r, c)) + costs.f_s[r][c]  # type: ignore[arg-type]
            f_end[v][mb] = end
            next_f[r][c] += 1
            mem[r] += act[c]
        else:
            mb, c = w_queue[r].popleft()
            end = t + costs.w_s[r][c]
            mem[r] -= (1.0 - frac) * act[c]
        order[r].append(Op(kind, mb, c))
        remaining[r] -= 1
        version[r] += 1
        seq += 1
        heapq.heappush(heap, (end, seq, r, version[r]))
        for q in range(pp):  # a new end time may make an idle rank's op ready: let it look again
            since = idle_since[q]
            if since is not None and remaining[q]:
                idle_since[q] = None
                version[q] += 1
                seq += 1
                heapq.heappush(heap, (max(since, t), seq, q, version[q]))
    assert not any(remaining), f"V greedy deadlocked with {remaining} ops left (cannot happen, see docstring)"
    return order


def best_v_order(pp: int, m: int, costs: StageCosts | None, mem_fraction: float,
                 extra: Iterable[Order] = ()) -> Order:
    """Shortest simulated makespan among the greedy policies and ``extra`` orders that respect the cap."""
    from oracle.pipeline.simulator import simulate  # local: the simulator does not depend on schedules

    c = costs if costs is not None else unit_costs(pp)
    caps = memory_caps(c, mem_fraction)
    best: tuple[float, Order] | None = None
    candidates = [greedy_order(pp, m, c, caps, policy) for policy in POLICIES] + list(extra)
    for order in candidates:
        res = simulate(order, pp, 2, "v", m, c)
        if any(peak > cap * (1 + 1e-9) for peak, cap in zip(res.peak_activation_bytes, caps)):
            continue
        if best is None or res.makespan_s < best[0] - _EPS:
            best = (res.makespan_s, order)
    assert best is not None, "every greedy policy respects the cap by construction"
    return best[1]

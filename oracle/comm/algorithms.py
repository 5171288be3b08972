"""Alpha-beta formulas of every collective algorithm, the protocol table, and inner-phase selection.

Each formula takes the group's ``Levels`` and returns (time_s without launch, payload bytes the
busiest GPU sends). "up" time runs on the scale-up links and "nic" time on the GPU's own NIC
(scale_out and inter_pod traffic share it); pipelined patterns overlap the two (max), hops add.
Derivations and sources: docs/comm.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from oracle.comm.topology import SCALE_UP, Levels, Topology


@dataclass(frozen=True, slots=True)
class Protocol:
    """How a wire protocol trades latency for bandwidth, relative to NCCL/RCCL Simple."""

    latency_multiplier: float
    """Per-hop latency as a fraction of the Simple hop latency (the profile's ``latency_us``)."""
    bandwidth_efficiency: float
    """Fraction of the achievable (Simple) bandwidth left for payload."""
    source: str
    """Where the two numbers come from."""


PROTOCOLS: dict[str, Protocol] = {
    # NCCL LL: every 8-byte store carries 4 B data + 4 B flag (NCCL docs, "LL" protocol) -> 1/2 bandwidth;
    # latency ~0.2 x Simple: NCCL src/graph/tuning.cc hwLat ring LL/Simple = 0.6/3.4 us NVLink, 2.7/14 us NET.
    "ll": Protocol(0.2, 0.5, "NCCL LL: 4 B data + 4 B flag per 8 B store; tuning.cc hwLat ring LL/Simple ~0.18-0.19"),
    # NCCL LL128: 120 B data + 8 B flag per 128-byte line -> 120/128; latency 1.9/3.4 us (NVLink) and
    # 4.0/14 us (NET) of Simple in tuning.cc hwLat -> ~0.5 (the two tiers averaged, rounded).
    "ll128": Protocol(0.5, 120 / 128, "NCCL LL128: 120 B data per 128 B line; tuning.cc hwLat ring LL128/Simple ~0.3-0.56"),
    # Simple is the reference: the profile's latency_us and *_bus efficiencies describe it.
    "simple": Protocol(1.0, 1.0, "reference protocol: profile latency_us and bus efficiencies are Simple's"),
}

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "halving_doubling", "recursive_doubling", "one_shot", "hierarchical"),
    "all_gather": ("ring", "hierarchical"),
    "reduce_scatter": ("ring", "hierarchical"),
    "all_to_all": ("direct", "hierarchical", "pxn"),
    "p2p": ("direct",),
}


def _nic_time(topo: Topology, tier: str, nbytes: float) -> float:
    return nbytes / topo.bandwidth_bytes_per_s(tier)


def _ring(topo: Topology, lv: Levels, S: float, passes: int, p: Protocol) -> tuple[float, float]:
    """Ring over all levels: ``passes`` (2 all-reduce, 1 AG/RS) x (n-1) steps of S/n chunks.

    Channels rotate which member of a domain carries the crossing edge, so each GPU puts
    edges_t/n of its ring traffic on tier t; tiers pipeline (max), hops add.
    """
    n = math.prod(m for m, _ in lv)
    payload = passes * (n - 1) / n * S
    outer = [math.prod(m for m, _ in lv[i:]) for i in range(1, len(lv))] + [0]
    up = nic = hops = 0.0
    for i, (m, tier) in enumerate(lv):
        edges = (n if i == 0 else outer[i - 1]) - outer[i]
        nbytes = payload * edges / n
        hops += passes * (n - 1) / n * edges * topo.latency_s(tier)
        if tier == SCALE_UP:
            up += nbytes / topo.bandwidth_bytes_per_s(SCALE_UP, peers=m - 1)
        else:
            nic += _nic_time(topo, tier, nbytes)
    return hops * p.latency_multiplier + max(up, nic) / p.bandwidth_efficiency, payload


def _halving_doubling(topo: Topology, lv: Levels, S: float, passes: int, p: Protocol) -> tuple[float, float]:
    """Recursive halving (reduce-scatter) [+ doubling (all-gather)], innermost tier first so the big
    chunks ride the fast links; non-power-of-two levels fold/unfold the excess ranks (Thakur et al. 2005)."""
    c, t, wire = S, 0.0, 0.0
    for m, tier in lv:
        f = int(math.log2(m))
        p2 = 1 << f
        a = topo.latency_s(tier) * p.latency_multiplier
        bw = topo.bandwidth_bytes_per_s(tier, peers=1) * p.bandwidth_efficiency
        if p2 != m:
            t += passes * (a + c / bw)
            wire += c
        t += passes * (f * a + c * (1 - 1 / p2) / bw)
        wire += passes * c * (1 - 1 / p2)
        c /= p2
    return t, wire


def _recursive_doubling(topo: Topology, lv: Levels, S: float, p: Protocol) -> tuple[float, float]:
    """Recursive doubling all-reduce (Bruck-style): log2 n steps, each exchanging the whole buffer."""
    t = wire = 0.0
    for m, tier in lv:
        f = int(math.log2(m))
        a = topo.latency_s(tier) * p.latency_multiplier
        bw = topo.bandwidth_bytes_per_s(tier, peers=1) * p.bandwidth_efficiency
        steps = f + (2 if (1 << f) != m else 0)
        t += steps * (a + S / bw)
        wire += steps * S
    return t, wire


def _one_shot(topo: Topology, lv: Levels, S: float, p: Protocol) -> tuple[float, float]:
    """Single-shot all-reduce inside one scale-up domain: every rank reads the n-1 other buffers at
    once (load/store, flag carried with the data) and reduces locally: one hop, (n-1) S on its links."""
    n = lv[0][0]
    bw = topo.bandwidth_bytes_per_s(SCALE_UP, peers=n - 1) * p.bandwidth_efficiency
    return topo.scale_up_latency_s * p.latency_multiplier + (n - 1) * S / bw, (n - 1) * S


def _hierarchical_reduce(topo: Topology, lv: Levels, S: float, kind: str, p: Protocol) -> tuple[float, float]:
    """Intra-level0 reduce-scatter, the collective on S/k over the k parallel rails of the outer
    levels (recursively the best algorithm), intra-level0 all-gather; phases run one after another."""
    k, tier = lv[0]
    t1, w1 = _ring(topo, ((k, tier),), S, 1, p)
    tm, wm = _best(topo, kind, lv[1:], S / k, p)
    phases = 2 if kind == "all_reduce" else 1
    return phases * t1 + tm, phases * w1 + wm


def _a2a_up_bytes_per_s(topo: Topology, peers: int) -> float:
    """Scale-up bandwidth of the collective library's all-to-all over ``peers`` peers: the collectives' bandwidth
    times the share its pairwise send/recv reaches (``Topology.alltoall_share``)."""
    return topo.bandwidth_bytes_per_s(SCALE_UP, peers=peers) * topo.alltoall_share


def _direct_parts(topo: Topology, lv: Levels, S: float) -> tuple[float, float, float, float]:
    """(up time, up hops, nic time, nic hops) of a pairwise all-to-all: S/n to each peer; a rendezvous
    (one hop latency) per peer, serialised as NCCL's round-based p2p schedule does."""
    n = math.prod(m for m, _ in lv)
    up = up_h = nic = nic_h = 0.0
    inner = 1
    for m, tier in lv:
        peers = inner * (m - 1)
        inner *= m
        if tier == SCALE_UP:
            up += peers * S / n / _a2a_up_bytes_per_s(topo, m - 1)
            up_h += peers * topo.latency_s(tier)
        else:
            nic += _nic_time(topo, tier, peers * S / n)
            nic_h += peers * topo.latency_s(tier)
    return up, up_h, nic, nic_h


def _a2a_direct(topo: Topology, lv: Levels, S: float, p: Protocol) -> tuple[float, float]:
    """Every rank sends S/n to each peer, (n-1)/n*S in all: (k-1)/n*S to its k-1 domain peers over the
    scale-up links and (n-k)/n*S to the peers outside its domain over its own NIC; the two run in
    parallel (max). Pairwise exchange (Thakur, Rabenseifner & Gropp 2005, Sec. 3.4), as NCCL's
    alltoall = grouped ncclSend/ncclRecv to every peer (NCCL docs, "Point-to-point communication")."""
    n = math.prod(m for m, _ in lv)
    up, up_h, nic, nic_h = _direct_parts(topo, lv, S)
    lm, be = p.latency_multiplier, p.bandwidth_efficiency
    return max(up_h * lm + up / be, nic_h * lm + nic / be), (n - 1) / n * S


def _a2a_hierarchical(topo: Topology, lv: Levels, S: float, p: Protocol) -> tuple[float, float]:
    """Rail-aligned 2-D all-to-all, chunked so the stages pipeline: (1) all-to-all inside the level-0
    block, moving each block to the member on the destination's rail (it then lands on its final GPU,
    so no scatter stage is needed); (2) all-to-all along the rail over the outer levels, one
    aggregated message of k*S/n per remote block instead of k messages. NIC bytes equal direct's
    (n-k)/n*S; scale-up bytes grow to (k-1)/k*S. Source: NCCL 2.12 PXN (NVIDIA technical blog "Doubling
    all2all Performance with NVIDIA Collective Communication Library 2.12", 2022: data moves over NVLink
    to the GPU on the destination's rail, then one message per rail peer over the network)."""
    k, tier = lv[0]
    rest = lv[1:]
    r = math.prod(m for m, _ in rest)
    s1 = (k - 1) / k * S
    up = nic = 0.0
    if tier == SCALE_UP:
        up = s1 / _a2a_up_bytes_per_s(topo, k - 1)
    else:
        nic = _nic_time(topo, tier, s1)
    up2, up_h2, nic2, nic_h2 = _direct_parts(topo, rest, S)
    hops = (k - 1) * topo.latency_s(tier) + up_h2 + nic_h2
    return (hops * p.latency_multiplier + max(up + up2, nic + nic2) / p.bandwidth_efficiency,
            s1 + (r - 1) / r * S)


def _dedup(blocks: int, topk: int) -> float:
    """Bytes kept when a token routed to ``topk`` experts (uniform over ``blocks`` ranks or nodes) is
    sent once per destination block instead of once per expert: E[distinct blocks] / topk."""
    if blocks <= 1 or topk <= 1:
        return 1.0
    return blocks * (1 - (1 - 1 / blocks) ** topk) / topk


def _a2a_pxn(topo: Topology, lv: Levels, S: float, p: Protocol, topk: int) -> tuple[float, float]:
    """DeepEP normal kernels (PXN-style): one RDMA write per destination node on the GPU's own rail,
    then NVLink fan-out to the destination ranks (a token crosses the network once per node and
    NVLink once per rank); GPU-initiated, so the per-peer posts overlap and only a notify round and
    a data round of hop latency remain (no per-peer rendezvous chain)."""
    if lv[0][1] == SCALE_UP:
        k, rest = lv[0][0], lv[1:]
    else:
        k, rest = 1, lv
    r = math.prod(m for m, _ in rest)
    up_bytes = (k - 1) / k * S * _dedup(k * r, topk)
    d = _dedup(r, topk)
    up = up_bytes / topo.bandwidth_bytes_per_s(SCALE_UP, peers=k - 1) if k > 1 else 0.0
    nic, inner = 0.0, 1
    for m, tier in rest:
        nic += _nic_time(topo, tier, inner * (m - 1) * S / r * d)
        inner *= m
    hop = (topo.scale_up_latency_s if k > 1 else 0.0) + (topo.latency_s(rest[-1][1]) if rest else 0.0)
    return (2 * hop * p.latency_multiplier + max(up, nic) / p.bandwidth_efficiency,
            up_bytes + (r - 1) / r * S * d)


# ------------------------------------------------------------------------------------------ selection
def applicable(kind: str, lv: Levels, backend: str) -> tuple[str, ...]:
    """Algorithms of ``kind`` that exist for this layout and backend, in tie-break order."""
    multi = len(lv) > 1
    if kind == "all_to_all":
        if backend in ("deepep", "hybridep"):  # the flex dispatcher's backends (docs/comm.md "Flex dispatcher")
            return ("pxn",)
        return ("direct", "hierarchical") if multi else ("direct",)
    out = []
    for a in ALGORITHMS[kind]:
        if a == "hierarchical" and not multi:
            continue
        if a == "one_shot" and (multi or lv[0][1] != SCALE_UP):
            continue
        out.append(a)
    return tuple(out)


def protocols(kind: str, backend: str) -> tuple[str, ...]:
    """Protocols a call may use. DeepEP normal (training) kernels have one wire format (Simple here);
    its LL kernels are the low-latency decoding path."""
    return ("simple",) if backend in ("deepep", "hybridep") else tuple(PROTOCOLS)


def run(topo: Topology, kind: str, algo: str, lv: Levels, S: float, p: Protocol,
        topk: int = 1) -> tuple[float, float]:
    """(time_s without launch, busiest GPU's payload bytes) of ``algo`` under protocol ``p``."""
    if kind == "all_to_all":
        if algo == "direct":
            return _a2a_direct(topo, lv, S, p)
        return _a2a_hierarchical(topo, lv, S, p) if algo == "hierarchical" else _a2a_pxn(topo, lv, S, p, topk)
    passes = 2 if kind == "all_reduce" else 1
    if algo == "ring":
        return _ring(topo, lv, S, passes, p)
    if algo == "halving_doubling":
        return _halving_doubling(topo, lv, S, passes, p)
    if algo == "recursive_doubling":
        return _recursive_doubling(topo, lv, S, p)
    if algo == "one_shot":
        return _one_shot(topo, lv, S, p)
    return _hierarchical_reduce(topo, lv, S, kind, p)


@lru_cache(maxsize=65536)
def _best(topo: Topology, kind: str, lv: Levels, S: float, p: Protocol) -> tuple[float, float]:
    """Fastest algorithm for a reduction collective under one protocol (the inner phase of hierarchical)."""
    return min((run(topo, kind, a, lv, S, p) for a in applicable(kind, lv, "alltoall")), key=lambda tw: tw[0])

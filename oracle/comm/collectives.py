"""Public API: collective costs (min over algorithm x protocol), p2p, and the projector's CommModel."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from oracle.comm.algorithms import ALGORITHMS, PROTOCOLS, applicable, protocols, run
from oracle.comm.topology import TIERS, Levels, Topology
from oracle.errors import InvalidConfigError, UnknownComponentError
from oracle.hardware import HardwareProfile
from oracle.layout import GroupSpec

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
BACKENDS = ("alltoall", "deepep", "hybridep")
"""All-to-all implementations: NCCL/RCCL, and the two flex-dispatcher backends (GPU-initiated, deduplicated)."""
FLEX_BACKENDS = ("deepep", "hybridep")


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveCost:
    """Time and shape of one collective call on one group."""

    time_s: float
    """Wall time of the call, launch overhead included."""
    algorithm: str
    """Chosen algorithm (see ``ALGORITHMS``), or 'none' for a trivial call."""
    protocol: str
    """Chosen protocol (a key of ``PROTOCOLS``), or 'none'."""
    domain: str
    """Outermost tier the traffic crosses: 'scale_up', 'scale_out', 'inter_pod', or 'none'."""
    bytes_on_wire_per_gpu: float
    """Payload bytes the busiest GPU sends over its links, all tiers summed (protocol flags excluded)."""


ZERO = CollectiveCost(time_s=0.0, algorithm="none", protocol="none", domain="none", bytes_on_wire_per_gpu=0.0)
"""Cost of a trivial call (one rank, or nothing to send)."""


def _check_choice(kind: str, lv: Levels, backend: str, algorithm: str | None, protocol: str | None) -> None:
    if kind == "all_to_all" and backend not in BACKENDS:
        raise UnknownComponentError("all_to_all backend", backend, BACKENDS)
    if protocol is not None and protocol not in PROTOCOLS:
        raise UnknownComponentError("protocol", protocol, PROTOCOLS)
    if algorithm is not None:
        if algorithm not in ALGORITHMS[kind]:
            raise UnknownComponentError(f"{kind} algorithm", algorithm, ALGORITHMS[kind])
        ok = applicable(kind, lv, backend)
        if algorithm not in ok:
            span = " x ".join(f"{m} {t}" for m, t in lv)
            raise InvalidConfigError(
                f"{kind} algorithm {algorithm!r} does not apply to a group laid out as {span}"
                f"{f' with backend {backend!r}' if kind == 'all_to_all' else ''}; applicable: {', '.join(ok)}")
    if protocol is not None and protocol not in protocols(kind, backend):
        raise InvalidConfigError(f"protocol {protocol!r} is not available with backend {backend!r}; "
                                 f"available: {', '.join(protocols(kind, backend))}")


@lru_cache(maxsize=65536)
def _candidates(topo: Topology, kind: str, lv: Levels, S: float, backend: str, topk: int,
                algorithm: str | None, protocol: str | None) -> tuple[CollectiveCost, ...]:
    launch = topo.kernel_launch_s if backend in FLEX_BACKENDS else topo.collective_launch_s
    domain = lv[-1][1]
    out = []
    for a in ((algorithm,) if algorithm else applicable(kind, lv, backend)):
        for pn in ((protocol,) if protocol else protocols(kind, backend)):
            t, w = run(topo, kind, a, lv, S, PROTOCOLS[pn], topk)
            out.append(CollectiveCost(time_s=launch + t, algorithm=a, protocol=pn, domain=domain,
                                      bytes_on_wire_per_gpu=w))
    return tuple(out)


def candidates(topo: Topology, kind: str, group: GroupSpec, nbytes: float, *, algorithm: str | None = None,
               protocol: str | None = None, backend: str = "alltoall", topk: int = 1) -> tuple[CollectiveCost, ...]:
    """Every applicable (algorithm, protocol) cost of a collective (or the forced ones), unsorted."""
    if kind not in KINDS or kind == "p2p":
        raise UnknownComponentError("collective", kind, [k for k in KINDS if k != "p2p"])
    if nbytes < 0:
        raise InvalidConfigError(f"{kind} message size nbytes={nbytes} must be >= 0")
    if topk < 1:
        raise InvalidConfigError(f"topk={topk} must be >= 1")
    lv = topo.place(group).levels
    if not lv or nbytes == 0:
        return (ZERO,)
    _check_choice(kind, lv, backend, algorithm, protocol)
    return _candidates(topo, kind, lv, float(nbytes), backend, topk if backend in FLEX_BACKENDS else 1,
                       algorithm, protocol)


def _pick(cands: tuple[CollectiveCost, ...]) -> CollectiveCost:
    return min(cands, key=lambda c: c.time_s)  # first of equals wins: candidate order is the tie-break


# ------------------------------------------------------------------------------------------ public API
def all_reduce(topo: Topology, group: GroupSpec, nbytes: float, *, algorithm: str | None = None,
               protocol: str | None = None) -> CollectiveCost:
    """All-reduce of an ``nbytes`` buffer on every rank; the fastest candidate unless one is forced."""
    return _pick(candidates(topo, "all_reduce", group, nbytes, algorithm=algorithm, protocol=protocol))


def all_gather(topo: Topology, group: GroupSpec, nbytes: float, *, algorithm: str | None = None,
               protocol: str | None = None) -> CollectiveCost:
    """All-gather producing an ``nbytes`` OUTPUT buffer per rank (each contributes nbytes/n)."""
    return _pick(candidates(topo, "all_gather", group, nbytes, algorithm=algorithm, protocol=protocol))


def reduce_scatter(topo: Topology, group: GroupSpec, nbytes: float, *, algorithm: str | None = None,
                   protocol: str | None = None) -> CollectiveCost:
    """Reduce-scatter of an ``nbytes`` INPUT buffer per rank (each keeps nbytes/n)."""
    return _pick(candidates(topo, "reduce_scatter", group, nbytes, algorithm=algorithm, protocol=protocol))


def all_to_all(topo: Topology, group: GroupSpec, nbytes: float, *, backend: str = "alltoall",
               algorithm: str | None = None, protocol: str | None = None, topk: int = 1) -> CollectiveCost:
    """All-to-all where each rank sends ``nbytes`` in total, nbytes/n per destination including itself.

    ``backend='alltoall'``: NCCL/RCCL (direct or hierarchical); ``'deepep'``: DeepEP normal kernels
    (PXN-style, fused kernel launch); ``'hybridep'``: HybridEP, the same two-level exchange with the whole
    scale-up (NVLink) domain as its inner level. ``topk``: copies per token inside ``nbytes`` (MoE top-k,
    experts uniform over ranks); the flex backends send a token once per destination domain over RDMA and
    once per destination rank over NVLink, so they shrink the bytes (NCCL sends every copy).
    """
    return _pick(candidates(topo, "all_to_all", group, nbytes, algorithm=algorithm, protocol=protocol,
                            backend=backend, topk=topk))


@lru_cache(maxsize=16384)
def _p2p(topo: Topology, tier: str, S: float, protocol: str | None) -> CollectiveCost:
    best = None
    for pn in ((protocol,) if protocol else tuple(PROTOCOLS)):
        p = PROTOCOLS[pn]
        bw = topo.bandwidth_bytes_per_s(tier, peers=1) * p.bandwidth_efficiency
        t = topo.collective_launch_s + topo.latency_s(tier) * p.latency_multiplier + S / bw
        if best is None or t < best.time_s:
            best = CollectiveCost(time_s=t, algorithm="direct", protocol=pn, domain=tier, bytes_on_wire_per_gpu=S)
    assert best is not None
    return best


def p2p(topo: Topology, nbytes: float, *, tier: str, protocol: str | None = None) -> CollectiveCost:
    """Send ``nbytes`` to one peer across ``tier``: launch + alpha + S/B. Inside a scale-up domain B is
    one peer's share: the full per-GPU bandwidth on a switch, one xGMI link on a mesh."""
    if tier not in TIERS:
        raise UnknownComponentError("tier", tier, TIERS)
    if protocol is not None and protocol not in PROTOCOLS:
        raise UnknownComponentError("protocol", protocol, PROTOCOLS)
    if nbytes < 0:
        raise InvalidConfigError(f"p2p message size nbytes={nbytes} must be >= 0")
    if nbytes == 0:
        return ZERO
    return _p2p(topo, tier, float(nbytes), protocol)


class CommModel:
    """What the projector calls: ``cost(kind, group, nbytes)``, ``p2p_members(group, a, b, nbytes)``
    (pipeline stage edges) and ``p2p_between(rank_a, rank_b, nbytes)``."""

    __slots__ = ("topology", "_memo")
    _MEMO_MAX = 1 << 17

    def __init__(self, topology: Topology):
        self.topology = topology
        self._memo: dict[tuple, CollectiveCost] = {}  # avoids re-hashing the topology per call

    @classmethod
    def from_profile(cls, hw: HardwareProfile, num_gpus: int, **kw) -> "CommModel":
        return cls(Topology.from_profile(hw, num_gpus, **kw))

    def cost(self, kind: str, group: GroupSpec, nbytes: float, **kw) -> CollectiveCost:
        """Cost of collective ``kind`` over ``group`` with ``nbytes`` per rank (see module docstring).

        ``kind='p2p'`` prices one send between neighbouring members (e.g. pipeline stages), on the
        outermost tier the group spans. Keyword arguments go to the collective (algorithm, protocol,
        backend, topk). Groups of one rank cost 0 with algorithm 'none'.
        """
        key = (kind, group.size, group.stride, nbytes, *sorted(kw.items()))
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        out = self._cost(kind, group, nbytes, **kw)
        if len(self._memo) >= self._MEMO_MAX:
            self._memo.clear()
        self._memo[key] = out
        return out

    def _cost(self, kind: str, group: GroupSpec, nbytes: float, **kw) -> CollectiveCost:
        if group.size <= 1:
            if kind not in KINDS:
                raise UnknownComponentError("collective", kind, KINDS)
            return ZERO
        if kind == "p2p":
            return p2p(self.topology, nbytes, tier=self.topology.place(group).domain, **kw)
        fn = _PUBLIC.get(kind)
        if fn is None:
            raise UnknownComponentError("collective", kind, KINDS)
        return fn(self.topology, group, nbytes, **kw)

    def p2p_members(self, group: GroupSpec, a: int, b: int, nbytes: float, **kw) -> CollectiveCost:
        """Send ``nbytes`` from member ``a`` to member ``b`` of ``group`` (e.g. pipeline stage a to b of
        the ``pp`` group), on the worst tier that edge crosses in any group of that kind."""
        tier = self.topology.member_tier(group, a, b)
        if a == b:
            return ZERO
        return p2p(self.topology, nbytes, tier=tier, **kw)

    def p2p_between(self, rank_a: int, rank_b: int, nbytes: float, **kw) -> CollectiveCost:
        """Send ``nbytes`` from global rank ``rank_a`` to ``rank_b`` (0 when they are the same rank)."""
        if rank_a == rank_b:
            self.topology.tier_between(rank_a, rank_b)  # validates the rank
            return ZERO
        return p2p(self.topology, nbytes, tier=self.topology.tier_between(rank_a, rank_b), **kw)


_PUBLIC = {"all_reduce": all_reduce, "all_gather": all_gather, "reduce_scatter": reduce_scatter,
           "all_to_all": all_to_all}


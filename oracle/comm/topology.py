"""Topology domains and where a process group sits on them (from its rank layout, not its size).

Ranks are packed domain by domain (Megatron order: tp fastest, then cp, dp, pp; experts etp, ep, edp,
pp), so a group of ``size`` ranks ``stride`` apart lands on aligned blocks of ``domain_ranks`` (one
scale-up domain) and ``pod_ranks`` (one pod). ``Placement.levels`` is the view the formulas use.

The scale-up domain, not the host, decides the tier: on GB200/GB300 NVL72 a 4-GPU compute tray is one
host but all 72 GPUs of the rack share one NVLink switch fabric, so ``domain_ranks`` is the job's ranks
per rack (``network.scale_up.ranks_per_domain``, else ``domain_size``) and ``gpus_per_node`` plays
no part in pricing. A pod holds ``pod_size / domain_size`` whole domains, so its rank span scales the
same way (8 racks x 64 job ranks = 512 on an NVL72 pod of 576 GPUs).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from oracle.errors import InvalidConfigError
from oracle.hardware import HardwareProfile
from oracle.layout import GroupSpec, min_members_per_block

SCALE_UP, SCALE_OUT, INTER_POD = "scale_up", "scale_out", "inter_pod"
TIERS = (SCALE_UP, SCALE_OUT, INTER_POD)

Levels = tuple[tuple[int, str], ...]
"""A group seen from the topology: (members, tier) per level, innermost first, every members > 1.

``((8, 'scale_up'), (4, 'scale_out'))`` = 8 members per scale-up domain, 4 domains, one pod."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """How a process group sits on the topology (worst group of its kind when layouts are irregular)."""

    size: int
    """Ranks in the group."""
    stride: int
    """Global-rank distance between consecutive members."""
    members_per_domain: int
    """Members per scale-up domain the formulas assume: the fewest that any group of this kind has in
    one domain (its ranks send the largest share over their own NICs), rounded down to a divisor of
    ``size``. Equal to ``size`` when every group stays inside one domain."""
    num_domains: int
    """``size // members_per_domain``: the domains of the pricing view (the worst group's real count
    can be smaller when it straddles a boundary unevenly: 8 + 24 members is priced as 4 x 8)."""
    members_per_pod: int
    """Members per pod in the pricing view (a multiple of ``members_per_domain``)."""
    num_pods: int
    """``size // members_per_pod``."""

    @property
    def crosses_pods(self) -> bool:
        return self.num_pods > 1

    @property
    def domain(self) -> str:
        """Outermost tier the group spans."""
        if self.size <= 1 or self.num_domains == 1:
            return SCALE_UP
        return INTER_POD if self.num_pods > 1 else SCALE_OUT

    @property
    def levels(self) -> Levels:
        """(members, tier) per level, innermost first; the product of the members is ``size``."""
        k = self.members_per_domain
        per_pod = self.members_per_pod // k
        lv = ((k, SCALE_UP), (per_pod, SCALE_OUT), (self.num_pods, INTER_POD))
        return tuple((m, t) for m, t in lv if m > 1)


def _largest_divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, max(1, min(n, cap)) + 1) if n % d == 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    """The network of one job, in SI units, with the achievable (bus-efficiency-scaled) bandwidths."""

    name: str
    """Hardware profile key."""
    num_gpus: int
    """GPUs in the job (ranks 0..num_gpus-1, packed domain by domain)."""
    domain_ranks: int
    """Consecutive ranks per scale-up domain."""
    pod_ranks: int
    """Consecutive ranks per pod (>= num_gpus when there is one pod)."""
    mesh: bool
    """Scale-up fabric is a fully connected point-to-point mesh (AMD xGMI), not a switch (NVSwitch)."""
    mesh_size: int
    """GPUs in one mesh (xGMI links per GPU + 1); used only when ``mesh``."""
    scale_up_bytes_per_s: float
    """Achievable per-GPU, per-direction scale-up bandwidth (all links together)."""
    scale_out_bytes_per_s: float
    """Achievable per-GPU NIC bandwidth inside a pod."""
    alltoall_share: float = 1.0
    """Share of the scale-up bandwidth the collective library's all-to-all reaches (``Efficiency.alltoall_share``)."""
    inter_pod_bytes_per_s: float
    """Achievable per-GPU bandwidth across pods."""
    scale_up_latency_s: float
    """Simple-protocol hop latency inside a scale-up domain."""
    scale_out_latency_s: float
    """Simple-protocol hop latency across domains inside a pod."""
    inter_pod_latency_s: float
    """Simple-protocol hop latency across pods."""
    collective_launch_s: float
    """Fixed software cost of one NCCL/RCCL call (launch, proxy setup)."""
    kernel_launch_s: float
    """Fixed cost of one fused kernel (DeepEP launches no NCCL collective)."""

    @classmethod
    def from_profile(cls, hw: HardwareProfile, num_gpus: int, *, ranks_per_domain: int | None = None) -> "Topology":
        """The job's topology. ``ranks_per_domain`` (job ranks per scale-up domain) overrides the
        profile's ``network.scale_up.ranks_per_domain`` (itself ``domain_size`` when absent), e.g. 72 for
        a job that fills whole NVL72 racks, 64 for one that takes 16 of a rack's 18 compute trays."""
        if num_gpus < 1:
            raise InvalidConfigError(f"num_gpus={num_gpus} must be >= 1")
        domain = ranks_per_domain or hw.ranks_per_scale_up_domain
        if not 1 <= domain <= hw.scale_up_domain_size:
            raise InvalidConfigError(f"ranks_per_domain={domain} must be in 1..{hw.scale_up_domain_size} "
                                     f"(the GPUs of one {hw.name} scale-up domain)")
        pod = hw.pod_size or num_gpus
        if hw.pod_size and hw.pod_size % hw.scale_up_domain_size == 0:
            pod = hw.pod_size // hw.scale_up_domain_size * domain  # a pod is whole domains
        pod = max(pod, domain)
        eff = hw.efficiency
        # the profile says whether scale-up is a switch (NVSwitch) or a full mesh (AMD xGMI)
        return cls(
            name=hw.name, num_gpus=num_gpus, domain_ranks=domain, pod_ranks=pod,
            mesh=hw.scale_up_topology == "mesh", mesh_size=hw.scale_up_domain_size,
            scale_up_bytes_per_s=hw.scale_up_bandwidth_bytes_per_s * eff.scale_up_bus,
            scale_out_bytes_per_s=hw.scale_out_bandwidth_bytes_per_s * eff.scale_out_bus,
            alltoall_share=eff.alltoall_share,
            inter_pod_bytes_per_s=hw.inter_pod_bandwidth_bytes_per_s * eff.scale_out_bus,
            scale_up_latency_s=hw.scale_up_latency_s, scale_out_latency_s=hw.scale_out_latency_s,
            inter_pod_latency_s=hw.inter_pod_latency_s,
            collective_launch_s=eff.collective_launch_s, kernel_launch_s=eff.kernel_launch_s)

    def place(self, group: GroupSpec) -> Placement:
        """Members per scale-up domain / pod and the number of each the group touches."""
        return _place(self, group.size, group.stride)

    def tier_between(self, rank_a: int, rank_b: int) -> str:
        """Tier a message from ``rank_a`` to ``rank_b`` crosses."""
        for r in (rank_a, rank_b):
            if not 0 <= r < self.num_gpus:
                raise InvalidConfigError(f"rank {r} is outside the job's {self.num_gpus} GPUs (0..{self.num_gpus - 1})")
        if rank_a // self.domain_ranks == rank_b // self.domain_ranks:
            return SCALE_UP
        return SCALE_OUT if rank_a // self.pod_ranks == rank_b // self.pod_ranks else INTER_POD

    def member_tier(self, group: GroupSpec, a: int, b: int) -> str:
        """Outermost tier a message between members ``a`` and ``b`` of a group crosses, worst over
        every group of that kind (e.g. pipeline stages a -> b: every pipeline replica runs the same
        schedule and the data-parallel step waits for the slowest one)."""
        for m in (a, b):
            if not 0 <= m < group.size:
                raise InvalidConfigError(f"member {m} is outside the {group.kind} group of {group.size} "
                                         f"(0..{group.size - 1})")
        if group.size > 1 and group.size * group.stride > self.num_gpus:
            raise InvalidConfigError(f"group size*stride = {group.size}*{group.stride} = "
                                     f"{group.size * group.stride} exceeds the job's {self.num_gpus} GPUs")
        return _member_tier(self, group.size, group.stride, min(a, b), max(a, b))

    def latency_s(self, tier: str) -> float:
        return {SCALE_UP: self.scale_up_latency_s, SCALE_OUT: self.scale_out_latency_s,
                INTER_POD: self.inter_pod_latency_s}[tier]

    def bandwidth_bytes_per_s(self, tier: str, peers: int = 1) -> float:
        """Per-GPU bandwidth of ``tier`` for a pattern driving ``peers`` distinct peers at once.

        NVSwitch: any subgroup gets the full per-GPU bandwidth. xGMI mesh: one link per peer, so a
        pattern over ``peers`` peers gets ``peers / (mesh_size - 1)`` of the per-GPU aggregate
        (a ring over g members uses g-1 link-disjoint channels; a pairwise step uses one link).
        """
        if tier == SCALE_UP:
            b = self.scale_up_bytes_per_s
            if self.mesh and self.mesh_size > 1:
                b *= min(max(peers, 1), self.mesh_size - 1) / (self.mesh_size - 1)
            return b
        return self.scale_out_bytes_per_s if tier == SCALE_OUT else self.inter_pod_bytes_per_s


@lru_cache(maxsize=4096)
def _place(topo: Topology, n: int, s: int) -> Placement:
    if n < 1 or s < 1:
        raise InvalidConfigError(f"group size={n} and stride={s} must be >= 1")
    if n > 1 and n * s > topo.num_gpus:
        raise InvalidConfigError(f"group size*stride = {n}*{s} = {n * s} exceeds the job's {topo.num_gpus} GPUs")
    # the worst group's fewest members per block, rounded down to a divisor so the levels multiply to n
    k = _largest_divisor_at_most(n, min_members_per_block(topo.num_gpus, n, s, topo.domain_ranks))
    kp = min_members_per_block(topo.num_gpus, n, s, topo.pod_ranks)
    per_pod = _largest_divisor_at_most(n // k, max(1, kp // k))
    return Placement(size=n, stride=s, members_per_domain=k, num_domains=n // k,
                     members_per_pod=k * per_pod, num_pods=n // (k * per_pod))


_ORDER = {SCALE_UP: 0, SCALE_OUT: 1, INTER_POD: 2}


@lru_cache(maxsize=16384)
def _member_tier(topo: Topology, n: int, s: int, a: int, b: int) -> str:
    if a == b or n <= 1:
        return SCALE_UP
    worst = SCALE_UP
    for base in range(0, topo.num_gpus - n * s + 1, n * s):  # every group {base + o + i*s}
        for o in range(s):
            t = topo.tier_between(base + o + a * s, base + o + b * s)
            if _ORDER[t] > _ORDER[worst]:
                worst = t
                if t == INTER_POD:
                    return t
    return worst

"""Topology domains and where a process group sits on them (from its rank layout, not its size).

Ranks are packed domain by domain (Megatron order: tp fastest, then cp, dp, pp; experts etp, ep, edp,
pp), so a group of ``size`` ranks ``stride`` apart lands on aligned blocks of ``domain_ranks`` (one
scale-up domain) and ``pod_ranks`` (one pod). ``Placement.levels`` is the view the formulas use.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from oracle.errors import InvalidConfigError
from oracle.hardware import HardwareProfile
from oracle.layout import GroupSpec

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
    """Members sharing one scale-up domain (the fewest, where that differs between domains)."""
    num_domains: int
    """Scale-up domains the group touches."""
    members_per_pod: int
    """Members sharing one pod (the fewest)."""
    num_pods: int
    """Pods the group touches."""

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
        """(members, tier) per level, innermost first; irregular layouts use the fewest members per block."""
        k = self.members_per_domain
        per_pod = -(-self.num_domains // self.num_pods)
        lv = ((k, SCALE_UP), (per_pod, SCALE_OUT), (self.num_pods, INTER_POD))
        return tuple((m, t) for m, t in lv if m > 1)


@lru_cache(maxsize=4096)
def _min_members_per_block(num_gpus: int, n: int, s: int, block: int) -> int:
    """Fewest members of any group {base + o + i*s} found in one aligned block of ``block`` ranks.

    Groups of one kind tile the job in windows of n*s ranks (Megatron order), offsets 0 <= o < s.
    """
    if n <= 1:
        return 1
    if s >= block:
        return 1  # members at least a block apart: one per block
    window = n * s
    if num_gpus <= block or (window <= block and block % window == 0):
        return n  # every group inside one block
    if block % s == 0 and window % block == 0:
        return block // s  # aligned: every block holds block/s members
    period = window * block // math.gcd(window, block)
    limit = max(window, min(num_gpus, period))
    best = n
    for base in range(0, limit - window + 1, window):
        for o in range(s):
            counts = Counter((base + o + i * s) // block for i in range(n))
            best = min(best, min(counts.values()))
    return best


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
        """The job's topology. ``ranks_per_domain`` overrides the scale-up domain size in rank space
        (e.g. 64 on NVL72 racks where a job uses 16 of the 18 compute trays)."""
        if num_gpus < 1:
            raise InvalidConfigError(f"num_gpus={num_gpus} must be >= 1")
        domain = ranks_per_domain or hw.scale_up_domain_size
        if domain < 1:
            raise InvalidConfigError(f"ranks_per_domain={domain} must be >= 1")
        pod = max(hw.pod_size or num_gpus, domain)
        eff = hw.efficiency
        # the profile says whether scale-up is a switch (NVSwitch) or a full mesh (AMD xGMI)
        return cls(
            name=hw.name, num_gpus=num_gpus, domain_ranks=domain, pod_ranks=pod,
            mesh=hw.scale_up_topology == "mesh", mesh_size=hw.scale_up_domain_size,
            scale_up_bytes_per_s=hw.scale_up_bandwidth_bytes_per_s * eff.scale_up_bus,
            scale_out_bytes_per_s=hw.scale_out_bandwidth_bytes_per_s * eff.scale_out_bus,
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
    k = _min_members_per_block(topo.num_gpus, n, s, topo.domain_ranks)
    kp = _min_members_per_block(topo.num_gpus, n, s, topo.pod_ranks)
    return Placement(size=n, stride=s, members_per_domain=k, num_domains=-(-n // k),
                     members_per_pod=kp, num_pods=-(-n // kp))


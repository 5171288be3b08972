"""Communication model: textbook formulas, layout-aware domains, algorithm choice and physical properties."""
import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.comm import (PROTOCOLS, ZERO, CommModel, Topology, all_gather, all_reduce, all_to_all, candidates, p2p,
                         reduce_scatter)
from oracle.errors import InvalidConfigError, UnknownComponentError
from oracle.hardware import load_hardware, profile_from_dict
from oracle.layout import GroupSpec

MiB, GiB = 2**20, 2**30
H100 = load_hardware("h100-sxm")
MI355X = load_hardware("mi355x")


def nvl72():
    """The GB200 NVL72 profile (built here if the YAML is not there)."""
    try:
        return load_hardware("gb200-nvl72")
    except UnknownComponentError:  # pragma: no cover - the YAML ships with the repo today
        eff = {f: {"value": v, "source": "test"} for f, v in dict(
            gemm_bf16=0.8, gemm_fp8=0.65, gemm_k_half=128, attention_fwd=0.55, attention_bwd=0.45, hbm=0.85,
            scale_up_bus=0.8, scale_out_bus=0.85, kernel_launch_s=4e-6, collective_launch_s=15e-6,
            moe_sync_stall_s=3e-3).items()}
        return profile_from_dict({
            "name": "gb200-nvl72", "vendor": "nvidia", "arch": "blackwell",
            "compute": {"peak_tflops": {"bf16": 2500}, "num_compute_units": 148},
            "memory": {"hbm_capacity_gib": 186, "hbm_bandwidth_gb_per_s": 8000, "runtime_reserved_gib": 2},
            "network": {"gpus_per_node": 4,
                        "scale_up": {"domain_size": 72, "bandwidth_gb_per_s": 900, "latency_us": 3.0},
                        "scale_out": {"bandwidth_gb_per_s": 50, "latency_us": 5.0}},
            "efficiency": eff}, "gb200-nvl72")


def up_bw(hw, peers=None):
    b = hw.scale_up_bandwidth_bytes_per_s * hw.efficiency.scale_up_bus
    if peers is not None and hw.scale_up_topology == "mesh":
        b *= peers / (hw.scale_up_domain_size - 1)
    return b


def nic_bw(hw):
    return hw.scale_out_bandwidth_bytes_per_s * hw.efficiency.scale_out_bus


def launch(hw):
    return hw.efficiency.collective_launch_s


# ------------------------------------------------------------------------------------ textbook formulas
@pytest.mark.parametrize("hw,n", [(H100, 8), (H100, 4), (MI355X, 8), (MI355X, 4), (MI355X, 2)])
def test_forced_ring_simple_all_reduce_is_the_textbook_formula(hw, n):
    topo = Topology.from_profile(hw, 64)
    S = 256 * MiB
    c = all_reduce(topo, GroupSpec("tp", n, 1), S, algorithm="ring", protocol="simple")
    B = up_bw(hw, n - 1)  # NVSwitch: full per-GPU bandwidth; xGMI mesh: (n-1)/7 of it
    expect = 2 * (n - 1) / n * S / B + 2 * (n - 1) * hw.scale_up_latency_s + launch(hw)
    assert (c.algorithm, c.protocol, c.domain) == ("ring", "simple", "scale_up")
    assert c.time_s == pytest.approx(expect, rel=1e-12)
    assert c.bytes_on_wire_per_gpu == pytest.approx(2 * (n - 1) / n * S)


def test_all_gather_and_reduce_scatter_ring_are_half_an_all_reduce_ring():
    topo = Topology.from_profile(H100, 8)
    g, S, n = GroupSpec("tp", 8, 1), 64 * MiB, 8
    expect = (n - 1) / n * S / up_bw(H100) + (n - 1) * H100.scale_up_latency_s + launch(H100)
    for fn in (all_gather, reduce_scatter):
        assert fn(topo, g, S, algorithm="ring", protocol="simple").time_s == pytest.approx(expect, rel=1e-12)


def test_ring_across_nodes_spreads_the_crossing_edges_over_the_members_nics():
    # 16 ranks, 8 per node: 2 of the 16 ring edges cross nodes; channels rotate the exit GPU, so each GPU
    # puts 2/16 of its ring bytes on its NIC and 14/16 on NVLink, pipelined; hops add per edge type.
    topo = Topology.from_profile(H100, 16)
    S, n = GiB, 16
    payload = 2 * (n - 1) / n * S
    bw = max(payload * 14 / 16 / up_bw(H100), payload * 2 / 16 / nic_bw(H100))
    hops = 2 * (n - 1) / n * (14 * H100.scale_up_latency_s + 2 * H100.scale_out_latency_s)
    c = all_reduce(topo, GroupSpec("dp", 16, 1), S, algorithm="ring", protocol="simple")
    assert c.domain == "scale_out"
    assert c.time_s == pytest.approx(launch(H100) + hops + bw, rel=1e-12)


def test_protocol_table_orders_latency_and_bandwidth():
    ll, ll128, simple = PROTOCOLS["ll"], PROTOCOLS["ll128"], PROTOCOLS["simple"]
    assert ll.latency_multiplier < ll128.latency_multiplier < simple.latency_multiplier == 1.0
    assert ll.bandwidth_efficiency < ll128.bandwidth_efficiency < simple.bandwidth_efficiency == 1.0
    assert all(p.source for p in PROTOCOLS.values())


# ------------------------------------------------------------------------------------ domains from layout
def test_dp_group_of_two_with_stride_eight_is_priced_on_the_nic():
    topo = Topology.from_profile(H100, 16)
    dp = GroupSpec("dp", 2, 8)
    pl = topo.place(dp)
    assert (pl.members_per_domain, pl.num_domains, pl.crosses_pods, pl.domain) == (1, 2, False, "scale_out")
    S = 512 * MiB
    c = all_reduce(topo, dp, S, algorithm="ring", protocol="simple")
    assert c.domain == "scale_out"
    assert c.time_s == pytest.approx(launch(H100) + 2 * H100.scale_out_latency_s + S / nic_bw(H100), rel=1e-12)


def test_tp_group_of_eight_with_stride_one_stays_on_nvlink():
    topo = Topology.from_profile(H100, 16)
    pl = topo.place(GroupSpec("tp", 8, 1))
    assert (pl.members_per_domain, pl.num_domains, pl.domain) == (8, 1, "scale_up")
    assert all_reduce(topo, GroupSpec("tp", 8, 1), GiB).domain == "scale_up"


def test_group_size_alone_does_not_decide_the_domain():
    topo = Topology.from_profile(H100, 64)
    assert topo.place(GroupSpec("cp", 4, 2)).domain == "scale_up"  # 4 members, 2 apart: one node
    assert topo.place(GroupSpec("dp", 4, 16)).domain == "scale_out"  # 4 members, 2 nodes apart
    pl = topo.place(GroupSpec("dp", 8, 4))  # 2 members per node over 4 nodes
    assert (pl.members_per_domain, pl.num_domains) == (2, 4)
    assert pl.levels == ((2, "scale_up"), (4, "scale_out"))


def test_nvl72_keeps_a_64_gpu_group_inside_the_scale_up_domain():
    hw = nvl72()
    topo = Topology.from_profile(hw, 64)
    g = GroupSpec("tp", 64, 1)
    assert topo.place(g).domain == "scale_up"
    assert all_reduce(topo, g, GiB).domain == "scale_up"
    # 128 GPUs using 64 per rack: each 64-GPU group is one rack, the DP pair spans two
    topo2 = Topology.from_profile(hw, 128, ranks_per_domain=64)
    assert topo2.place(g).domain == "scale_up"
    assert topo2.place(GroupSpec("dp", 2, 64)).domain == "scale_out"
    # the same 64-GPU group on 8-GPU H100 nodes spans 8 nodes and is slower
    h = Topology.from_profile(H100, 64)
    assert h.place(g).domain == "scale_out"
    assert all_reduce(h, g, GiB).time_s > all_reduce(topo, g, GiB).time_s


def test_irregular_layouts_take_the_worst_group():
    # tp=2, 6 GPUs per pipeline stage on 8-GPU nodes: the dp group {6, 8, 10} straddles two nodes
    topo = Topology.from_profile(H100, 24)
    pl = topo.place(GroupSpec("dp", 3, 2))
    assert pl.members_per_domain == 1 and pl.domain == "scale_out"


def test_pods_are_crossed_beyond_pod_size():
    topo = Topology.from_profile(H100, 2048)
    assert H100.pod_size == 1024
    pl = topo.place(GroupSpec("dp", 256, 8))
    assert pl.crosses_pods and pl.domain == "inter_pod" and pl.num_pods == 2
    assert all_reduce(topo, GroupSpec("dp", 256, 8), GiB).domain == "inter_pod"
    assert topo.tier_between(0, 1024) == "inter_pod"
    assert topo.tier_between(0, 8) == "scale_out"
    assert topo.tier_between(3, 5) == "scale_up"


def test_the_mesh_is_decided_by_the_profile_topology():
    assert Topology.from_profile(MI355X, 8).mesh
    assert not Topology.from_profile(H100, 8).mesh


# ------------------------------------------------------------------------------------ algorithm choice
GROUPS = [(H100, 8, GroupSpec("tp", 8, 1)), (H100, 64, GroupSpec("dp", 64, 1)), (H100, 64, GroupSpec("dp", 8, 8)),
          (MI355X, 8, GroupSpec("tp", 8, 1)), (MI355X, 64, GroupSpec("dp", 16, 4)),
          (MI355X, 64, GroupSpec("tp", 4, 1))]


@pytest.mark.parametrize("hw,num_gpus,g", GROUPS)
@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
@pytest.mark.parametrize("nbytes", [256, 64 * 1024, 4 * MiB, 256 * MiB, 4 * GiB])
def test_auto_choice_is_never_slower_than_any_candidate(hw, num_gpus, g, kind, nbytes):
    topo = Topology.from_profile(hw, num_gpus)
    backends = ["alltoall", "deepep"] if kind == "all_to_all" else [None]
    for b in backends:
        kw = {"backend": b} if b else {}
        cands = candidates(topo, kind, g, nbytes, **kw)
        chosen = CommModel(topo).cost(kind, g, nbytes, **kw)
        assert chosen.time_s == min(c.time_s for c in cands)
        for c in cands:  # forcing any candidate reproduces it
            forced = CommModel(topo).cost(kind, g, nbytes, algorithm=c.algorithm, protocol=c.protocol, **kw)
            assert forced.time_s == pytest.approx(c.time_s) and forced.time_s >= chosen.time_s


@pytest.mark.parametrize("hw,num_gpus,g", GROUPS[:5])
def test_large_messages_pick_bandwidth_optimal_and_tiny_ones_latency_optimal(hw, num_gpus, g):
    topo = Topology.from_profile(hw, num_gpus)
    big = all_reduce(topo, g, 4 * GiB)
    assert big.algorithm in ("ring", "halving_doubling", "hierarchical") and big.protocol == "simple"
    assert big.bytes_on_wire_per_gpu <= 2 * 4 * GiB  # bandwidth-optimal: ~2(n-1)/n S per GPU
    tiny = all_reduce(topo, g, 64)
    assert tiny.algorithm in ("one_shot", "recursive_doubling") and tiny.protocol == "ll"


def test_mesh_prefers_ring_over_pairwise_exchange_for_large_messages():
    # xGMI: a pairwise (halving-doubling) step drives one link of 7; a ring drives all 7 channels
    topo = Topology.from_profile(MI355X, 8)
    assert all_reduce(topo, GroupSpec("tp", 8, 1), GiB).algorithm == "ring"
    hd = all_reduce(topo, GroupSpec("tp", 8, 1), GiB, algorithm="halving_doubling", protocol="simple")
    ring = all_reduce(topo, GroupSpec("tp", 8, 1), GiB, algorithm="ring", protocol="simple")
    assert hd.time_s > 3 * ring.time_s


@pytest.mark.parametrize("hw", [H100, MI355X])
@pytest.mark.parametrize("nbytes", [1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB])
def test_all_to_all_across_nodes_chooses_hierarchical_or_pxn(hw, nbytes):
    topo = Topology.from_profile(hw, 16)
    ep = GroupSpec("ep", 16, 1)
    assert topo.place(ep).levels == ((8, "scale_up"), (2, "scale_out"))
    assert all_to_all(topo, ep, nbytes).algorithm == "hierarchical"
    assert all_to_all(topo, ep, nbytes, backend="deepep").algorithm == "pxn"


def test_all_to_all_inside_a_node_is_direct_and_matches_its_formula():
    topo = Topology.from_profile(MI355X, 8)
    n, S = 8, 64 * MiB
    c = all_to_all(topo, GroupSpec("ep", n, 1), S, algorithm="direct", protocol="simple")
    bw = up_bw(MI355X, n - 1) * MI355X.efficiency.alltoall_share
    expect = launch(MI355X) + (n - 1) * MI355X.scale_up_latency_s + (n - 1) / n * S / bw
    assert c.time_s == pytest.approx(expect, rel=1e-12)
    assert all_to_all(topo, GroupSpec("ep", n, 1), S).algorithm == "direct"


def _with_share(hw, share):
    return dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, alltoall_share=share))


def test_alltoall_share_prices_the_librarys_all_to_all_only():
    # NCCL's all-to-all inside a node at half the collectives' bus efficiency: its bandwidth term doubles; the
    # flex dispatcher's kernels and the ring collectives keep the scale-up bandwidth
    n, S, g = 8, 256 * MiB, GroupSpec("ep", 8, 1)
    full, half = (Topology.from_profile(_with_share(H100, s), 8) for s in (1.0, 0.5))
    expect = launch(H100) + (n - 1) * H100.scale_up_latency_s + 2 * (n - 1) / n * S / up_bw(H100)
    assert all_to_all(half, g, S, algorithm="direct", protocol="simple").time_s == pytest.approx(expect, rel=1e-12)
    for kw in ({"backend": "deepep", "topk": 8}, {"backend": "hybridep", "topk": 8}):
        assert all_to_all(half, g, S, **kw) == all_to_all(full, g, S, **kw)
    assert all_reduce(half, g, S) == all_reduce(full, g, S)


def test_a_profile_without_alltoall_share_prices_the_all_to_all_at_the_bus_efficiency():
    data = {"name": "x", "vendor": "nvidia", "arch": "hopper",
            "compute": {"peak_tflops": {"bf16": 989}, "num_compute_units": 132},
            "memory": {"hbm_capacity_gib": 80, "hbm_bandwidth_gb_per_s": 3350, "runtime_reserved_gib": 2},
            "network": {"gpus_per_node": 8, "scale_up": {"bandwidth_gb_per_s": 450, "latency_us": 3.0},
                        "scale_out": {"bandwidth_gb_per_s": 50, "latency_us": 5.0}},
            "efficiency": {f: {"value": v, "source": "test"} for f, v in dict(
                gemm_bf16=0.8, gemm_k_half=128, attention_fwd=0.55, attention_bwd=0.45, hbm=0.85, scale_up_bus=0.8,
                scale_out_bus=0.85, kernel_launch_s=4e-6, collective_launch_s=15e-6, host_op_s=1e-5,
                moe_sync_stall_s=3e-3).items()}}
    assert profile_from_dict(data, "x").efficiency.alltoall_share == 1.0


@settings(max_examples=100, deadline=None)
@given(share=st.floats(0.1, 1.0), n=st.sampled_from([2, 4, 8, 16, 32]), nbytes=st.floats(1, 4 * GiB),
       hw=st.sampled_from(["h100", "mi355x", "nvl72"]))
def test_a_smaller_alltoall_share_slows_the_all_to_all_by_at_most_its_inverse(share, n, nbytes, hw):
    # only the all-to-all's scale-up bandwidth term scales: never faster, and at most 1/share times slower
    prof = {"h100": H100, "mi355x": MI355X, "nvl72": nvl72()}[hw]
    g = GroupSpec("ep", n, 1)
    base = all_to_all(Topology.from_profile(_with_share(prof, 1.0), 64), g, nbytes).time_s
    slow = all_to_all(Topology.from_profile(_with_share(prof, share), 64), g, nbytes).time_s
    assert base <= slow * (1 + 1e-12) and slow <= base / share * (1 + 1e-12)


def test_deepep_deduplicates_topk_copies_per_node_and_launches_one_kernel():
    topo = Topology.from_profile(H100, 32)
    ep, S = GroupSpec("ep", 32, 1), 256 * MiB
    one = all_to_all(topo, ep, S, backend="deepep")
    top8 = all_to_all(topo, ep, S, backend="deepep", topk=8)
    assert top8.time_s < one.time_s and top8.bytes_on_wire_per_gpu < one.bytes_on_wire_per_gpu
    assert all_to_all(topo, ep, S, topk=8) == all_to_all(topo, ep, S)  # NCCL all-to-all sends every copy
    tiny = all_to_all(topo, GroupSpec("ep", 8, 1), 1, backend="deepep")
    assert tiny.time_s < H100.efficiency.collective_launch_s + 2 * H100.scale_up_latency_s


def test_hierarchical_all_reduce_is_its_three_phases():
    topo = Topology.from_profile(MI355X, 64)
    S, k = 8 * MiB, 8
    g = GroupSpec("dp", 64, 1)
    h = all_reduce(topo, g, S, algorithm="hierarchical", protocol="simple")
    rs = reduce_scatter(topo, GroupSpec("tp", k, 1), S, algorithm="ring", protocol="simple").time_s - launch(MI355X)
    inner = all_reduce(topo, GroupSpec("dp", 8, 8), S / k, protocol="simple").time_s - launch(MI355X)
    assert h.time_s == pytest.approx(launch(MI355X) + 2 * rs + inner, rel=1e-12)


# ------------------------------------------------------------------------------------ p2p
def test_p2p_intra_uses_one_peers_share_and_inter_uses_the_nic():
    S = 64 * MiB
    for hw in (H100, MI355X):
        m = CommModel.from_profile(hw, 16)
        intra = m.p2p_between(0, 1, S, protocol="simple")
        inter = m.p2p_between(0, 8, S, protocol="simple")
        assert (intra.domain, inter.domain) == ("scale_up", "scale_out")
        assert intra.time_s == pytest.approx(launch(hw) + hw.scale_up_latency_s + S / up_bw(hw, 1), rel=1e-12)
        assert inter.time_s == pytest.approx(launch(hw) + hw.scale_out_latency_s + S / nic_bw(hw), rel=1e-12)
        assert m.p2p_between(3, 3, S) == ZERO
    assert p2p(Topology.from_profile(H100, 16), S, tier="scale_up").protocol == "simple"
    assert p2p(Topology.from_profile(H100, 16), 8, tier="scale_up").protocol == "ll"


def test_commmodel_p2p_kind_prices_the_groups_outermost_tier():
    m = CommModel.from_profile(H100, 64)
    assert m.cost("p2p", GroupSpec("pp", 4, 16), MiB).domain == "scale_out"
    assert m.cost("p2p", GroupSpec("pp", 2, 4), MiB).domain == "scale_up"


# ------------------------------------------------------------------------------------ trivial and errors
@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"])
def test_trivial_groups_and_empty_messages_cost_nothing(kind):
    m = CommModel.from_profile(H100, 16)
    assert m.cost(kind, GroupSpec("tp", 1, 1), GiB) == ZERO
    assert ZERO.algorithm == "none" and ZERO.time_s == 0.0
    assert m.cost(kind, GroupSpec("tp", 8, 1), 0) == ZERO


def test_bad_requests_name_the_offending_value():
    topo = Topology.from_profile(H100, 16)
    m = CommModel(topo)
    with pytest.raises(UnknownComponentError, match="'tree'.*valid: "):
        all_reduce(topo, GroupSpec("tp", 8, 1), MiB, algorithm="tree")
    with pytest.raises(InvalidConfigError, match="'one_shot'.*applicable: ring"):
        all_reduce(topo, GroupSpec("dp", 16, 1), MiB, algorithm="one_shot")
    with pytest.raises(InvalidConfigError, match="'hierarchical'"):
        all_gather(topo, GroupSpec("tp", 8, 1), MiB, algorithm="hierarchical")
    with pytest.raises(UnknownComponentError, match="'ll64'"):
        all_reduce(topo, GroupSpec("tp", 8, 1), MiB, protocol="ll64")
    with pytest.raises(InvalidConfigError, match="'ll'.*deepep"):
        all_to_all(topo, GroupSpec("ep", 8, 1), MiB, backend="deepep", protocol="ll")
    with pytest.raises(UnknownComponentError, match="'nvshmem'"):
        all_to_all(topo, GroupSpec("ep", 8, 1), MiB, backend="nvshmem")
    with pytest.raises(UnknownComponentError, match="'broadcast'"):
        m.cost("broadcast", GroupSpec("tp", 8, 1), MiB)
    with pytest.raises(InvalidConfigError, match="4\\*8 = 32 exceeds the job's 16 GPUs"):
        m.cost("all_reduce", GroupSpec("dp", 4, 8), MiB)
    with pytest.raises(InvalidConfigError, match="nbytes=-1"):
        m.cost("all_reduce", GroupSpec("tp", 8, 1), -1)
    with pytest.raises(InvalidConfigError, match="rank 16 is outside"):
        m.p2p_between(0, 16, MiB)


def test_commmodel_memo_returns_the_same_answer():
    m = CommModel.from_profile(H100, 64)
    g = GroupSpec("dp", 8, 8)
    a = m.cost("all_reduce", g, 123456.0)
    assert m.cost("all_reduce", g, 123456.0) is a
    assert a == all_reduce(m.topology, g, 123456.0)


# ------------------------------------------------------------------------------------ properties
PROFILES = {"h100": H100, "mi355x": MI355X, "nvl72": nvl72()}
CALLS = [("all_reduce", {}), ("all_gather", {}), ("reduce_scatter", {}), ("all_to_all", {}),
         ("all_to_all", {"backend": "deepep"}), ("all_to_all", {"backend": "deepep", "topk": 4})]


@settings(max_examples=150, deadline=None)
@given(hw=st.sampled_from(sorted(PROFILES)), call=st.sampled_from(CALLS), n=st.sampled_from([2, 4, 8]),
       stride=st.sampled_from([1, 2, 8, 16]), s1=st.floats(0, 8 * GiB), s2=st.floats(0, 8 * GiB))
def test_every_collective_is_nonnegative_and_monotone_in_size(hw, call, n, stride, s1, s2):
    kind, kw = call
    m = CommModel.from_profile(PROFILES[hw], 1024)
    g = GroupSpec("g", n, stride)
    lo, hi = sorted((s1, s2))
    a, b = m.cost(kind, g, lo, **kw), m.cost(kind, g, hi, **kw)
    assert 0 <= a.time_s <= b.time_s and math.isfinite(b.time_s)


@settings(max_examples=100, deadline=None)
@given(hw=st.sampled_from(sorted(PROFILES)), call=st.sampled_from(CALLS + [("p2p", {})]),
       n=st.sampled_from([2, 4, 8]), nbytes=st.floats(1, 8 * GiB))
def test_inter_domain_is_never_faster_than_intra_domain(hw, call, n, nbytes):
    kind, kw = call
    prof = PROFILES[hw]
    m = CommModel.from_profile(prof, 1024)
    intra = m.cost(kind, GroupSpec("g", n, 1), nbytes, **kw)
    inter = m.cost(kind, GroupSpec("g", n, prof.ranks_per_scale_up_domain), nbytes, **kw)
    assert intra.domain == "scale_up" and inter.domain == "scale_out"
    assert inter.time_s >= intra.time_s

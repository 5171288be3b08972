"""Simulate-mode layer costs: forward, input-gradient (B) and weight-gradient (W) time per layer type,
with the communication that lives inside a layer (TP, CP, EP) and how much of it is exposed.

A layer is its op graph (oracle.opgraph); each op is priced by the kernel model (oracle.gemm): GEMMs by
shape with tile/wave quantisation, attention by its tile model, memory-bound ops by bytes. Backward
GEMMs are dgrad C'[m x k] (same FLOPs as forward) and wgrad [k x n] (reduction over the m tokens).

Host-bound passes: the host issues every op (``Op.host_ops`` x ``efficiency.host_op_s``, plus C++
per-expert launch loops x ``kernel_launch_s``) while the GPU runs the previous ones; a pass takes
max(device, host) per stretch between device-to-host syncs, and the GPU idles for the difference
(reported with the MoE sync stall as host time). Small kernels (fine-grained MoE at small micro-batch)
make whole layers host-bound: this, with the grouped-GEMM tile waste at a few hundred tokens per
expert, is why such models reach a fraction of their FLOP-rate projection (docs/kernel-model.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from math import ceil

from oracle.activations import op_sac_plan, replayed_ops
from oracle.comm.collectives import FLEX_BACKENDS
from oracle.cuda_graphs import GRAPH_REPLAY_HOST_OPS, captured_blocks, replays_per_layer
from oracle.gemm import attention_time_s, gemm_time_s, memory_bound_time_s
from oracle.layout import Layout
from oracle.model_card import MOE_KINDS
from oracle.opgraph import (ATTENTION, GDN, GEMM, POST_SYNC, SSD, SSD_KERNELS_B,
                            UNFUSED_SOFTMAX, Op, Shapes, embedding_ops, gdn_cp_a2a_bytes, gdn_kernels, layer_ops,
                            mamba_cp_a2a_bytes, moe_pairs, output_ops, qkv_gather_bytes, ssd_matmuls)

BF16 = 2
FP32 = 4
# DeepEP hides part of dispatch/combine behind the same layer's compute (paper App. B.3; AMD's public
# code uses 0.65 for its DeepEP overlap efficiency, public-code notes Sec. 2.7).
DEEPEP_OVERLAP = 0.65
# Share of the SMs the all-to-all kernels hold while they overlap another micro-batch's compute, which
# runs that much slower meanwhile (DeepSeek-V3 technical report Sec. 3.2.2: 20 of 132 H800 SMs for
# communication under DualPipe's forward/backward overlap).
A2A_OVERLAP_SM_SHARE = 20 / 132
# Megatron grad-reduce bucket size in elements (DistributedDataParallelConfig.bucket_size default 40M).
DP_BUCKET_ELEMS = 40_000_000


@dataclass(frozen=True, slots=True)
class CommPart:
    """A communication kind inside a layer: totals and exposed parts, forward and backward."""

    f_total_s: float = 0.0
    f_exposed_s: float = 0.0
    b_total_s: float = 0.0
    b_exposed_s: float = 0.0
    algorithm: str = ""

    def __add__(self, other: "CommPart") -> "CommPart":
        """Both parts' traffic as one kind (the first's algorithm named, else the other's)."""
        return CommPart(self.f_total_s + other.f_total_s, self.f_exposed_s + other.f_exposed_s,
                        self.b_total_s + other.b_total_s, self.b_exposed_s + other.b_exposed_s,
                        self.algorithm or other.algorithm)


@dataclass(frozen=True, slots=True)
class LayerCost:
    """One micro-batch through one decoder layer on one rank."""

    kind: str
    f_s: float
    """Forward compute (GEMMs, attention, memory-bound ops)."""
    b_s: float
    """Input-gradient compute."""
    w_s: float
    """Weight-gradient compute."""
    attn_f_s: float
    """Core-attention forward (what selective recompute replays)."""
    comm: dict[str, CommPart] = field(default_factory=dict)
    host_f_s: float = 0.0
    """GPU idle per forward pass waiting on the host: the MoE dispatcher's device-to-host sync stall
    plus host-bound stretches (full recompute replays it); not part of ``f_s``."""
    host_b_s: float = 0.0
    """GPU idle per backward pass (B + W) while the host issues small kernels; not part of ``b_s``."""
    ops: tuple = ()
    """The op graph priced: (op, forward_s, dgrad_s, wgrad_s) per op."""
    replay_f_s: float = 0.0
    """Forward of the ops selective recompute replays besides core attention (the run's recompute_modules
    other than core_attn: oracle.activations.replayed_ops), device seconds."""
    replay_comm: tuple[str, ...] = ()
    """Communication kinds (``comm`` keys) whose forward the replay repeats: EP/ETP when 'moe' is recomputed."""
    replay_host_s: float = 0.0
    """Host idle of the replay: the MoE dispatcher's sync stall again when 'moe' is recomputed."""

    @property
    def f_exposed_comm_s(self) -> float:
        return sum(c.f_exposed_s for c in self.comm.values())

    @property
    def b_exposed_comm_s(self) -> float:
        return sum(c.b_exposed_s for c in self.comm.values())


@lru_cache(maxsize=65536)
def price_op(hw, op: Op) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) device seconds of one op on ``hw`` (cached per op shape)."""
    if op.kind == GEMM:
        g, fz = op.groups, op.fused_groups
        f = gemm_time_s(hw, op.m, op.n, op.k, op.dtype, g, fz)
        b = gemm_time_s(hw, op.m, op.k, op.n, op.dtype, g, fz)
        w = gemm_time_s(hw, op.k, op.n, op.m, op.dtype, g, fz, op.wgrad_c_bytes) if op.has_wgrad else 0.0
        return f, b, w
    if op.kind == ATTENTION and op.softmax:
        return unfused_attention_s(hw, op)
    if op.kind == ATTENTION:
        return tuple(attention_time_s(hw, op.batch_heads, op.s_q, op.s_k, op.d_qk, op.d_v, bwd, op.seq, op.window,
                                      op.dtype) for bwd in (False, True)) + (0.0,)
    if op.kind == SSD:
        return ssd_time_s(hw, op)
    if op.kind == GDN:
        return gdn_time_s(hw, op)
    # memory-bound: backward ~2x (read grad + saved input, write grad)
    return (memory_bound_time_s(hw, op.bytes_f, op.kernels), memory_bound_time_s(hw, 2 * op.bytes_f, 2 * op.kernels), 0.0)


def unfused_attention_s(hw, op: Op) -> tuple[float, float, float]:
    """(forward, backward, 0) device seconds of unfused attention (Transformer Engine UnfusedDotProductAttention):
    scores = Q K^T as a batched GEMM over the full square (baddbmm), the softmax over them in HBM (``op.softmax``'s
    path, UNFUSED_SOFTMAX), context = P V (bmm); backward dP = dO V^T, dV = P^T dO, the softmax's backward,
    dQ = dS K, dK = dS^T Q. Each batched GEMM is priced as one GEMM over the stacked heads (their tiles share the
    waves; the per-head operand read once, under 1/(s/d) of the traffic)."""
    bh, sq, sk, dqk, dv = op.batch_heads, op.s_q, op.seq, op.d_qk, op.d_v
    sm = UNFUSED_SOFTMAX[op.softmax]
    scores = bh * sq * sk
    f = (gemm_time_s(hw, bh * sq, sk, dqk) + memory_bound_time_s(hw, sm.fwd_bytes * scores, sm.kernels)
         + gemm_time_s(hw, bh * sq, dv, sk))
    b = (gemm_time_s(hw, bh * sq, sk, dv) + gemm_time_s(hw, bh * sk, dv, sq)
         + memory_bound_time_s(hw, sm.bwd_bytes * scores, sm.kernels)
         + gemm_time_s(hw, bh * sq, dqk, sk) + gemm_time_s(hw, bh * sk, dqk, sq))
    return f, b, 0.0


def ssd_time_s(hw, op: Op) -> tuple[float, float, float]:
    """(forward, backward, 0) device seconds of Mamba-2's fused split-conv1d-scan (mamba_ssm
    ``mamba_split_conv1d_scan_combined``): its chunked matmuls (``ssd_matmuls``: C B^T, the chunk states, the
    chunk scan) priced as bf16 batched GEMMs over their (chunk, head) groups, one kernel each, plus its memory
    passes (``op.bytes_f``: conv1d, the scan's reads and writes, the chunk states). The backward computes
    both operand gradients of every matmul and recomputes the chunk states (mamba_ssm
    ``_mamba_chunk_scan_combined_bwd``; the conv1d too), and moves the forward's bytes about 3x (recomputed
    passes, gradients read and written)."""
    mm = ssd_matmuls(op)
    f = sum(gemm_time_s(hw, m, n, k, "bf16", g, True) for m, n, k, g in mm)
    states = mm[1]
    b = 2 * f + gemm_time_s(hw, *states[:3], "bf16", states[3], True)
    return (f + memory_bound_time_s(hw, op.bytes_f, op.kernels),
            b + memory_bound_time_s(hw, 3 * op.bytes_f, SSD_KERNELS_B), 0.0)


GDN_STATE_BLOCK = 64
"""Value columns of the state one thread block of the gated delta rule's recurrence carries (flash-linear-attention
``chunk_gated_delta_rule_fwd_kernel_h``: grid (dv / BV, batch x heads), BV 32 or 64; the larger taken)."""


def gdn_recurrence_s(hw, op: Op) -> float:
    """Forward device seconds of the gated delta rule's state recurrence (flash-linear-attention
    ``chunk_gated_delta_rule_fwd_h``): one thread block per (sequence, value head, 64 state columns) walks the
    chunks in order, each step v_new = U - W h (C x 64 x dk) and h = h exp(g) + K^T v_new (dk x 64 x C), loading its
    chunk's W, K and U and writing v_new and the state. The steps of one block cannot overlap, so with fewer blocks
    than compute units the kernel takes the chain's length: per step the larger of its matmuls at one unit's share
    of the dense bf16 rate and its bytes at the active units' share of HBM bandwidth, the next chunk's loads in
    flight meanwhile (waves when the blocks outnumber the units)."""
    e = hw.efficiency
    units = hw.num_compute_units
    bv = min(GDN_STATE_BLOCK, op.d_v)
    blocks = op.batch_heads * -(-op.d_v // bv)
    steps = -(-op.s_q // op.chunk)
    c, dk = op.chunk, op.d_qk
    step_flops = 2.0 * 2 * c * dk * bv
    step_bytes = BF16 * (2 * c * dk + 2 * c * bv + dk * bv)
    t_flops = step_flops / (hw.peak_flops_per_s["bf16"] / units * e.attention_fwd)
    t_bytes = step_bytes / (hw.hbm_bandwidth_bytes_per_s * e.hbm / min(blocks, units))
    return ceil(blocks / units) * steps * max(t_flops, t_bytes)


def gdn_time_s(hw, op: Op) -> tuple[float, float, float]:
    """(forward, backward, 0) device seconds of the chunked gated delta rule (flash-linear-attention
    ``chunk_gated_delta_rule``, as Megatron-Core GatedDeltaNet calls it), kernel by kernel (``gdn_kernels``): each
    fused Triton kernel takes the larger of its matmuls at the fused-attention kernels' fraction of the dense bf16
    rate (efficiency.attention_fwd / _bwd: tiled kernels of the same kind, estimate) and its bytes at the achievable
    HBM bandwidth; the state recurrence at least its chain (``gdn_recurrence_s``). The backward
    (``chunk_gated_delta_rule_bwd``) recomputes W, U and the states, then runs each forward kernel's gradient, both
    operands of every matmul and about twice its bytes (the local dv, the reverse state recurrence for dh and dv,
    dq dk dw dg, the WY backward: estimate), each at its forward time x 2 at the backward efficiency."""
    e = hw.efficiency
    groups = -(-op.s_q // op.chunk) * op.batch_heads
    tok_heads = op.s_q * op.batch_heads
    peak = hw.peak_flops_per_s["bf16"]
    bw = hw.hbm_bandwidth_bytes_per_s * e.hbm
    f = b = recompute = 0.0
    for kern in gdn_kernels(op.d_qk, op.d_v, op.chunk):
        flops = sum(2.0 * m * n * k for m, n, k in kern.matmuls) * groups
        mem = kern.bytes_per_token_head * tok_heads / bw
        tf = max(flops / (peak * e.attention_fwd), mem, e.kernel_launch_s)
        tb = max(2 * flops / (peak * e.attention_bwd), 2 * mem, 2 * e.kernel_launch_s)
        if kern.recurrent:
            chain = gdn_recurrence_s(hw, op)
            tf, tb = max(tf, chain), max(tb, 2 * chain)
        if kern.recomputed:
            recompute += tf
        f += tf
        b += tb
    return f, b + recompute, 0.0


def op_host_s(hw, op: Op) -> tuple[float, float]:
    """(forward, backward) host issue seconds of one op on ``hw``."""
    e = hw.efficiency
    base = op.host_ops * e.host_op_s
    return base + op.loop_launches * e.kernel_launch_s, base + 2 * op.loop_launches * e.kernel_launch_s


@dataclass(frozen=True, slots=True)
class _OpSums:
    """What one decoder layer's op graph costs on a part, before any communication: everything of
    ``LayerModel.layer`` that depends only on the ops (their shapes and dtypes), the part and the run's
    CUDA-graph capture, sync and recompute choices, so it is priced once per distinct layer and shared by
    every configuration with that layer (``_op_sums``)."""

    priced: tuple
    """(op, forward_s, dgrad_s, wgrad_s) per op."""
    f: float
    b: float
    w: float
    attn_f: float
    """Core-attention forward."""
    ag_f: float
    """Forward of the attention block's GEMMs, or a Mamba mixer's in_proj and out_proj (what its TP pair's comm
    overlaps)."""
    ag_b: float
    """Backward (dgrad + wgrad) of those GEMMs."""
    has_mixer_gemms: bool
    """The layer has an attention block or a Mamba mixer: a column-parallel in / row-parallel out TP pair."""
    has_mlp_gemms: bool
    """The layer has a dense MLP or shared-expert GEMM pair (a second TP pair)."""
    mlp_f: float
    mlp_b: float
    attention: tuple | None
    """The priced core-attention op (CP's ring overlaps it)."""
    moe_f: float
    """The MoE block's own forward compute: router and post-sync routed-expert ops (what DeepEP overlaps)."""
    moe_bw: float
    shared_f: float
    """The shared experts' forward (what moe_shared_expert_overlap runs beside the all-to-all)."""
    shared_bw: float
    seg_dev: tuple[float, float]
    """Device seconds per forward segment (before / after the dispatcher's sync), without communication."""
    seg_host: tuple[float, float]
    """Host issue seconds per forward segment."""
    host_b: float
    """Host issue seconds of the backward (graph replays included)."""
    replay_f: float
    """Forward of the ops selective recompute replays besides core attention."""


_MIXER_GEMMS = frozenset({"q_down", "q_up", "q_proj", "kv_down", "kv_up", "qkv", "attn_out", "in_proj", "out_proj"})
"""The GEMMs of a layer's token mixer (attention, or a Mamba-2 mixer's in_proj / out_proj): its TP pair."""


@lru_cache(maxsize=4096)
def _op_sums(hw, card, shapes: Shapes, kind: str, window: int | None, graphed: frozenset[str], synced: bool,
             graph_replays: int, mods: frozenset[str], op_level_sac: bool) -> _OpSums:
    ops = layer_ops(card, shapes, kind, window)  # cached per shape by oracle.opgraph
    priced = tuple((op, *price_op(hw, op)) for op in ops)
    f = sum(p[1] for p in priced)
    b = sum(p[2] for p in priced)
    w = sum(p[3] for p in priced)
    attn_f = sum(p[1] for p in priced if p[0].kind == ATTENTION)
    gemm = [p for p in priced if p[0].kind == GEMM]
    ag_f = sum(p[1] for p in gemm if p[0].name in _MIXER_GEMMS)
    ag_b = sum(p[2] + p[3] for p in gemm if p[0].name in _MIXER_GEMMS)
    mlp_prefix = "shared_" if kind in MOE_KINDS else "mlp_"
    mg = [p for p in gemm if p[0].name.startswith(mlp_prefix)]
    attention = next((p for p in priced if p[0].kind == ATTENTION), None)
    moe_f = moe_bw = 0.0
    shared = [p for p in priced if p[0].name.startswith("shared_")]
    if kind in MOE_KINDS:
        post = [p for p in priced if p[0].segment == POST_SYNC and not p[0].name.startswith("shared_")]
        moe_f = sum(p[1] for p in priced if p[0].name in ("router", "router_topk")) + sum(p[1] for p in post)
        moe_bw = sum(p[2] + p[3] for p in priced if p[0].name in ("router", "router_topk")) + \
            sum(p[2] + p[3] for p in post)
    e = hw.efficiency
    host_b = graph_replays * GRAPH_REPLAY_HOST_OPS * e.host_op_s
    seg_dev = [0.0, 0.0]
    seg_host = [host_b, 0.0]
    for op, pf, _pb, _pw in priced:
        hf, hb = (0.0, 0.0) if op.block in graphed else op_host_s(hw, op)
        seg = op.segment if synced else 0
        seg_dev[seg] += pf
        seg_host[seg] += hf
        host_b += hb
    replayed = {op.name for op in replayed_ops(ops, mods)} if mods else set()
    replay_f = sum(p[1] for p in priced if p[0].name in replayed)
    if op_level_sac:  # TorchTitan: every op's forward but attention's and every other matmul's, again
        replay_f = sum(p[1] * share for p, (_, share) in zip(priced, op_sac_plan(ops)))
    mixer = any(p[0].name in _MIXER_GEMMS for p in gemm)
    return _OpSums(priced=priced, f=f, b=b, w=w, attn_f=attn_f, ag_f=ag_f, ag_b=ag_b, has_mixer_gemms=mixer,
                   has_mlp_gemms=bool(mg),
                   mlp_f=sum(p[1] for p in mg), mlp_b=sum(p[2] + p[3] for p in mg), attention=attention,
                   moe_f=moe_f, moe_bw=moe_bw, shared_f=sum(p[1] for p in shared),
                   shared_bw=sum(p[2] + p[3] for p in shared), seg_dev=(seg_dev[0], seg_dev[1]), seg_host=(seg_host[0], seg_host[1]),
                   host_b=host_b, replay_f=replay_f)


_EDGE_OPS = {"embedding": embedding_ops, "output": output_ops}


def _edge_key(shapes: Shapes) -> tuple:
    """What the embedding's and the output's op graphs read of the shapes (``embedding_ops``, ``output_ops``,
    ``_norm_op``): the token counts, whose kernels, the logits GEMM's dtype and its weight-gradient traffic (the
    layers' sizes, experts and dispatcher do not enter them). tests/oracle/test_compute_edges.py prices them again
    for every shape of several spaces and compares."""
    return shapes.T, shapes.T_sp, shapes.framework, shapes.eager, shapes.output_dtype, shapes.wgrad_c_bytes


_EDGE_SUMS: dict[tuple, tuple[list[Op], float, float, float]] = {}


def _edge_sums(hw, card, shapes: Shapes, which: str, *args) -> tuple[list[Op], float, float, float]:
    """:func:`_price_edge`, cached on (part, card, args, :func:`_edge_key`): a search's new shapes mostly repeat
    their edges (TypeError for an unhashable card)."""
    key = (hw, card, which, args, *_edge_key(shapes))
    hit = _EDGE_SUMS.get(key)
    if hit is None:
        if len(_EDGE_SUMS) > 4096:
            _EDGE_SUMS.clear()
        hit = _EDGE_SUMS[key] = _price_edge(hw, card, shapes, which, *args)
    return hit


def _price_edge(hw, card, shapes: Shapes, which: str, *args) -> tuple[list[Op], float, float, float]:
    """(ops, forward, input-gradient, weight-gradient device seconds) of the embedding's or output's op graph
    (``LayerModel._dev`` without the unfused gradient accumulation, which the caller adds)."""
    ops = _EDGE_OPS[which](card, shapes, *args)
    return (ops, *_price_sums(ops, lambda op: price_op(hw, op)))


def _price_sums(ops: list[Op], price) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) device seconds of ``ops`` under ``price``, summed in order."""
    f = b = w = 0.0
    for op in ops:
        a, bb, c = price(op)
        f, b, w = f + a, b + bb, w + c
    return f, b, w


def _run_ahead_idle(host_f: float, dev_f: float, host_b: float, dev_b: float) -> tuple[float, float]:
    """(forward, backward) device idle of a layer whose host issue runs ahead of the device across both passes:
    the total is max(0, host - device) over the two; it is split by each pass's own host excess."""
    total = max(0.0, host_f + host_b - dev_f - dev_b)
    if total <= 0.0:
        return 0.0, 0.0
    ef, eb = max(0.0, host_f - dev_f), max(0.0, host_b - dev_b)
    share = ef / (ef + eb) if ef + eb > 0 else 0.5
    return total * share, total * (1.0 - share)


class LayerModel:
    """Prices decoder layers, embedding and output for one RunConfig (simulate mode) from their op graphs."""

    def __init__(self, layout: Layout, comm) -> None:
        self.L = layout
        self.comm = comm
        run = layout.run
        self.run, self.m, self.t, self.hw = run, run.model, run.training, run.cluster.hardware
        self.shapes = Shapes.of(run)
        self.dtype = self.shapes.dtype
        self.T = self.shapes.T
        self.T_sp = self.shapes.T_sp
        self._cache: dict[tuple, LayerCost] = {}
        self._bf16: LayerModel | None = None

    # ------------------------------------------------------------------ pricing one op
    def price(self, op: Op) -> tuple[float, float, float]:
        """(forward, input-gradient, weight-gradient) device seconds of one op."""
        return price_op(self.hw, op)

    def host_s(self, op: Op) -> tuple[float, float]:
        """(forward, backward) host issue seconds of one op."""
        return op_host_s(self.hw, op)

    def _coll(self, kind: str, group: str, nbytes: float, **kw):
        g = self.L.group(group)
        if g.size <= 1 or nbytes <= 0:
            return None
        return self.comm.cost(kind, g, nbytes, **kw)

    def _tp_comm(self, gathered_bytes: float, pairs: int, gemm_f: float, gemm_b: float) -> CommPart:
        """TP traffic of ``pairs`` (column-parallel in, row-parallel out) GEMM pairs.

        With SP: forward all-gather + reduce-scatter per pair; backward reduce-scatter + all-gather
        + the re-gather of the saved sharded input for wgrad (Korthikanti et al. 2022, Sec. 4.2.2).
        Without SP: one all-reduce per pair each way (Shoeybi et al. 2019). With TP overlap the
        ring-chunked comm hides behind the paired GEMMs except its first chunk (1/tp).
        """
        t = self.t
        if t.tp <= 1 or pairs == 0:
            return CommPart()
        if t.sp:
            ag = self._coll("all_gather", "tp", gathered_bytes)
            rs = self._coll("reduce_scatter", "tp", gathered_bytes)
            f = pairs * (ag.time_s + rs.time_s)
            b = pairs * (2 * ag.time_s + rs.time_s)
            algo = ag.algorithm
        else:
            ar = self._coll("all_reduce", "tp", gathered_bytes)
            f = b = pairs * ar.time_s
            algo = ar.algorithm
        if t.tp_overlap:
            fe = max(f - gemm_f, f / t.tp)
            be = max(b - gemm_b, b / t.tp)
        else:
            fe, be = f, b
        return CommPart(f, fe, b, be, algo)

    def _cp_comm(self, attn_f: float, attn_b: float, d_qk: int, d_v: int) -> CommPart:
        """The attention layer's context-parallel traffic (TrainingConfig.cp_comm_type, Megatron-Core's
        TransformerConfig docstring). p2p, ring attention: cp-1 exchanges of the local K,V block forward (K,V and
        dK,dV backward), each overlapped with the attention of the block in hand. a2a (Ulysses): Q, K, V to head
        sharding before attention and the output back after, dO in and dQ, dK, dV out in backward; all_gather: the
        full K,V gathered in forward and again in backward, dK,dV reduce-scattered; neither overlaps."""
        m, t = self.m, self.t
        heads_kv = m.kv_heads if m.attention == "gqa" else m.num_attention_heads
        kv_bytes = BF16 * self.T * max(1, heads_kv // t.tp) * (d_qk + d_v)
        if t.cp_comm_type == "a2a":
            q_bytes = BF16 * self.T * (m.num_attention_heads // t.tp) * d_qk
            o_bytes = BF16 * self.T * (m.num_attention_heads // t.tp) * d_v
            qkv = self._coll("all_to_all", "cp", q_bytes + kv_bytes)
            out = self._coll("all_to_all", "cp", o_bytes)
            f = qkv.time_s + out.time_s
            return CommPart(f, f, f, f, qkv.algorithm)
        if t.cp_comm_type == "all_gather":
            ag = self._coll("all_gather", "cp", kv_bytes * t.cp)
            rs = self._coll("reduce_scatter", "cp", kv_bytes * t.cp)
            return CommPart(ag.time_s, ag.time_s, ag.time_s + rs.time_s, ag.time_s + rs.time_s, ag.algorithm)
        step_f = self._coll("p2p", "cp", kv_bytes)
        step_b = self._coll("p2p", "cp", 2 * kv_bytes)
        steps = t.cp - 1
        f_tot, b_tot = steps * step_f.time_s, steps * step_b.time_s
        f_exp = steps * max(0.0, step_f.time_s - attn_f / t.cp)
        b_exp = steps * max(0.0, step_b.time_s - attn_b / t.cp)
        return CommPart(f_tot, f_exp, b_tot, b_exp, step_f.algorithm)

    # ------------------------------------------------------------------ communication of the MLP part
    def _lone_fraction(self) -> float:
        """Share of forward (and backward) chunks that run without a partner under the merged
        forward/backward schedule of ``moe_a2a_overlap``: the warm-up forwards and cool-down backwards.
        PP 1: the first forward and the last backward of ``mb``; interleaved: rank r warms up with
        (pp - r - 1) * 2 + (vpp - 1) * pp chunks of its mb * vpp (Megatron-Core's interleaved 1F1B),
        averaged over the ranks."""
        t = self.t
        mb = max(1, self.L.num_microbatches)
        warm = 1.0 if t.pp == 1 else (t.pp - 1) + (t.vpp - 1) * t.pp
        return min(1.0, warm / (mb * t.vpp))

    def a2a_sm_share(self) -> float:
        """Share of the compute units the all-to-all kernels hold while they run beside another micro-batch's
        compute: the flex dispatcher's configured SMs (``moe_flex_dispatcher_num_sms``, default 20) out of the
        part's; NCCL's all-to-all the DeepSeek-V3 report's 20 of 132 H800 SMs (A2A_OVERLAP_SM_SHARE)."""
        t = self.t
        if t.moe_a2a_backend in FLEX_BACKENDS:
            return min(1.0, t.flex_sms / self.hw.num_compute_units)
        return A2A_OVERLAP_SM_SHARE

    def overlapped_a2a_s(self, a2a_s: float, cover_s: float) -> float:
        """Exposed seconds of one direction's dispatch+combine when it overlaps ``cover_s`` of another
        micro-batch's compute of the same layer: the part the cover cannot hide, plus the slowdown of
        the hidden part's compute (the SMs the communication kernels hold, ``a2a_sm_share``); lone
        chunks expose it all. Never more than the all-to-all itself, and it hides at most ``cover_s``."""
        hidden = min(a2a_s, cover_s)
        steady = a2a_s - hidden + self.a2a_sm_share() * hidden
        u = self._lone_fraction()
        return u * a2a_s + (1.0 - u) * steady

    def _moe_comm(self, compute_f: float, compute_bw: float, pairs: float, layer_f: float = 0.0,
                  layer_b: float = 0.0, layer_w: float = 0.0, shared_f: float = 0.0,
                  shared_bw: float = 0.0) -> dict[str, CommPart]:
        """EP (and ETP) traffic of a MoE layer. ``compute_f``/``compute_bw``: the MoE block's own compute
        (what DeepEP overlaps inside the layer); ``layer_f``, ``layer_b``, ``layer_w``: the whole layer's forward,
        input-gradient and weight-gradient compute, what ``moe_a2a_overlap`` hides the other direction's
        all-to-all behind (the weight gradients only with ``delay_wgrad_compute``, which defers them to run
        beside the backward's all-to-all); ``shared_f``/``shared_bw``: the shared experts, which
        ``moe_shared_expert_overlap`` runs on a side stream while the dispatch and combine are in flight."""
        m, t = self.m, self.t
        H = m.expert_width  # what a token carries to the experts: hidden_size, or a latent MoE's latent width
        comm: dict[str, CommPart] = {}
        if t.ep > 1:
            backend = t.moe_a2a_backend
            flex = backend in FLEX_BACKENDS
            # DeepEP dispatches fp8 under low precision; HybridEP dispatches bf16 (Megatron-Core fused_a2a:
            # "HybridEP dispatcher does not support fp8 dispatch now")
            disp_elem = 1 if (backend == "deepep" and self.dtype != "bf16") else BF16
            # the busiest rank's pairs (drop-and-pad sends the padded capacity buffers)
            per_rank = self.T_sp * m.moe_topk * H * t.moe_load
            kw = {"backend": backend, "topk": m.moe_topk} if flex else {}
            d = self._coll("all_to_all", "ep", disp_elem * per_rank, **kw)
            c = self._coll("all_to_all", "ep", BF16 * per_rank, **kw)
            a2a = d.time_s + c.time_s
            f_exp = b_exp = a2a
            if backend == "deepep":  # DeepEP's async kernels (paper App. B.3)
                f_exp = a2a - min(DEEPEP_OVERLAP * a2a, compute_f)
                b_exp = a2a - min(DEEPEP_OVERLAP * a2a, compute_bw)
            if t.moe_shared_expert_overlap:  # shared experts on a side stream beside dispatch + combine
                f_exp = max(0.0, f_exp - shared_f)
                b_exp = max(0.0, b_exp - shared_bw)
            if t.moe_a2a_overlap:  # forward a2a under another micro-batch's backward, and vice versa
                cover_bw = layer_b + (layer_w if t.delays_wgrad else 0.0)
                f_exp = min(f_exp, self.overlapped_a2a_s(a2a, cover_bw))
                b_exp = min(b_exp, self.overlapped_a2a_s(a2a, layer_f))
            comm["ep_a2a"] = CommPart(a2a, f_exp, a2a, b_exp, d.algorithm)
        if t.etp > 1:
            eg = self._coll("all_gather", "etp", BF16 * pairs / t.etp * H * t.etp)
            er = self._coll("reduce_scatter", "etp", BF16 * pairs / t.etp * H * t.etp)
            tot = eg.time_s + er.time_s
            comm["etp"] = CommPart(tot, tot, tot, tot, eg.algorithm)
        return comm

    # ------------------------------------------------------------------ layers
    def layer_bf16(self, kind: str, window: int | None = None) -> LayerCost:
        """A decoder layer kept in BF16 under an FP8/FP4 recipe (``first_last_layers_bf16``): its GEMMs and
        attention in BF16, no quantise casts; the rest of the run as configured."""
        if self._bf16 is None:
            other = LayerModel(self.L, self.comm)
            other.shapes = replace(self.shapes, dtype="bf16", attention_dtype="bf16")
            other.dtype = "bf16"
            self._bf16 = other
        return self._bf16.layer(kind, window)

    def ops(self, kind: str, window: int | None = None) -> list[Op]:
        """The op graph of one decoder layer on this rank."""
        return layer_ops(self.m, self.shapes, kind, window)  # cached per shape by oracle.opgraph

    def layer(self, kind: str, window: int | None = None) -> LayerCost:
        key = (kind, window)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        m, t = self.m, self.t
        # CUDA graphs: a captured op costs the host nothing; each graph replay costs its callable's ops
        # (captured regions sit before the sync: a dispatcher that syncs cannot be captured)
        graphed = captured_blocks(t, kind)
        synced = kind in MOE_KINDS and t.moe_host_sync
        # selective recompute besides core attention (attn_f_s): each recomputed module's forward once;
        # Megatron's MoE checkpoint replays the router, dispatch all-to-all (and its sync) and combine
        mods = frozenset(self.t.recomputed_modules - {"core_attn"})
        args = (self.hw, m, self.shapes, kind, window, graphed, synced, replays_per_layer(t, kind), mods, t.op_level_sac)
        try:
            o = _op_sums(*args)
        except TypeError:  # an unhashable card: priced uncached
            o = _op_sums.__wrapped__(*args)
        f, b = o.f, o.b
        w = o.w + self.grad_accumulate_s([p[0] for p in o.priced])  # 0 unless unfused accumulation
        # TP traffic: one column-parallel in / row-parallel out pair for attention, one for a dense MLP
        # or the shared experts; each pair's comm overlaps the GEMMs of its block
        tp_bytes = BF16 * self.T * m.hidden_size
        tp = self._tp_comm(tp_bytes, 1 if o.has_mixer_gemms else 0, o.ag_f, o.ag_b)
        if o.has_mlp_gemms:
            tp = tp + self._tp_comm(tp_bytes, 1, o.mlp_f, o.mlp_b)
        if o.attention is not None and (gathered := qkv_gather_bytes(m, self.shapes)):
            # fewer KV heads than TP ranks: the QKV output gathered over TP (its backward reduce-scatter), outside
            # the overlapped GEMM pairs: exposed
            ag = self._coll("all_gather", "tp", gathered)
            rs = self._coll("reduce_scatter", "tp", gathered)
            tp = tp + CommPart(ag.time_s, ag.time_s, rs.time_s, rs.time_s, ag.algorithm)
        comm: dict[str, CommPart] = {"tp": tp}
        if t.cp > 1 and o.attention is not None:
            att = o.attention
            comm["cp"] = self._cp_comm(att[1], att[2], att[0].d_qk, att[0].d_v)
        elif t.cp > 1 and kind in ("mamba", "gdn"):
            # Mamba / Gated DeltaNet context parallelism: all-to-alls to head sharding before the conv and the scan
            # and back after (their gradients the same way back in backward), outside any overlap: exposed
            pre, post = (mamba_cp_a2a_bytes if kind == "mamba" else gdn_cp_a2a_bytes)(m, self.shapes)
            a2a = sum(self._coll("all_to_all", "cp", x).time_s for x in (pre, post))
            comm["cp"] = CommPart(a2a, a2a, a2a, a2a, "direct")
        if kind in MOE_KINDS:
            comm.update(self._moe_comm(o.moe_f, o.moe_bw, moe_pairs(m, self.shapes), layer_f=f, layer_b=b, layer_w=w,
                                       shared_f=o.shared_f, shared_bw=o.shared_bw))
        comm = {k: v for k, v in comm.items() if v.f_total_s or v.b_total_s}
        # host-bound stretches: per forward segment (the dispatcher sync stops the host running ahead)
        # max(device, host); backward has no sync, one stretch. The idle is the excess over the device.
        f_exposed_comm = sum(c.f_exposed_s for c in comm.values())
        b_exposed_comm = sum(c.b_exposed_s for c in comm.values())
        seg_dev = list(o.seg_dev)
        seg_dev[1 if synced else 0] += f_exposed_comm
        if synced:  # the host cannot run ahead of a device-to-host sync: each stretch is max(host, device)
            idle_f = sum(max(0.0, h - d) for h, d in zip(o.seg_host, seg_dev))
            idle_b = max(0.0, o.host_b - (b + w + b_exposed_comm))
        else:
            # no sync: the host issues ahead of the device across the forward and the backward (CUDA's launch
            # queue), so the pass is host-bound only where the host's total outlasts the device's; the idle
            # lands where the host is the slower side (``_run_ahead_idle``)
            idle_f, idle_b = _run_ahead_idle(sum(o.seg_host), sum(seg_dev), o.host_b, b + w + b_exposed_comm)
        # one device-to-host sync per MoE forward (token counts -> all-to-all splits, grouped-GEMM
        # sizes); the backward reuses the host-side counts (docs/calibration.md, "MoE sync stall")
        stall = self.hw.efficiency.moe_sync_stall_s if synced else 0.0
        moe_replay = kind in MOE_KINDS and "moe" in mods
        cost = LayerCost(kind, f, b, w, o.attn_f, comm, stall + idle_f, idle_b, o.priced, replay_f_s=o.replay_f,
                         replay_comm=tuple(k for k in ("ep_a2a", "etp") if k in comm) if moe_replay else (),
                         replay_host_s=stall if moe_replay else 0.0)
        self._cache[key] = cost
        return cost

    def grad_accumulate_s(self, ops: list[Op]) -> float:
        """Without gradient-accumulation fusion (Megatron-Core ``gradient_accumulation_fusion=false``) every
        weight gradient is written in bf16 by its wgrad GEMM (Op.wgrad_c_bytes) and then added into the
        main-gradient buffer by a kernel of its own: read the bf16 gradient, read and write the buffer."""
        t = self.t
        if t.gradient_accumulation_fusion or t.framework != "megatron":
            return 0.0
        per = BF16 + 2 * (FP32 if t.grad_reduce_in_fp32 else BF16)
        return sum(memory_bound_time_s(self.hw, op.groups * op.k * op.n * per, op.groups)
                   for op in ops if op.kind == GEMM and op.has_wgrad)

    def _dev(self, ops: list[Op]) -> tuple[float, float, float]:
        f, b, w = _price_sums(ops, self.price)
        return f, b, w + self.grad_accumulate_s(ops)

    def _dev_of(self, which: str, *args) -> tuple[float, float, float]:
        """``_dev`` of the embedding's or the output's ops, priced once per (part, card, shapes, args) when the
        ops are priced analytically (``price`` not overridden): they depend on nothing else of the run."""
        if type(self).price is LayerModel.price:
            try:
                ops, f, b, w = _edge_sums(self.hw, self.m, self.shapes, which, *args)
            except TypeError:  # an unhashable card: priced uncached
                ops, f, b, w = _price_edge(self.hw, self.m, self.shapes, which, *args)
            return f, b, w + self.grad_accumulate_s(ops)
        return self._dev(_EDGE_OPS[which](self.m, self.shapes, *args))

    def embedding(self) -> tuple[float, float]:
        """Embedding lookup forward (gather + write) and backward (scatter-add into fp32 grad)."""
        f, b, _ = self._dev_of("embedding")
        return f, b

    def output(self) -> tuple[float, float, float]:
        """Final norm + output projection + cross-entropy: (f, b, w). Logits GEMM runs in bf16."""
        v = self.m.padded_vocab(self.t.tp) // self.t.tp
        return self._dev_of("output", v, self.t.loss_fusion)

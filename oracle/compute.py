"""Simulate-mode layer costs: forward, input-gradient (B) and weight-gradient (W) time per layer type,
with the communication that lives inside a layer (TP, CP, EP) and how much of it is exposed.

Shapes follow Megatron-Core: T = mbs*seq/cp tokens per rank; TP-split GEMMs see all T tokens
(sequence-parallel regions are gathered first), norms/residuals see T/tp with SP. Backward GEMMs
are dgrad C'[m x k] (same FLOPs as forward) and wgrad [k x n] (reduction over the m tokens).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil

from oracle.gemm import attention_time_s, gemm_time_s, memory_bound_time_s
from oracle.layout import Layout

BF16 = 2
FP32 = 4
# DeepEP hides part of dispatch/combine behind the same layer's compute (paper App. B.3; AMD's public
# code uses 0.65 for its DeepEP overlap efficiency, public-code notes Sec. 2.7).
DEEPEP_OVERLAP = 0.65
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
    """GPU idle per forward pass while the host catches up after the MoE dispatcher's
    device-to-host sync (full recompute replays it); not part of ``f_s``."""

    @property
    def f_exposed_comm_s(self) -> float:
        return sum(c.f_exposed_s for c in self.comm.values())

    @property
    def b_exposed_comm_s(self) -> float:
        return sum(c.b_exposed_s for c in self.comm.values())


def _avg_keys(seq: int, window: int | None) -> float:
    """Average keys per query under a causal mask, optionally within a sliding window."""
    if window is None or window >= seq:
        return (seq + 1) / 2.0
    return (window * (window + 1) / 2.0 + (seq - window) * window) / seq


class LayerModel:
    """Prices decoder layers, embedding and output for one RunConfig (simulate mode)."""

    def __init__(self, layout: Layout, comm) -> None:
        self.L = layout
        self.comm = comm
        run = layout.run
        self.run, self.m, self.t, self.hw = run, run.model, run.training, run.cluster.hardware
        t = self.t
        self.dtype = "fp8" if t.precision == "fp8" else "bf16"
        self.T = t.mbs * t.seq_len // t.cp
        self.T_sp = self.T // t.tp if t.sp else self.T
        self._cache: dict[tuple, LayerCost] = {}

    # ------------------------------------------------------------------ helpers
    def _gemm3(self, m: int, n: int, k: int, groups: int = 1) -> tuple[float, float, float]:
        """(forward, dgrad, wgrad) of one linear layer y[m x n] = x[m x k] W[k x n]."""
        hw, dt = self.hw, self.dtype
        return (gemm_time_s(hw, m, n, k, dt, groups), gemm_time_s(hw, m, k, n, dt, groups),
                gemm_time_s(hw, k, n, m, dt, groups))

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

    def _elementwise(self, nbytes_f: float, kernels_f: int) -> tuple[float, float]:
        """Memory-bound forward bytes and the backward (~2x: read grad + saved input, write grad)."""
        return (memory_bound_time_s(self.hw, nbytes_f, kernels_f),
                memory_bound_time_s(self.hw, 2 * nbytes_f, 2 * kernels_f))

    # ------------------------------------------------------------------ attention block
    def _attention(self, window: int | None) -> tuple[float, float, float, float, dict[str, CommPart]]:
        m, t, T, Tsp, H = self.m, self.t, self.T, self.T_sp, self.m.hidden_size
        tp = t.tp
        f = b = w = 0.0
        gemm_f = gemm_b = 0.0
        if m.attention == "mla":
            rope = m.qk_rope_head_dim or 0
            shapes = []
            if m.q_lora_rank:
                shapes += [(T, m.q_lora_rank, H), (T, m.q_width // tp, m.q_lora_rank)]
            else:
                shapes += [(T, m.q_width // tp, H)]
            shapes += [(T, m.kv_lora_rank + rope, H), (T, m.kv_width // tp, m.kv_lora_rank),
                       (T, H, m.attn_out_width // tp)]
            d_qk, d_v = m.qk_nope_head_dim + rope, m.v_head_dim
        else:
            qkv_n = (m.q_width + 2 * m.kv_heads * m.head_size) // tp
            shapes = [(T, qkv_n, H), (T, H, m.attn_out_width // tp)]
            d_qk = d_v = m.head_size
        for (gm, gn, gk) in shapes:
            a, bb, c = self._gemm3(gm, gn, gk)
            f += a
            b += bb
            w += c
        gemm_f, gemm_b = f, b + w
        # core attention: mbs * heads/tp query heads over seq/cp queries, causal (load-balanced CP)
        heads = t.mbs * (m.num_attention_heads // tp)
        s_q = t.seq_len // t.cp
        keys = _avg_keys(t.seq_len, window)
        attn_f = attention_time_s(self.hw, heads, s_q, keys, d_qk, d_v)
        attn_b = attention_time_s(self.hw, heads, s_q, keys, d_qk, d_v, backward=True)
        f += attn_f
        b += attn_b
        # memory-bound: input norm (r+w), residual add (2r+1w), RoPE on q,k (r+w), fp8 casts of GEMM inputs
        qk_elems = T * (m.q_width + m.kv_heads * d_qk) / tp if m.attention == "gqa" else T * m.q_width / tp
        nbytes = BF16 * (2 * Tsp * H + 3 * Tsp * H + 2 * qk_elems)
        if self.dtype == "fp8":
            nbytes += 3 * (T * H + T * m.attn_out_width / tp)
        ef, eb = self._elementwise(nbytes, 5)
        f += ef
        b += eb
        comm = {"tp": self._tp_comm(BF16 * T * H, 1, gemm_f, gemm_b)}
        if t.cp > 1:
            comm["cp"] = self._cp_comm(attn_f, attn_b, d_qk, d_v)
        return f, b, w, attn_f, comm

    def _cp_comm(self, attn_f: float, attn_b: float, d_qk: int, d_v: int) -> CommPart:
        """Ring attention: cp-1 exchanges of the local K,V block forward (K,V and dK,dV backward),
        each overlapped with the attention of the block in hand (Megatron-Core context parallel)."""
        m, t = self.m, self.t
        heads_kv = m.kv_heads if m.attention == "gqa" else m.num_attention_heads
        kv_bytes = BF16 * self.T * max(1, heads_kv // t.tp) * (d_qk + d_v)
        step_f = self._coll("p2p", "cp", kv_bytes)
        step_b = self._coll("p2p", "cp", 2 * kv_bytes)
        steps = t.cp - 1
        f_tot, b_tot = steps * step_f.time_s, steps * step_b.time_s
        f_exp = steps * max(0.0, step_f.time_s - attn_f / t.cp)
        b_exp = steps * max(0.0, step_b.time_s - attn_b / t.cp)
        return CommPart(f_tot, f_exp, b_tot, b_exp, step_f.algorithm)

    # ------------------------------------------------------------------ MLPs
    def _dense_mlp(self, ffn: int, tokens: int) -> tuple[float, float, float, float, float]:
        """(f, b, w, gemm_f, gemm_b) of a TP-split MLP over ``tokens`` gathered tokens."""
        m, tp = self.m, self.t.tp
        up = (2 if m.gated else 1) * ffn // tp
        f1 = self._gemm3(tokens, up, m.hidden_size)
        f2 = self._gemm3(tokens, m.hidden_size, ffn // tp)
        f = f1[0] + f2[0]
        b = f1[1] + f2[1]
        w = f1[2] + f2[2]
        gf, gb = f, b + w
        act_bytes = BF16 * tokens * ffn / tp * (3 if m.gated else 2)
        if self.dtype == "fp8":
            act_bytes += 3 * tokens * (m.hidden_size + ffn / tp)
        ef, eb = self._elementwise(act_bytes, 2)
        return f + ef, b + eb, w, gf, gb

    def _moe(self) -> tuple[float, float, float, dict[str, CommPart]]:
        m, t, H = self.m, self.t, self.m.hidden_size
        tokens = self.T_sp  # the router and dispatcher work on the sequence-parallel shard
        E_local = m.num_experts // t.ep
        pairs = tokens * m.moe_topk * t.etp * t.moe_imbalance  # busiest rank (paper Sec. 4.10)
        m_e = max(1, ceil(pairs / E_local))
        ffn_l = m.expert_ffn // t.etp
        up = (2 if m.gated else 1) * ffn_l
        g1 = self._gemm3(m_e, up, H, E_local)
        g2 = self._gemm3(m_e, H, ffn_l, E_local)
        f, b, w = g1[0] + g2[0], g1[1] + g2[1], g1[2] + g2[2]
        # router GEMM (fp32 logits in Megatron) + softmax/top-k
        rf = gemm_time_s(self.hw, tokens, m.num_experts, H, "bf16")
        f += rf
        b += rf
        w += rf
        # permute/unpermute copies k*T*H each way, activation of expert fc1, router scores
        nbytes = BF16 * (2 * (tokens * H + pairs * H) + pairs * ffn_l * (3 if m.gated else 2)) + FP32 * 3 * tokens * m.num_experts
        if self.dtype == "fp8":
            nbytes += 3 * pairs * (H + ffn_l)
        ef, eb = self._elementwise(nbytes, 8)
        f += ef
        b += eb
        comm: dict[str, CommPart] = {}
        compute_f = f
        if m.num_shared_experts:
            sf, sb, sw, sgf, sgb = self._dense_mlp(m.shared_ffn, self.T)
            f, b, w = f + sf, b + sb, w + sw
            comm["tp"] = self._tp_comm(BF16 * self.T * H, 1, sgf, sgb)
        if t.ep > 1:
            deepep = t.moe_a2a_backend == "deepep"
            disp_elem = 1 if (deepep and self.dtype == "fp8") else BF16  # DeepEP dispatches fp8 under fp8
            per_rank = tokens * m.moe_topk * H * t.moe_imbalance
            kw = {"backend": t.moe_a2a_backend, "topk": m.moe_topk} if deepep else {}
            d = self._coll("all_to_all", "ep", disp_elem * per_rank, **kw)
            c = self._coll("all_to_all", "ep", BF16 * per_rank, **kw)
            a2a = d.time_s + c.time_s
            f_exp = b_exp = a2a
            if deepep:
                f_exp = a2a - min(DEEPEP_OVERLAP * a2a, compute_f)
                b_exp = a2a - min(DEEPEP_OVERLAP * a2a, b + w)
            comm["ep_a2a"] = CommPart(a2a, f_exp, a2a, b_exp, d.algorithm)
        if t.etp > 1:
            eg = self._coll("all_gather", "etp", BF16 * pairs / t.etp * H * t.etp)
            er = self._coll("reduce_scatter", "etp", BF16 * pairs / t.etp * H * t.etp)
            tot = eg.time_s + er.time_s
            comm["etp"] = CommPart(tot, tot, tot, tot, eg.algorithm)
        return f, b, w, comm

    # ------------------------------------------------------------------ layers
    def layer(self, kind: str, window: int | None = None) -> LayerCost:
        key = (kind, window)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        af, ab, aw, attn_f, comm = self._attention(window)
        # post-attention norm + second residual add (memory-bound, SP shard)
        nbytes = BF16 * 5 * self.T_sp * self.m.hidden_size
        ef, eb = self._elementwise(nbytes, 2)
        af, ab = af + ef, ab + eb
        if kind == "moe":
            mf, mb, mw, mcomm = self._moe()
            for k, v in mcomm.items():
                if k in comm:
                    o = comm[k]
                    v = CommPart(o.f_total_s + v.f_total_s, o.f_exposed_s + v.f_exposed_s,
                                 o.b_total_s + v.b_total_s, o.b_exposed_s + v.b_exposed_s, o.algorithm)
                comm[k] = v
        else:
            mf, mb, mw, gf, gb = self._dense_mlp(self.m.ffn_hidden_size or 0, self.T)
            tpm = self._tp_comm(BF16 * self.T * self.m.hidden_size, 1, gf, gb)
            o = comm["tp"]
            comm["tp"] = CommPart(o.f_total_s + tpm.f_total_s, o.f_exposed_s + tpm.f_exposed_s,
                                  o.b_total_s + tpm.b_total_s, o.b_exposed_s + tpm.b_exposed_s, o.algorithm or tpm.algorithm)
        comm = {k: v for k, v in comm.items() if v.f_total_s or v.b_total_s}
        # one device-to-host sync per MoE forward (token counts -> all-to-all splits, grouped-GEMM
        # sizes); the backward reuses the host-side counts (docs/calibration.md, "MoE sync stall")
        host = self.hw.efficiency.moe_sync_stall_s if kind == "moe" and not self.t.moe_sync_free else 0.0
        cost = LayerCost(kind, af + mf, ab + mb, aw + mw, attn_f, comm, host)
        self._cache[key] = cost
        return cost

    def embedding(self) -> tuple[float, float]:
        """Embedding lookup forward (gather + write) and backward (scatter-add into fp32 grad)."""
        n = self.T_sp * self.m.hidden_size
        return (memory_bound_time_s(self.hw, BF16 * 2 * n, 1), memory_bound_time_s(self.hw, (BF16 + 2 * FP32) * n, 2))

    def output(self) -> tuple[float, float, float]:
        """Final norm + output projection + cross-entropy: (f, b, w). Logits GEMM runs in bf16."""
        m, t = self.m, self.t
        v = m.padded_vocab(t.tp) // t.tp
        f = gemm_time_s(self.hw, self.T, v, m.hidden_size, "bf16")
        b = gemm_time_s(self.hw, self.T, m.hidden_size, v, "bf16")
        w = gemm_time_s(self.hw, m.hidden_size, v, self.T, "bf16")
        # cross-entropy: fused = read logits, write grad; unfused adds fp32 softmax materialisation
        ce = BF16 * self.T * v * (2 if t.loss_fusion else 1) + (0 if t.loss_fusion else FP32 * 2 * self.T * v)
        ef, eb = self._elementwise(ce + BF16 * 2 * self.T_sp * m.hidden_size, 3)
        return f + ef, b + eb, w

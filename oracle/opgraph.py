"""One decoder layer (and the embedding / output head) as a list of ops: the one description of a layer
that simulate timing prices (oracle.compute), the FLOP count checks against (oracle.flops) and benchmark
mode names its measurements by.

An op is what one rank runs for one micro-batch: a GEMM [m x k] @ [k x n] (``groups`` of them for the
grouped expert GEMMs), the flash-attention core, or a memory-bound kernel group (norms, RoPE, residual
adds, activations, permutes, FP8/FP4 quantise casts) with the bytes it moves. Each op also says how
many framework-level operations the host issues for it (``host_ops``: Python/autograd calls of
Megatron-Core + Transformer Engine, each costing the profile's ``efficiency.host_op_s``) and how many
extra device launches a C++ loop issues (``loop_launches``: Transformer Engine's GroupedLinear runs one
GEMM per local expert; each costs ``efficiency.kernel_launch_s`` of host time). The host counts are
engineering counts read off Megatron-Core's TransformerLayer / MoELayer with TE modules (core 0.12-0.14):
they set the *shape* of the host cost (MoE layers issue ~3x a dense layer's ops, expert loops scale with
the local experts); its *scale* is the fitted ``host_op_s`` of each GPU generation (docs/kernel-model.md).

Shapes follow Megatron-Core: T = mbs*seq/cp tokens per rank; TP-split GEMMs see all T tokens
(sequence-parallel regions are gathered first), norms/residuals see T/tp with SP.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import ceil

BF16 = 2
FP32 = 4
FP8 = 1

GEMM, ATTENTION, MEMORY = "gemm", "attention", "memory"
PRE_SYNC, POST_SYNC = 0, 1
"""Forward segments of an MoE layer: ops before / after the dispatcher's device-to-host sync."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One op of one micro-batch on one rank."""

    name: str
    """Stable op name (``qkv``, ``attn_core``, ``experts_up`` ...): benchmark mode keys its timings by it."""
    kind: str
    """``gemm`` | ``attention`` | ``memory``."""
    m: int = 0
    """GEMM rows (tokens) of ONE group."""
    n: int = 0
    """GEMM output columns."""
    k: int = 0
    """GEMM reduction length."""
    groups: int = 1
    """Independent GEMMs of the same shape (local experts)."""
    dtype: str = "bf16"
    """GEMM input precision: bf16 | fp8 | fp4."""
    has_wgrad: bool = True
    """The GEMM has a trainable weight (a weight-gradient GEMM in backward)."""
    batch_heads: int = 0
    """Attention: mbs x local query heads."""
    s_q: int = 0
    """Attention: queries per head on this rank."""
    s_k: float = 0.0
    """Attention: average keys per query (causal ~ s/2, window w)."""
    d_qk: int = 0
    """Attention: Q/K head dim."""
    d_v: int = 0
    """Attention: V head dim."""
    bytes_f: float = 0.0
    """Memory-bound op: bytes read + written in forward (backward moves ~2x)."""
    kernels: int = 1
    """Device kernels the op launches in forward (memory-bound ops: each costs at least a launch gap)."""
    host_ops: int = 1
    """Framework-level operations the host issues in forward (the backward issues as many autograd nodes)."""
    loop_launches: int = 0
    """Extra launches issued from a C++ loop in forward (per-expert GEMMs); backward issues 2x."""
    segment: int = PRE_SYNC
    """Forward segment relative to the MoE dispatcher's device-to-host sync."""

    @property
    def flops_f(self) -> float:
        """Forward FLOPs actually executed (attention: causal average keys, QK^T and PV)."""
        if self.kind == GEMM:
            return 2.0 * self.groups * self.m * self.n * self.k
        if self.kind == ATTENTION:
            return 2.0 * self.batch_heads * self.s_q * self.s_k * (self.d_qk + self.d_v)
        return 0.0


def avg_keys(seq: int, window: int | None) -> float:
    """Average keys per query under a causal mask, optionally within a sliding window."""
    if window is None or window >= seq:
        return (seq + 1) / 2.0
    return (window * (window + 1) / 2.0 + (seq - window) * window) / seq


@dataclass(frozen=True, slots=True, kw_only=True)
class Shapes:
    """The per-rank sizes every op builder needs (from a RunConfig)."""

    T: int
    """Tokens per micro-batch on this rank (mbs*seq/cp)."""
    T_sp: int
    """Tokens in sequence-parallel regions (T/tp with SP)."""
    tp: int
    cp: int
    ep: int
    etp: int
    mbs: int
    seq_len: int
    dtype: str
    """Decoder-layer GEMM precision: bf16 | fp8 | fp4."""
    moe_imbalance: float = 1.0

    @classmethod
    def of(cls, run) -> "Shapes":
        t = run.training
        T = t.mbs * t.seq_len // t.cp
        return cls(T=T, T_sp=T // t.tp if t.sp else T, tp=t.tp, cp=t.cp, ep=t.ep, etp=t.etp, mbs=t.mbs,
                   seq_len=t.seq_len, dtype=t.gemm_dtype, moe_imbalance=t.moe_imbalance)


def _cast_bytes(dtype: str, elems: float) -> float:
    """Quantise-cast traffic for low-precision GEMM inputs: read bf16, write fp8/fp4 (+scales)."""
    if dtype == "fp8":
        return 3.0 * elems
    if dtype == "fp4":
        return 2.5 * elems + elems / 16  # bf16 read, 0.5 B write, one fp8 scale per 16 (NVFP4)
    return 0.0


def attention_ops(card, s: Shapes, window: int | None) -> list[Op]:
    """Input norm, QKV (or MLA projections), RoPE, core attention, output projection, residual."""
    H, tp, T, Tsp, dt = card.hidden_size, s.tp, s.T, s.T_sp, s.dtype
    ops: list[Op] = [Op(name="attn_norm", kind=MEMORY, bytes_f=BF16 * 2 * Tsp * H, host_ops=1)]
    if card.attention == "mla":
        rope = card.qk_rope_head_dim or 0
        if card.q_lora_rank:
            ops += [Op(name="q_down", kind=GEMM, m=T, n=card.q_lora_rank, k=H, dtype=dt, host_ops=2),
                    Op(name="q_up", kind=GEMM, m=T, n=card.q_width // tp, k=card.q_lora_rank, dtype=dt, host_ops=2)]
        else:
            ops.append(Op(name="q_proj", kind=GEMM, m=T, n=card.q_width // tp, k=H, dtype=dt, host_ops=2))
        ops += [Op(name="kv_down", kind=GEMM, m=T, n=card.kv_lora_rank + rope, k=H, dtype=dt, host_ops=2),
                Op(name="kv_up", kind=GEMM, m=T, n=card.kv_width // tp, k=card.kv_lora_rank, dtype=dt, host_ops=2)]
        d_qk, d_v = (card.qk_nope_head_dim or 0) + rope, card.v_head_dim or 0
        qk_elems = T * card.q_width / tp
        in_elems = T * H * 2 + T * (card.q_lora_rank or 0) + T * card.kv_lora_rank
    else:
        qkv_n = (card.q_width + 2 * card.kv_heads * card.head_size) // tp
        ops.append(Op(name="qkv", kind=GEMM, m=T, n=qkv_n, k=H, dtype=dt, host_ops=2))
        d_qk = d_v = card.head_size
        qk_elems = T * (card.q_width + card.kv_heads * d_qk) / tp
        in_elems = T * H
    if card.qk_layernorm:
        ops.append(Op(name="qk_norm", kind=MEMORY, bytes_f=BF16 * 2 * qk_elems, kernels=2, host_ops=2))
    ops.append(Op(name="rope", kind=MEMORY, bytes_f=BF16 * 2 * qk_elems, host_ops=2))
    ops.append(Op(name="attn_core", kind=ATTENTION, batch_heads=s.mbs * (card.num_attention_heads // tp),
                  s_q=s.seq_len // s.cp, s_k=avg_keys(s.seq_len, window), d_qk=d_qk, d_v=d_v, host_ops=3))
    ops.append(Op(name="attn_out", kind=GEMM, m=T, n=H, k=card.attn_out_width // tp, dtype=dt, host_ops=2))
    if dt != "bf16":
        ops.append(Op(name="attn_quant", kind=MEMORY, bytes_f=_cast_bytes(dt, in_elems + T * card.attn_out_width / tp),
                      kernels=2, host_ops=2))
    ops.append(Op(name="attn_residual", kind=MEMORY, bytes_f=BF16 * 3 * Tsp * H, host_ops=1))
    return ops


def mlp_ops(card, s: Shapes, ffn: int, tokens: int, prefix: str = "mlp", segment: int = PRE_SYNC) -> list[Op]:
    """A TP-split (gated) MLP over ``tokens`` gathered tokens: up, activation, down (+ quantise casts)."""
    H, tp, dt = card.hidden_size, s.tp, s.dtype
    up = (2 if card.gated else 1) * ffn // tp
    ops = [Op(name=f"{prefix}_up", kind=GEMM, m=tokens, n=up, k=H, dtype=dt, host_ops=2, segment=segment),
           Op(name=f"{prefix}_act", kind=MEMORY, bytes_f=BF16 * tokens * ffn / tp * (3 if card.gated else 2),
              host_ops=1, segment=segment),
           Op(name=f"{prefix}_down", kind=GEMM, m=tokens, n=H, k=ffn // tp, dtype=dt, host_ops=2, segment=segment)]
    if dt != "bf16":
        ops.append(Op(name=f"{prefix}_quant", kind=MEMORY, bytes_f=_cast_bytes(dt, tokens * (H + ffn / tp)),
                      kernels=2, host_ops=2, segment=segment))
    return ops


def moe_pairs(card, s: Shapes) -> float:
    """(token, expert) pairs the busiest rank's local experts process per micro-batch (paper Sec. 4.10):
    the SP shard's tokens x top-k x ETP, times the imbalance."""
    return s.T_sp * card.moe_topk * s.etp * s.moe_imbalance


def moe_ops(card, s: Shapes) -> list[Op]:
    """Router + top-k, permute, grouped expert GEMMs (busiest rank, paper Sec. 4.10), unpermute, shared
    experts. The dispatcher's device-to-host sync splits the forward after the router."""
    H, dt = card.hidden_size, s.dtype
    tokens = s.T_sp  # the router and dispatcher work on the sequence-parallel shard
    E_local = card.num_experts // s.ep
    pairs = moe_pairs(card, s)
    m_e = max(1, ceil(pairs / E_local))
    ffn_l = card.expert_ffn // s.etp
    up = (2 if card.gated else 1) * ffn_l
    ops = [Op(name="mlp_norm", kind=MEMORY, bytes_f=BF16 * 2 * tokens * H, host_ops=1),
           # router logits GEMM runs in bf16/fp32 in Megatron; its weight is tiny, dgrad and wgrad both run
           Op(name="router", kind=GEMM, m=tokens, n=card.num_experts, k=H, dtype="bf16", host_ops=2),
           # softmax/sigmoid, top-k, score normalisation, aux loss, token counts per expert
           Op(name="router_topk", kind=MEMORY, bytes_f=FP32 * 3 * tokens * card.num_experts, kernels=6, host_ops=14),
           # permute + unpermute copies (k*T*H each way) after the sync, plus sort/unsort by local expert
           Op(name="permute", kind=MEMORY, bytes_f=BF16 * 2 * (tokens * H + pairs * H), kernels=6, host_ops=12,
              segment=POST_SYNC),
           Op(name="experts_up", kind=GEMM, m=m_e, n=up, k=H, groups=E_local, dtype=dt, host_ops=2,
              loop_launches=E_local, segment=POST_SYNC),
           Op(name="experts_act", kind=MEMORY, bytes_f=BF16 * pairs * ffn_l * (3 if card.gated else 2), host_ops=1,
              segment=POST_SYNC),
           Op(name="experts_down", kind=GEMM, m=m_e, n=H, k=ffn_l, groups=E_local, dtype=dt, host_ops=2,
              loop_launches=E_local, segment=POST_SYNC)]
    if dt != "bf16":
        ops.append(Op(name="experts_quant", kind=MEMORY, bytes_f=_cast_bytes(dt, pairs * (H + ffn_l)), kernels=2,
                      host_ops=2, loop_launches=2 * E_local, segment=POST_SYNC))
    if card.num_shared_experts:
        ops += mlp_ops(card, s, card.shared_ffn, s.T, prefix="shared", segment=POST_SYNC)
    ops.append(Op(name="mlp_residual", kind=MEMORY, bytes_f=BF16 * 3 * tokens * H, host_ops=1, segment=POST_SYNC))
    return ops


def dense_mlp_block_ops(card, s: Shapes) -> list[Op]:
    """Post-attention norm, dense MLP, second residual add."""
    H = card.hidden_size
    return ([Op(name="mlp_norm", kind=MEMORY, bytes_f=BF16 * 2 * s.T_sp * H, host_ops=1)]
            + mlp_ops(card, s, card.ffn_hidden_size or 0, s.T)
            + [Op(name="mlp_residual", kind=MEMORY, bytes_f=BF16 * 3 * s.T_sp * H, host_ops=1)])


def layer_ops(card, s: Shapes, kind: str, window: int | None = None) -> list[Op]:
    """Every op of one decoder layer (``kind`` 'dense' or 'moe') for one micro-batch on one rank."""
    mlp = moe_ops(card, s) if kind == "moe" else dense_mlp_block_ops(card, s)
    return attention_ops(card, s, window) + mlp


def embedding_ops(card, s: Shapes) -> list[Op]:
    """Embedding lookup (gather + write); backward scatter-adds into the fp32 gradient (~2x bytes)."""
    return [Op(name="embedding", kind=MEMORY, bytes_f=BF16 * 2 * s.T_sp * card.hidden_size, host_ops=2)]


def output_ops(card, s: Shapes, vocab_local: int, loss_fusion: bool) -> list[Op]:
    """Final norm, logits GEMM (bf16, as Megatron keeps the output layer in high precision), cross-entropy."""
    T = s.T
    ce = BF16 * T * vocab_local * (2 if loss_fusion else 1) + (0 if loss_fusion else FP32 * 2 * T * vocab_local)
    return [Op(name="final_norm", kind=MEMORY, bytes_f=BF16 * 2 * s.T_sp * card.hidden_size, host_ops=1),
            Op(name="logits", kind=GEMM, m=T, n=vocab_local, k=card.hidden_size, dtype="bf16", host_ops=2),
            Op(name="loss", kind=MEMORY, bytes_f=ce, kernels=2, host_ops=4)]


def forward_flops(ops: list[Op]) -> float:
    """Forward FLOPs the ops execute (GEMMs + attention as run, causal)."""
    return sum(op.flops_f for op in ops)

"""Per-module memory of one GPU: parameters held and activations saved per micro-batch.

Each decoder layer, the embedding and the output head is a ``Block`` of ``Module``s, and each
module lists the tensors autograd keeps for its backward pass (``Tensor``), as Megatron-Core with
Transformer Engine (TE) keeps them. Symbols (one micro-batch, one GPU):

    T   = mbs * seq_len / cp      tokens of the micro-batch on this context-parallel rank
    Ts  = T / tp with sequence parallelism (SP), else T   (norm / residual / GEMM-input regions)
    H hidden, a heads, g KV groups, d head dim, F FFN, F_e expert FFN, E experts, k top-k, V padded vocab
    B_g = 1 with fp8_activations else 2   (TE saves GEMM inputs in FP8; paper App. B.1's B_act)

Byte sizes: bf16 2, fp32 4, int64 8, dropout mask 1 (torch bool). Sources are cited per formula;
"K22" is Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198), Sec. 4.1: 34sbh + 5as^2b bytes per GPT layer, which this accounting reproduces
exactly under ``MemoryAssumptions(flash_attention=False, dropout=True)`` (tests/oracle/test_memory.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.model_card import ModelCard

BF16, FP32, INT64, MASK = 2, 4, 8, 1
"""Bytes per element: bf16 tensors, fp32 tensors, int64 token ids, torch.bool dropout masks."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryAssumptions:
    """Modelling choices that are not training-config keys (defaults = Megatron-Core + TE today)."""

    flash_attention: bool = True
    """Fused attention keeps Q, K, V, the output and an fp32 logsumexp; False materialises the
    a x s x s softmax (K22's 2as^2b, plus 3as^2b with dropout)."""
    dropout: bool = False
    """Dropout after attention/MLP and on attention probabilities (modern LLM recipes use 0, and
    torch's dropout with p=0 keeps no mask)."""
    loss_fp32_scratch: bool = True
    """Unfused cross entropy keeps an fp32 softmax of T x V/tp (paper App. B.1), counted in other_bytes."""
    router_fp32: bool = True
    """Router logits and probabilities are kept in fp32 (Megatron moe_router_dtype=fp32)."""
    fsdp_prefetch_units: int = 2
    """FSDP: unsharded units (layers / embedding / head) alive at once: the current one + one prefetched."""
    fsdp_unsharded_grad: bool = True
    """FSDP: one unit's unsharded fp32 gradient exists before its reduce-scatter."""
    fp8_weight_cache: bool = True
    """precision=fp8 (nvfp4): TE caches each GEMM weight in FP8 (NVFP4) row- and column-wise (2 x 1 B,
    2 x 0.5625 B) across the micro-batches of a step (Megatron passes is_first_microbatch); not with FSDP."""
    deepep_nvl_tokens_per_peer: int = 2560
    """DeepEP NVLink buffer, in H-wide bf16 tokens per intra-node peer: 10 channels x 256 receive
    tokens (DeepEP's default dispatch Config(20 SMs, 6, 256, 6, 128), get_nvl_buffer_size_hint)."""
    deepep_rdma_tokens_per_node: int = 2560
    """DeepEP RDMA buffer when the EP group spans nodes: 10 channels x 128 tokens x 2 (send + receive)."""


DEFAULT = MemoryAssumptions()


@dataclass(frozen=True, slots=True)
class Tensor:
    """One saved tensor of one module (bytes per micro-batch)."""

    name: str
    bytes: float
    core_attention: bool = False
    """Part of core attention (softmax / logsumexp): dropped by selective recompute."""


@dataclass(frozen=True, slots=True)
class Module:
    """One module: parameters on this GPU and the tensors it saves for backward."""

    name: str
    params: float
    tensors: tuple[Tensor, ...] = ()
    expert: bool = False
    """Routed-expert weights (optimizer sharded over expert data parallel, edp)."""
    gemm: bool = False
    """Weights are TE GEMM weights (FP8 weight cache applies)."""


@dataclass(frozen=True, slots=True)
class Block:
    """A decoder layer, the embedding, the output head or an MTP module, with its sums."""

    name: str
    modules: tuple[Module, ...]
    params_dense: float
    params_expert: float
    gemm_params: float
    act_none: float
    """Saved bytes per micro-batch without recompute."""
    act_selective: float
    """Saved bytes with core attention recomputed (Megatron 'selective')."""
    checkpoint_bytes: float
    """Saved bytes under full recompute: the bf16 layer input only."""

    @property
    def params(self) -> float:
        return self.params_dense + self.params_expert

    def act(self, policy: str) -> float:
        """Saved bytes per micro-batch under 'none', 'selective' or 'checkpoint'."""
        if policy == "checkpoint":
            return self.checkpoint_bytes
        return self.act_selective if policy == "selective" else self.act_none


def make_block(name: str, modules: tuple[Module, ...], checkpoint_bytes: float) -> Block:
    none = sum(t.bytes for m in modules for t in m.tensors)
    core = sum(t.bytes for m in modules for t in m.tensors if t.core_attention)
    return Block(name, modules,
                 params_dense=sum(m.params for m in modules if not m.expert),
                 params_expert=sum(m.params for m in modules if m.expert),
                 gemm_params=sum(m.params for m in modules if m.gemm),
                 act_none=none, act_selective=none - core, checkpoint_bytes=checkpoint_bytes)


@dataclass(frozen=True, slots=True)
class Shape:
    """Everything besides the card that sizes a block (hashable: the block cache key)."""

    tokens: float
    """T = mbs * seq_len / cp."""
    seq_tokens: float
    """Ts = T / tp with SP, else T."""
    seq_len: int
    tp: int
    ep: int
    etp: int
    b_gemm: int
    """Bytes per saved GEMM input (1 with fp8_activations, else 2)."""
    moe_imbalance: float
    assumptions: MemoryAssumptions


def shape_of(run: RunConfig, assumptions: MemoryAssumptions = DEFAULT) -> Shape:
    t = run.training
    tokens = t.mbs * t.seq_len / t.cp
    return Shape(tokens=tokens, seq_tokens=tokens / t.tp if t.sp else tokens, seq_len=t.seq_len,
                 tp=t.tp, ep=t.ep, etp=t.etp, b_gemm=1 if t.fp8_activations else BF16,
                 moe_imbalance=t.moe_imbalance, assumptions=assumptions)


# ---------------------------------------------------------------------------------- parameters
def _kv_heads_per_rank(card: ModelCard, tp: int) -> float:
    """KV heads on one TP rank; with tp > g Megatron replicates one group per rank."""
    g = card.kv_heads
    return g / tp if g >= tp else 1.0


def attention_params_per_gpu(card: ModelCard, tp: int) -> float:
    """Attention weights without the input norm: TP-split linears, replicated norms/row-parallel bias."""
    h = card.hidden_size
    if card.attention == "mla":
        # Megatron MLA: q/kv down-projections and latent norms are duplicated over TP
        # (TELinear parallel_mode='duplicated'); q_up/kv_up column- and out row-parallel.
        ql, kvl, rope = card.q_lora_rank, card.kv_lora_rank or 0, card.qk_rope_head_dim or 0
        rep = h * (kvl + rope) + card.norm_params(kvl)
        split = kvl * card.kv_width + card.attn_out_width * h
        if ql:
            rep += h * ql + card.norm_params(ql)
            split += ql * card.q_width
        else:
            split += h * card.q_width
        return rep + split / tp
    qkv_out = card.q_width / tp + 2 * _kv_heads_per_rank(card, tp) * card.head_size
    p = h * qkv_out + card.attn_out_width / tp * h
    if card.linear_bias or card.qkv_bias:
        p += qkv_out
    if card.linear_bias:
        p += h  # row-parallel output bias is replicated
    if card.qk_layernorm:
        p += 2 * card.norm_params(card.head_size)
    if card.attention_sinks:
        p += card.num_attention_heads / tp
    return p


def mlp_params_per_gpu(card: ModelCard, ffn: float, tp: int) -> float:
    """One MLP / expert of width ``ffn`` split over ``tp`` (fc1 column-, fc2 row-parallel)."""
    up = 2 if card.gated else 1
    p = (up + 1) * card.hidden_size * ffn / tp
    if card.linear_bias:
        p += up * ffn / tp + card.hidden_size  # fc2 bias replicated
    return p


# ---------------------------------------------------------------------------------- modules
def _norm(card: ModelCard, s: Shape, name: str) -> Module:
    # norm input, sequence-sharded under SP (K22 "LayerNorm: 2sbh" each)
    return Module(name, card.norm_params(card.hidden_size), (Tensor("input", s.seq_tokens * card.hidden_size * BF16),))


def _residual(card: ModelCard, s: Shape, name: str) -> Module:
    # bias-dropout-add keeps only the dropout mask (K22 "dropout mask: sbh"); the add saves nothing
    t = (Tensor("dropout_mask", s.seq_tokens * card.hidden_size * MASK),) if s.assumptions.dropout else ()
    return Module(name, 0.0, t)


def _attention(card: ModelCard, s: Shape) -> Module:
    T, Ts, h, A = s.tokens, s.seq_tokens, card.hidden_size, s.assumptions
    a_r = card.num_attention_heads / s.tp
    # QKV GEMM input = norm output (K22 "QKV input 2sbh"; SP keeps it sequence-sharded)
    t = [Tensor("qkv_input", Ts * h * s.b_gemm)]
    if card.attention == "mla":
        ql, kvl = card.q_lora_rank, card.kv_lora_rank or 0
        if ql:  # q_norm input and q_up GEMM input (Megatron MLA, down-projection on the SP shard)
            t += [Tensor("q_latent", Ts * ql * BF16), Tensor("q_up_input", Ts * ql * s.b_gemm)]
        t += [Tensor("kv_latent", Ts * kvl * BF16), Tensor("kv_up_input", Ts * kvl * s.b_gemm)]
        nope, rope, dv = card.qk_nope_head_dim or 0, card.qk_rope_head_dim or 0, card.v_head_dim or 0
        q_w = k_w = a_r * (nope + rope)  # up-projected Q and K (rope part broadcast to every head)
        v_w = ctx_w = a_r * dv
    else:
        d = card.head_size
        q_w = ctx_w = a_r * d
        k_w = v_w = _kv_heads_per_rank(card, s.tp) * d
        if card.qk_layernorm:  # per-head q/k norm inputs (Qwen3)
            t += [Tensor("q_norm_input", T * q_w * BF16), Tensor("k_norm_input", T * k_w * BF16)]
    # Q, K, V kept by core attention (K22 "QK^T: 4sbh", "V: 2sbh")
    t += [Tensor("q", T * q_w * BF16), Tensor("k", T * k_w * BF16), Tensor("v", T * v_w * BF16)]
    if A.flash_attention:
        # flash attention keeps an fp32 logsumexp per (head, token) (TE softmax_lse, b x a/tp x s/cp)
        t.append(Tensor("softmax_lse", a_r * T * FP32, core_attention=True))
    else:
        scores = a_r * T * s.seq_len  # (a/tp) x b x (s/cp) x s score matrix
        t.append(Tensor("softmax_output", scores * BF16, core_attention=True))  # K22 "softmax output: 2as^2b"
        if A.dropout:  # K22 "softmax dropout mask as^2b" + "dropout output 2as^2b"
            t += [Tensor("attn_dropout_mask", scores * MASK, core_attention=True),
                  Tensor("attn_dropout_output", scores * BF16, core_attention=True)]
    # output-projection GEMM input (K22 "linear projection: 2sbh")
    t.append(Tensor("context", T * ctx_w * s.b_gemm))
    return Module("self_attention", attention_params_per_gpu(card, s.tp), tuple(t), gemm=True)


def _mlp_tensors(card: ModelCard, tokens: float, ffn_r: float, s: Shape) -> list[Tensor]:
    up = 2 if card.gated else 1
    # fc1 output = activation input (K22 GeLU input 8sbh; SwiGLU keeps gate+up 2F)
    # activation output = fc2 GEMM input (K22 "8sbh")
    return [Tensor("fc1_output", tokens * up * ffn_r * BF16), Tensor("act_output", tokens * ffn_r * s.b_gemm)]


def _dense_mlp(card: ModelCard, s: Shape) -> Module:
    ffn = card.ffn_hidden_size or 0
    # fc1 GEMM input = norm output (K22 "2sbh", SP-sharded)
    t = [Tensor("fc1_input", s.seq_tokens * card.hidden_size * s.b_gemm)] + _mlp_tensors(card, s.tokens, ffn / s.tp, s)
    return Module("mlp", mlp_params_per_gpu(card, ffn, s.tp), tuple(t), gemm=True)


def _moe_modules(card: ModelCard, s: Shape) -> list[Module]:
    h, E, k, A = card.hidden_size, card.num_experts, card.moe_topk, s.assumptions
    Tr = s.seq_tokens  # tokens this GPU routes (Megatron MoE with tp > 1 requires SP)
    rb = FP32 if A.router_fp32 else BF16
    # router GEMM input = pre-MLP norm output (the same tensor feeds dispatch and shared experts);
    # logits and probabilities T x E (fp32)
    router = Module("router", card.router_params(), (
        Tensor("router_input", Tr * h * BF16), Tensor("router_logits", Tr * E * rb),
        Tensor("router_probs", Tr * E * rb)))
    # the combine needs only the routing map (probs are applied in the expert activation,
    # Megatron-Core weighted SwiGLU), so no k*T*H copy is saved on the way back
    dispatcher = Module("token_dispatcher", 0.0, (Tensor("routing_map", Tr * E * MASK),))
    # uniform routing: each GPU of the EP group receives k x its routed tokens on average; ETP
    # all-gathers them over the etp ranks of an expert; the busiest rank gets moe_imbalance x that
    Te = k * Tr * s.etp * s.moe_imbalance
    fe_r = card.expert_ffn / s.etp
    t = [Tensor("expert_fc1_input", Te * h * s.b_gemm), Tensor("expert_probs", Te * FP32)] + _mlp_tensors(card, Te, fe_r, s)
    experts = Module("experts", E / s.ep * mlp_params_per_gpu(card, card.expert_ffn, s.etp), tuple(t),
                     expert=True, gemm=True)
    mods = [router, dispatcher, experts]
    if card.num_shared_experts:
        sh = card.shared_ffn
        # fc1 input is the router input tensor (bf16: no extra copy; fp8: TE keeps an FP8 cast)
        st = ([Tensor("fc1_input_fp8", Tr * h * s.b_gemm)] if s.b_gemm != BF16 else []) + _mlp_tensors(card, s.tokens, sh / s.tp, s)
        mods.append(Module("shared_experts", mlp_params_per_gpu(card, sh, s.tp), tuple(st), gemm=True))
    return mods


def _layer(card: ModelCard, s: Shape, kind: str) -> Block:
    h = card.hidden_size
    mods = [_norm(card, s, "input_norm"), _attention(card, s), _residual(card, s, "attention_residual"),
            _norm(card, s, "pre_mlp_norm")]
    mods += _moe_modules(card, s) if kind == "moe" else [_dense_mlp(card, s)]
    mods.append(_residual(card, s, "mlp_residual"))
    # full recompute keeps only the bf16 layer input, SP-sharded (paper B.1: MBS x S/(TP*CP) x H)
    return make_block(f"{kind}_layer", tuple(mods), checkpoint_bytes=s.seq_tokens * h * BF16)


def _embedding(card: ModelCard, s: Shape) -> Block:
    pos = card.max_seq_len * card.hidden_size if card.position_embedding == "learned" else 0
    # vocab-parallel lookup keeps its int64 token ids; its output is layer 0's saved norm input
    m = Module("embedding", card.padded_vocab(s.tp) * card.hidden_size / s.tp + pos,
               (Tensor("token_ids", s.tokens * INT64),))
    return make_block("embedding", (m,), 0.0)


def _head_modules(card: ModelCard, s: Shape, holds_weight: bool, prefix: str = "") -> list[Module]:
    h, v_r = card.hidden_size, card.padded_vocab(s.tp) / s.tp
    return [_norm(card, s, f"{prefix}final_norm"),
            # output GEMM input (bf16: Megatron runs the head outside the FP8 region), logits
            # T x V/tp kept (bf16) by the cross entropy, per-token fp32 loss
            Module(f"{prefix}output_layer", v_r * h if holds_weight else 0.0,
                   (Tensor("input", s.seq_tokens * h * BF16), Tensor("logits", s.tokens * v_r * BF16))),
            Module(f"{prefix}loss", 0.0, (Tensor("per_token_loss", s.tokens * FP32),))]


def _head(card: ModelCard, s: Shape, holds_weight: bool) -> Block:
    return make_block("output_head", tuple(_head_modules(card, s, holds_weight)), 0.0)


def _scaled(mods: list[Module], n: int) -> tuple[Module, ...]:
    if n == 1:
        return tuple(mods)
    return tuple(Module(m.name, m.params * n, tuple(Tensor(t.name, t.bytes * n, t.core_attention) for t in m.tensors),
                        m.expert, m.gemm) for m in mods)


def _mtp(card: ModelCard, s: Shape, kind: str) -> tuple[Block, Block]:
    """DeepSeek-V3 MTP modules (Megatron MultiTokenPredictionLayer) x card.mtp_layers, on the output
    stage: the recomputable part (norms, eh_proj, one layer) and its head (shares the output weight)."""
    h, Ts, n = card.hidden_size, s.seq_tokens, card.mtp_layers
    layer = _layer(card, s, kind)
    mods = [Module("mtp_embedding_lookup", 0.0, (Tensor("token_ids", s.tokens * INT64),)),
            Module("mtp_norms", 2 * card.norm_params(h), (Tensor("enorm_input", Ts * h * BF16),
                                                          Tensor("hnorm_input", Ts * h * BF16))),
            Module("mtp_eh_proj", 2 * h * h / s.tp, (Tensor("input", Ts * 2 * h * BF16),), gemm=True)]
    mods += [Module(f"mtp_layer.{m.name}", m.params, m.tensors, m.expert, m.gemm) for m in layer.modules]
    # full recompute checkpoints the MTP layer's hidden-state input (Megatron MTP _checkpointed_forward)
    body = make_block(f"mtp x{n}", _scaled(mods, n), layer.checkpoint_bytes * n)
    head = make_block(f"mtp_head x{n}", _scaled(_head_modules(card, s, holds_weight=False, prefix="mtp_"), n), 0.0)
    return body, head


@dataclass(frozen=True, slots=True)
class Blocks:
    """The blocks of a model at one shape (cached per (card, shape))."""

    dense: Block
    moe: Block | None
    embedding: Block
    head: Block
    """Final norm + output layer holding the output weight + loss."""
    head_no_weight: Block
    """Same without the output weight (tied, on the embedding's own chunk)."""
    mtp: Block | None
    """MTP norms, projection and layer (recomputable)."""
    mtp_head: Block | None
    """MTP final norms, logits and losses (kept, like the main head)."""

    def layer(self, kind: str) -> Block:
        return self.moe if kind == "moe" else self.dense  # type: ignore[return-value]


@lru_cache(maxsize=2048)
def blocks(card: ModelCard, s: Shape) -> Blocks:
    mtp = _mtp(card, s, "moe" if card.is_moe else "dense") if card.mtp_layers else (None, None)
    return Blocks(dense=_layer(card, s, "dense"), moe=_layer(card, s, "moe") if card.is_moe else None,
                  embedding=_embedding(card, s), head=_head(card, s, True),
                  head_no_weight=_head(card, s, False), mtp=mtp[0], mtp_head=mtp[1])


def layer_activation_bytes(run: RunConfig, kind: str, *, recompute: str | None = None,
                           assumptions: MemoryAssumptions = DEFAULT) -> float:
    """Saved bytes of one ``kind`` ('dense' | 'moe') layer for one micro-batch on one GPU.

    ``recompute`` defaults to the run's; 'full' gives the checkpointed layer input only.
    """
    if kind not in ("dense", "moe"):
        raise InvalidConfigError(f"kind={kind!r} must be 'dense' or 'moe'")
    if kind == "moe" and not run.model.is_moe:
        raise InvalidConfigError(f"kind='moe' but {run.model.name} is a dense model")
    rc = recompute or run.training.recompute
    if rc not in ("none", "selective", "full"):
        raise InvalidConfigError(f"recompute={rc!r} must be none, selective or full")
    b = blocks(run.model, shape_of(run, assumptions)).layer(kind)
    return b.act("checkpoint" if rc == "full" else rc)

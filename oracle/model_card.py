"""Model cards: the architecture facts the projector needs, and their parameter counts.

Cards are YAML files in ``oracle/models/`` (file name = key), a path to a card YAML, or a path to
a Hugging Face ``config.json`` (imported by :mod:`oracle.hf_import`). A card with ``based_on: NAME`` is that
bundled card with its own keys over it (a variant: other layer counts or widths). Parameter formulas live here,
once, and are used both for the published-figure test and for the memory model.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from oracle.errors import InvalidConfigError, PrimusError, clip
from oracle.registry import YamlRegistry
from oracle.schema import from_dict, to_dict
from oracle.yamlio import load_mapping

MODEL_DIR = Path(__file__).resolve().parent / "models"

Activation = Literal["swiglu", "geglu", "gelu", "squared_relu", "relu"]
GATED = ("swiglu", "geglu")
HYBRID_SYMBOLS: dict[str, str] = {"M": "mamba", "G": "gdn", "*": "attention", "-": "mlp", "E": "moe_mlp"}
"""Megatron-Core hybrid layer pattern symbols (megatron/core/models/hybrid/hybrid_layer_allocation.py Symbols) and
the layer kind each is: a Mamba-2 mixer, a Gated DeltaNet mixer, an attention-only layer, an MLP-only layer, a
MoE-only layer."""
HYBRID_UNMODELLED: dict[str, str] = {"D": "DeepSeek sparse attention", "+": "MLA", "/": "MTP patterns"}
"""Pattern symbols Megatron-Core takes that this oracle does not model."""
LAYER_KINDS: tuple[str, ...] = ("dense", "moe", "mamba", "gdn", "attention", "mlp", "moe_mlp")
"""Every decoder layer kind: a transformer layer with a dense MLP or a MoE block, and the hybrid kinds."""
HYBRID_KINDS: tuple[str, ...] = tuple(HYBRID_SYMBOLS.values())
"""The layer kinds only a hybrid model has."""
MOE_KINDS = frozenset({"moe", "moe_mlp"})
"""Layer kinds with a MoE block (router, dispatcher, experts)."""
ATTENTION_KINDS = frozenset({"dense", "moe", "attention"})
"""Layer kinds with an attention block."""
_LAYERS, _WIDTH, _FFN, _HEADS, _CONTEXT = 10_000, 2**20, 2**22, 2**16, 2**30
MAX_SIZES: dict[str, int] = {
    "num_layers": _LAYERS, "first_dense_layers": _LAYERS, "moe_layer_freq": _LAYERS, "mtp_layers": _LAYERS,
    "sliding_window_every": _LAYERS, "hidden_size": _WIDTH, "q_lora_rank": _WIDTH, "kv_lora_rank": _WIDTH,
    "ffn_hidden_size": _FFN, "moe_ffn_hidden_size": _FFN, "shared_expert_ffn_hidden_size": _FFN,
    "num_attention_heads": _HEADS, "num_query_groups": _HEADS, "head_dim": _HEADS, "qk_nope_head_dim": _HEADS,
    "qk_rope_head_dim": _HEADS, "v_head_dim": _HEADS, "num_experts": _HEADS, "num_shared_experts": _HEADS,
    "moe_topk": _HEADS, "vocab_size": 2**24, "make_vocab_size_divisible_by": 2**24, "max_seq_len": _CONTEXT,
    "sliding_window": _CONTEXT, "mamba_num_heads": _HEADS, "mamba_head_dim": _HEADS, "mamba_state_dim": _HEADS,
    "mamba_num_groups": _HEADS, "mamba_conv_kernel": _HEADS, "mamba_chunk_size": _CONTEXT, "moe_latent_size": _WIDTH,
    "gdn_num_key_heads": _HEADS, "gdn_num_value_heads": _HEADS, "gdn_key_head_dim": _HEADS,
    "gdn_value_head_dim": _HEADS, "gdn_conv_kernel": _HEADS,
}
"""Largest accepted value of each size field: about 100x the largest published model's, the bounds
oracle.hf_import.SIZE_LIMITS puts on config.json keys (a fuzzed card of 10**7 layers took 37 s to refuse,
10**9 would not end)."""


@dataclass(frozen=True, kw_only=True)
class ModelCard:
    """Architecture of a decoder-only transformer (dense, MoE, GQA/MLA, sliding window)."""

    name: str
    """Card key."""
    num_layers: int
    """Decoder layers (excluding MTP layers)."""
    hidden_size: int
    """Model width H."""
    num_attention_heads: int
    """Query heads a."""
    vocab_size: int
    """Vocabulary size before padding."""
    ffn_hidden_size: int | None = None
    """Dense-MLP intermediate size F (None for all-MoE models)."""
    num_query_groups: int | None = None
    """KV heads g (None = MHA, g = a)."""
    head_dim: int | None = None
    """Per-head dim d (None = H / a)."""
    max_seq_len: int = 4096
    """Longest trained context (informational)."""
    tied_embeddings: bool = False
    """Output layer shares the embedding matrix."""
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    """Normalisation (layernorm has a bias: 2H parameters instead of H)."""
    activation: Activation = "swiglu"
    """MLP activation; swiglu/geglu are gated (3 weight matrices instead of 2)."""
    linear_bias: bool = False
    """Linear layers carry biases."""
    qkv_bias: bool = False
    """QKV projection carries a bias even when other linears do not (Qwen2 style)."""
    qk_layernorm: bool = False
    """Per-head norm on Q and K (Qwen3) or on MLA latents (DeepSeek)."""
    position_embedding: Literal["rope", "learned", "none"] = "rope"
    """'learned' adds max_seq_len x H absolute position embeddings."""
    attention: Literal["gqa", "mla"] = "gqa"
    """'gqa' covers MHA and GQA; 'mla' is DeepSeek's multi-head latent attention."""
    q_lora_rank: int | None = None
    """MLA: query low-rank dim (None = dense Q projection)."""
    kv_lora_rank: int | None = None
    """MLA: compressed KV dim."""
    qk_nope_head_dim: int | None = None
    """MLA: non-rotary part of the Q/K head dim."""
    qk_rope_head_dim: int | None = None
    """MLA: rotary part of the Q/K head dim (K rope part shared across heads)."""
    v_head_dim: int | None = None
    """MLA: value head dim."""
    sliding_window: int | None = None
    """Sliding-window attention span in tokens (None = full causal everywhere)."""
    sliding_window_every: int = 0
    """Every n-th layer (0-based index % n == 0) uses the window; 0 = none, 1 = all."""
    attention_sinks: bool = False
    """Learnable per-head softmax sink (gpt-oss): a parameters per layer."""
    attention_output_gate: bool = False
    """Gated attention (Megatron-Core ``attention_output_gate``, Qwen3-Next): the QKV projection also produces a
    per-query-channel gate, and the attention output is multiplied by its sigmoid before the output projection."""
    num_experts: int = 0
    """Routed experts E (0 = dense model)."""
    moe_topk: int = 0
    """Experts per token k."""
    moe_ffn_hidden_size: int | None = None
    """Per-expert intermediate size F_e."""
    num_shared_experts: int = 0
    """Always-on shared experts."""
    shared_expert_ffn_hidden_size: int | None = None
    """Intermediate size of each shared expert (None = F_e)."""
    first_dense_layers: int = 0
    """Leading layers with a dense MLP instead of MoE (DeepSeek: 3)."""
    moe_layer_freq: int = 1
    """Every n-th layer after the leading dense ones is MoE (1 = all)."""
    router_bias: bool = False
    """Router has a bias (gpt-oss) or an expert-score bias (DeepSeek aux-loss-free)."""
    moe_latent_size: int | None = None
    """Latent MoE (Megatron-Core ``moe_latent_size``: Nemotron 3 Super / Ultra): the routed experts work on this width;
    a replicated H -> latent projection before the dispatch and latent -> H after the combine (MoELayer
    fc1_latent_proj / fc2_latent_proj). None: the experts work on hidden_size."""
    mtp_layers: int = 0
    """Multi-token-prediction modules (DeepSeek V3: 1), each a full decoder layer plus projection (a hybrid model's:
    an attention + MoE, or attention + MLP, transformer layer: Megatron-Core's MTP pattern ``*E`` / ``*-``)."""
    mtp_shared_weights: bool = False
    """One MTP module's weights run at every depth (Megatron-Core ``mtp_use_repeated_layer``: Nemotron 3 Super):
    its parameters are counted once, its compute and activations once per depth."""
    hybrid_pattern: str | None = None
    """Megatron-Core hybrid model (``--hybrid-layer-pattern``, HF ``hybrid_override_pattern``): one symbol per
    decoder layer, M a Mamba-2 mixer, * attention, - MLP, E MoE (:data:`HYBRID_SYMBOLS`). None: every layer is a
    transformer layer (attention + MLP or MoE)."""
    hybrid_pairs: bool = False
    """The hybrid pattern writes transformer layers as (token mixer, MLP or MoE) symbol pairs: Megatron-Core runs
    the model as a GPTModel whose layers mix with a Gated DeltaNet or attention (Qwen3-Next: experimental_attention_
    variant gated_delta_net, linear_attention_freq), so its pipeline splits whole pairs the way a GPT model's is
    split (virtual stages without '|' too), not by HybridModel's pattern rules."""
    mamba_num_heads: int | None = None
    """Mamba-2 heads (None: 2 x hidden_size / mamba_head_dim, Megatron-Core's expand = 2)."""
    mamba_head_dim: int = 64
    """Mamba-2 head dim P."""
    mamba_state_dim: int = 128
    """Mamba-2 state size N per head."""
    mamba_num_groups: int = 8
    """Mamba-2 B/C groups (shared by nheads / groups heads each)."""
    mamba_conv_kernel: int = 4
    """Depthwise causal conv1d width (d_conv)."""
    mamba_chunk_size: int = 128
    """SSD chunk length Q (Megatron-Core MambaMixer chunk_size)."""
    gdn_num_key_heads: int = 16
    """Gated DeltaNet query / key heads (Megatron-Core ``linear_num_key_heads``; HF ``linear_num_key_heads``)."""
    gdn_num_value_heads: int = 32
    """Gated DeltaNet value heads (``linear_num_value_heads``): q and k are repeated to these heads."""
    gdn_key_head_dim: int = 128
    """Gated DeltaNet query / key head dim (``linear_key_head_dim``)."""
    gdn_value_head_dim: int = 128
    """Gated DeltaNet value head dim (``linear_value_head_dim``)."""
    gdn_conv_kernel: int = 4
    """Gated DeltaNet depthwise causal conv1d width (``linear_conv_kernel_dim``)."""
    make_vocab_size_divisible_by: int = 128
    """Megatron pads the vocabulary to a multiple of this x TP."""
    published_params_billion: float | None = None
    """Published total parameter count (billions), for the card test."""
    published_active_params_billion: float | None = None
    """Published activated parameters per token (MoE), billions."""
    family: str = ""
    """Model family label."""
    sources: tuple[str, ...] = ()
    """Where each number came from."""
    aliases: tuple[str, ...] = ()
    """Other spellings published tables use for this model (the registry's loose lookup; bundled cards)."""
    notes: str = ""
    """Assumptions and caveats."""

    # ------------------------------------------------------------------ derived shapes
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def kv_heads(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def pipeline_layers(self) -> int:
        """The layers Megatron's pipeline layout keys count (decoder_first/last_pipeline_num_layers, the layout
        string's ``t``, even splits): num_layers, or the transformer layers of a ``hybrid_pairs`` card (two pattern
        positions each)."""
        return self.num_layers // self.positions_per_layer

    @property
    def positions_per_layer(self) -> int:
        """The card's layers (pattern positions) one of Megatron's pipeline layers spans: 2 for a ``hybrid_pairs``
        card (a (mixer, MLP) pair), else 1."""
        return 2 if self.hybrid_pairs else 1

    @property
    def gated(self) -> bool:
        return self.activation in GATED

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size or 0

    @property
    def expert_width(self) -> int:
        """The width the routed experts take in and give out: the latent size of a latent MoE, else hidden_size."""
        return self.moe_latent_size or self.hidden_size

    @property
    def shared_ffn(self) -> int:
        return (self.shared_expert_ffn_hidden_size or self.expert_ffn) * self.num_shared_experts

    @property
    def is_hybrid(self) -> bool:
        """A Megatron-Core hybrid model: its layers follow ``hybrid_pattern``."""
        return self.hybrid_pattern is not None

    @property
    def mixer_name(self) -> str:
        """The token mixers besides attention a hybrid model's layers use, in words ('Mamba', 'Gated DeltaNet', both
        joined by 'and'); '' for none."""
        return " and ".join(n for k, n in (("mamba", "Mamba"), ("gdn", "Gated DeltaNet")) if k in self.layer_kinds)

    @property
    def mamba_heads(self) -> int:
        """Mamba-2 heads: given, or d_inner / head dim with d_inner = 2 x hidden (MambaMixer expand = 2)."""
        return self.mamba_num_heads or 2 * self.hidden_size // self.mamba_head_dim

    @property
    def mamba_d_inner(self) -> int:
        """Mamba-2 inner width: heads x head dim."""
        return self.mamba_heads * self.mamba_head_dim

    @property
    def mamba_in_proj_width(self) -> int:
        """Output width of the Mamba in_proj: z and x (d_inner each), B and C (groups x state each), dt (heads)."""
        return 2 * self.mamba_d_inner + 2 * self.mamba_num_groups * self.mamba_state_dim + self.mamba_heads

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of the depthwise conv1d: x, B and C."""
        return self.mamba_d_inner + 2 * self.mamba_num_groups * self.mamba_state_dim

    @property
    def gdn_qk_dim(self) -> int:
        """Gated DeltaNet query (and key) width: key heads x key head dim."""
        return self.gdn_num_key_heads * self.gdn_key_head_dim

    @property
    def gdn_v_dim(self) -> int:
        """Gated DeltaNet value width: value heads x value head dim."""
        return self.gdn_num_value_heads * self.gdn_value_head_dim

    @property
    def gdn_in_proj_width(self) -> int:
        """Output width of the Gated DeltaNet in_proj: q, k, v, the output gate z, beta and alpha (one each per value
        head) (Megatron-Core GatedDeltaNet in_proj_split_sections)."""
        return 2 * self.gdn_qk_dim + 2 * self.gdn_v_dim + 2 * self.gdn_num_value_heads

    @property
    def gdn_conv_dim(self) -> int:
        """Channels of the Gated DeltaNet depthwise conv1d: q, k and v."""
        return 2 * self.gdn_qk_dim + self.gdn_v_dim

    def __hash__(self) -> int:
        """The fields' hash (the dataclass's own), computed once per card: a card keys most of the oracle's caches,
        and hashing its fields costs about as much as the rest of a cache lookup."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash(tuple(getattr(self, f) for f in _HASHED_FIELDS))
        return h

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_hash", None)  # string hashes differ between processes: a copy hashes itself again
        return state

    def padded_vocab(self, tp: int = 1) -> int:
        m = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // m) * m

    @cached_property
    def layer_kinds(self) -> tuple[str, ...]:
        """The kind of each decoder layer (:data:`LAYER_KINDS`): 'dense' or 'moe', or a hybrid model's pattern."""
        if self.hybrid_pattern is not None:
            return tuple(HYBRID_SYMBOLS[c] for c in self.hybrid_pattern)
        if not self.is_moe:
            return ("dense",) * self.num_layers
        return tuple("moe" if (i >= self.first_dense_layers and
                               (i - self.first_dense_layers) % self.moe_layer_freq == 0) else "dense"
                     for i in range(self.num_layers))

    def uses_window(self, layer: int) -> bool:
        return bool(self.sliding_window and self.sliding_window_every
                    and layer % self.sliding_window_every == 0)

    # ------------------------------------------------------------------ parameter counts
    @property
    def q_width(self) -> int:
        """Width of the query projection output (a x d, or a x (nope+rope) for MLA)."""
        if self.attention == "mla":
            return self.num_attention_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)  # type: ignore[operator]
        return self.num_attention_heads * self.head_size

    @property
    def kv_width(self) -> int:
        """Width of K plus V projection outputs (GQA) or of the up-projected K and V (MLA)."""
        if self.attention == "mla":
            return self.num_attention_heads * (self.qk_nope_head_dim + self.v_head_dim)  # type: ignore[operator]
        return 2 * self.kv_heads * self.head_size

    @property
    def q_gate_width(self) -> int:
        """Width of the output gate the QKV projection also produces (``attention_output_gate``: one per query
        channel), else 0."""
        return self.q_width if self.attention_output_gate and self.attention != "mla" else 0

    @property
    def qkv_width(self) -> int:
        """Output width of the fused QKV projection (GQA): Q, the output gate if any, K and V."""
        return self.q_width + self.q_gate_width + 2 * self.kv_heads * self.head_size

    @property
    def attn_out_width(self) -> int:
        """Input width of the attention output projection."""
        if self.attention == "mla":
            return self.num_attention_heads * self.v_head_dim  # type: ignore[operator]
        return self.num_attention_heads * self.head_size

    def norm_params(self, width: int) -> int:
        return width * (2 if self.norm == "layernorm" else 1)

    def attention_gemm_params(self) -> int:
        """Weights of the attention block's GEMMs only (Q or its LoRA pair, K/V or MLA's down/up
        projections, output): what a token multiplies through, without norms or biases."""
        h = self.hidden_size
        if self.attention == "mla":
            rope = self.qk_rope_head_dim or 0
            q = (h * self.q_lora_rank + self.q_lora_rank * self.q_width) if self.q_lora_rank else h * self.q_width
            kv = h * (self.kv_lora_rank + rope) + self.kv_lora_rank * self.kv_width  # type: ignore[operator]
            return q + kv + self.attn_out_width * h
        return h * self.qkv_width + self.attn_out_width * h

    def mlp_gemm_params(self, ffn: int, width: int | None = None) -> int:
        """Weights of one MLP's GEMMs (up, gate when gated, down) of intermediate size ``ffn`` on ``width`` (default
        hidden_size; a latent MoE's experts: expert_width)."""
        return ((2 if self.gated else 1) + 1) * (width or self.hidden_size) * ffn

    def latent_proj_params(self) -> int:
        """A latent MoE layer's two projections, H -> latent and latent -> H (with their biases when linears have
        them); 0 without a latent size."""
        lat = self.moe_latent_size
        if not lat:
            return 0
        return 2 * self.hidden_size * lat + ((lat + self.hidden_size) if self.linear_bias else 0)

    def expert_params(self) -> int:
        """One routed expert (on expert_width)."""
        return self.mlp_params(self.expert_ffn, width=self.expert_width)

    def attention_params(self) -> int:
        """Attention block weights incl. its input norm (and qk norms), excluding nothing else."""
        h = self.hidden_size
        b = self.linear_bias
        if self.attention == "mla":
            norms = self.norm_params(self.kv_lora_rank) + self.norm_params(h)  # type: ignore[arg-type]
            if self.q_lora_rank:
                norms += self.norm_params(self.q_lora_rank)
            return self.attention_gemm_params() + norms
        qkv_out = self.qkv_width
        p = self.attention_gemm_params() + self.norm_params(h)
        if b or self.qkv_bias:
            p += qkv_out
        if b:
            p += h
        if self.qk_layernorm:
            p += 2 * self.norm_params(self.head_size)
        if self.attention_sinks:
            p += self.num_attention_heads
        return p

    def mlp_params(self, ffn: int, width: int | None = None) -> int:
        """One MLP (dense or a single expert) of intermediate size ``ffn`` on ``width`` (default hidden_size), without
        its norm."""
        p = self.mlp_gemm_params(ffn, width)
        if self.linear_bias:
            p += (2 if self.gated else 1) * ffn + (width or self.hidden_size)
        return p

    def router_params(self) -> int:
        return self.hidden_size * self.num_experts + (self.num_experts if self.router_bias else 0)

    def dense_layer_params(self) -> int:
        return self.attention_params() + self.mlp_params(self.ffn_hidden_size or 0) + self.norm_params(self.hidden_size)

    def moe_layer_params(self, *, experts: int | None = None) -> int:
        """A MoE layer with ``experts`` routed experts (default all): attention and a MoE block."""
        return self.attention_params() + self.moe_block_params(experts=experts)

    def mamba_gemm_params(self) -> int:
        """Weights of a Mamba layer's GEMMs: in_proj and out_proj."""
        return self.hidden_size * self.mamba_in_proj_width + self.mamba_d_inner * self.hidden_size

    def mamba_layer_params(self) -> int:
        """A Mamba-2 layer (Megatron-Core MambaLayer): the input norm (fused into in_proj), in_proj, the conv1d's
        weight and bias, dt_bias, A_log and D per head, the gated RMSNorm over d_inner, out_proj."""
        conv = self.mamba_conv_dim * (self.mamba_conv_kernel + 1)
        return (self.norm_params(self.hidden_size) + self.mamba_gemm_params() + conv + 3 * self.mamba_heads
                + self.mamba_d_inner)

    def gdn_gemm_params(self) -> int:
        """Weights of a Gated DeltaNet layer's GEMMs: in_proj and out_proj."""
        return self.hidden_size * self.gdn_in_proj_width + self.gdn_v_dim * self.hidden_size

    def gdn_layer_params(self) -> int:
        """A Gated DeltaNet layer (Megatron-Core GatedDeltaNet in a TransformerLayer): the input norm (fused into
        in_proj), in_proj, the conv1d's weight (no bias: Megatron-Core's default, Qwen3-Next's), dt_bias and A_log
        per value head, the output RMSNorm over one value head's width (shared by the heads), out_proj."""
        return (self.norm_params(self.hidden_size) + self.gdn_gemm_params() + self.gdn_conv_dim * self.gdn_conv_kernel
                + 2 * self.gdn_num_value_heads + self.norm_params(self.gdn_value_head_dim))

    def moe_block_params(self, *, experts: int | None = None) -> int:
        """A MoE block: its pre-MLP norm, the router, ``experts`` routed experts (default all), shared experts."""
        e = self.num_experts if experts is None else experts
        shared = self.mlp_params(self.shared_ffn) if self.num_shared_experts else 0
        return (self.norm_params(self.hidden_size) + self.router_params() + e * self.expert_params() + shared
                + self.latent_proj_params())

    def layer_params(self, kind: str, *, experts: int | None = None) -> int:
        """One decoder layer of ``kind``; MoE kinds with ``experts`` routed experts (default all)."""
        if kind == "moe":
            return self.moe_layer_params(experts=experts)
        if kind == "dense":
            return self.dense_layer_params()
        if kind == "mamba":
            return self.mamba_layer_params()
        if kind == "gdn":
            return self.gdn_layer_params()
        if kind == "attention":
            return self.attention_params()
        if kind == "mlp":
            return self.mlp_params(self.ffn_hidden_size or 0) + self.norm_params(self.hidden_size)
        if kind == "moe_mlp":
            return self.moe_block_params(experts=experts)
        raise ValueError(f"layer kind {kind!r} is not one of {', '.join(LAYER_KINDS)}")

    def embedding_params(self, tp: int = 1) -> int:
        pos = self.max_seq_len * self.hidden_size if self.position_embedding == "learned" else 0
        return self.padded_vocab(tp) * self.hidden_size + pos

    def output_params(self, tp: int = 1) -> int:
        """Output projection (0 when tied) plus final norm."""
        out = 0 if self.tied_embeddings else self.padded_vocab(tp) * self.hidden_size
        return out + self.norm_params(self.hidden_size)

    def mtp_params(self) -> int:
        """DeepSeek-V3 MTP module: 2 norms + 2H->H projection + one (MoE if MoE) layer + norm."""
        if not self.mtp_layers:
            return 0
        h = self.hidden_size
        kind = "moe" if self.is_moe else "dense"
        per = 2 * self.norm_params(h) + 2 * h * h + self.layer_params(kind) + self.norm_params(h)
        return self.mtp_weight_sets * per

    @property
    def mtp_weight_sets(self) -> int:
        """MTP modules with weights of their own: every depth's, or one shared by all (``mtp_shared_weights``)."""
        return min(1, self.mtp_layers) if self.mtp_shared_weights else self.mtp_layers

    def total_params(self, *, include_mtp: bool = False, padded_vocab: bool = False) -> int:
        """All parameters (unpadded vocabulary by default, as published figures count)."""
        v_pad = self.padded_vocab() if padded_vocab else self.vocab_size
        pos = self.max_seq_len * self.hidden_size if self.position_embedding == "learned" else 0
        emb = v_pad * self.hidden_size + pos
        out = (0 if self.tied_embeddings else v_pad * self.hidden_size) + self.norm_params(self.hidden_size)
        layers = sum(self.layer_params(k) for k in self.layer_kinds)
        return emb + layers + out + (self.mtp_params() if include_mtp else 0)

    def active_params(self) -> int:
        """Parameters touched per token (top-k routed experts instead of all)."""
        total = self.total_params()
        if not self.is_moe:
            return total
        n_moe = sum(1 for k in self.layer_kinds if k in MOE_KINDS)
        return total - n_moe * (self.num_experts - self.moe_topk) * self.expert_params()

    # ------------------------------------------------------------------ validation and IO
    def problems(self) -> list[str]:
        """Structural problems of the card itself (not of a parallel layout)."""
        p = []
        w = f"model card {self.name!r}"
        for k, limit in MAX_SIZES.items():  # before anything below (or a layout) is sized by them
            v = getattr(self, k)
            if v is not None and v > limit:
                p.append(f"{w}: {k}={v:,} is absurd: at most {limit:,} is accepted "
                         f"(about 100x the largest published model's)")
            elif v is not None and v < 0:
                p.append(f"{w}: {k}={v:,} must be >= 0")
        if p:
            return p
        for k in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"):
            if getattr(self, k) <= 0:
                p.append(f"{w}: {k}={getattr(self, k)} must be > 0")
        if self.num_attention_heads > 0 and self.kv_heads > 0 and self.num_attention_heads % self.kv_heads:
            p.append(f"{w}: num_attention_heads={self.num_attention_heads} is not a multiple of "
                     f"num_query_groups={self.kv_heads}")
        if not self.is_moe and not self.ffn_hidden_size and self.hybrid_pattern is None:
            p.append(f"{w}: a dense model needs ffn_hidden_size")
        if self.is_moe:
            if not self.expert_ffn:
                p.append(f"{w}: a MoE model needs moe_ffn_hidden_size")
            if not 1 <= self.moe_topk <= self.num_experts:
                p.append(f"{w}: moe_topk={self.moe_topk} must be in 1..num_experts={self.num_experts}")
            if self.first_dense_layers and not self.ffn_hidden_size:
                p.append(f"{w}: first_dense_layers={self.first_dense_layers} needs ffn_hidden_size")
            if self.moe_layer_freq < 1:
                p.append(f"{w}: moe_layer_freq={self.moe_layer_freq} must be >= 1")
        if self.moe_latent_size is not None and (not self.is_moe or self.moe_latent_size <= 0):
            p.append(f"{w}: moe_latent_size={self.moe_latent_size} needs a MoE model and a width > 0")
        if self.attention == "mla":
            for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if not getattr(self, k):
                    p.append(f"{w}: attention=mla needs {k}")
        if self.sliding_window is not None and self.sliding_window <= 0:
            p.append(f"{w}: sliding_window={self.sliding_window} must be > 0")
        if self.mtp_shared_weights and not self.mtp_layers:
            p.append(f"{w}: mtp_shared_weights=true needs MTP layers (mtp_layers={self.mtp_layers})")
        if self.hybrid_pattern is not None:
            p += self._hybrid_problems(w)
        return p

    def _nonpositive(self, w: str, *keys: str) -> list[str]:
        """A problem line for each of ``keys`` that is not a positive size."""
        return [f"{w}: {k}={getattr(self, k)} must be > 0" for k in keys if getattr(self, k) <= 0]

    def _hybrid_problems(self, w: str) -> list[str]:
        """A hybrid pattern's own checks (Megatron-Core HybridModel / MambaMixer asserts)."""
        pat = self.hybrid_pattern or ""
        if not isinstance(pat, str) or not pat:
            return [f"{w}: hybrid_pattern must be a non-empty string of {', '.join(HYBRID_SYMBOLS)} (one per layer)"]
        p = []
        bad = sorted(set(pat) - set(HYBRID_SYMBOLS))
        for c in bad:
            what = HYBRID_UNMODELLED.get(c)
            if c == "|":  # a stage boundary belongs to the run's layout, not to the card
                p.append(f"{w}: hybrid_pattern has '|' stage boundaries: a card holds the layers only; give the "
                         f"stages as training.pipeline_model_parallel_layout (one '|' per boundary)")
                continue
            p.append(f"{w}: hybrid_pattern symbol {c!r} " + (f"({what}) is not modelled" if what else "is unknown")
                     + f"; valid: {', '.join(f'{k} {v}' for k, v in HYBRID_SYMBOLS.items())}")
        layers = len(pat) - pat.count("|")
        if layers != self.num_layers:
            p.append(f"{w}: hybrid_pattern has {layers} layer symbols but num_layers={self.num_layers} (one per layer)")
        if "E" in pat and not self.is_moe:
            p.append(f"{w}: hybrid_pattern has MoE layers (E) but num_experts=0")
        if "-" in pat and not self.ffn_hidden_size:
            p.append(f"{w}: hybrid_pattern has MLP layers (-) but no ffn_hidden_size")
        if self.first_dense_layers or self.moe_layer_freq != 1:
            p.append(f"{w}: first_dense_layers / moe_layer_freq do not apply to a hybrid model: its pattern places "
                     f"the MoE layers")
        if "M" in pat:
            sizes = self._nonpositive(w, "mamba_head_dim", "mamba_state_dim", "mamba_num_groups", "mamba_conv_kernel",
                                      "mamba_chunk_size")
            if sizes:  # the head count below divides by them
                return p + sizes
            heads, groups = self.mamba_heads, self.mamba_num_groups
            if heads <= 0:
                p.append(f"{w}: mamba_num_heads={heads} must be > 0")
            elif groups > 0 and heads % groups:
                p.append(f"{w}: mamba_num_heads={heads} must be a multiple of mamba_num_groups={groups} "
                         f"(MambaMixer: each group shares B and C over nheads / ngroups heads)")
        if self.hybrid_pairs and (len(pat) % 2 or any(pat[i] not in "MG*" or pat[i + 1] not in "-E"
                                                       for i in range(0, len(pat) - 1, 2))):
            p.append(f"{w}: hybrid_pairs=true needs the pattern as (mixer, MLP) pairs: G, M or * then - or E, "
                     f"each layer two symbols")
        if "G" in pat:
            sizes = self._nonpositive(w, "gdn_num_key_heads", "gdn_num_value_heads", "gdn_key_head_dim",
                                      "gdn_value_head_dim", "gdn_conv_kernel")
            p += sizes
            if not sizes and self.gdn_num_value_heads % self.gdn_num_key_heads:
                p.append(f"{w}: gdn_num_value_heads={self.gdn_num_value_heads} must be a multiple of "
                         f"gdn_num_key_heads={self.gdn_num_key_heads} (GatedDeltaNet repeats q and k to the value "
                         f"heads)")
        return p

    @classmethod
    def from_dict(cls, data: dict[str, Any], name: str | None = None) -> "ModelCard":
        if not isinstance(data, dict):
            raise InvalidConfigError(f"model card {name!r} must be a mapping of keys to values, "
                                     f"got a {type(data).__name__}")
        if "based_on" in data:
            data = _based_on(data, f"model card {data.get('name', name)!r}")
        empty = not data
        data = dict(data)
        if name is not None:
            data.setdefault("name", name)
        where = f"model card {data.get('name', name)!r}"
        missing = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in data
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        try:
            card = from_dict(cls, data, where)
        except InvalidConfigError as exc:
            if not missing:
                raise
            # the missing keys in one line that says what a card needs; every other problem on its own
            one_each = {f"{where}: missing required key {k!r}" for k in missing}
            need = (f"a card needs {', '.join(_REQUIRED)} and ffn_hidden_size (dense) or num_experts, moe_topk and "
                    f"moe_ffn_hidden_size (MoE), as in oracle/models/llama3.1-8b.yaml; or give a bundled card name "
                    f"(raytune-primus models list), a card YAML path or a Hugging Face config.json path")
            line = f"{where} is an empty mapping: {need}" if empty else \
                f"{where} is incomplete, missing {', '.join(missing)}: {need}"
            raise InvalidConfigError([line] + [p for p in exc.problems if p not in one_each]) from None
        probs = card.problems()
        if probs:
            raise InvalidConfigError(probs)
        return card

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def replace(self, **changes: Any) -> "ModelCard":
        return dataclasses.replace(self, **changes)


_HASHED_FIELDS = tuple(f.name for f in dataclasses.fields(ModelCard) if (f.compare if f.hash is None else f.hash))
"""The fields the dataclass's generated hash would read (``ModelCard.__hash__``)."""
_REQUIRED = tuple(f.name for f in dataclasses.fields(ModelCard) if f.init and f.default is dataclasses.MISSING
                  and f.default_factory is dataclasses.MISSING and f.name != "name")
"""The keys every card states (``name`` comes from the file name when absent)."""


BASE_ONLY = ("name", "published_params_billion", "published_active_params_billion", "sources", "aliases", "notes")
"""What a card ``based_on`` another does not take from it: the base's own name, published counts, citations,
spellings and caveats (they describe the base, not the variant)."""


def _based_on(data: dict[str, Any], where: str) -> dict[str, Any]:
    """A card that names a bundled card in ``based_on`` (a variant: other layer counts or widths): that card's fields
    except :data:`BASE_ONLY`, with this card's keys over them."""
    ref = data["based_on"]
    if not isinstance(ref, str) or not ref.strip() or ref.strip().endswith((".yaml", ".yml", ".json")) or "/" in ref:
        raise InvalidConfigError(f"{where}.based_on={clip(repr(ref), 80)} must name a bundled model card "
                                 f"(raytune-primus models list), not a file")
    try:
        base = load_model(ref.strip())
    except PrimusError as exc:
        raise InvalidConfigError(f"{where}.based_on: {exc}") from None
    inherited = {k: v for k, v in base.to_dict().items() if k not in BASE_ONLY}
    return {**inherited, "notes": f"based on {base.name}", **{k: v for k, v in data.items() if k != "based_on"}}


def _parse_bundled(path: Path, name: str) -> ModelCard:
    return ModelCard.from_dict(load_mapping(path, "model card"), name=name)


def _parse_path(path: Path) -> ModelCard:
    data = load_mapping(path, "model card")
    if path.suffix.lower() == ".json" and "name" not in data and ("model_type" in data or "architectures" in data):
        from oracle.hf_import import card_from_hf_config, hf_card_name
        return card_from_hf_config(data, name=hf_card_name(path, data))
    return ModelCard.from_dict(data, name=path.stem)


_REGISTRY: YamlRegistry[ModelCard] = YamlRegistry("model", MODEL_DIR, _parse_bundled, _parse_path)


def bundled_models() -> list[str]:
    return _REGISTRY.names()


def is_bundled_model(name: str) -> bool:
    """``name in bundled_models()``, without listing the folder where the card was loaded before."""
    return _REGISTRY.bundled(name) is not None or name in _REGISTRY.names()


def bundled_model_name(name: str) -> str | None:
    """The bundled card a loose spelling names (case, punctuation, aliases: ``Meta-Llama-3.1-70B``), or None; reads
    no card (the aliases only)."""
    return _REGISTRY.resolve(name)


def load_model(name_or_path: str) -> ModelCard:
    """A bundled card by name, a card YAML by path, or a Hugging Face config.json by path."""
    return _REGISTRY.load(name_or_path)

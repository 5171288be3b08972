"""What one benchmarked layer is: a rank's share of a model-card layer at the benchmark shape (no torch).

A :class:`LayerSpec` is the layer signature the measurement cache is keyed by: every dimension a
kernel sees (heads/tp, ffn/tp, experts/ep, tokens per rank), the dtype, nothing about learned weights
(paper Sec. 3.1: layers of one type share GEMM shapes, so one timing per type suffices).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from oracle.config import RunConfig
from oracle.errors import BenchmarkError
from oracle.model_card import ModelCard
from oracle.scaling import BenchPlan

KINDS = ("dense", "moe", "embedding", "output", "optimizer")
OPTIMIZER_MAX_PARAMS = 256 * 2 ** 20
"""Largest parameter shard the optimizer step is timed on (its per-parameter rate is flat beyond the caches)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerSpec:
    """A rank's share of one layer type at the benchmark shape."""

    kind: str
    """'dense' | 'moe' decoder layer, 'embedding', or 'output' (final norm + logits + loss)."""
    hidden: int
    mbs: int
    seq_q: int
    """Query tokens per sequence on this rank (seq_len / cp)."""
    seq_k: int
    """Keys per sequence (seq_len; ring attention over CP sees them all)."""
    cp: int = 1
    dtype: str = "bf16"
    norm: str = "rmsnorm"
    linear_bias: bool = False
    # attention
    attention: str = "gqa"
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    qkv_bias: bool = False
    qk_layernorm: bool = False
    window: int | None = None
    unfused: bool = False
    """The attention core materialises its scores (training.attention_backend=unfused): matmul, masked softmax in
    fp32, matmul, as Transformer Engine's UnfusedDotProductAttention runs it, instead of SDPA."""
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # MLP / MoE
    ffn: int = 0
    activation: str = "swiglu"
    experts: int = 0
    """Experts on this rank (num_experts / ep)."""
    router_experts: int = 0
    """Router width (all experts of the target: the router is replicated)."""
    topk: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    router_bias: bool = False
    ep_ranks: int = 1
    """Ranks of the target's EP group the dispatch orders tokens for: with more than one, and more than one
    expert on this rank, the received chunks are re-sorted by local expert (Megatron-Core's alltoall
    dispatcher), work a layout without EP does not do."""
    # embedding / output
    vocab: int = 0
    # optimizer
    params: int = 0
    """Parameters of the shard the optimizer step is timed on (kind 'optimizer')."""

    @property
    def tokens(self) -> int:
        return self.mbs * self.seq_q

    @property
    def gated(self) -> bool:
        return self.activation in ("swiglu", "geglu")

    def key(self) -> str:
        """Canonical signature (stable across runs; fields at their defaults are left out)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if getattr(self, f.name) != f.default or f.name in ("kind", "dtype")}
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_key(cls, key: str) -> "LayerSpec":
        return cls(**json.loads(key))

    def label(self) -> str:
        """Short human label: kind, window, tokens, dtype."""
        if self.kind == "optimizer":
            return f"optimizer Adam over {self.params:,} params ({self.dtype} model, fp32 master)"
        w = f" window={self.window}" if self.window else ""
        extra = f" experts={self.experts}/rank top{self.topk}" if self.kind == "moe" else ""
        return f"{self.kind}{w} h={self.hidden} tokens={self.tokens}{extra} {self.dtype}"


def bench_dtype(run: RunConfig) -> str:
    """The dtype the benchmark times: bf16 (fp8 configs time bf16 GEMMs, rescaled at upscale)."""
    return "bf16"


def layer_spec(card: ModelCard, run: RunConfig, plan: BenchPlan, kind: str, window: int | None = None,
               *, dtype: str | None = None) -> LayerSpec:
    """The rank's share of a ``kind`` layer of ``card`` in the downscaled layout ``plan``."""
    if card.is_hybrid and kind not in ("embedding", "output", "optimizer"):
        raise BenchmarkError(f"benchmark mode times transformer layers (attention + MLP or MoE); {card.name} is a "
                             f"hybrid {card.mixer_name or 'Mamba'} model "
                             f"({', '.join(sorted(set(card.layer_kinds)))} layers), which it "
                             f"cannot build yet: use --mode simulate")
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not one of {KINDS}")
    t = run.training
    tp, cp = plan.tp, plan.cp
    base = dict(kind=kind, hidden=card.hidden_size, mbs=t.mbs, seq_q=t.seq_len // cp, seq_k=t.seq_len, cp=cp,
                dtype=dtype or bench_dtype(run), norm=card.norm, linear_bias=card.linear_bias)
    if kind in ("embedding", "output"):
        return LayerSpec(**base, vocab=card.padded_vocab(tp) // tp)
    heads = card.num_attention_heads // tp
    attn = dict(attention=card.attention, heads=heads, qkv_bias=card.qkv_bias, qk_layernorm=card.qk_layernorm,
                window=window, unfused=t.attention_backend == "unfused")
    if card.attention == "mla":
        attn.update(kv_heads=heads, q_lora_rank=card.q_lora_rank, kv_lora_rank=card.kv_lora_rank,
                    qk_nope_head_dim=card.qk_nope_head_dim or 0, qk_rope_head_dim=card.qk_rope_head_dim or 0,
                    v_head_dim=card.v_head_dim or 0)
    else:
        attn.update(kv_heads=max(1, card.kv_heads // tp), head_dim=card.head_size)
    mlp: dict[str, object] = dict(activation=card.activation)
    if kind == "moe":
        mlp.update(experts=plan.experts_per_rank, router_experts=card.num_experts, topk=card.moe_topk,
                   expert_ffn=card.expert_ffn // plan.etp, router_bias=card.router_bias,
                   shared_ffn=card.shared_ffn // tp if card.num_shared_experts else 0,
                   ep_ranks=t.ep)
    else:
        mlp.update(ffn=(card.ffn_hidden_size or 0) // tp)
    return LayerSpec(**base, **attn, **mlp)


def run_layer_specs(run: RunConfig, plan: BenchPlan, *, dtype: str | None = None) -> dict[tuple[str, int | None], LayerSpec]:
    """Every distinct layer type of ``run`` ((kind, window) -> spec), plus embedding and output."""
    m = run.model
    out: dict[tuple[str, int | None], LayerSpec] = {}
    for i, kind in enumerate(m.layer_kinds):
        window = m.sliding_window if m.uses_window(i) else None
        if (kind, window) not in out:
            out[(kind, window)] = layer_spec(m, run, plan, kind, window, dtype=dtype)
    if m.mtp_layers:  # MTP modules use a full-attention layer of the model's last kind
        kind = "moe" if m.is_moe else "dense"
        out.setdefault((kind, None), layer_spec(m, run, plan, kind, None, dtype=dtype))
    out[("embedding", None)] = layer_spec(m, run, plan, "embedding", dtype=dtype)
    out[("output", None)] = layer_spec(m, run, plan, "output", dtype=dtype)
    out[("optimizer", None)] = optimizer_spec(run, dtype=dtype)
    return out


def optimizer_spec(run: RunConfig, *, dtype: str | None = None) -> LayerSpec:
    """The optimizer step timed on the largest parameter shard a rank of the target holds (after
    distributed-optimizer sharding), rounded to 2 significant digits so similar shards share a measurement."""
    from oracle.layout import Layout
    from oracle.memory import rank_param_counts
    t = run.training
    L = Layout(run)
    sharded = t.use_distributed_optimizer or t.fsdp
    n = 0.0
    for r in range(t.pp):
        dense, expert = rank_param_counts(run, r)
        n = max(n, dense / (L.dp * t.cp) + expert / L.edp if sharded else dense + expert)
    n = int(float(f"{max(1.0, min(n, OPTIMIZER_MAX_PARAMS)):.2g}"))
    return LayerSpec(kind="optimizer", hidden=0, mbs=0, seq_q=0, seq_k=0, dtype=dtype or bench_dtype(run), params=n)

"""Model FLOPs per iteration: the convention behind reported TFLOP/s/GPU and MFU.

We use the Megatron-LM / NeMo "model FLOPs" convention (Narayanan et al. 2021, Eq. 3; NeMo
``flops_formulas.py``): 3 x the forward FLOPs of every GEMM a token touches (forward + 2x backward),
plus self-attention counted WITHOUT the causal halving (QK^T and AV each 2*s*d per query, per head),
plus the logits layer; recomputation is NOT counted (hardware FLOPs would include it). For MoE only
the top-k routed experts (and shared experts) a token visits count. Sliding-window layers count
min(seq, window) keys. This is what NeMo's published TFLOP/s use, so ours compare like for like.
"""
from __future__ import annotations

from functools import lru_cache

from oracle.model_card import ATTENTION_KINDS, MOE_KINDS, ModelCard


def gemm_params_per_token(card: ModelCard, kind: str) -> float:
    """Weights a token multiplies through in one layer (norms, biases excluded; the router counts)."""
    if kind == "mamba":
        return float(card.mamba_gemm_params())
    if kind == "gdn":
        return float(card.gdn_gemm_params())
    attn = card.attention_gemm_params() if kind in ATTENTION_KINDS else 0
    if kind in MOE_KINDS:
        mlp = (card.moe_topk * card.mlp_gemm_params(card.expert_ffn, card.expert_width)
               + card.hidden_size * card.num_experts)
        if card.moe_latent_size:  # the latent projections (Megatron-LM moe_layer_flops: + 4 T H latent)
            mlp += 2 * card.hidden_size * card.moe_latent_size
        if card.num_shared_experts:
            mlp += card.mlp_gemm_params(card.shared_ffn)
    elif kind in ("dense", "mlp"):
        mlp = card.mlp_gemm_params(card.ffn_hidden_size or 0)
    else:
        mlp = 0
    return float(attn + mlp)


def mamba_scan_flops_per_token(card: ModelCard) -> float:
    """Forward FLOPs per token of a Mamba-2 layer's scan in Megatron-LM's model-FLOPs convention: 7 x d_inner x
    state (megatron/training/training.py ``mamba_layer_flops``; Megatron-Bridge flop_utils the same, which sizes
    d_inner as 2 x hidden where this uses the card's heads x head dim)."""
    return 7.0 * card.mamba_d_inner * card.mamba_state_dim


def gdn_core_flops_per_token(card: ModelCard) -> float:
    """Forward FLOPs per token of a Gated DeltaNet layer besides its GEMMs, in Megatron-LM's model-FLOPs convention:
    2 x (conv width x (2 qk + v) for the conv1d + 4 x value heads x value head dim^2 for the gated delta rule: K K^T,
    V K^T, S (a (I - b K K^T)) and S Q) (megatron/training/training.py ``gdn_layer_flops``)."""
    return 2.0 * (card.gdn_conv_kernel * card.gdn_conv_dim + 4 * card.gdn_num_value_heads * card.gdn_value_head_dim ** 2)


def attention_flops_per_token(card: ModelCard, seq_len: int, layer: int) -> float:
    """Forward QK^T + AV FLOPs per token in one layer, full (non-causal) convention."""
    keys = min(seq_len, card.sliding_window) if card.uses_window(layer) else seq_len
    if card.attention == "mla":
        d_qk = (card.qk_nope_head_dim or 0) + (card.qk_rope_head_dim or 0)
        d_v = card.v_head_dim or 0
    else:
        d_qk = d_v = card.head_size
    return 2.0 * keys * card.num_attention_heads * (d_qk + d_v)


@lru_cache(maxsize=1024)
def model_flops_per_token(card: ModelCard, seq_len: int) -> float:
    """Forward+backward model FLOPs per token (3x forward), excluding recompute."""
    fwd = 0.0
    for i, kind in enumerate(card.layer_kinds):
        fwd += 2.0 * gemm_params_per_token(card, kind)
        if kind in ATTENTION_KINDS:
            fwd += attention_flops_per_token(card, seq_len, i)
        elif kind == "mamba":
            fwd += mamba_scan_flops_per_token(card)
        elif kind == "gdn":
            fwd += gdn_core_flops_per_token(card)
    fwd += 2.0 * card.hidden_size * card.padded_vocab()
    return 3.0 * fwd


FLOP_FORMULA = ("model FLOPs/token = 3 x [sum over layers (2 x GEMM weights touched per token + "
                "2 x seq x heads x (d_qk + d_v)) + 2 x hidden x vocab]  (Megatron/NeMo convention: "
                "non-causal attention, top-k experts, no recompute)")
HYBRID_FLOP_FORMULA = ("model FLOPs/token = 3 x [sum over layers (2 x GEMM weights touched per token + "
                       "2 x seq x heads x (d_qk + d_v) in attention layers, 7 x d_inner x state in Mamba layers) "
                       "+ 2 x hidden x vocab]  (Megatron/NeMo convention: non-causal attention, top-k experts, "
                       "no recompute)")
GDN_FLOP_FORMULA = ("model FLOPs/token = 3 x [sum over layers (2 x GEMM weights touched per token + "
                    "2 x seq x heads x (d_qk + d_v) in attention layers, 7 x d_inner x state in Mamba layers, "
                    "2 x (conv x (2 qk + v) + 4 x value heads x d_v^2) in Gated DeltaNet layers) + 2 x hidden x "
                    "vocab]  (Megatron/NeMo convention: non-causal attention, top-k experts, no recompute)")


def flop_formula(card: ModelCard) -> str:
    """The formula :func:`model_flops_per_token` applies to ``card`` (in words, for a projection's details)."""
    if "gdn" in card.layer_kinds:
        return GDN_FLOP_FORMULA
    return HYBRID_FLOP_FORMULA if "mamba" in card.layer_kinds else FLOP_FORMULA

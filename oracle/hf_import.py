"""Hugging Face ``config.json`` -> :class:`ModelCard`, and a card back to YAML.

Works on a local, already-parsed ``config.json`` dict; nothing is downloaded. One small reader per
family maps the Hugging Face keys onto card fields; whatever a card cannot express exactly is said in
the card's ``notes`` (or, when it would change the parameter count, raised as InvalidConfigError).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from oracle.errors import InvalidConfigError, clip
from oracle.model_card import ModelCard

_MISSING = object()

# HF hidden_act -> card activation, for families whose MLP is gated (gate * act(up)) or plain.
_GATED_ACT = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_new": "geglu",
              "gelu_pytorch_tanh": "geglu", "gelu_fast": "geglu"}
_PLAIN_ACT = {"gelu": "gelu", "gelu_new": "gelu", "gelu_fast": "gelu", "gelu_pytorch_tanh": "gelu",
              "quick_gelu": "gelu", "relu": "relu", "relu2": "squared_relu"}

# Architecture class names accepted when a config.json has no model_type.
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2", "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe", "Qwen3NextForCausalLM": "qwen3_next", "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3", "GptOssForCausalLM": "gpt_oss", "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox", "NemotronForCausalLM": "nemotron", "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3_text", "Llama4ForConditionalGeneration": "llama4",
    "Llama4ForCausalLM": "llama4_text", "DbrxForCausalLM": "dbrx", "Phi3ForCausalLM": "phi3",
    "GraniteForCausalLM": "granite", "Olmo2ForCausalLM": "olmo2", "OlmoeForCausalLM": "olmoe",
    "Glm4MoeForCausalLM": "glm4_moe", "NemotronHForCausalLM": "nemotron_h",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe", "Qwen3_5MoeForCausalLM": "qwen3_5_moe_text",
    "Qwen3_5ForConditionalGeneration": "qwen3_5", "Qwen3_5ForCausalLM": "qwen3_5_text",
}
# Multimodal wrappers whose language model is a nested config: model_type -> key of the text config.
_TEXT_CONFIG = {"llama4": "text_config", "gemma3": "text_config", "qwen3_5_moe": "text_config", "qwen3_5": "text_config"}
_TEXT_MODEL_TYPE = {"llama4": "llama4_text", "gemma3": "gemma3_text", "qwen3_5_moe": "qwen3_5_moe_text",
                    "qwen3_5": "qwen3_5_text"}
"""The model_type of a wrapper's text config when the nested object does not name it."""


class _Reader:
    """Reads keys of one config.json, collecting every missing/bad key before raising."""

    def __init__(self, data: dict[str, Any], model_type: str):
        self.data, self.model_type = data, model_type
        self.problems: list[str] = []
        self.missing: list[str] = []
        """Required keys absent: reported together, in one line."""
        self.notes: list[str] = []

    def req(self, *keys: str) -> Any:
        """The first of ``keys`` present and not null; a problem naming them otherwise."""
        for k in keys:
            if self.data.get(k) is not None:
                return self.data[k]
        self.missing.append(keys[0] + (f" (or {' / '.join(keys[1:])})" if len(keys) > 1 else ""))
        return None

    def opt(self, key: str, default: Any = None, *, minimum: float | None = None) -> Any:
        """``key``'s value, or ``default`` when absent; a value of another kind than a numeric or list
        default (or below ``minimum``) is a problem naming it, and ``default`` stands in."""
        v = self.data.get(key, _MISSING)
        if v is _MISSING or v is None:
            return default
        where = f"config.json (model_type {self.model_type!r}): {key}={clip(repr(v), 80)}"
        if isinstance(default, (int, float)) and not isinstance(default, bool) and (
                isinstance(v, bool) or not isinstance(v, (int, float))):
            self.problems.append(f"{where} must be a number")
            return default
        if isinstance(default, list) and not isinstance(v, list):
            self.problems.append(f"{where} must be a list")
            return default
        if minimum is not None and isinstance(v, (int, float)) and not v >= minimum:  # NaN too
            self.problems.append(f"{where} must be >= {minimum:g}")
            return default
        return v

    def act(self, gated: bool) -> str | None:
        raw = self.opt("hidden_act", self.opt("activation_function", "silu" if gated else "gelu"))
        table = _GATED_ACT if gated else _PLAIN_ACT
        if not isinstance(raw, str) or raw not in table:
            self.problems.append(f"config.json (model_type {self.model_type!r}): hidden_act={clip(repr(raw), 100)} is "
                                 f"not supported for this family; supported: {', '.join(sorted(table))}")
            return None
        return table[raw]


# ------------------------------------------------------------------ shared pieces
def _attention_shape(r: _Reader) -> dict[str, Any]:
    heads = r.req("num_attention_heads")
    return {
        "num_layers": r.req("num_hidden_layers"),
        "hidden_size": r.req("hidden_size"),
        "num_attention_heads": heads,
        "num_query_groups": r.opt("num_key_value_heads", heads),
        "head_dim": r.opt("head_dim"),
        "vocab_size": r.req("vocab_size"),
        "max_seq_len": r.opt("max_position_embeddings", 4096),
    }


def _biases(r: _Reader, *, attention_default: bool = False, mlp_default: bool = False) -> dict[str, Any]:
    """Llama-style attention_bias (q, k, v, o) / mlp_bias onto the card's linear_bias / qkv_bias."""
    attn, mlp = bool(r.opt("attention_bias", attention_default)), bool(r.opt("mlp_bias", mlp_default))
    if attn and mlp:
        return {"linear_bias": True}
    if attn:
        r.notes.append("attention_bias: q/k/v biases counted; the o_proj bias (H per layer) is not")
        return {"qkv_bias": True}
    if mlp:
        r.notes.append("mlp_bias=true without attention_bias is not representable; MLP biases not counted")
    return {}


def _window_pattern(sliding: list[bool]) -> int | None:
    """The card's sliding_window_every for this per-layer pattern, or None if it has no such form."""
    n_layers = len(sliding)
    if not any(sliding):
        return 0
    if all(sliding):
        return 1
    for n in range(2, n_layers + 1):
        if sliding == [i % n == 0 for i in range(n_layers)]:
            return n
    return None


def _window(r: _Reader, n_layers: int, default_types: list[str] | None) -> dict[str, Any]:
    """sliding_window / sliding_window_every from layer_types (or the family's default pattern)."""
    types = r.opt("layer_types", default_types)
    if not types or not isinstance(n_layers, int):
        return {}
    sliding = [t == "sliding_attention" for t in types]
    if not any(sliding):
        return {}
    window = r.req("sliding_window")
    every = _window_pattern(sliding)
    if every is None:
        r.notes.append(f"sliding window {window} on layers {[i for i, s in enumerate(sliding) if s]} "
                       "is not an every-n pattern; imported as full attention everywhere (conservative)")
        return {}
    return {"sliding_window": window, "sliding_window_every": every}


def _moe_layout(r: _Reader, n_layers: int, is_moe: Callable[[int], bool]) -> dict[str, Any]:
    """first_dense_layers / moe_layer_freq reproducing the HF per-layer MoE choice exactly."""
    if not isinstance(n_layers, int):
        return {}
    moe = [i for i in range(n_layers) if is_moe(i)]
    if not moe:
        r.problems.append(f"config.json (model_type {r.model_type!r}): experts are configured but no "
                          f"layer of {n_layers} is MoE")
        return {}
    first = moe[0]
    freq = moe[1] - moe[0] if len(moe) > 1 else 1
    if moe != list(range(first, n_layers, freq)):
        r.problems.append(f"config.json (model_type {r.model_type!r}): MoE layers {moe} are not "
                          f"'dense for the first k, then every n-th' and cannot be expressed as a card")
        return {}
    return {"first_dense_layers": first, "moe_layer_freq": freq}


# ------------------------------------------------------------------ families
def _llama(r: _Reader) -> dict[str, Any]:
    """llama, mistral, qwen2, qwen3, and the Llama-shaped phi3 (Phi-3 / Phi-4: fused qkv and gate-up projections,
    the same matrices), granite (Granite 3: scalar multipliers, no weights) and olmo2 (norms after each block and
    on the full q / k projections) (dense, gated, RMSNorm)."""
    mt = r.model_type
    card = _attention_shape(r)
    card.update(ffn_hidden_size=r.req("intermediate_size"), norm="rmsnorm", activation=r.act(True),
                tied_embeddings=bool(r.opt("tie_word_embeddings", False)))
    if mt == "qwen2":
        card["qkv_bias"] = True
    else:
        card.update(_biases(r))
    if mt in ("qwen3", "olmo2"):
        card["qk_layernorm"] = True
    if mt == "olmo2":
        r.notes.append("OLMo 2 normalises the whole q and k projections; counted as per-head q/k norms "
                       "(~2 x (heads - 1) x head_dim parameters per layer fewer)")
    if mt == "phi3" and r.opt("partial_rotary_factor", 1.0) != 1.0:
        r.notes.append("partial_rotary_factor: rotary on part of each head (no weights; its cost is not modelled)")
    card.update(_window(r, card["num_layers"], _default_layer_types(r, card["num_layers"])))
    return card


def _default_layer_types(r: _Reader, n_layers: Any) -> list[str] | None:
    """Per-layer attention kinds implied by older configs that have no layer_types (none for a layer count the card
    refuses: below 1, or above the accepted sizes, which are refused before)."""
    if not isinstance(n_layers, int) or isinstance(n_layers, bool) or not 1 <= n_layers <= MAX_LIST_LENGTH:
        return None
    if r.model_type in ("mistral", "mixtral", "phi3"):  # one window on every layer where one is set
        kind = "sliding_attention" if r.opt("sliding_window") else "full_attention"
        return [kind] * n_layers
    if r.model_type.startswith("qwen"):
        if not r.opt("use_sliding_window", False) or not r.opt("sliding_window"):
            return None
        first = r.opt("max_window_layers", n_layers)
        return ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]
    if r.model_type in ("gpt_oss", "gemma2"):
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]
    if r.model_type == "gemma3_text":  # (i + 1) % sliding_window_pattern != 0 is local (transformers Gemma3)
        pattern = r.opt("sliding_window_pattern", 6, minimum=1)
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]
    return None


def _gemma(r: _Reader) -> dict[str, Any]:
    """gemma, gemma2, gemma3_text: GeGLU (tanh GELU), tied embeddings, head_dim set explicitly; Gemma 2
    alternates local (sliding) and global layers starting with a local one, Gemma 3 runs five local per
    global (no every-n form: imported as full attention, noted)."""
    mt = r.model_type
    card = _attention_shape(r)
    raw_act = r.opt("hidden_activation", r.opt("hidden_act", "gelu_pytorch_tanh"))
    act = _GATED_ACT.get(raw_act) if isinstance(raw_act, str) else None
    if act != "geglu":
        r.problems.append(f"config.json (model_type {mt!r}): hidden_activation={clip(repr(raw_act), 80)} is not "
                          f"supported for this family; supported: {', '.join(k for k, v in _GATED_ACT.items() if v == 'geglu')}")
    card.update(ffn_hidden_size=r.req("intermediate_size"), norm="rmsnorm", activation=act,
                tied_embeddings=bool(r.opt("tie_word_embeddings", True)))
    card.update(_biases(r))
    if mt == "gemma3_text":
        card["qk_layernorm"] = True
    if mt != "gemma":
        r.notes.append("the extra post-attention and post-MLP RMSNorms (2H per layer) and logit soft-capping are "
                       "not modelled")
    card.update(_window(r, card["num_layers"], _default_layer_types(r, card["num_layers"])))
    return card


def _llama4(r: _Reader) -> dict[str, Any]:
    """llama4 (its text_config) / llama4_text: MoE layers of routed experts top-k plus one shared expert of
    the same size on the layers ``moe_layers`` lists (default every ``interleave_moe_layer_step``-th,
    counting from the step's last layer), dense layers of ``intermediate_size_mlp``."""
    card = _attention_shape(r)
    n = card["num_layers"]
    step = r.opt("interleave_moe_layer_step", 1, minimum=1)
    listed = r.opt("moe_layers", None)
    moe = set(listed) if isinstance(listed, list) else (set(range(step - 1, n, step)) if isinstance(n, int) else set())
    layout = _moe_layout(r, n, lambda i: i in moe)
    expert_ffn = r.req("intermediate_size")
    card.update(norm="rmsnorm", activation=r.act(True), tied_embeddings=bool(r.opt("tie_word_embeddings", False)),
                qk_layernorm=bool(r.opt("use_qk_norm", False)), num_experts=r.req("num_local_experts"),
                moe_topk=r.req("num_experts_per_tok"), moe_ffn_hidden_size=expert_ffn, num_shared_experts=1,
                shared_expert_ffn_hidden_size=expert_ffn, **layout)
    if layout.get("first_dense_layers") or layout.get("moe_layer_freq", 1) > 1:
        card["ffn_hidden_size"] = r.req("intermediate_size_mlp")
    chunk = r.opt("attention_chunk_size")
    if chunk:
        r.notes.append(f"chunked attention ({chunk} tokens) on the RoPE layers is causal attention at seq_len <= "
                       f"{chunk}; longer sequences are priced as causal on every layer")
    if card["qk_layernorm"]:
        r.notes.append("use_qk_norm: a weightless L2 norm on Q and K")
    return card


def _dbrx(r: _Reader) -> dict[str, Any]:
    """dbrx: nested attn_config / ffn_config; every layer MoE, GLU experts, LayerNorm without bias."""
    attn = r.opt("attn_config", {})
    ffn = r.opt("ffn_config", {})
    if not isinstance(attn, dict) or not isinstance(ffn, dict):
        r.problems.append(f"config.json (model_type {r.model_type!r}): attn_config and ffn_config must be objects")
        attn, ffn = {}, {}
    sub_a, sub_f = _Reader(attn, r.model_type), _Reader(ffn, r.model_type)
    heads = r.req("n_heads")
    card = {"num_layers": r.req("n_layers"), "hidden_size": r.req("d_model"), "num_attention_heads": heads,
            "num_query_groups": sub_a.opt("kv_n_heads", heads), "vocab_size": r.req("vocab_size"),
            "max_seq_len": r.opt("max_seq_len", 4096), "norm": "rmsnorm", "activation": "swiglu",
            "tied_embeddings": bool(r.opt("tie_word_embeddings", False)),
            "num_experts": sub_f.req("moe_num_experts"), "moe_topk": sub_f.req("moe_top_k"),
            "moe_ffn_hidden_size": sub_f.req("ffn_hidden_size")}
    for sub, key in ((sub_a, "attn_config"), (sub_f, "ffn_config")):
        r.problems += [p.replace("config.json", f"config.json {key}") for p in sub.problems]
        r.missing += [f"{key}.{k}" for k in sub.missing]
    r.notes.append("LayerNorm without bias counted as an RMSNorm (H parameters); clip_qkv costs nothing")
    return card


def _mixtral(r: _Reader) -> dict[str, Any]:
    """mixtral, and olmoe (OLMoE: every layer MoE as Mixtral's, num_experts, q / k norms over the projections)."""
    card = _attention_shape(r)
    olmoe = r.model_type == "olmoe"
    card.update(norm="rmsnorm", activation=r.act(True), tied_embeddings=bool(r.opt("tie_word_embeddings", False)),
                num_experts=r.req("num_experts" if olmoe else "num_local_experts"),
                moe_topk=r.req("num_experts_per_tok"), moe_ffn_hidden_size=r.req("intermediate_size"))
    if olmoe:
        card["qk_layernorm"] = True
        card.update(_biases(r))
        r.notes.append("OLMoE normalises the whole q and k projections; counted as per-head q/k norms")
    card.update(_window(r, card["num_layers"], _default_layer_types(r, card["num_layers"])))
    return card


def _qwen_moe_layers(r: _Reader) -> Callable[[int], bool]:
    """Which layers of a Qwen MoE config hold a MoE block: (i + 1) % decoder_sparse_step == 0 and i not in
    mlp_only_layers (transformers Qwen2MoE / Qwen3MoE / Qwen3Next decoder layers)."""
    step = r.opt("decoder_sparse_step", 1, minimum=1)
    mlp_only = r.opt("mlp_only_layers", [])
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in mlp_only):
        r.problems.append(f"config.json (model_type {r.model_type!r}): mlp_only_layers={clip(repr(mlp_only), 80)} "
                          f"must list layer indices")
        mlp_only = []
    dense = set(mlp_only)
    return lambda i: i not in dense and (i + 1) % step == 0


def _qwen_moe(r: _Reader) -> dict[str, Any]:
    """qwen2_moe, qwen3_moe: MoE where (i + 1) % decoder_sparse_step == 0 and i not in mlp_only_layers."""
    card = _attention_shape(r)
    n = card["num_layers"]
    layout = _moe_layout(r, n, _qwen_moe_layers(r))
    card.update(norm="rmsnorm", activation=r.act(True), tied_embeddings=bool(r.opt("tie_word_embeddings", False)),
                num_experts=r.req("num_experts"), moe_topk=r.req("num_experts_per_tok"),
                moe_ffn_hidden_size=r.req("moe_intermediate_size"), **layout)
    if layout.get("first_dense_layers") or layout.get("moe_layer_freq", 1) > 1:
        card["ffn_hidden_size"] = r.req("intermediate_size")
    if r.model_type == "qwen2_moe":
        card["qkv_bias"] = True
        shared = r.opt("shared_expert_intermediate_size", 0)
        if shared:
            card.update(num_shared_experts=1, shared_expert_ffn_hidden_size=shared)
            r.notes.append("the shared expert's sigmoid gate (H parameters per MoE layer) is not counted")
    else:
        card["qk_layernorm"] = True
        card.update(_biases(r))
    card.update(_window(r, n, _default_layer_types(r, n)))
    return card


def _deepseek(r: _Reader) -> dict[str, Any]:
    """deepseek_v2, deepseek_v3, kimi_k2: MLA + MoE with shared experts and leading dense layers; glm4_moe (GLM-4.5):
    the same MoE layout and MTP layers with GQA attention (per-head q/k norms where use_qk_norm)."""
    card = _attention_shape(r)
    n = card["num_layers"]
    card.update(norm="rmsnorm", activation=r.act(True), tied_embeddings=bool(r.opt("tie_word_embeddings", False)),
                mtp_layers=r.opt("num_nextn_predict_layers", 0))
    if r.model_type == "glm4_moe":  # GQA; attention_bias: q, k and v only (its o_proj has none)
        card.update(qk_layernorm=bool(r.opt("use_qk_norm", False)), qkv_bias=bool(r.opt("attention_bias", False)))
        if r.opt("partial_rotary_factor", 1.0) != 1.0:
            r.notes.append("partial_rotary_factor: rotary on part of each head (no weights; its cost is not modelled)")
    else:
        card.pop("head_dim")
        card.update(attention="mla", qk_layernorm=True, q_lora_rank=r.opt("q_lora_rank"),
                    kv_lora_rank=r.req("kv_lora_rank"), qk_nope_head_dim=r.req("qk_nope_head_dim"),
                    qk_rope_head_dim=r.req("qk_rope_head_dim"), v_head_dim=r.req("v_head_dim"))
        card.update(_biases(r))
    experts = r.opt("n_routed_experts")
    if not experts:
        card["ffn_hidden_size"] = r.req("intermediate_size")
        return card
    first_k, freq = r.opt("first_k_dense_replace", 0, minimum=0), r.opt("moe_layer_freq", 1, minimum=1)
    layout = _moe_layout(r, n, lambda i: i >= first_k and i % freq == 0)
    moe_ffn = r.req("moe_intermediate_size")
    card.update(num_experts=experts, moe_topk=r.req("num_experts_per_tok"), moe_ffn_hidden_size=moe_ffn,
                router_bias=r.opt("topk_method", "noaux_tc" if r.model_type != "deepseek_v2" else "greedy")
                == "noaux_tc", **layout)
    shared = r.opt("n_shared_experts", 0)
    if shared:
        card.update(num_shared_experts=shared, shared_expert_ffn_hidden_size=moe_ffn)
    if layout.get("first_dense_layers") or layout.get("moe_layer_freq", 1) > 1:
        card["ffn_hidden_size"] = r.req("intermediate_size")
    return card


def _gpt_oss(r: _Reader) -> dict[str, Any]:
    card = _attention_shape(r)
    card["head_dim"] = r.opt("head_dim", 64)
    card.update(norm="rmsnorm", activation="swiglu", tied_embeddings=bool(r.opt("tie_word_embeddings", False)),
                linear_bias=bool(r.opt("attention_bias", True)), attention_sinks=True, router_bias=True,
                num_experts=r.req("num_local_experts"),
                moe_topk=r.req("num_experts_per_tok", "experts_per_token"),
                moe_ffn_hidden_size=r.req("intermediate_size"))
    r.notes.append("gpt-oss MLP: gated quick-GELU GLU with +1 offset and clamp (SwiGLU-like, 3 matrices)")
    card.update(_window(r, card["num_layers"], _default_layer_types(r, card["num_layers"])))
    return card


def _gpt2(r: _Reader) -> dict[str, Any]:
    h = r.req("n_embd", "hidden_size")
    inner = r.opt("n_inner")
    return {"num_layers": r.req("n_layer", "num_hidden_layers"), "hidden_size": h,
            "num_attention_heads": r.req("n_head", "num_attention_heads"), "vocab_size": r.req("vocab_size"),
            "ffn_hidden_size": inner or (4 * h if isinstance(h, int) else None),
            "max_seq_len": r.req("n_positions", "max_position_embeddings"),
            "tied_embeddings": bool(r.opt("tie_word_embeddings", True)), "norm": "layernorm",
            "activation": r.act(False), "linear_bias": True, "position_embedding": "learned"}


def _gpt_neox(r: _Reader) -> dict[str, Any]:
    card = _attention_shape(r)
    card.update(ffn_hidden_size=r.req("intermediate_size"), norm="layernorm", activation=r.act(False),
                tied_embeddings=bool(r.opt("tie_word_embeddings", False)),
                linear_bias=bool(r.opt("attention_bias", True)))
    if not card["linear_bias"]:
        r.notes.append("attention_bias=false: the MLP biases (always present in GPT-NeoX) are not counted")
    return card


def _nemotron(r: _Reader) -> dict[str, Any]:
    card = _attention_shape(r)
    card.update(ffn_hidden_size=r.req("intermediate_size"), norm="layernorm", activation=r.act(False),
                tied_embeddings=bool(r.opt("tie_word_embeddings", False)))
    card.update(_biases(r))
    r.notes.append("LayerNorm1P (zero-centred gamma) counted as LayerNorm with bias")
    return card


_HF_BLOCK_SYMBOL = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
"""transformers NemotronHConfig layers_block_type names -> Megatron-Core hybrid pattern symbols."""


def _nemotron_h(r: _Reader) -> dict[str, Any]:
    """Nemotron-H / Nemotron 3 (transformers NemotronHConfig): a hybrid of Mamba-2, attention, MLP and MoE layers,
    each its own layer; the pattern from ``layers_block_type`` or ``hybrid_override_pattern``."""
    types = r.opt("layers_block_type", r.opt("layer_types", []))
    pattern = r.opt("hybrid_override_pattern")
    if types:
        known = [t if isinstance(t, str) and t in _HF_BLOCK_SYMBOL else None for t in types]
        bad = sorted({clip(repr(t), 40) for t, k in zip(types, known) if k is None})
        if bad:
            r.problems.append(f"config.json (model_type {r.model_type!r}): layers_block_type entries {', '.join(bad)} "
                              f"are not one of {', '.join(_HF_BLOCK_SYMBOL)}")
        pattern = "".join(_HF_BLOCK_SYMBOL[k] for k in known if k is not None) if not bad else None
    elif not isinstance(pattern, str) or not pattern:
        r.missing.append("hybrid_override_pattern (or layers_block_type)")
        pattern = None
    heads = r.req("num_attention_heads")
    hidden = r.req("hidden_size")
    card: dict[str, Any] = {
        "num_layers": len(pattern) if pattern else r.req("num_hidden_layers"), "hidden_size": hidden,
        "num_attention_heads": heads, "num_query_groups": r.opt("num_key_value_heads", heads),
        "head_dim": r.opt("head_dim", r.opt("attention_head_dim")), "vocab_size": r.req("vocab_size"),
        "max_seq_len": r.opt("max_position_embeddings", 4096), "norm": "rmsnorm", "position_embedding": "none",
        "tied_embeddings": bool(r.opt("tie_word_embeddings", False)), "hybrid_pattern": pattern,
        "mamba_num_heads": r.opt("mamba_num_heads"), "mamba_head_dim": r.opt("mamba_head_dim", 64, minimum=1),
        "mamba_state_dim": r.opt("ssm_state_size", 128, minimum=1),
        "mamba_num_groups": r.opt("n_groups", r.opt("mamba_n_groups", 8), minimum=1),
        "mamba_conv_kernel": r.opt("conv_kernel", r.opt("mamba_d_conv", 4), minimum=1),
        "mamba_chunk_size": r.opt("chunk_size", r.opt("mamba_chunk_size", 128), minimum=1),
    }
    raw = r.opt("mlp_hidden_act", "relu2")
    card["activation"] = _PLAIN_ACT.get(raw) if isinstance(raw, str) else None
    if card["activation"] is None:
        r.problems.append(f"config.json (model_type {r.model_type!r}): mlp_hidden_act={clip(repr(raw), 100)} is not "
                          f"supported; supported: {', '.join(sorted(_PLAIN_ACT))}")
    if pattern and "-" in pattern:
        card["ffn_hidden_size"] = r.req("intermediate_size")
    if pattern and "E" in pattern:
        card.update(num_experts=r.req("n_routed_experts"), moe_topk=r.req("num_experts_per_tok"),
                    moe_ffn_hidden_size=r.req("moe_intermediate_size"), router_bias=True)
        shared = r.opt("n_shared_experts", 0, minimum=0)
        if shared:
            card.update(num_shared_experts=shared,
                        shared_expert_ffn_hidden_size=r.opt("moe_shared_expert_intermediate_size"))
        card["moe_latent_size"] = r.opt("moe_latent_size", minimum=1)
    if r.opt("use_bias", False) or r.opt("attention_bias", False) or r.opt("mlp_bias", False):
        card["linear_bias"] = True
    n_mtp = r.opt("num_nextn_predict_layers", 0, minimum=0)
    if n_mtp:
        # each MTP depth: Megatron-Core's MTP pattern (mtp_layers_block_type; NemotronHConfig's default attention +
        # moe), which the card models as one transformer layer of the model's kind
        mtp = r.opt("mtp_layers_block_type", None)
        old = r.opt("mtp_hybrid_override_pattern", None)
        if mtp is None and isinstance(old, str):
            symbols = {v: k for k, v in _HF_BLOCK_SYMBOL.items()}
            mtp = [symbols.get(c, c) for c in old]
        mtp = mtp if mtp is not None else ["attention", "moe"]
        want = ["attention", "moe" if pattern and "E" in pattern else "mlp"]
        if mtp == want:
            card["mtp_layers"] = n_mtp
            r.notes.append(f"{n_mtp} MTP depths, each with weights of its own; a recipe with mtp_use_repeated_layer "
                           f"runs one set at every depth (mtp_shared_weights: true)")
        else:
            r.notes.append(f"MTP layers {clip(repr(mtp), 80)} are not one attention + {want[1]} layer: not modelled "
                           f"and not counted")
    if r.opt("sliding_window") is not None:
        r.notes.append(f"sliding_window={r.opt('sliding_window')} on the attention layers is not modelled (full "
                       f"causal attention, conservative)")
    return card


_QWEN3_NEXT_MIXER = {"linear_attention": "G", "full_attention": "*"}
"""transformers Qwen3NextConfig layer_types -> Megatron-Core hybrid pattern symbols of the token mixer."""


def _qwen3_next(r: _Reader) -> dict[str, Any]:
    """Qwen3-Next (transformers Qwen3NextConfig) and Qwen3.5's language model (Qwen3_5MoeTextConfig, a
    Qwen3NextConfig whose every layer is MoE; Qwen3_5TextConfig, the same layers with a dense MLP; their Gated
    DeltaNet splits in_proj into qkv / z / b / a, the same weights): transformer layers whose token mixer is a Gated
    DeltaNet ('linear_attention') or gated attention ('full_attention', every full_attention_interval-th layer by
    default), each followed by a MoE block (or a dense MLP in mlp_only_layers / off the decoder_sparse_step),
    written as a hybrid pattern of two symbols per layer (G or *, then E or -)."""
    dense = r.model_type == "qwen3_5_text"
    n = r.req("num_hidden_layers")
    types = r.opt("layer_types", [])
    if not types and isinstance(n, int) and 0 < n <= MAX_LIST_LENGTH:
        every = r.opt("full_attention_interval", 4, minimum=1)
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    bad = sorted({clip(repr(t), 40) for t in types if not (isinstance(t, str) and t in _QWEN3_NEXT_MIXER)})
    miscounted = isinstance(n, int) and len(types) != n
    if bad:
        r.problems.append(f"config.json (model_type {r.model_type!r}): layer_types entries {', '.join(bad)} are not "
                          f"one of {', '.join(_QWEN3_NEXT_MIXER)}")
    elif types and miscounted:
        r.problems.append(f"config.json (model_type {r.model_type!r}): layer_types lists {len(types)} layers but "
                          f"num_hidden_layers={n}")
    is_moe = (lambda i: False) if dense else _qwen_moe_layers(r)
    ok = not bad and types and not miscounted
    pattern = "".join(_QWEN3_NEXT_MIXER[t] + ("E" if is_moe(i) else "-") for i, t in enumerate(types)) if ok else None
    heads = r.req("num_attention_heads")
    card: dict[str, Any] = {
        "num_layers": len(pattern) if pattern else n, "hidden_size": r.req("hidden_size"),
        "num_attention_heads": heads, "num_query_groups": r.opt("num_key_value_heads", heads),
        "head_dim": r.opt("head_dim"), "vocab_size": r.req("vocab_size"),
        "max_seq_len": r.opt("max_position_embeddings", 4096), "norm": "rmsnorm", "activation": r.act(True),
        "tied_embeddings": bool(r.opt("tie_word_embeddings", False)), "qk_layernorm": True,
        "attention_output_gate": True, "hybrid_pattern": pattern, "hybrid_pairs": True,
        "gdn_num_key_heads": r.opt("linear_num_key_heads", 16, minimum=1),
        "gdn_num_value_heads": r.opt("linear_num_value_heads", 32, minimum=1),
        "gdn_key_head_dim": r.opt("linear_key_head_dim", 128, minimum=1),
        "gdn_value_head_dim": r.opt("linear_value_head_dim", 128, minimum=1),
        "gdn_conv_kernel": r.opt("linear_conv_kernel_dim", 4, minimum=1),
    }
    if not dense:
        card.update(num_experts=r.req("num_experts"), moe_topk=r.req("num_experts_per_tok"),
                    moe_ffn_hidden_size=r.req("moe_intermediate_size"))
    if pattern and "-" in pattern:
        card["ffn_hidden_size"] = r.req("intermediate_size")
    shared = 0 if dense else r.opt("shared_expert_intermediate_size", 0, minimum=0)
    if shared:
        card.update(num_shared_experts=1, shared_expert_ffn_hidden_size=shared)
        r.notes.append("the shared expert's sigmoid gate (H parameters per MoE layer) is not counted")
    card.update(_biases(r))
    n_mtp = r.opt("num_nextn_predict_layers", r.opt("mtp_num_hidden_layers", 0, minimum=0), minimum=0)
    if n_mtp:
        card["mtp_layers"] = n_mtp
        r.notes.append(f"{n_mtp} MTP depths, each a gated-attention + MoE layer with weights of its own")
    r.notes.append("partial rotary (partial_rotary_factor) is priced as RoPE over the whole of Q and K")
    return card


_FAMILIES: dict[str, Callable[[_Reader], dict[str, Any]]] = {
    "llama": _llama, "mistral": _llama, "qwen2": _llama, "qwen3": _llama, "phi3": _llama, "granite": _llama,
    "olmo2": _llama, "mixtral": _mixtral, "olmoe": _mixtral, "qwen2_moe": _qwen_moe, "qwen3_moe": _qwen_moe,
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek, "kimi_k2": _deepseek, "glm4_moe": _deepseek,
    "gpt_oss": _gpt_oss, "gpt2": _gpt2, "gpt_neox": _gpt_neox, "nemotron": _nemotron,
    "gemma": _gemma, "gemma2": _gemma, "gemma3_text": _gemma, "llama4": _llama4, "llama4_text": _llama4,
    "dbrx": _dbrx, "nemotron_h": _nemotron_h, "qwen3_next": _qwen3_next, "qwen3_5_moe_text": _qwen3_next,
    "qwen3_5_text": _qwen3_next,
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_FAMILIES))


def _model_type(data: dict[str, Any]) -> str:
    mt = data.get("model_type")
    if mt is None:
        archs = data.get("architectures")
        for arch in archs if isinstance(archs, list) else []:
            if isinstance(arch, str) and arch in _ARCHITECTURES:
                return _ARCHITECTURES[arch]
        raise InvalidConfigError(
            f"config.json has no 'model_type' (architectures={data.get('architectures')!r}); "
            f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if not isinstance(mt, str) or mt not in _FAMILIES:
        raise InvalidConfigError(f"config.json model_type={clip(repr(mt), 100)} is not supported; "
                                 f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}")
    return mt


# Largest accepted value of each size key, about 100x the largest published model's (DeepSeek-V3 / Kimi-K2:
# 61-64 layers, hidden 7168, 18432 FFN, 384 experts, vocab 163840; Llama-4: 10M-token context). A value
# above is a typo or an attack, refused before anything is sized by it (a list per layer, the parameter count).
SIZE_LIMITS: dict[str, int] = {
    "num_hidden_layers": 10_000, "n_layer": 10_000, "num_layers": 10_000,
    "hidden_size": 2**20, "n_embd": 2**20, "d_model": 2**20,
    "intermediate_size": 2**22, "moe_intermediate_size": 2**22, "shared_expert_intermediate_size": 2**22,
    "n_inner": 2**22, "ffn_hidden_size": 2**22,
    "num_attention_heads": 2**16, "n_head": 2**16, "num_key_value_heads": 2**16, "head_dim": 2**16,
    "vocab_size": 2**24,
    "num_local_experts": 2**16, "n_routed_experts": 2**16, "num_experts": 2**16, "n_shared_experts": 2**16,
    "num_experts_per_tok": 2**16,
    "max_position_embeddings": 2**30, "n_positions": 2**30, "sliding_window": 2**30,
    "kv_lora_rank": 2**20, "q_lora_rank": 2**20, "qk_nope_head_dim": 2**16, "qk_rope_head_dim": 2**16,
    "v_head_dim": 2**16, "first_k_dense_replace": 10_000, "moe_layer_freq": 10_000,
    "decoder_sparse_step": 10_000, "max_window_layers": 10_000, "intermediate_size_mlp": 2**22,
    "interleave_moe_layer_step": 10_000, "sliding_window_pattern": 10_000, "n_layers": 10_000, "n_heads": 2**16,
    "mamba_num_heads": 2**16, "mamba_head_dim": 2**16, "ssm_state_size": 2**16, "n_groups": 2**16,
    "conv_kernel": 2**16, "chunk_size": 2**30, "moe_shared_expert_intermediate_size": 2**22,
    "linear_num_key_heads": 2**16, "linear_num_value_heads": 2**16, "linear_key_head_dim": 2**16,
    "linear_value_head_dim": 2**16, "linear_conv_kernel_dim": 2**16, "full_attention_interval": 10_000,
}
"""Size keys of a config.json and the largest value :func:`card_from_hf_config` accepts."""
MAX_LIST_LENGTH = 10_000
"""Longest per-layer list (``layer_types``, ``mlp_only_layers``) accepted."""


def size_problems(data: dict[str, Any], where: str = "config.json") -> list[str]:
    """One line per absurd size in ``data`` (above :data:`SIZE_LIMITS`, or a list longer than a model's layers);
    ``where`` names the object in the messages (a wrapper's nested text config)."""
    problems = []
    for key, limit in SIZE_LIMITS.items():
        v = data.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not (v <= limit):  # NaN too
            if not isinstance(v, int):
                shown = repr(v)
            elif v.bit_length() <= 128:
                shown = f"{v:,}"
            else:
                shown = f"a number of about {int(v.bit_length() * 0.30103)} digits"
            problems.append(f"{where} {key}={shown} is absurd: at most {limit:,} is accepted "
                            f"(about 100x the largest published model's)")
    for key, v in data.items():
        if isinstance(v, list) and len(v) > MAX_LIST_LENGTH:
            problems.append(f"{where} {key} has {len(v):,} entries: at most {MAX_LIST_LENGTH:,} (one per layer)")
    return problems


def hf_card_name(path: str | Path, data: Any = None) -> str:
    """The card name of a Hugging Face config.json at ``path``: the repository name its ``_name_or_path`` gives
    ('Qwen/Qwen2.5-7B' -> 'Qwen2.5-7B'), else the repository of a Hugging Face cache snapshot
    (``models--Qwen--Qwen2.5-7B/snapshots/<hash>/config.json`` -> 'Qwen2.5-7B'), else the folder holding the file
    (resolved: ``./config.json`` is named after the current folder), else the file's stem."""
    given = data.get("_name_or_path") if isinstance(data, dict) else None
    last = re.split(r"[/\\]", given.strip().rstrip("/\\"))[-1] if isinstance(given, str) else ""
    if last not in ("", ".", ".."):  # '.' or './': the folder it was loaded from, found below
        return last
    p = Path(path).resolve()
    parent = p.parent
    if parent.parent.name == "snapshots" and parent.parent.parent.name.startswith("models--"):
        return parent.parent.parent.name.split("--")[-1]
    return parent.name or p.stem


def card_from_hf_config(data: dict[str, Any], name: str) -> ModelCard:
    """A model card from a parsed Hugging Face ``config.json`` (raises InvalidConfigError).

    Sizes above :data:`SIZE_LIMITS` are refused first, so a ``num_hidden_layers`` of 10**9 is an error,
    not a billion-entry list.
    """
    if not isinstance(data, dict):
        raise InvalidConfigError(f"config.json for {name!r} must be a JSON object, got a {type(data).__name__}")
    absurd = size_problems(data)
    wrapper, tower = data.get("model_type"), []
    if isinstance(wrapper, str) and wrapper in _TEXT_CONFIG:  # a multimodal checkpoint: its language model
        key = _TEXT_CONFIG[wrapper]
        text = data.get(key)
        if not isinstance(text, dict):
            raise InvalidConfigError(absurd + [f"config.json (model_type {wrapper!r}) needs a {key!r} object with "
                                               f"the language model's keys"])
        absurd += size_problems(text, f"config.json {key}")
        if isinstance(data.get("vision_config"), dict):
            tower = [f"the {wrapper} checkpoint's vision encoder is not priced (the card is its language model)"]
        data = {**text, "model_type": text.get("model_type", _TEXT_MODEL_TYPE[wrapper])}
    if absurd:
        raise InvalidConfigError(absurd)
    mt = _model_type(data)
    r = _Reader(data, mt)
    fields = _FAMILIES[mt](r)
    if r.missing:
        r.problems.insert(0, f"config.json (model_type {mt!r}) is incomplete, missing {', '.join(r.missing)}: a "
                             f"Hugging Face config.json of this model type states them (or write a model card)")
    if r.problems:
        raise InvalidConfigError(r.problems + ([] if r.missing and len(r.problems) == 1 else
                                               [f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}"]))
    fields = {k: v for k, v in fields.items() if v is not None}
    fields.update(name=name, family=mt, sources=[f"Hugging Face config.json (model_type {mt})"],
                  notes="; ".join(r.notes + tower))
    return ModelCard.from_dict(fields)


def card_to_yaml(card: ModelCard) -> str:
    """A card YAML (fields at their default omitted) that loads back to an equal card."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(ModelCard):
        v = getattr(card, f.name)
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        if required or v != default:
            out[f.name] = list(v) if isinstance(v, tuple) else v
    header = f"# {card.name}: model card written by oracle.hf_import.card_to_yaml\n"
    return header + yaml.safe_dump(out, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100)

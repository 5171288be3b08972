"""Hugging Face config.json import and card YAML round trip (offline, hand-written fixtures)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from oracle.errors import InvalidConfigError
from oracle.hf_import import SUPPORTED_MODEL_TYPES, card_from_hf_config, card_to_yaml
from oracle.model_card import ModelCard, bundled_models, load_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def _config(folder: str) -> dict:
    return json.loads((FIXTURES / folder / "config.json").read_text())


def _import(folder: str) -> ModelCard:
    return card_from_hf_config(_config(folder), name=folder)


# fixture folder -> bundled card with the same shapes
SAME_AS_BUNDLED = {
    "llama-3.1-8b": "llama3.1-8b",
    "mixtral-8x7b": "mixtral-8x7b",
    "deepseek-v3": "deepseek-v3",
    "kimi-k2": "kimi-k2",
    "qwen3-30b-a3b": "qwen3-30b-a3b",
    "gpt-oss-120b": "gpt-oss-120b",
    "gemma-2-9b": "gemma2-9b",
    "llama-4-maverick": "llama4-maverick",  # a multimodal wrapper: the text_config is the card
    "dbrx-base": "dbrx",  # nested attn_config / ffn_config
}

# fixture folder -> exact parameter count of the released checkpoint (Hugging Face safetensors count)
EXACT_TOTAL = {
    "gpt2": 124_439_808,          # GPT-2 small: learned positions, tied embeddings, biases, LayerNorm
    "qwen2.5-0.5b": 494_032_768,  # Qwen2.5-0.5B: QKV bias only, tied embeddings
    "phi-3-mini-4k": 3_821_079_552,  # Phi-3-mini: fused qkv / gate-up (the same matrices as Llama's), untied
}

# fixture folder -> (published total, active) parameters in billions as the model cards round them
PUBLISHED_B = {
    "olmo-2-7b": (7.30, 7.30),        # OLMo 2 1124 7B (q/k norms over whole projections: counted per head)
    "olmoe-1b-7b": (6.92, 1.28),      # OLMoE-1B-7B: 64 experts, top-8, every layer MoE
    "granite-3.1-8b": (8.17, 8.17),   # Granite 3.1 8B: GQA 32/8, tied embeddings, scalar multipliers
}
PUBLISHED_B_NO_EMBEDDINGS = {
    "glm-4.5-air": (106.85, 12.18),   # GLM-4.5-Air: "106B total, 12B active" (active without the embeddings)
}


@pytest.mark.parametrize("folder, bundled", sorted(SAME_AS_BUNDLED.items()))
def test_import_reproduces_bundled_card(folder, bundled):
    card, ref = _import(folder), load_model(bundled)
    assert card.total_params() == ref.total_params()
    assert card.active_params() == ref.active_params()
    assert card.total_params(include_mtp=True) == ref.total_params(include_mtp=True)
    assert card.layer_kinds == ref.layer_kinds
    for f in ("attention", "kv_heads", "head_size", "is_moe", "sliding_window", "sliding_window_every",
              "attention_sinks", "num_shared_experts"):
        assert getattr(card, f) == getattr(ref, f), f


@pytest.mark.parametrize("folder, expected", sorted(EXACT_TOTAL.items()))
def test_import_matches_checkpoint_count(folder, expected):
    assert _import(folder).total_params() == expected


@pytest.mark.parametrize("folder, published", sorted(PUBLISHED_B.items()))
def test_more_families_import_at_their_published_size(folder, published):
    card = _import(folder)
    assert (round(card.total_params() / 1e9, 2), round(card.active_params() / 1e9, 2)) == published


def test_glm4_moe_is_deepseeks_moe_layout_with_gqa_and_an_mtp_layer():
    card = _import("glm-4.5-air")
    emb = 2 * card.vocab_size * card.hidden_size
    total, active = PUBLISHED_B_NO_EMBEDDINGS["glm-4.5-air"]
    assert (round(card.total_params() / 1e9, 2), round((card.active_params() - emb) / 1e9, 2)) == (total, active)
    assert (card.attention, card.kv_heads, card.num_experts, card.moe_topk, card.num_shared_experts,
            card.first_dense_layers, card.mtp_layers, card.qkv_bias, card.linear_bias) == (
        "gqa", 8, 128, 8, 1, 1, 1, True, False)
    assert not any("o_proj" in n for n in card.notes.split(";"))  # GLM's o_proj has no bias: nothing left out


def test_phi3_window_and_families_by_architecture():
    card = _import("phi-3-mini-4k")
    assert (card.sliding_window, card.sliding_window_every) == (2047, 1)  # Phi-3: the window on every layer
    assert _import("olmoe-1b-7b").qk_layernorm and _import("olmo-2-7b").qk_layernorm
    for folder in ("phi-3-mini-4k", "olmoe-1b-7b", "olmo-2-7b", "granite-3.1-8b", "glm-4.5-air"):  # no model_type: architectures
        cfg = {k: v for k, v in _config(folder).items() if k != "model_type"}
        assert card_from_hf_config(cfg, folder).total_params() == _import(folder).total_params()


def test_deepseek_v3_details():
    card = _import("deepseek-v3")
    assert card.layer_kinds.count("dense") == 3 and card.layer_kinds.count("moe") == 58
    assert card.mtp_layers == 1 and card.router_bias and card.max_seq_len == 163840
    assert (card.q_lora_rank, card.kv_lora_rank, card.qk_rope_head_dim) == (1536, 512, 64)


def test_gpt_oss_window_and_extras():
    card = _import("gpt-oss-120b")
    assert (card.sliding_window, card.sliding_window_every) == (128, 2)
    assert card.attention_sinks and card.router_bias and card.linear_bias and card.moe_topk == 4
    assert "GLU" in card.notes


def test_load_model_routes_config_json():
    path = FIXTURES / "llama-3.1-8b" / "config.json"
    card = load_model(str(path))
    assert card.name == "llama-3.1-8b" and card.family == "llama"
    assert card.total_params() == load_model("llama3.1-8b").total_params()


def test_a_config_json_is_named_after_its_repository(tmp_path, monkeypatch):
    """The card of a config.json takes the repository name its _name_or_path gives, else a Hugging Face cache
    snapshot's repository, else its folder: also for './config.json' in the current folder (it was 'config')."""
    import json

    from oracle.hf_import import hf_card_name
    cfg = _config("llama-3.1-8b")
    snap = tmp_path / "models--meta-llama--Llama-3.1-8B" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(cfg))
    assert load_model(str(snap / "config.json")).name == "Llama-3.1-8B"
    plain = tmp_path / "my-8b"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps(cfg))
    monkeypatch.chdir(plain)
    assert load_model("config.json").name == "my-8b" == hf_card_name("./config.json")
    assert hf_card_name("config.json", {**cfg, "_name_or_path": "meta-llama/Llama-3.1-8B"}) == "Llama-3.1-8B"
    assert hf_card_name("config.json", {**cfg, "_name_or_path": "/data/ckpt/llama8b/"}) == "llama8b"
    assert hf_card_name("config.json", {**cfg, "_name_or_path": ""}) == "my-8b"
    assert hf_card_name("config.json", {**cfg, "_name_or_path": "./"}) == "my-8b"
    assert hf_card_name("config.json", {**cfg, "_name_or_path": ".."}) == "my-8b"


def test_mistral_sliding_window_on_every_layer():
    cfg = _config("llama-3.1-8b") | {"model_type": "mistral", "sliding_window": 4096}
    card = card_from_hf_config(cfg, "mistral-like")
    assert (card.sliding_window, card.sliding_window_every) == (4096, 1)


def test_irregular_window_pattern_is_noted_not_guessed():
    cfg = _config("gpt-oss-120b")
    cfg["layer_types"] = ["sliding_attention"] * 3 + ["full_attention"] * 33
    card = card_from_hf_config(cfg, "odd")
    assert card.sliding_window is None and "full attention" in card.notes


def test_qwen_moe_sparse_step_maps_exactly():
    cfg = _config("qwen3-30b-a3b") | {"num_hidden_layers": 6, "decoder_sparse_step": 2}
    card = card_from_hf_config(cfg, "sparse")
    assert card.layer_kinds == ("dense", "moe") * 3
    assert card.ffn_hidden_size == 6144


def test_qwen_moe_irregular_layers_are_rejected():
    cfg = _config("qwen3-30b-a3b") | {"num_hidden_layers": 6, "mlp_only_layers": [2]}
    with pytest.raises(InvalidConfigError, match="cannot be expressed"):
        card_from_hf_config(cfg, "irregular")


def test_deepseek_moe_layer_freq_maps_exactly():
    cfg = _config("deepseek-v3") | {"num_hidden_layers": 8, "first_k_dense_replace": 3, "moe_layer_freq": 2}
    card = card_from_hf_config(cfg, "freq")
    # HF: MoE where i >= 3 and i % 2 == 0
    assert [i for i, k in enumerate(card.layer_kinds) if k == "moe"] == [4, 6]


# ------------------------------------------------------------------ errors
def test_gemma3_five_local_layers_per_global_are_noted_not_guessed():
    text = {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208,
            "sliding_window": 1024, "sliding_window_pattern": 6, "hidden_activation": "gelu_pytorch_tanh"}
    card = card_from_hf_config({"model_type": "gemma3", "text_config": text}, name="gemma-3-4b")
    assert card.qk_layernorm and card.tied_embeddings and card.activation == "geglu"
    assert card.sliding_window is None and "not an every-n pattern" in card.notes


def test_wrapper_without_its_text_config_and_bad_nested_sections_are_clear_errors():
    with pytest.raises(InvalidConfigError, match="text_config"):
        card_from_hf_config({"model_type": "llama4", "vision_config": {}}, name="x")
    bad = {**_config("dbrx-base"), "ffn_config": [1, 2]}
    with pytest.raises(InvalidConfigError, match="ffn_config must be objects"):
        card_from_hf_config(bad, name="x")
    missing = {**_config("dbrx-base"), "ffn_config": {"moe_top_k": 4}}
    with pytest.raises(InvalidConfigError, match="ffn_config.*moe_num_experts") as e:
        card_from_hf_config(missing, name="x")
    assert "ffn_hidden_size" in str(e.value)


def test_unsupported_model_type_names_supported_ones():
    with pytest.raises(InvalidConfigError) as err:
        card_from_hf_config({"model_type": "bert", "hidden_size": 768}, "bert")
    msg = str(err.value)
    assert "'bert'" in msg and all(t in msg for t in SUPPORTED_MODEL_TYPES)


def test_missing_keys_are_named_all_at_once():
    cfg = _config("llama-3.1-8b")
    del cfg["vocab_size"], cfg["intermediate_size"]
    with pytest.raises(InvalidConfigError) as err:
        card_from_hf_config(cfg, "broken")
    msg = str(err.value)
    assert "vocab_size" in msg and "intermediate_size" in msg and "llama" in msg
    assert err.value.problems == [msg]  # one line names them all


def test_missing_model_type_falls_back_to_architectures():
    cfg = _config("llama-3.1-8b")
    del cfg["model_type"]
    assert card_from_hf_config(cfg, "arch").total_params() == load_model("llama3.1-8b").total_params()
    del cfg["architectures"]
    with pytest.raises(InvalidConfigError, match="model_type"):
        card_from_hf_config(cfg, "none")


def test_unsupported_activation_is_rejected():
    cfg = _config("llama-3.1-8b") | {"hidden_act": "tanh"}
    with pytest.raises(InvalidConfigError, match="hidden_act='tanh'"):
        card_from_hf_config(cfg, "tanh")


def test_malformed_json_is_an_invalid_config():
    with pytest.raises(InvalidConfigError, match="not valid YAML/JSON"):
        load_model(str(FIXTURES / "malformed" / "config.json"))


def test_non_mapping_is_rejected():
    with pytest.raises(InvalidConfigError, match="JSON object"):
        card_from_hf_config([1, 2], "list")  # type: ignore[arg-type]


def test_imported_card_violating_card_rules_is_rejected():
    cfg = _config("mixtral-8x7b") | {"num_experts_per_tok": 16}
    with pytest.raises(InvalidConfigError, match="moe_topk=16"):
        card_from_hf_config(cfg, "bad")


@pytest.mark.parametrize("folder, extra", [("llama-3.1-8b", {"model_type": "mistral", "sliding_window": 4096}),
                                           ("gpt-oss-120b", {"layer_types": None}), ("gemma-2-9b", {})])
@pytest.mark.parametrize("layers", [0, -3, pytest.param(-10**80, id="-1e80")])
def test_a_layer_count_below_one_is_the_cards_error_not_an_overflow(folder, extra, layers):
    # the per-layer attention kinds of older configs were a list of num_hidden_layers entries: [x] * -10**80
    # raised OverflowError (found by benchmarks/fuzz_inputs.py --random)
    cfg = {k: v for k, v in (_config(folder) | extra | {"num_hidden_layers": layers}).items() if v is not None}
    with pytest.raises(InvalidConfigError, match="num_layers"):
        card_from_hf_config(cfg, "bad")


# ------------------------------------------------------------------ YAML round trip
@pytest.mark.parametrize("name", bundled_models())
def test_bundled_card_yaml_round_trip(name):
    card = load_model(name)
    text = card_to_yaml(card)
    assert ModelCard.from_dict(yaml.safe_load(text)) == card


@pytest.mark.parametrize("folder", sorted({*SAME_AS_BUNDLED, *EXACT_TOTAL}))
def test_imported_card_yaml_round_trip(folder, tmp_path):
    card = _import(folder)
    p = tmp_path / f"{folder}.yaml"
    p.write_text(card_to_yaml(card))
    assert load_model(str(p)) == card

"""Bundled model cards: every card loads, and its parameter count matches the published figure.

Golden table: a card's computed total (and, for MoE, active) parameters must lie within a tolerance of
the figure the card cites (``published_params_billion`` / ``published_active_params_billion``). The
default tolerance is 2%; a wider one needs a written reason in TOLERANCE below.
"""
from __future__ import annotations

import pytest
import yaml

from oracle.errors import InvalidConfigError, UnknownComponentError
from oracle.model_card import MODEL_DIR, ModelCard, bundled_models, load_model

DEFAULT_TOL = 0.02

EXPECTED_CARDS = {
    "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3.1-8b", "llama3.1-70b",
    "llama3.1-405b", "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "kimi-k2", "qwen3-30b-a3b",
    "qwen3-235b-a22b", "gpt-oss-20b", "gpt-oss-120b", "nemotron3-8b", "nemotron3-22b", "nemotron4-15b",
    "nemotron4-340b", "gpt3-5b", "gpt3-20b", "gpt3-175b", "tiny-dense", "tiny-moe", "tiny-mla",
    # open models of published training runs outside ../shared/validation (Hugging Face config.json shapes)
    "llama3.2-1b", "llama3.2-3b", "llama4-scout", "llama4-maverick", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b",
    "qwen2.5-72b", "qwen3-8b", "qwen3-14b", "qwen3-32b", "mistral-7b", "mistral-nemo-12b", "mistral-large-2",
    "gemma2-9b", "gemma2-27b", "deepseek-v2-lite", "deepseek-v2", "dbrx",
    # hybrid Mamba-2 / Transformer models (Megatron-Core HybridModel; Megatron-Bridge recipes)
    "nemotronh-8b", "nemotronh-47b", "nemotronh-56b", "nemotron3-nano-30b-a3b", "nemotron-nano-9b-v2",
    "nemotron-nano-12b-v2",
    # hybrid Gated DeltaNet / gated attention MoE (Megatron-Bridge qwen3_next recipes)
    "qwen3-next-80b-a3b",
    # Megatron-LM README GPT tables (H100 weak scaling; A100), keys of ../shared/validation/model_cards_reference.yaml
    *(f"megatron-gpt-{s}" for s in ("1.7b", "7.1b", "16b", "32b", "70b", "119b", "177b", "314b", "462b")),
    *(f"megatron-gpt-a100-{s}" for s in ("1.7b", "3.6b", "7.5b", "18b", "39b", "76b", "145b", "310b", "530b", "1t")),
}
TEST_CARDS = {"tiny-dense", "tiny-moe", "tiny-mla"}

# card -> (total tolerance, reason). Only rows that need more than DEFAULT_TOL.
TOLERANCE: dict[str, tuple[float, str]] = {
    "nemotron3-8b": (0.08, "only the rounded name '8B' is published; computed 8.54B, of which 2.1B are the "
                           "untied 256k-vocab embeddings (vocab itself an assumption, see the card)"),
    "nemotron3-22b": (0.05, "only the rounded name '22B' is published (NeMo Nemotron3Config22B); computed 21.27B"),
    "gpt3-5b": (0.03, "only the rounded NeMo name GPTConfig5B is published; computed 5.05B"),
    "gpt3-20b": (0.03, "only the rounded NeMo name GPTConfig20B is published; computed 20.26B"),
    "megatron-gpt-1.7b": (0.04, "only the rounded README label '1.7B' is published; the table's shapes with the "
                                "assumed untied embeddings and learned positions count 1.754B (+3.2%)"),
    "megatron-gpt-a100-1.7b": (0.03, "the README/SC21 table's '1.7B' is rounded; computed 1.652B (-2.8%)"),
    "nemotron-nano-12b-v2": (0.03, "only the rounded name '12B' is cited; computed 12.31B (+2.6%)"),
}

# card -> (active tolerance, reason). Only rows that need more than DEFAULT_TOL.
ACTIVE_TOLERANCE: dict[str, tuple[float, str]] = {
    "kimi-k2": (0.03, "published '32B activated' is rounded to whole billions and does not say whether the "
                      "1.17B input embedding counts: 32.86B with it, 31.69B without"),
    "deepseek-v2-lite": (0.03, "published '2.4B activated' is rounded to a tenth: 2.45B without the input "
                               "embedding (2.66B with it)"),
    "qwen3-next-80b-a3b": (0.20, "published '3B activated' is a round figure: the card counts 3.25B without "
                                 "either embedding (+8%) and 3.56B with the output layer (+19%, the figure checked "
                                 "here); the total (79.7B of 80B) is within the default tolerance"),
}

# Published active counts that leave out the input embedding (a lookup, no matmul), with the source.
ACTIVE_EXCLUDES_INPUT_EMBEDDING: dict[str, str] = {
    "gpt-oss-120b": "gpt-oss model card parameter table: active = MLP (top-4) + attention + unembedding",
    "gpt-oss-20b": "gpt-oss model card parameter table: active = MLP (top-4) + attention + unembedding",
    "deepseek-v2-lite": "DeepSeek-V2 report (arXiv:2405.04434): 2.4B activated of 15.7B; the card counts 2.45B "
                        "without the input embedding, 2.66B with it",
    "qwen3-next-80b-a3b": "Qwen3-Next-80B-A3B model card: '80B total, 3B activated' (the embeddings are 0.31B each)",
}

REAL_CARDS = sorted(EXPECTED_CARDS - TEST_CARDS)
MOE_CARDS = sorted(n for n in REAL_CARDS if load_model(n).is_moe)


def _rel(computed: float, published: float) -> float:
    return (computed - published) / published


def test_bundled_cards_are_exactly_the_expected_set():
    assert set(bundled_models()) == EXPECTED_CARDS


def test_tolerance_tables_name_real_cards():
    for table in (TOLERANCE, ACTIVE_TOLERANCE, ACTIVE_EXCLUDES_INPUT_EMBEDDING):
        assert set(table) <= set(REAL_CARDS)
    for tol, reason in [*TOLERANCE.values(), *ACTIVE_TOLERANCE.values()]:
        assert tol > DEFAULT_TOL and len(reason) > 20


@pytest.mark.parametrize("name", sorted(EXPECTED_CARDS))
def test_card_loads_and_is_consistent(name):
    card = load_model(name)
    assert card.name == name, f"{MODEL_DIR / name}.yaml declares name {card.name!r}"
    assert card.problems() == []
    assert card.sources, f"{name}: a card must cite its sources"
    assert card.total_params() > 0
    assert len(card.layer_kinds) == card.num_layers
    if card.is_moe:
        assert 0 < card.active_params() < card.total_params()
    text = (MODEL_DIR / f"{name}.yaml").read_text()
    assert text.startswith("#"), f"{name}.yaml needs a header comment with its sources"


@pytest.mark.parametrize("name", REAL_CARDS)
def test_total_params_match_published(name):
    card = load_model(name)
    assert card.published_params_billion, f"{name}: published_params_billion missing"
    tol = TOLERANCE.get(name, (DEFAULT_TOL, ""))[0]
    computed = card.total_params() / 1e9
    rel = _rel(computed, card.published_params_billion)
    assert abs(rel) <= tol, (f"{name}: computed {computed:.3f}B vs published {card.published_params_billion}B "
                             f"({rel:+.2%}, tolerance {tol:.0%})")


@pytest.mark.parametrize("name", MOE_CARDS)
def test_active_params_match_published(name):
    card = load_model(name)
    assert card.published_active_params_billion, f"{name}: published_active_params_billion missing"
    active = card.active_params()
    if name in ACTIVE_EXCLUDES_INPUT_EMBEDDING:
        active -= card.vocab_size * card.hidden_size
    tol = ACTIVE_TOLERANCE.get(name, (DEFAULT_TOL, ""))[0]
    rel = _rel(active / 1e9, card.published_active_params_billion)
    assert abs(rel) <= tol, (f"{name}: computed active {active / 1e9:.3f}B vs published "
                             f"{card.published_active_params_billion}B ({rel:+.2%}, tolerance {tol:.0%})")


def test_test_cards_have_no_published_figure():
    for name in TEST_CARDS:
        card = load_model(name)
        assert card.family == "test" and card.published_params_billion is None


def test_deepseek_v3_layer_kinds():
    card = load_model("deepseek-v3")
    assert card.layer_kinds[:3] == ("dense",) * 3
    assert card.layer_kinds[3:] == ("moe",) * 58


def test_deepseek_v3_with_mtp_matches_685b():
    """685B = 671B + the 14B MTP module as stored, i.e. with its own embedding and output-head copies.

    total_params(include_mtp=True) shares those two matrices (as training does), so add them back.
    """
    card = load_model("deepseek-v3")
    with_copies = card.total_params(include_mtp=True) + 2 * card.vocab_size * card.hidden_size
    assert abs(_rel(with_copies / 1e9, 685.0)) <= 0.005


def test_tiny_cards_shapes():
    moe = load_model("tiny-moe")
    assert moe.layer_kinds == ("dense", "moe", "moe", "moe")
    mla = load_model("tiny-mla")
    assert mla.attention == "mla" and mla.num_shared_experts == 1 and mla.mtp_layers == 1
    assert mla.layer_kinds == ("dense", "moe", "moe", "moe")
    assert mla.total_params(include_mtp=True) > mla.total_params()
    dense = load_model("tiny-dense")
    assert (dense.num_layers, dense.hidden_size, dense.kv_heads, dense.vocab_size) == (4, 256, 2, 1024)


def test_gpt_oss_window_every_other_layer():
    card = load_model("gpt-oss-120b")
    assert [card.uses_window(i) for i in range(4)] == [True, False, True, False]


# ------------------------------------------------------------------ bad cards
def _tiny_dict(**changes):
    data = yaml.safe_load((MODEL_DIR / "tiny-moe.yaml").read_text())
    data.update(changes)
    return data


def test_list_instead_of_mapping_is_rejected(tmp_path):
    p = tmp_path / "listy.yaml"
    p.write_text(yaml.safe_dump([_tiny_dict()]))
    with pytest.raises(InvalidConfigError, match="mapping"):
        load_model(str(p))


def test_unknown_key_is_rejected_with_suggestion(tmp_path):
    data = _tiny_dict()
    data["num_layer"] = data.pop("num_layers")
    with pytest.raises(InvalidConfigError, match=r"unknown key 'num_layer'.*did you mean 'num_layers'"):
        ModelCard.from_dict(data)
    p = tmp_path / "typo.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(InvalidConfigError, match="did you mean 'num_layers'"):
        load_model(str(p))


def test_topk_above_num_experts_is_rejected():
    with pytest.raises(InvalidConfigError, match=r"moe_topk=9 must be in 1\.\.num_experts=8"):
        ModelCard.from_dict(_tiny_dict(moe_topk=9))


def test_all_problems_are_reported_together():
    with pytest.raises(InvalidConfigError) as err:
        ModelCard.from_dict(_tiny_dict(moe_topk=9, num_attention_heads=3))
    assert len(err.value.problems) == 2


def test_a_card_based_on_a_bundled_one_is_that_card_with_its_own_keys(tmp_path):
    p = tmp_path / "llama-12b-variant.yaml"
    p.write_text("based_on: llama3.1-8b\nnum_layers: 48\nhidden_size: 5120\nnum_attention_heads: 40\n")
    card, base = load_model(str(p)), load_model("llama3.1-8b")
    assert (card.name, card.num_layers, card.hidden_size, card.num_attention_heads) == (
        "llama-12b-variant", 48, 5120, 40)
    own = {"name", "num_layers", "hidden_size", "num_attention_heads", "published_params_billion",
           "published_active_params_billion", "sources", "aliases", "notes"}
    assert {k: v for k, v in card.to_dict().items() if k not in own} == {
        k: v for k, v in base.to_dict().items() if k not in own}
    # the base's published counts, citations and spellings describe the base, not the variant
    assert (card.published_params_billion, card.sources, card.aliases, card.notes) == (
        None, (), (), "based on llama3.1-8b")
    inline = ModelCard.from_dict({"based_on": "qwen3-30b-a3b", "name": "small-moe", "num_layers": 24})
    assert inline.is_moe and inline.num_experts == load_model("qwen3-30b-a3b").num_experts
    for bad, needle in (({"based_on": "lama3.1-8b"}, "based_on: unknown model 'lama3.1-8b'"),
                        ({"based_on": "cards/x.yaml"}, "must name a bundled model card"),
                        ({"based_on": 5}, "based_on=5 must name a bundled model card"),
                        ({"based_on": "llama3.1-8b", "num_layers": 0}, "num_layers")):
        with pytest.raises(InvalidConfigError, match=needle):
            ModelCard.from_dict(bad, name="v")


def test_unknown_model_lists_valid_names():
    with pytest.raises(UnknownComponentError) as err:
        load_model("llama9-1t")
    assert err.value.valid == sorted(bundled_models())
    assert "llama9-1t" in str(err.value) and "llama3.1-70b" in str(err.value)


def test_a_card_hashes_as_its_fields_and_a_copy_hashes_itself_again():
    """ModelCard caches its hash (it keys most oracle caches); the cache never travels with a pickled or copied card,
    whose string hashes differ in another process."""
    import copy
    import dataclasses
    import pickle
    card = load_model("mixtral-8x22b")
    assert hash(card) == hash(tuple(getattr(card, f.name) for f in dataclasses.fields(card)))
    for other in (pickle.loads(pickle.dumps(card)), copy.copy(card), copy.deepcopy(card)):
        assert "_hash" not in other.__dict__ and other == card and hash(other) == hash(card)
    changed = card.replace(num_layers=card.num_layers + 1)
    assert hash(changed) != hash(card) and changed != card

"""Megatron's module-level selective recompute (training.recompute_modules): what each module drops from
the op graph's saved tensors, what its replay costs, and the default ('core_attn') left as it was."""
from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracle.activations import DEFAULT_SELECTIVE, blocks, recompute_droppers, replayed_ops, shape_of
from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.memory import layer_activation_bytes, module_tree, project_memory
from oracle.model_card import load_model
from oracle.opgraph import BF16, FP32, RECOMPUTE_MODULES, SELECTIVE, layer_ops
from oracle.projector import project

from tests.oracle.test_activations_opgraph import CARDS
from tests.oracle.test_activations_opgraph import make as _make


def make(model: str, num_gpus: int = 8, **training) -> RunConfig:
    """A run of ``model`` on H100s, seq 4096 and gbs 64 unless given."""
    return _make(model, num_gpus, **{"seq_len": 4096, "gbs": 64, **training})


def _moe_run(card: str, pp: int = 1, **kw) -> RunConfig:
    """tp=2 (SP) x ep=8 (MoE cards) x ``pp`` on 8 x pp GPUs."""
    m = load_model(card)
    ep = 8 if m.is_moe and m.num_experts % 8 == 0 else 1
    return make(card, 8 * pp, tp=2, pp=pp, ep=ep, **kw)


def valid_modules(card: str) -> list[str]:
    """The recompute_modules values legality accepts for ``card``."""
    run = _moe_run(card)
    ok = []
    for name in RECOMPUTE_MODULES:
        try:
            run.with_training(recompute="selective", recompute_modules=(name,)).check()
            ok.append(name)
        except InvalidConfigError:
            pass
    return ok


def dropped(run: RunConfig, kind: str, module: str) -> set[str]:
    """``op.tensor`` names ``module`` drops in one ``kind`` layer."""
    ops = layer_ops(run.model, shape_of(run).graph, kind)
    return {f"{op.name}.{t.name}" for op, by in zip(ops, recompute_droppers(ops))
            for t, d in zip(op.saved, by) if module in d}


def act(run: RunConfig, kind: str, modules: tuple[str, ...] | None) -> float:
    if not modules:
        return layer_activation_bytes(run, kind, recompute="none")
    return layer_activation_bytes(run.with_training(recompute="selective", recompute_modules=modules), kind)


# ---------------------------------------------------------------------------------- what each module drops
def test_each_module_drops_its_own_tensors_deepseek_v3():
    run = make("deepseek-v3", 64, tp=2, ep=8, pp=4, decoder_first_pipeline_num_layers=16)
    moe = {"core_attn": {"attn_core.softmax_lse"},
           "moe_act": {"experts_down.act_output"},
           "layernorm": {"q_down.qkv_input", "router.router_input"},
           "mla_up_proj": {"q_up.q_up_input", "kv_up.kv_up_input", "attn_core.q", "attn_core.k", "attn_core.v"},
           "mlp": set(),
           "moe": {"router_topk.router_logits", "router_topk.router_probs", "permute.routing_map",
                   "experts_up.expert_fc1_input", "experts_act.expert_probs", "experts_act.fc1_output",
                   "experts_down.act_output", "shared_act.fc1_output", "shared_down.act_output"},
           "shared_experts": {"shared_act.fc1_output", "shared_down.act_output"}}
    dense = {**{k: set() for k in moe}, "core_attn": moe["core_attn"], "mla_up_proj": moe["mla_up_proj"],
             "layernorm": {"q_down.qkv_input"},  # the dense pre-MLP norm is fused into linear_fc1
             "mlp": {"mlp_up.fc1_input", "mlp_act.fc1_output", "mlp_down.act_output"}}
    for kind, want in (("moe", moe), ("dense", dense)):
        assert {m: dropped(run, kind, m) for m in RECOMPUTE_MODULES} == want, kind


def test_mla_up_proj_bytes_by_hand_deepseek_v3():
    # tp=2, SP: T = 4096 tokens, T_sp = 2048; 64 heads per rank, Q/K head dim 128 + 64 (RoPE), V 128;
    # up-projection inputs q_lora 1536 and kv_lora 512 on the SP shard, bf16
    run = make("deepseek-v3", 64, tp=2, ep=8, pp=4, decoder_first_pipeline_num_layers=16)
    qkv = 4096 * 64 * (192 + 192 + 128) * BF16
    up_inputs = 2048 * (1536 + 512) * BF16
    for kind in ("dense", "moe"):
        assert act(run, kind, None) - act(run, kind, ("mla_up_proj",)) == qkv + up_inputs


def test_moe_act_bytes_by_hand_qwen3_30b_a3b():
    # tp=2 (SP), ep=8: T_sp = 2048 tokens x top-8 = 16,384 (token, expert) pairs; the fc2 input is the
    # activation output, 768 wide, bf16; nothing else goes (fc1 output and probs are its checkpoint)
    run = make("qwen3-30b-a3b", 8, tp=2, ep=8)
    assert dropped(run, "moe", "moe_act") == {"experts_down.act_output"}
    assert act(run, "moe", None) - act(run, "moe", ("moe_act",)) == 2048 * 8 * 768 * BF16
    # layernorm: only the pre-MLP norm is a module of its own (GQA's input norm is fused into linear_qkv)
    assert act(run, "moe", None) - act(run, "moe", ("layernorm",)) == 2048 * 2048 * BF16


def test_core_attn_is_what_selective_dropped_before():
    run = make("llama3-8b", 8, tp=2, pp=2)
    ops = layer_ops(run.model, shape_of(run).graph, "dense")
    assert dropped(run, "dense", "core_attn") == {f"{op.name}.{t.name}" for op in ops for t in op.saved
                                                  if t.dropped_by == SELECTIVE}
    assert act(run, "dense", None) - act(run, "dense", ("core_attn",)) == 16 * 4096 * FP32  # lse, 32/2 heads


# ---------------------------------------------------------------------------------- default unchanged
@pytest.mark.parametrize("card", ["llama3-70b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-20b", "mixtral-8x7b",
                                  "tiny-mla"])
def test_default_selective_equals_explicit_core_attn(card):
    extra = {"decoder_first_pipeline_num_layers": 13} if card == "deepseek-v3" else {}
    base = _moe_run(card, pp=2 if card != "tiny-mla" else 1, recompute="selective", **extra)
    explicit = base.with_training(recompute_modules=("core_attn",))
    a, b = project(base), project(explicit)
    assert a.iteration_time_s == b.iteration_time_s
    assert a.breakdown.recompute_s == b.breakdown.recompute_s
    assert [s.total_bytes for s in a.memory.stages] == [s.total_bytes for s in b.memory.stages]
    assert module_tree(base, 0) == module_tree(explicit, 0)
    # the general drop path equals the precomputed default for the default set, exactly
    bl = blocks(base.model, shape_of(base))
    for kind in set(base.model.layer_kinds):
        layer = bl.layer(kind)
        assert layer.act_none - sum(b for by, b in layer.drop_groups if by & DEFAULT_SELECTIVE) == layer.act_selective


# ---------------------------------------------------------------------------------- properties
@st.composite
def card_and_modules(draw):
    card = draw(st.sampled_from([c for c in CARDS if valid_modules(c)]))
    valid = valid_modules(card)
    subset = draw(st.lists(st.sampled_from(valid), unique=True, max_size=len(valid) - 1))
    extra = draw(st.sampled_from([m for m in valid if m not in subset]))
    return card, tuple(subset), extra


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(card_and_modules())
def test_adding_a_module_never_adds_memory(case):
    card, subset, extra = case
    run = _moe_run(card)
    for kind in set(run.model.layer_kinds):
        assert act(run, kind, subset + (extra,)) <= act(run, kind, subset)
        assert act(run, kind, subset + (extra,)) <= act(run, kind, None)
    before = run if not subset else run.with_training(recompute="selective", recompute_modules=subset)
    after = run.with_training(recompute="selective", recompute_modules=subset + (extra,))
    assert project_memory(after, trees="none").peak_bytes <= project_memory(before, trees="none").peak_bytes


_TIME_CARDS = ["qwen3-30b-a3b", "tiny-mla", "tiny-moe", "llama3-8b", "gpt-oss-20b", "mixtral-8x7b"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_TIME_CARDS), st.data())
def test_adding_a_module_never_lowers_recompute_time(card, data):
    valid = valid_modules(card)
    subset = tuple(data.draw(st.lists(st.sampled_from(valid), unique=True, min_size=1, max_size=len(valid) - 1)))
    extra = data.draw(st.sampled_from([m for m in valid if m not in subset]))
    run = _moe_run(card, recompute="selective")
    a = project(run.with_training(recompute_modules=subset))
    b = project(run.with_training(recompute_modules=subset + (extra,)))
    assert b.breakdown.recompute_s >= a.breakdown.recompute_s
    assert b.iteration_time_s >= a.iteration_time_s * (1 - 1e-12)


def test_replay_cost_small_for_activations_and_norms_large_for_the_moe_block():
    run = make("qwen3-30b-a3b", 8, tp=2, ep=8, recompute="selective")
    rec = {m: project(run.with_training(recompute_modules=(m,))).breakdown.recompute_s
           for m in ("moe_act", "layernorm", "moe")}
    assert 0 < rec["layernorm"] < rec["moe_act"] < rec["moe"] / 4
    # the MoE block's replay is the forward of its ops (router, dispatch, experts, combine), once
    ops = layer_ops(run.model, shape_of(run).graph, "moe")
    names = [op.name for op in replayed_ops(ops, frozenset({"moe", "moe_act"}))]
    assert names == [op.name for op in ops if op.name.startswith(("router", "permute", "experts"))]


# ---------------------------------------------------------------------------------- config
def test_round_trip_yaml_and_overrides(tmp_path):
    run = make("deepseek-v3", 64, tp=2, ep=8, pp=4, decoder_first_pipeline_num_layers=16, recompute="selective",
               recompute_modules=["mla_up_proj", "moe_act"])
    assert run.training.recompute_modules == ("mla_up_proj", "moe_act")
    assert run.training.recomputed_modules == frozenset({"mla_up_proj", "moe_act"})
    again = RunConfig.from_dict(run.to_dict())
    assert again.training == run.training and again.key() == run.key()
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(run.to_dict()))
    over = RunConfig.load(path, ["recompute_modules=[moe, layernorm]"])
    assert over.training.recompute_modules == ("moe", "layernorm")
    assert make("llama3-8b", recompute="selective").training.recomputed_modules == frozenset({"core_attn"})
    assert make("llama3-8b").training.recomputed_modules == frozenset()


@pytest.mark.parametrize("card, training, message", [
    ("llama3-8b", {"recompute": "selective", "recompute_modules": ["attention"]},
     "'attention' is not one of core_attn | moe_act | layernorm | mla_up_proj | mlp | moe | shared_experts"),
    ("llama3-8b", {"recompute": "full", "recompute_modules": ["core_attn"]},
     "only applies with recompute=selective, got recompute=full"),
    ("llama3-8b", {"recompute_modules": ["core_attn"]}, "only applies with recompute=selective, got recompute=none"),
    ("llama3-8b", {"recompute": "selective", "recompute_modules": []}, "recomputes nothing: use recompute=none"),
    ("llama3-8b", {"recompute": "selective", "recompute_modules": ["mlp", "mlp"]}, "lists a module twice"),
    ("llama3-8b", {"recompute": "selective", "recompute_modules": ["mla_up_proj"]},
     "'mla_up_proj' needs an MLA model (llama3-8b has gqa attention); valid for llama3-8b: core_attn, layernorm, mlp"),
    ("llama3-8b", {"recompute": "selective", "recompute_modules": ["moe"]}, "'moe' needs a MoE model"),
    ("qwen3-30b-a3b", {"recompute": "selective", "recompute_modules": ["shared_experts"], "ep": 8},
     "'shared_experts' needs shared experts (qwen3-30b-a3b has none)"),
    ("qwen3-30b-a3b", {"recompute": "selective", "recompute_modules": ["mlp"], "ep": 8},
     "'mlp' needs dense MLP layers (qwen3-30b-a3b has MoE layers only; use moe)"),
])
def test_bad_recompute_modules_are_named(card, training, message):
    with pytest.raises(InvalidConfigError) as exc:
        make(card, **training)
    assert message in str(exc.value)


def test_every_valid_module_projects_on_every_card():
    for card in ("deepseek-v3", "qwen3-30b-a3b", "llama3-8b", "tiny-mla", "tiny-moe"):
        extra = {"pp": 4, "decoder_first_pipeline_num_layers": 16} if card == "deepseek-v3" else {}
        run = _moe_run(card, recompute="selective", **extra)
        valid = valid_modules(card)
        for r in range(1, len(valid) + 1):
            for mods in itertools.islice(itertools.combinations(valid, r), 6):
                p = project(replace(run, training=run.training.replace(recompute_modules=mods)))
                assert p.iteration_time_s > 0 and p.breakdown.recompute_s >= 0

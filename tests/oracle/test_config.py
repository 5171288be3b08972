"""Configuration model: strict parsing, overrides, round-trips and legality messages."""
import json

import pytest

from oracle.config import RunConfig, TrainingConfig, apply_overrides
from oracle.errors import InvalidConfigError, UnknownComponentError
from oracle.layout import Layout
from oracle.schema import from_dict

BASE = {"model": "llama3.1-70b", "cluster": {"hardware": "h100-sxm", "num_gpus": 64},
        "training": {"seq_len": 8192, "gbs": 128, "tp": 8, "pp": 2}}


def make(**training):
    d = json.loads(json.dumps(BASE))
    d["training"].update(training)
    return RunConfig.from_dict(d)


def problems_of(**training):
    with pytest.raises(InvalidConfigError) as ei:
        make(**training)
    return ei.value.problems


def test_defaults_match_the_documented_training_section():
    t = from_dict(TrainingConfig, {"seq_len": 8192, "gbs": 128}, "training")
    assert (t.mbs, t.tp, t.pp, t.vpp, t.cp, t.ep, t.etp) == (1, 1, 1, 1, 1, 1, 1)
    assert t.precision == "bf16" and t.fp8_activations is False and t.pp_schedule == "auto"
    assert t.recompute == "none" and t.recompute_num_layers is None
    assert t.use_distributed_optimizer is True and t.fsdp is False and t.sequence_parallel == "auto"
    assert t.moe_a2a_backend == "alltoall" and t.overlap_grad_reduce and t.overlap_param_gather
    assert t.moe_imbalance == 1.0


def test_derived_layout():
    run = make()
    L = Layout(run)
    assert L.dp == 4 and L.num_microbatches == 32
    assert run.training.sp is True and run.training.schedule == "1f1b"
    assert [len(c[0]) for c in L.stage_layers] == [40, 40]


def test_round_trip_and_stable_key():
    run = make(vpp=2)
    again = RunConfig.from_dict(run.to_dict())
    assert again.to_dict() == run.to_dict()
    assert again.key() == run.key()
    assert make(vpp=4).key() != run.key()


def test_unknown_key_is_named_with_a_suggestion():
    probs = problems_of(tpp=8)
    assert any("unknown key 'tpp'" in p and "did you mean 'tp'" in p for p in probs)


def test_num_nodes_alternative():
    d = json.loads(json.dumps(BASE))
    d["cluster"] = {"hardware": "h100-sxm", "num_nodes": 8}
    assert RunConfig.from_dict(d).cluster.num_gpus == 64
    d["cluster"]["num_gpus"] = 64
    with pytest.raises(InvalidConfigError, match="exactly one of num_gpus or num_nodes"):
        RunConfig.from_dict(d)


@pytest.mark.parametrize("changes,needle", [
    ({"tp": 3}, "tp*pp*cp = 3*2*1 = 6 does not divide 64 GPUs"),
    ({"pp": 3}, "does not divide 64 GPUs"),
    ({"pp": 2, "vpp": 3}, "not divisible by pp*vpp"),
    ({"gbs": 98}, "gbs=98 is not divisible by mbs*dp = 1*4 = 4"),
    ({"cp": 2, "seq_len": 8190}, "2*cp"),
    ({"vpp": 2, "pp_schedule": "1f1b"}, "needs vpp=1"),
    ({"vpp": 4, "pp_schedule": "zbv"}, "needs vpp=2"),
    ({"ep": 2}, "needs a MoE model"),
    ({"recompute_num_layers": 2}, "only applies with recompute=full"),
    ({"fp8_activations": True}, "needs precision=fp8"),
    ({"precision": "fp4"}, "precision='fp4' is not one of bf16 | fp8"),
    ({"mbs": 0}, "must be >= 1"),
    ({"tp": "eight"}, "must be an integer"),
])
def test_illegal_layouts_are_explained(changes, needle):
    probs = problems_of(**changes)
    assert any(needle in p for p in probs), probs


def test_heads_must_divide_by_tp():
    d = json.loads(json.dumps(BASE))
    d["model"] = "llama2-13b"
    d["training"].update(tp=16, pp=1, gbs=64)
    with pytest.raises(InvalidConfigError, match="num_attention_heads=40 of llama2-13b is not divisible by tp=16"):
        RunConfig.from_dict(d)


def test_every_problem_is_reported_at_once():
    probs = problems_of(tp=3, gbs=7)
    assert len(probs) >= 3


def test_fp8_needs_hardware_support():
    d = json.loads(json.dumps(BASE))
    d["cluster"]["hardware"] = "a100-80gb"
    d["training"]["precision"] = "fp8"
    with pytest.raises(InvalidConfigError, match="needs FP8 support"):
        RunConfig.from_dict(d)


def test_moe_checks():
    d = {"model": "mixtral-8x22b", "cluster": {"hardware": "h100-sxm", "num_gpus": 64},
         "training": {"seq_len": 4096, "gbs": 256, "ep": 16}}
    with pytest.raises(InvalidConfigError, match="num_experts=8 of mixtral-8x22b is not divisible by ep=16"):
        RunConfig.from_dict(d)


def test_uneven_pipeline_stages():
    d = json.loads(json.dumps(BASE))
    d["training"].update(pp=4, tp=4, decoder_first_pipeline_num_layers=17, decoder_last_pipeline_num_layers=17)
    run = RunConfig.from_dict(d)
    assert [len(c[0]) for c in Layout(run).stage_layers] == [17, 23, 23, 17]
    d["training"].update(decoder_first_pipeline_num_layers=18)
    with pytest.raises(InvalidConfigError, match="do not split evenly"):
        RunConfig.from_dict(d)


def test_v_shape_stage_mapping():
    run = make(pp=2, vpp=2, pp_schedule="zbv")
    L = Layout(run)
    assert L.has_embedding(0, 0) and L.has_output(0, 1)
    assert L.stage_layers[0][0] == tuple(range(0, 20)) and L.stage_layers[0][1] == tuple(range(60, 80))


def test_unknown_names_list_valid_ones():
    d = json.loads(json.dumps(BASE))
    d["model"] = "llama-9000"
    with pytest.raises(InvalidConfigError, match="unknown model 'llama-9000'; valid: .*llama3.1-70b"):
        RunConfig.from_dict(d)
    with pytest.raises(UnknownComponentError):
        from oracle.hardware import load_hardware
        load_hardware("h1000")


def test_an_unknown_name_suggests_the_closest_bundled_ones():
    """A typo gets the nearest names after the list (at most two; case ignored); a name like none gets no guess."""
    from oracle.hardware import load_hardware
    from oracle.model_card import load_model
    with pytest.raises(UnknownComponentError, match=r"unknown hardware profile 'b300x'; valid: .*; did you mean 'b300'"):
        load_hardware("b300x")
    with pytest.raises(UnknownComponentError, match=r"; did you mean 'llama3.1-70b'( or '[^']+')?\?$"):
        load_model("Lama3.1-70B")
    with pytest.raises(UnknownComponentError) as err:
        load_model("zzzzzz")
    assert "did you mean" not in str(err.value) and str(err.value).endswith("tiny-moe")


def test_overrides():
    d = apply_overrides(BASE, ["training.tp=4", "pp=4", "cluster.num_nodes=4", "training.precision=fp8"])
    assert d["training"]["tp"] == 4 and d["training"]["pp"] == 4 and d["training"]["precision"] == "fp8"
    assert d["cluster"] == {"hardware": "h100-sxm", "num_nodes": 4}
    assert BASE["training"]["tp"] == 8  # input untouched
    with pytest.raises(InvalidConfigError, match="expected KEY=VALUE"):
        apply_overrides(BASE, ["training.tp"])
    # a key with a part left out replaced its section ('training.=1.5' set training to 1.5, which tune's
    # derivation then read as a mapping: AttributeError); it is named instead
    for key in ("training.", "training..tp", ".tp", "cluster. .num_gpus"):
        with pytest.raises(InvalidConfigError, match=r"has an empty part; write SECTION.KEY=VALUE"):
            apply_overrides(BASE, [f"{key}=1.5"])
    with pytest.raises(InvalidConfigError, match="empty key"):
        apply_overrides(BASE, [".=1"])


def test_list_where_mapping_belongs():
    d = json.loads(json.dumps(BASE))
    d["training"] = [1, 2]
    with pytest.raises(InvalidConfigError, match="config.training must be a mapping"):
        RunConfig.from_dict(d)


def test_embedding_and_loss_take_a_pipeline_slot_when_asked():
    d = {"model": "qwen3-235b-a22b", "cluster": {"hardware": "mi355x", "num_gpus": 32},
         "training": {"seq_len": 4096, "gbs": 1024, "pp": 4, "vpp": 2, "ep": 8, "precision": "fp8"}}
    # 94 layers over 8 virtual stages: refused, naming the Megatron keys that would tile them
    with pytest.raises(InvalidConfigError, match="num_layers=94 is not divisible by pp\\*vpp = 4\\*2 = 8; set an "
                                                 "uneven layout .*decoder_first_pipeline_num_layers=24, "
                                                 "decoder_last_pipeline_num_layers=22"):
        RunConfig.from_dict(d)
    d["training"].update(account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    L = Layout(RunConfig.from_dict(d))
    sizes = [len(L.stage_layers[r][c]) for c in range(2) for r in range(4)]  # virtual-stage order
    assert sizes == [11, 12, 12, 12, 12, 12, 12, 11] and sum(sizes) == 94


def test_recompute_num_layers_counts_per_stage():
    run = make(pp=2, vpp=2, recompute="full", recompute_num_layers=25)
    L = Layout(run)
    assert [L.recomputed_layers(0, c) for c in range(2)] == [13, 12]
    assert problems_of(pp=2, recompute="full", recompute_num_layers=41)


def test_memory_margin_sets_the_fits_threshold():
    from oracle.projector import project
    d = json.loads(json.dumps(BASE))
    base = RunConfig.from_dict(d)
    assert base.cluster.memory_margin == 0.10 and "memory_margin" not in base.to_dict()["cluster"]
    d["cluster"]["memory_margin"] = 0.0
    loose = RunConfig.from_dict(d)
    assert RunConfig.from_dict(loose.to_dict()).cluster.memory_margin == 0.0  # round-trips
    assert loose.key() != base.key()
    hw = base.cluster.hardware
    allocatable = hw.hbm_capacity_bytes - hw.runtime_reserved_bytes
    assert base.cluster.memory_cap_bytes == pytest.approx(0.9 * allocatable)
    assert loose.cluster.memory_cap_bytes == pytest.approx(allocatable)
    pb, pl = project(base, "simulate"), project(loose, "simulate")
    assert pb.memory.peak_bytes == pl.memory.peak_bytes  # only the threshold moves
    assert pl.memory.cap_bytes == pytest.approx(allocatable)
    for bad in (1.0, -0.1, "tight", True):
        d["cluster"]["memory_margin"] = bad
        with pytest.raises(InvalidConfigError, match=r"memory_margin=.*must be a number in \[0, 1\)"):
            RunConfig.from_dict(d)


def test_a_coerced_value_is_read_again_the_same_and_a_registry_choice_is_checked_each_time():
    """``schema.from_dict`` keeps what it coerced of a scalar (a bulk reader meets the same values again): a second
    read of the same mapping gives the same config, string spellings included, refused values are refused again
    with their own place, floats are coerced each time (-0.0 keeps its sign) and a choice read from a registry
    (the pipeline schedule) is checked again: an unregistered schedule is refused though it was read before."""
    import math

    from oracle.pipeline.schedules import register, unregister
    from oracle.pipeline.schedules.one_f_one_b import fb_sequence
    from oracle.schema import coerce

    data = {"seq_len": "4096", "gbs": 64.0, "tp": 2, "precision": "BF16", "sequence_parallel": "yes",
            "moe_imbalance": -0.0, "recompute": "selective"}
    first, again = from_dict(TrainingConfig, dict(data), "t"), from_dict(TrainingConfig, dict(data), "t")
    assert first == again and (again.seq_len, again.gbs, again.precision, again.sequence_parallel) == (
        4096, 64, "bf16", True)
    assert math.copysign(1.0, again.moe_imbalance) == -1.0 == math.copysign(1.0, from_dict(
        TrainingConfig, {**data, "moe_imbalance": 0.0}, "t").moe_imbalance) * -1
    assert from_dict(TrainingConfig, {"seq_len": 1, "gbs": 1, "tp": 3}, "t").tp == coerce(3, int, "tp")
    for where in ("a", "b"):
        with pytest.raises(InvalidConfigError, match=f"{where}.tp='x' must be an integer"):
            from_dict(TrainingConfig, {"seq_len": 1, "gbs": 1, "tp": "x"}, where)

    @register("toy2", layout="interleaved", splits_bw=False, vpp_rule="one", in_flight=lambda pp, vpp, m, r: 1.0)
    def build(pp, vpp, m):
        return [fb_sequence(pp, r, m) for r in range(pp)]
    try:
        assert from_dict(TrainingConfig, {"seq_len": 1, "gbs": 1, "pp_schedule": "toy2"}, "t").pp_schedule == "toy2"
    finally:
        unregister("toy2")
    with pytest.raises(InvalidConfigError, match="toy2"):
        from_dict(TrainingConfig, {"seq_len": 1, "gbs": 1, "pp_schedule": "toy2"}, "t")


def test_an_integer_past_floats_range_is_a_clear_error_where_a_number_is_read():
    # float(10**400) raises OverflowError, which escaped the CLI as a traceback (model-card
    # published_active_params_billion; found by benchmarks/fuzz_inputs.py --random)
    with pytest.raises(InvalidConfigError, match=r"t.moe_imbalance=1000.*is too large: a number must be below"):
        from_dict(TrainingConfig, {"seq_len": 1, "gbs": 1, "moe_imbalance": 10**400}, "t")
    assert from_dict(TrainingConfig, {"seq_len": 1, "gbs": 1, "moe_imbalance": 10**300}, "t").moe_imbalance == 1e300

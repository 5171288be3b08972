"""oracle.recipe: every published recipe key is read (priced or ignored with a reason), the three spellings agree,
and the Megatron-LM export reads back to the same training values."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.recipe import (IGNORED, PRICED, RECIPE_TRAINING_KEYS, canonical, megatron_args, read_recipe,
                           split_megatron_args, split_recipe, unknown_settings)
from oracle.validate import read_row, read_rows

PUBLISHED = Path(__file__).resolve().parents[3] / "shared" / "validation" / "published-nvidia.csv"


def _published_rows() -> list[dict[str, str]]:
    if not PUBLISHED.exists():
        pytest.skip(f"{PUBLISHED} is not present beside the checkout")
    with PUBLISHED.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_every_published_recipe_key_is_priced_or_ignored_with_a_reason() -> None:
    rows = _published_rows()
    assert rows
    for row in rows:
        reading = read_recipe(row["recipe"])
        given = [k for k, _ in split_recipe(row["recipe"])]
        assert [e.key for e in reading.entries] == given, row["id"]  # one entry per key, in order
        assert not unknown_settings(reading), (row["id"], unknown_settings(reading))
        for e in reading.entries:
            assert e.status in (PRICED, IGNORED)
            if e.status == IGNORED:
                assert e.why, (row["id"], e.key)


def test_validate_lists_every_recipe_key_of_every_row() -> None:
    rows = read_rows(PUBLISHED) if PUBLISHED.exists() else pytest.skip("no published CSV")
    for row in rows:
        rr = read_row(row)
        named = {e.key for e in rr.recipe}
        for key, _ in split_recipe(row["recipe"]):
            assert key in named, (row["id"], key)


def test_a_recipe_is_read_the_same_from_a_string_a_mapping_and_a_command_line() -> None:
    text = ("moe_token_dispatcher_type=flex;moe_flex_dispatcher_backend=hybridep;moe_hybridep_num_sms=32;"
            "comm_overlap.overlap_moe_expert_parallel_comm=true;cuda_graph_impl=local;cuda_graph_scope=[full_iteration];"
            "recompute_granularity=selective;recompute_modules=[mla_up_proj,mlp];fp8_recipe=mxfp8;fp8_format=e4m3")
    by_text = read_recipe(text).training
    by_map = read_recipe(dict(split_recipe(text))).training
    line = ("torchrun pretrain_gpt.py --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep "
            "--moe-hybridep-num-sms 32 --overlap-moe-expert-parallel-comm --cuda-graph-impl local "
            "--cuda-graph-scope full_iteration --recompute-granularity selective --recompute-modules mla_up_proj mlp "
            "--fp8-recipe mxfp8 --fp8-format e4m3")
    by_line = read_recipe(split_megatron_args(line)).training
    assert by_text == by_map == by_line
    assert by_text["moe_a2a_backend"] == "hybridep" and by_text["moe_flex_dispatcher_num_sms"] == 32
    assert by_text["cuda_graph_impl"] == "full_iteration" and by_text["cuda_graph_scope"] == []
    assert by_text["moe_a2a_overlap"] and "delay_wgrad_compute" not in by_text  # follows the overlap (None)
    run = RunConfig.from_dict({"model": "qwen3-30b-a3b", "cluster": {"hardware": "gb200-nvl72", "num_gpus": 8},
                               "training": {"seq_len": 4096, "gbs": 64, "ep": 8, "moe_a2a_overlap": True}})
    assert run.training.delays_wgrad
    assert by_text["recompute_modules"] == ["mla_up_proj", "mlp"]
    assert (by_text["precision"], by_text["fp8_recipe"]) == ("fp8", "mxfp8")


def test_selective_with_no_modules_recomputes_nothing() -> None:
    assert read_recipe("recompute_granularity=selective;recompute_modules=[]").training["recompute"] == "none"


def test_a_ddp_field_loses_to_the_mixed_precision_one() -> None:
    r = read_recipe("ddp.grad_reduce_in_fp32=True;grad_reduce_in_fp32=False")
    assert r.training["grad_reduce_in_fp32"] is False
    assert [e.status for e in r.entries] == [IGNORED, PRICED]


def test_unknown_names_and_bad_values() -> None:
    r = read_recipe("moe_frobnicate=3;env.FOO=1;(inactive: a note)")
    assert unknown_settings(r) == ["moe_frobnicate"]
    assert all(e.status == IGNORED and e.why for e in r.entries)
    with pytest.raises(InvalidConfigError, match="valid dispatchers"):
        read_recipe("moe_token_dispatcher_type=teleport")
    with pytest.raises(InvalidConfigError, match="true or false"):
        read_recipe("moe_a2a_overlap=maybe")
    with pytest.raises(InvalidConfigError, match="could not be split"):
        split_megatron_args("--seq-length 'unclosed")
    # words before the first flag are the launcher and the script; words after a flag are its value (a list)
    assert split_megatron_args("torchrun x.py --recompute-modules a b --bf16") == [("--recompute-modules", ["a", "b"]),
                                                                                   ("--bf16", True)]



@pytest.mark.parametrize("line", ["--seq-length nan", "--global-batch-size -inf", "--micro-batch-size 1e400"])
def test_a_count_that_is_not_finite_is_a_whole_number_error(line) -> None:
    # int(nan) / int(inf) raised ValueError / OverflowError out of the command line (found by fuzzing --megatron-args)
    with pytest.raises(InvalidConfigError, match="must be a whole number"):
        read_recipe(split_megatron_args(line))
    # an integer past float's range is a whole number (the config's own checks bound it): no OverflowError
    assert read_recipe(split_megatron_args(f"--global-batch-size -{10**80}")).training["gbs"] == -10**80


def test_a_launch_line_is_read_as_the_shell_reads_it() -> None:
    # continuations and comments (a whole line, or after white space, outside quotes); a '#' inside a word or
    # quoted stays, as in bash (shlex's comment option would cut 'run#1' at the '#')
    script = ("# launch.sh: it's the 8-GPU run\nNVTE_FLAG=1 torchrun pretrain_gpt.py \\\n"
              "  --tensor-model-parallel-size 2 \\\n  --data-path /d/run#1 # the corpus\n"
              "  --wandb-exp-name \"#nightly\" --bf16")
    assert split_megatron_args(script) == [("env.NVTE_FLAG", 1), ("--tensor-model-parallel-size", 2),
                                           ("--data-path", "/d/run#1"), ("--wandb-exp-name", "#nightly"),
                                           ("--bf16", True)]


def test_a_number_past_floats_range_is_a_clear_error() -> None:
    # float(10**400) raised OverflowError out of read_recipe (a config's recipe: section; found by fuzzing it)
    with pytest.raises(InvalidConfigError, match="moe_expert_rank_capacity_factor=.* is too large"):
        read_recipe({"moe_expert_rank_capacity_factor": 10**400})


def test_one_value_where_a_list_belongs_is_a_list_of_it() -> None:
    # a number for a list setting raised "'float' object is not iterable" (found by fuzzing --megatron-args)
    r = read_recipe(split_megatron_args("--recompute-granularity selective --recompute-modules -inf "
                                        "--cuda-graph-impl transformer_engine --cuda-graph-modules 3"))
    assert (r.training["recompute_modules"], r.training["cuda_graph_scope"]) == (["-inf"], ["3"])


def test_command_line_layout_flags() -> None:
    r = read_recipe(split_megatron_args("python pretrain_gpt.py --tensor-model-parallel-size 4 "
                                        "--pipeline-model-parallel-size=2 --micro-batch-size 1 --global-batch-size 64 "
                                        "--seq-length 8192 --bf16 --use-distributed-optimizer"))
    assert {k: r.training[k] for k in ("tp", "pp", "mbs", "gbs", "seq_len", "precision")} == {
        "tp": 4, "pp": 2, "mbs": 1, "gbs": 64, "seq_len": 8192, "precision": "bf16"}
    assert r.training["use_distributed_optimizer"] is True


def test_canonical_names() -> None:
    assert canonical("--overlap-moe-expert-parallel-comm") == "moe_a2a_overlap"
    assert canonical("comm_overlap.tp_comm_overlap") == "tp_comm_overlap"
    assert canonical("workload_base_config.fp8_dot_product_attention") == "fp8_dot_product_attention"


@pytest.mark.parametrize("training", [
    {"moe_a2a_backend": "hybridep", "moe_flex_dispatcher_num_sms": 24, "moe_expert_rank_capacity_factor": 1.5,
     "moe_paged_stash": True, "moe_a2a_overlap": True, "moe_router_fusion": True,
     "fused_grouped_mlp": True, "precision": "fp8", "fp8_recipe": "mxfp8", "fp8_dot_product_attention": True,
     "fp8_output_proj": True, "fp8_param_gather": True, "cuda_graph_impl": "full_iteration", "fp8_activations": True},
    {"precision": "fp8", "first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 2,
     "num_layers_at_end_in_bf16": 1, "gradient_accumulation_fusion": False, "optimizer": "muon", "mtp_num_layers": 0},
    {"attention_backend": "unfused", "recompute": "selective"},
])
def test_megatron_args_read_back_to_the_same_training(training) -> None:
    base = {"seq_len": 4096, "gbs": 64, "ep": 8} if "moe_a2a_backend" in training else {"seq_len": 4096, "gbs": 64}
    model = "qwen3-30b-a3b" if "moe_a2a_backend" in training else "llama3-8b"
    run = RunConfig.from_dict({"model": model, "cluster": {"hardware": "gb200-nvl72", "num_gpus": 8},
                               "training": {**base, **training}})
    args = megatron_args(run.training)
    env = " ".join(f"{k[4:]}={v}" for k, v in args if k.startswith("env."))

    def flag(k: str, v) -> str:
        dashed = k.replace("_", "-")
        return f"--{dashed}" if v is True else f"--no-{dashed}" if v is False else f"--{dashed} {v}"
    line = env + " torchrun pretrain_gpt.py " + " ".join(flag(k, v) for k, v in args if not k.startswith("env."))
    back = read_recipe(split_megatron_args(line)).training
    for key in RECIPE_TRAINING_KEYS:
        if key in training:
            assert back.get(key) == training[key], key


def test_a_published_cell_with_an_unreadable_value_keeps_its_other_settings() -> None:
    """A user's recipe with a value no setting takes is an error naming it; a published row's cell (validate reads
    it leniently) lists that setting as ignored with the same message and prices the rest."""
    text = "fp8_recipe=bogus;moe_token_dispatcher_type=flex;moe_flex_dispatcher_backend=hybridep"
    with pytest.raises(InvalidConfigError, match="bogus"):
        read_recipe(text)
    r = read_recipe(text, lenient=True)
    assert r.training == {"moe_a2a_backend": "hybridep"}
    bad = [e for e in r.ignored if e.key == "fp8_recipe"]
    assert bad and "bogus" in bad[0].why and bad[0].why.startswith("a value this projection cannot read")


# --- Megatron-Bridge performance recipes as their ConfigContainer holds them (benchmarks/bridge_recipes.py) ---
def test_fp4_is_the_format_that_turns_nvfp4_on() -> None:
    # MixedPrecisionConfig / TransformerConfig.fp4 is the element format (e2m1); fp4_recipe defaults to nvfp4 and
    # the FP8 recipe left at its dataclass default scales nothing
    r = read_recipe({"fp4": "e2m1", "fp4_recipe": "nvfp4", "fp8_recipe": "tensorwise"})
    assert r.training == {"precision": "nvfp4"}
    assert read_recipe({"fp4_format": "e2m1"}).training == {"precision": "nvfp4"}
    assert read_recipe(split_megatron_args("--fp4-format e2m1")).training == {"precision": "nvfp4"}
    with pytest.raises(InvalidConfigError, match="the only FP4 format is e2m1"):
        read_recipe({"fp4": "e3m0"})
    with pytest.raises(InvalidConfigError, match="fp4_recipe='custom'"):
        read_recipe({"fp4": "e2m1", "fp4_recipe": "custom"})


def test_a_list_layout_is_megatrons_stages_and_sets_vpp_when_the_recipe_does_not() -> None:
    stages = [["embedding"] + ["decoder"] * 4] + [["decoder"] * 4] * 14 + [["decoder", "mtp", "loss"]]
    r = read_recipe({"pp": 8, "pipeline_model_parallel_layout": stages})
    assert r.training["pipeline_model_parallel_layout"] == "Etttt|" + "tttt|" * 14 + "tmL"
    assert r.training["vpp"] == 2  # Megatron-Core: 16 stages over pp=8 (TransformerConfig.__post_init__)
    assert read_recipe({"pp": 8, "vpp": 2, "pipeline_model_parallel_layout": "Et|tL"}).training["vpp"] == 2
    with pytest.raises(InvalidConfigError, match="layer type 'encoder' is not one of"):
        read_recipe({"pipeline_model_parallel_layout": [["embedding", "encoder"]]})


def test_settings_megatron_reads_only_with_another_are_ignored_without_it() -> None:
    r = read_recipe({"moe_token_dispatcher_type": "alltoall", "moe_hybridep_num_sms": 16,
                     "moe_expert_rank_capacity_factor": 1.5, "moe_paged_stash": True, "cpu_offloading": False,
                     "cpu_offloading_num_layers": 95, "cpu_offloading_weights": True})
    assert r.training == {"moe_a2a_backend": "alltoall", "cpu_offloading": False}
    assert {e.key: e.status for e in r.entries}["moe_hybridep_num_sms"] == IGNORED
    # under the flex dispatcher they are read as before
    on = read_recipe({"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep",
                      "moe_hybridep_num_sms": 32, "moe_expert_rank_capacity_factor": 1.5, "moe_paged_stash": True,
                      "cpu_offloading": True, "cpu_offloading_num_layers": 3})
    assert on.training["moe_flex_dispatcher_num_sms"] == 32 and on.training["moe_paged_stash"] is True
    assert on.training["moe_expert_rank_capacity_factor"] == 1.5 and on.training["cpu_offloading_num_layers"] == 3


def test_fp8_and_fp4_param_gather_are_one_training_flag_either_turns_on() -> None:
    for items in ([("fp8_param_gather", True), ("fp4_param_gather", False)],
                  [("fp4_param_gather", False), ("fp8_param_gather", True)]):
        assert read_recipe(items).training == {"fp8_param_gather": True}
    # the mixed-precision field outranks its ddp.* copy, whatever the order
    for items in ([("ddp.fp8_param_gather", True), ("fp8_param_gather", False)],
                  [("fp8_param_gather", False), ("ddp.fp8_param_gather", True)]):
        assert read_recipe(items).training == {"fp8_param_gather": False}


def test_dist_muon_is_sharded_whatever_the_ddp_flag_says() -> None:
    r = read_recipe([("optimizer", "dist_muon"), ("ddp.use_distributed_optimizer", False)])
    assert r.training == {"optimizer": "muon", "use_distributed_optimizer": True}
    r = read_recipe([("ddp.use_distributed_optimizer", False), ("optimizer", "dist_muon")])
    assert r.training == {"use_distributed_optimizer": True, "optimizer": "muon"}
    assert read_recipe([("optimizer", "adam"), ("use_distributed_optimizer", False)]).training[
        "use_distributed_optimizer"] is False


def test_a_recipes_vocab_size_is_the_cards_and_round_trips() -> None:
    # Megatron-Bridge's GPT-OSS-20B perf recipes set cfg.model.vocab_size = 128256 (the card's is 201088)
    base = {"model": "gpt-oss-20b", "cluster": {"hardware": "b300", "num_gpus": 8},
            "training": {"seq_len": 8192, "gbs": 64, "ep": 8}}
    plain = RunConfig.from_dict(base)
    run = RunConfig.from_dict({**base, "recipe": {"vocab_size": 128256}})
    assert run.model.vocab_size == 128256 and plain.model.vocab_size == 201088
    assert run.model.name == "gpt-oss-20b (recipe: vocab_size=128256)"
    assert {e.key: e.status for e in run.recipe}["vocab_size"] == PRICED
    back = RunConfig.from_dict(run.to_dict())  # an edited card is written inline
    assert back.model == run.model and back.key() == run.key() != plain.key()
    same = RunConfig.from_dict({**base, "recipe": {"vocab_size": 201088}})  # the card's own value: the bundled card
    assert same.model == plain.model and same.to_dict()["model"] == "gpt-oss-20b"
    with pytest.raises(InvalidConfigError, match="vocab_size=0 must be a positive whole number"):
        RunConfig.from_dict({**base, "recipe": {"vocab_size": 0}})

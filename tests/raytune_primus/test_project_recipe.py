"""``project`` with a recipe: a config's ``recipe:`` section and ``--megatron-args`` read onto the training config
(oracle.recipe), every setting priced or listed as ignored, bad values one line."""
import json

import pytest
import yaml

from raytune_primus.cli import main
from raytune_primus.export import export_run
from oracle.config import RunConfig

LINE = ("NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 torchrun pretrain_gpt.py --expert-model-parallel-size 8 --micro-batch-size 4 "
        "--global-batch-size 512 --seq-length 4096 --bf16 --fp8-format e4m3 --fp8-recipe mxfp8 "
        "--use-distributed-optimizer --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep "
        "--moe-expert-rank-capacity-factor 1.5 --moe-paged-stash --use-transformer-engine-op-fuser "
        "--overlap-moe-expert-parallel-comm --cuda-graph-impl full_iteration --manual-gc --frobnicate 3")


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_megatron_args_are_priced_and_the_rest_listed(capsys):
    code, out, err = run_cli(capsys, "project", "--model", "qwen3-30b-a3b", "--hardware", "gb200-nvl72",
                             "--num-gpus", "8", "--megatron-args", LINE, "--format", "json")
    assert code == 0, err
    d = json.loads(out)
    t = d["config"]["training"]
    assert (t["moe_a2a_backend"], t["cuda_graph_impl"], t["fused_grouped_mlp"], t["precision"]) == (
        "hybridep", "full_iteration", True, "fp8")
    status = {e["key"]: e["status"] for e in d["recipe"]}
    assert status["--frobnicate"] == "ignored" and status["--manual-gc"] == "ignored"
    assert status["--moe-paged-stash"] == "priced"
    code, out, _ = run_cli(capsys, "project", "--model", "qwen3-30b-a3b", "--hardware", "gb200-nvl72",
                           "--num-gpus", "8", "--megatron-args", LINE)
    assert code == 0 and "ignored: --frobnicate=3 (not a setting this projection knows)" in out


def test_a_config_recipe_section_is_the_same_as_the_training_keys(tmp_path, capsys):
    cfg = {"model": "qwen3-30b-a3b", "cluster": {"hardware": "gb200-nvl72", "num_gpus": 8},
           "training": {"seq_len": 4096, "gbs": 512, "mbs": 4, "ep": 8},
           "recipe": {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep",
                      "comm_overlap.overlap_moe_expert_parallel_comm": True, "moe_router_fusion": True,
                      "mbs": 2}}  # the training section wins over a recipe's value
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = RunConfig.load(path)
    t = run.training
    assert (t.moe_a2a_backend, t.moe_a2a_overlap, t.moe_router_fusion, t.mbs) == ("hybridep", True, True, 4)
    plain = RunConfig.from_dict({**cfg, "recipe": None, "training": {**cfg["training"], "moe_a2a_backend": "hybridep",
                                                                     "moe_a2a_overlap": True, "moe_router_fusion": True}})
    assert run.key() == plain.key()
    # the export writes the same settings back, and they read back to the same training
    text = export_run(run, "megatron")
    assert "--moe-flex-dispatcher-backend hybridep" in text and "--overlap-moe-expert-parallel-comm" in text


def test_a_bad_recipe_value_is_one_line(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": "qwen3-30b-a3b", "cluster": {"hardware": "gb200-nvl72", "num_gpus": 8},
                                    "training": {"seq_len": 4096, "gbs": 512, "ep": 8},
                                    "recipe": {"moe_token_dispatcher_type": "teleport"}}))
    code, out, err = run_cli(capsys, "project", str(path))
    assert code == 2 and "config.recipe: recipe moe_token_dispatcher_type='teleport'" in err
    assert len(err.strip().splitlines()) <= 2
    code, out, err = run_cli(capsys, "project", "--model", "qwen3-30b-a3b", "--megatron-args=--bf16")
    assert code == 2 and "--hardware" in err and "--num-gpus" in err


def test_flags_without_a_batch_say_how_to_give_it(capsys):
    """--model/--hardware/--num-gpus name the model and the cluster; the missing batch is one hint, naming the flags
    that give it, and those flags then project."""
    code, out, err = run_cli(capsys, "project", "--model", "qwen3-30b-a3b", "--hardware", "mi355x", "--num-gpus", "8")
    assert code == 2 and "Traceback" not in err
    assert "missing required key 'seq_len'" in err and "--set seq_len=... --set gbs=..." in err
    assert "--seq-len S --gbs G" in err and "--megatron-args" in err
    code, out, err = run_cli(capsys, "project", "--model", "qwen3-30b-a3b", "--hardware", "mi355x", "--num-gpus", "8",
                             "--set", "gbs=64")
    assert code == 2 and "--set seq_len=..." in err and "--set gbs=..." not in err
    assert "--seq-len S " in err and "--gbs G" not in err
    code, out, err = run_cli(capsys, "project", "--model", "qwen3-30b-a3b", "--hardware", "mi355x", "--num-gpus", "8",
                             "--set", "seq_len=4096", "--set", "gbs=64", "--set", "ep=8")
    assert code == 0 and "tokens/s/GPU" in out, err


def test_batch_and_precision_flags_are_the_training_keys_tune_takes(capsys):
    """project takes --seq-len/--gbs/--precision as tune does: the same run as --set seq_len/gbs/precision, an explicit
    --set after them wins, a config file's keys yield to them, and a bad value is a clear error."""
    base = ["project", "--model", "qwen3-8b", "--hardware", "h100-sxm", "--num-gpus", "16", "--format", "json"]
    code, by_flags, err = run_cli(capsys, *base, "--seq-len", "4096", "--gbs", "256", "--precision", "fp8")
    assert code == 0, err
    code, by_set, err = run_cli(capsys, *base, "--set", "seq_len=4096", "--set", "gbs=256", "--set", "precision=fp8")
    assert code == 0, err
    assert json.loads(by_flags) == json.loads(by_set)
    assert json.loads(by_flags)["config"]["training"]["precision"] == "fp8"
    code, out, err = run_cli(capsys, *base, "--seq-len", "4096", "--gbs", "256", "--set", "gbs=128")
    assert code == 0 and json.loads(out)["config"]["training"]["gbs"] == 128, err
    code, out, err = run_cli(capsys, *base, "--seq-len", "4096", "--gbs", "256", "--precision", "fp6")
    assert code == 2 and "precision" in err and "fp6" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as stop:  # argparse's usage error
        main([*base, "--seq-len", "0", "--gbs", "256"])
    assert stop.value.code == 2 and "--seq-len must be a positive integer, got 0" in capsys.readouterr().err

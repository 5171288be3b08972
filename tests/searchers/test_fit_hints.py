"""searchers.fit_hints: the one-change neighbours of a configuration that does not fit (tests/raytune_primus/test_cli.py
checks each hint, applied with --set, fits and projects what it said)."""
from __future__ import annotations

from oracle.config import RunConfig
from searchers.fit_hints import _changes, fit_hints, hints_text


def _run(**training):
    return RunConfig.from_dict({"model": "deepseek-v3", "cluster": {"hardware": "h100-sxm", "num_gpus": 256},
                                "training": {"seq_len": 4096, "gbs": 1024, "precision": "fp8", **training}})


def test_no_neighbour_fits_and_the_text_says_so_with_a_search_that_keeps_the_numerics():
    run = _run(ep=8, pp=8, pipeline_model_parallel_layout="Et*8|(t*8|)*6,t*5mL")  # 183.6 GiB against 70.2
    hints, n_fit, tried = fit_hints(run)
    assert hints == [] and n_fit == 0 and tried >= 5
    text = hints_text(run, hints, n_fit, tried)
    assert f"none of the {tried} legal one-change neighbours" in text
    assert text.endswith("--seq-len 4096 --gbs 1024 --precision fp8")


def test_the_candidates_are_one_change_each_never_the_numerics_and_moe_doubles_ep():
    run = _run(ep=8, mbs=4, pp=8, use_distributed_optimizer=False, pipeline_model_parallel_layout="Et*8|(t*8|)*6,t*5mL")
    changes = _changes(run)
    assert all(len(c) == 1 for c in changes)
    assert {k for c in changes for k in c} == {"recompute", "use_distributed_optimizer", "fsdp", "mbs", "tp", "pp",
                                               "cp", "ep"}
    assert {"ep": 16} in changes and {"mbs": 2} in changes and {"mbs": 1} in changes


def test_the_search_command_names_files_a_command_line_takes():
    inline = RunConfig.from_dict({"model": {"based_on": "llama3.1-70b", "name": "my70b", "num_layers": 40},
                                  "cluster": {"hardware": "h100-sxm", "num_gpus": 8},
                                  "training": {"seq_len": 8192, "gbs": 64}})
    text = hints_text(inline, [], 0, 6)
    assert "--model CARD.yaml --hardware h100-sxm" in text and "inline card or profile written to that file" in text


def test_a_loose_spelling_of_a_bundled_card_or_part_is_written_as_its_bundled_name():
    """``--model Meta-Llama-3.1-70B --hardware H100`` load the bundled llama3.1-70b and h100-sxm: the suggested search
    names them so (not the CARD.yaml / PROFILE.yaml placeholders of an inline card), reading no other card."""
    run = RunConfig.from_dict({"model": "Meta-Llama-3.1-70B", "cluster": {"hardware": "H100", "num_gpus": 8},
                               "training": {"seq_len": 8192, "gbs": 64}})
    text = hints_text(run, [], 0, 6)
    assert "--model llama3.1-70b --hardware h100-sxm" in text and "CARD.yaml" not in text

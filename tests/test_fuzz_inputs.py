"""Fuzzed input, zero tracebacks: every input file kind, mutated by hypothesis (see tests/fuzzing.py),
ends in a result or exit code 2 with short ``error:`` lines, and the library parsers raise only the
project's errors. Bounded and derandomized for CI; ``benchmarks/fuzz_inputs.py`` runs many more."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzzing import check_cli, check_lib, kinds, run_case, run_cli

KINDS = kinds()


@pytest.mark.parametrize("name", sorted(KINDS))
def test_fuzzed_files_end_in_a_result_or_a_one_line_error(name):
    kind = KINDS[name]
    with tempfile.TemporaryDirectory() as tmp:

        @settings(max_examples=kind.examples, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.data())
        def fuzz(data):
            run_case(kind, data, Path(tmp))

        fuzz()
    assert kind.tried >= kind.examples


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("text, named", [
    # values the message must name
    ("model: llama3.1-8b\ncluster: {hardware: h100-sxm, num_gpus: 8}\ntraining: {seq_len: .nan, gbs: 8}\n", "seq_len"),
    ("model: llama3.1-8b\ncluster: {hardware: h100-sxm, num_gpus: 8}\ntraining: {seq_len: 2048, gbs: .inf}\n", "gbs"),
    ("model: llama3.1-8b\ncluster: {hardware: h100-sxm, num_gpus: 8}\ntraining: {seq_len: 2048, gbs: 8, tp: -4}\n",
     "tp"),
    ("model: llama3.1-8b\ncluster: {hardware: h100-sxm, num_gpus: 8}\n"
     "training: {seq_len: 2048, gbs: 8, tp: 100000000000000000000000000000000000000000000}\n", "tp"),
    ("model: llama3.1-8b\ncluster: {hardware: h100-sxm, num_gpus: 8, memory_margin: .nan}\n"
     "training: {seq_len: 2048, gbs: 8}\n", "memory_margin"),
    # YAML aliases: a recursive one, and a "billion laughs" expansion (aliases are shared, not copied)
    ("a: &a [*a]\nmodel: llama3.1-8b\ncluster: {hardware: h100-sxm, num_gpus: 8}\ntraining: {seq_len: 2048, gbs: 8}\n",
     "'a'"),
    ("model: llama3.1-8b\ncluster: {hardware: h100-sxm, num_gpus: 8}\ntraining: &t {seq_len: 2048, gbs: 8, tp: *t}\n",
     "tp"),
    ("x1: &x1 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\nx2: &x2 [*x1, *x1, *x1, *x1, *x1, *x1, *x1, *x1, *x1]\n"
     "x3: &x3 [*x2, *x2, *x2, *x2, *x2, *x2, *x2, *x2, *x2]\nx4: &x4 [*x3, *x3, *x3, *x3, *x3, *x3, *x3, *x3, *x3]\n"
     "model: llama3.1-8b\ncluster: {hardware: h100-sxm, num_gpus: 8}\ntraining: {seq_len: 2048, gbs: 8}\n", "'x1'"),
    ("!!python/object/apply:os.system [echo pwned]\n", "python/object"),
    # sizes that once ran out of memory (a layout per virtual stage) or never ended (a simulated micro-batch each)
    ("model: llama3.1-70b\ncluster: {hardware: h100-sxm, num_gpus: 64}\n"
     "training: {seq_len: 8192, gbs: 128, tp: 4, pp: 4, vpp: 70666488190934110}\n", "pp*vpp = 4*70666488190934110"),
    ("model: llama3.1-70b\ncluster: {hardware: h100-sxm, num_gpus: 64}\n"
     "training: {seq_len: 8192, gbs: 536870912, tp: 4, pp: 4, vpp: 5}\n", "134,217,728 micro-batches"),
    ("model: llama3.1-70b\ncluster: {hardware: h100-sxm, num_gpus: 64}\n"
     "training: {seq_len: 8192, gbs: 10000000000000000, tp: 4, pp: 4, vpp: 5}\n", "gbs=10,000,000,000,000,000"),
    ("model: {name: big, num_layers: 1000000000, hidden_size: 64, num_attention_heads: 4, vocab_size: 100, "
     "ffn_hidden_size: 128}\ncluster: {hardware: h100-sxm, num_gpus: 8}\ntraining: {seq_len: 2048, gbs: 8}\n",
     "num_layers=1,000,000,000 is absurd"),
    ("model: {name: neg, num_layers: 2, hidden_size: 64, num_attention_heads: 4, vocab_size: 100, "
     "ffn_hidden_size: -100000000000000000000000000000000000000000}\ncluster: {hardware: h100-sxm, num_gpus: 8}\n"
     "training: {seq_len: 2048, gbs: 8}\n", "ffn_hidden_size=-100,000"),
    ("model: llama3.1-8b\ncluster: {hardware: h100-sxm, num_gpus: 8}\ntraining: {seq_len: 2048, gbs: 8, "
     "precision: !!python/name:os.system }\n", "python/name"),
])
def test_pathological_configs_name_the_offending_value(tmp_path, text, named):
    p = _write(tmp_path, "config.yaml", text)
    out = run_cli(["project", str(p), "--format", "json"])
    check_cli(out, text[:60])
    assert out.rc == 2 and named in out.stderr, out.stderr


def test_a_5000_character_hardware_name_is_a_one_line_error(tmp_path):
    name = "h" * 5000
    p = _write(tmp_path, "config.yaml", f"model: llama3.1-8b\ncluster: {{hardware: {name}, num_gpus: 8}}\n"
                                        f"training: {{seq_len: 2048, gbs: 8}}\n")
    out = run_cli(["project", str(p)])
    check_cli(out, "5,000-character hardware name")
    assert out.rc == 2 and "hhhh" in out.stderr
    from oracle.config import RunConfig
    check_lib(lambda: RunConfig.load(p), "5,000-character hardware name")


@pytest.mark.parametrize("cells, named", [
    ({"num_gpus": "inf"}, "num_gpus='inf'"),
    ({"num_gpus": "1e400"}, "num_gpus='1e400'"),
    ({"tp": "x" * 5000}, "characters"),
    ({"seq_len": "9" * 400}, "is absurd: at most 1,073,741,824"),
])
def test_bad_csv_cells_skip_the_row_with_a_reason(tmp_path, cells, named):
    import csv

    from tests.fuzzing import _csv_seed
    header, row, _ = _csv_seed()
    values = dict(zip(header, row))
    values.update(cells)
    p = tmp_path / "rows.csv"
    with p.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerow([values[h] for h in header])
    out = run_cli(["validate", str(p), "--format", "json"])
    check_cli(out, str(cells)[:60])
    assert out.rc == 0 and named in out.stdout


def test_a_short_csv_row_is_skipped_not_a_traceback():
    from oracle.validate import row_to_run
    from tests.fuzzing import _csv_seed
    header, row, _ = _csv_seed()
    short = {**dict(zip(header, row)), "model": None, "hardware": None}  # csv.DictReader's fill for missing cells
    run, _, skip = row_to_run(short)
    assert run is None and "model" in skip


@pytest.mark.parametrize("doc, named", [
    ({"model_type": ["llama"]}, "model_type=['llama']"),
    ({"architectures": "LlamaForCausalLM"}, "no 'model_type'"),
    ({"model_type": "llama", "hidden_act": ["silu"], "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 128}, "hidden_act=['silu']"),
    ({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
      "vocab_size": 100, "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
      "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "intermediate_size": 64,
      "moe_layer_freq": "4.36.0"}, "moe_layer_freq='4.36.0' must be a number"),
    ({"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
      "vocab_size": 100, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
      "decoder_sparse_step": 0}, "decoder_sparse_step=0 must be >= 1"),
])
def test_hf_configs_of_the_wrong_shape_are_named(tmp_path, doc, named):
    import json
    p = tmp_path / "m" / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps(doc))
    out = run_cli(["models", "import", str(p)])
    check_cli(out, named)
    assert out.rc == 2 and named in out.stderr, out.stderr


def test_hardware_numbers_must_be_finite(tmp_path):
    import yaml
    doc = yaml.safe_load((Path(__file__).parents[1] / "hardware" / "h100-sxm.yaml").read_text())
    doc["network"]["inter_pod"]["pod_size"] = -(10**80)
    doc["memory"]["hbm_capacity_gib"] = float("nan")
    doc["compute"]["peak_tflops"]["fp8"] = float("inf")
    p = tmp_path / "profile.yaml"
    p.write_text(yaml.safe_dump(doc))
    out = run_cli(["hardware", "show", str(p)])
    check_cli(out, "non-finite hardware numbers")
    assert out.rc == 2
    for named in ("pod_size=-1000", "hbm_capacity_gib=nan must be a finite number", "peak_tflops.fp8=inf"):
        assert named in out.stderr, out.stderr

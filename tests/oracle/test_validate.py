"""Accuracy against published measurements (golden table: ../shared/validation/calibration.csv).

These are the bars of the projection issue; they are asserted, so a change to a formula or a
hardware constant that breaks them fails CI. Known misses would be recorded as strict xfails.
"""
import shutil
import statistics
from pathlib import Path

import pytest

from oracle.validate import read_rows, summarize, validate_rows
from tests.conftest import SHARED

CSV = SHARED / "validation" / "calibration.csv"
NVIDIA_CSV = SHARED / "validation" / "published-nvidia.csv"
# only the tests that read ../shared skip without it; the rest (holdout, inline rows) always run
needs_shared = pytest.mark.skipif(not CSV.exists(), reason="shared/validation/calibration.csv not present")


@pytest.fixture(scope="module")
def results():
    if not CSV.exists():
        pytest.skip("shared/validation/calibration.csv not present")
    return validate_rows(read_rows(CSV))


def test_no_row_is_silently_dropped(results):
    assert len(results) == len(read_rows(CSV))
    for r in results:
        assert (r.skipped is None) == (r.projected is not None)
        if r.skipped:
            assert r.skipped.strip()


def test_quality_ab_accuracy(results):
    ab = [r for r in results if r.quality in ("A", "B") and r.skipped is None]
    assert len(ab) >= 20
    errs = [abs(r.error) for r in ab]
    assert statistics.median(errs) <= 0.12
    assert max(errs) <= 0.30, max(ab, key=lambda r: abs(r.error)).id


def test_qwen3_sweep_rank_correlation(results):
    g = summarize(results)["groups"]["paper-appE-qwen3-235b"]
    assert g["spearman"] >= 0.9 and g["regret"] == 0.0


def test_mixtral_sweep_rank_correlation(results):
    g = summarize(results)["groups"]["paper-appE-mixtral-8x22b"]
    assert g["spearman"] >= 0.9 and g["regret"] == 0.0


def test_batch_contrasts_are_reproduced(results):
    """Rows of one sweep that differ only in mbs/gbs (App. E: Mixtral r09/r14 at MBS 2 vs 1, Qwen3 at
    128 micro-batches of 2 vs 1): the measured gain of the larger micro-batch (+3.8% to +20.3%) comes
    from the per-MoE-layer dispatcher stall, a family constant fitted on these three contrasts jointly
    (docs/calibration.md; leave-one-out within 2 points). Without it the projection gave -1.8% to +2.4%."""
    cs = summarize(results)["contrasts"]
    assert {(c["a"], c["b"]) for c in cs} >= {("amd-seed-mixsweep-03", "amd-seed-mixsweep-05"),
                                              ("amd-seed-mixsweep-06", "amd-seed-mixsweep-07"),
                                              ("amd-seed-qwensweep-05", "amd-seed-qwensweep-07")}
    for c in cs:
        assert c["projected"] > 0 and abs(c["projected"] - c["measured"]) <= 0.02, c


def test_assumed_fields_are_listed(results):
    r = next(r for r in results if r.id == "nemo-longseq-h100-01")
    assert "mbs" in r.assumed and "vpp" in r.assumed


def test_bad_csv(tmp_path):
    from oracle.errors import InvalidConfigError
    p = tmp_path / "bad.csv"
    p.write_text("id,model\nx,llama2-7b\n")
    with pytest.raises(InvalidConfigError, match="lacks required column"):
        read_rows(p)
    with pytest.raises(InvalidConfigError, match="does not exist"):
        read_rows(tmp_path / "missing.csv")
    p.write_text("id,model,hardware,num_gpus,seq_len,gbs,measured_tokens_per_s_per_gpu\n"
                 "r1,llama2-7b,h100-sxm,8,4096,128,1000,extra\n")
    with pytest.raises(InvalidConfigError, match="row 2 has 8 cells"):
        read_rows(p)


def test_unexpressible_rows_carry_reasons(tmp_path):
    p = tmp_path / "rows.csv"
    p.write_text("id,group,model,hardware,num_gpus,seq_len,gbs,tp,measured_tokens_per_s_per_gpu\n"
                 "ok,g,llama2-7b,h100-sxm,8,4096,128,1,1000\n"
                 "noseq,g,llama2-7b,h100-sxm,8,,128,1,1000\n"
                 "badtp,g,llama2-7b,h100-sxm,8,4096,128,3,1000\n"
                 "nomodel,g,llama-99b,h100-sxm,8,4096,128,1,1000\n")
    res = {r.id: r for r in validate_rows(read_rows(p))}
    assert res["ok"].skipped is None and res["ok"].error is not None
    assert "seq_len is not published" in res["noseq"].skipped
    assert "does not divide 8 GPUs" in res["badtp"].skipped
    assert "unknown model 'llama-99b'" in res["nomodel"].skipped


# ---------------------------------------------------------------- out-of-sample (nothing fitted to it)
HOLDOUT = Path(__file__).resolve().parents[2] / "benchmarks" / "holdout" / "published-holdout.csv"


def test_holdout_published_runs_not_fitted_to():
    """Megatron-LM 2021 Table 1 and LLaMA 65B on A100 (a part with no calibration rows,
    docs/accuracy.md): the same model, untouched, must hold to the issue's bars on runs it was not
    fitted to (A/B rows; every row must at least project)."""
    res = validate_rows(read_rows(HOLDOUT), base_dir=HOLDOUT.parent)
    assert len(res) >= 11 and all(r.skipped is None for r in res), [r.skipped for r in res if r.skipped]
    ab = [r for r in res if r.quality in ("A", "B")]
    errs = [abs(r.error) for r in ab]
    assert len(ab) >= 10 and statistics.median(errs) <= 0.12
    assert max(abs(r.error) for r in res) <= 0.30, max(res, key=lambda r: abs(r.error)).id


SCALE = HOLDOUT.parent / "published-scale.csv"


def test_scale_holdout_projects_every_row():
    """DeepSeek-V3 on 2,048 H800 and Llama 3 405B on 8-16K H100 (docs/accuracy.md, nothing fitted to them): every
    row projects as its notes state, each assumption named, within the holdout's worst-row bar."""
    res = validate_rows(read_rows(SCALE), base_dir=SCALE.parent)
    assert len(res) == 4 and all(r.skipped is None for r in res), [r.skipped for r in res if r.skipped]
    assert max(abs(r.error) for r in res) <= 0.30, max(res, key=lambda r: abs(r.error)).id
    by_id = {r.id: r for r in res}
    assert any("fp8_recipe=blockwise" in a for a in by_id["deepseek-v3-h800-2048"].assumed)
    assert by_id["llama3-405b-h100-8192"].quantity == "tflops_per_gpu"


def test_jobs_split_the_rows_over_processes_with_the_same_results():
    rows = read_rows(HOLDOUT)
    one = [r.to_dict() for r in validate_rows(rows, base_dir=HOLDOUT.parent)]
    assert [r.to_dict() for r in validate_rows(rows, base_dir=HOLDOUT.parent, jobs=2)] == one
    assert [r.to_dict() for r in validate_rows(rows, base_dir=HOLDOUT.parent, jobs=0)] == one


def test_relative_card_paths_resolve_against_the_csv_folder(tmp_path, monkeypatch):
    (tmp_path / "cards").mkdir()
    src = Path(__file__).resolve().parents[2] / "oracle" / "models" / "llama2-7b.yaml"
    (tmp_path / "cards" / "my-7b.yaml").write_text(src.read_text().replace("name: llama2-7b", "name: my-7b"))
    p = tmp_path / "rows.csv"
    p.write_text("id,model,hardware,num_gpus,seq_len,gbs,measured_tokens_per_s_per_gpu\n"
                 "rel,cards/my-7b.yaml,h100-sxm,8,4096,128,1000\n"
                 "missing,cards/nope.yaml,h100-sxm,8,4096,128,1000\n"
                 "hf,hf/qwen2.5-0.5b/config.json,h100-sxm,8,4096,128,1000\n")
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen2.5-0.5b", tmp_path / "hf" / "qwen2.5-0.5b")
    monkeypatch.chdir(tmp_path.parent)  # not the CSV folder: resolution must not depend on the cwd
    res = {r.id: r for r in validate_rows(read_rows(p), base_dir=p.parent)}
    assert res["rel"].skipped is None and res["rel"].projected > 0
    assert "nope.yaml" in res["missing"].skipped
    assert res["hf"].skipped is None and res["hf"].projected > 0  # a Hugging Face config.json beside the CSV


@needs_shared
def test_the_bundled_moe_sync_stall_is_the_fit_of_the_batch_contrasts():
    """efficiency.moe_sync_stall_s of the AMD profiles says it is the fit of benchmarks/calibrate.py
    --contrasts; a change to the oracle that moves the fit must come with a recalibration."""
    import importlib.util
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "calibrate.py"
    spec = importlib.util.spec_from_file_location("calibrate_for_test", path)
    cal = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cal)
    rows = [r for r in read_rows(CSV) if r["hardware"].strip() in cal.FAMILIES["amd-instinct"]]
    pairs = cal.batch_contrasts(rows)
    assert len(pairs) == 3
    fit = cal.fit_stall(pairs)
    from oracle.hardware import load_hardware
    assert fit["stall_s"] == pytest.approx(load_hardware("mi355x").efficiency.moe_sync_stall_s, abs=1e-4)


# ---------------------------------------------------------------- releases and the published NVIDIA tables
def test_newest_release_of_a_configuration_is_the_target(tmp_path):
    """One configuration published in several releases: only the newest is 'newest'; an empty cell
    means the default (fsdp '' == false), and a different FP8 recipe is another configuration."""
    from oracle.validate import newest_flags, release_of
    base = {"model": "llama3-8b", "hardware": "h100-sxm", "num_gpus": "8", "seq_len": "8192", "gbs": "128",
            "fsdp": "", "notes": "fp8_recipe=mxfp8"}
    rows = [dict(base, id="a", group="25.09 NeMo Container / x"), dict(base, id="b", group="26.02.01 NeMo / x", fsdp="false"),
            dict(base, id="c", group="25.11 NeMo / x", notes="fp8_recipe=current_scaling"),
            dict(base, id="d", group="no release here")]
    assert [release_of(r) for r in rows] == ["25.09", "26.02.01", "25.11", None]
    assert newest_flags(rows) == [False, True, True, True]


@pytest.mark.skipif(not NVIDIA_CSV.exists(), reason="shared/validation/published-nvidia.csv not present")
def test_published_nvidia_runs_project_and_rank():
    """Issue bars that hold today (docs/accuracy.md): >= 95% of rows projected (uneven layouts, NVFP4,
    DeepSeek-V3 included), per-table Spearman median >= 0.9, dense models' newest rows within 8% median.
    The MoE misses (median, share within 10%, worst row) are documented there, not asserted away."""
    res = validate_rows(read_rows(NVIDIA_CSV), base_dir=NVIDIA_CSV.parent)
    h = summarize(res)["summary"]["headline"]
    assert h["projected_share"] >= 0.95
    assert h["spearman_median"] >= 0.9
    assert any(r.skipped is None and "nvfp4" in r.id for r in res)
    assert sum(1 for r in res if r.skipped is None and "deepseek" in r.id) >= 30
    dense = [abs(r.error) for r in res if r.newest and r.error is not None and ("llama" in r.id)]
    assert len(dense) >= 20 and statistics.median(dense) <= 0.08


def test_unstated_recompute_is_the_fastest_that_fits():
    """A row that publishes no recompute and does not fit without it ran with some (it trained): the
    row is projected with the fastest recompute that fits (Megatron module sets or full recompute of
    the fewest layers), said in ``assumed``; a stated recompute or a row that fits is left alone."""
    from oracle.memory import project_memory
    from oracle.projector import project
    from oracle.validate import row_to_run
    big = {"id": "big", "model": "llama3-70b", "hardware": "h100-sxm", "num_gpus": "64", "seq_len": "8192",
           "gbs": "128", "mbs": "2", "tp": "4", "pp": "4", "precision": "bf16"}
    run, assumed, skip = row_to_run(big)
    assert skip is None and project_memory(run, trees="none").fits
    note = [a for a in assumed if "fastest memory setting that fits" in a]
    assert len(note) == 1 and run.training.recompute != "none"
    chosen = project(run).tokens_per_s_per_gpu
    for alt in ({"recompute": "full"}, {"recompute": "selective", "recompute_modules": "mlp+core_attn"}):
        other, _, _ = row_to_run(dict(big, **alt))
        p = project(other)
        assert not p.fits or p.tokens_per_s_per_gpu <= chosen * (1 + 1e-9)
    stated, assumed2, _ = row_to_run(dict(big, recompute="none"))
    assert stated.training.recompute == "none" and not any("memory setting that fits" in a for a in assumed2)
    small = dict(big, model="llama3-8b", mbs="1", tp="1")
    r3, assumed3, _ = row_to_run(small)
    assert r3.training.recompute == "none" and not any("memory setting that fits" in a for a in assumed3)


def test_a_published_without_mtp_variant_drops_the_mtp_layers():
    from oracle.validate import row_to_run
    row = {"id": "ds", "model": "deepseek-v3", "hardware": "gb300-nvl72", "num_gpus": "256", "seq_len": "4096",
           "gbs": "4096", "mbs": "1", "tp": "1", "pp": "2", "vpp": "8", "ep": "32", "precision": "fp8"}
    with_mtp, a1, _ = row_to_run(dict(row, notes="variant=w/ MTP"))
    without, a2, _ = row_to_run(dict(row, notes="ga=32;variant=w/o MTP;moe_force_balanced=true"))
    assert with_mtp.model.mtp_layers == 1 and without.model.mtp_layers == 0
    assert any("w/o MTP" in a for a in a2) and not any("w/o MTP" in a for a in a1)
    assert "m" not in without.training.pipeline_model_parallel_layout.replace("|", "")
    assert without.model.total_params() == with_mtp.model.total_params()  # same model, one module fewer trained

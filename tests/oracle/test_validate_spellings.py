"""validate reads published tables as they are written: their spellings of precision, dispatcher and
recompute map onto the oracle's values (and the row says so), and a memory setting validate assumes for
a row that does not fit as published fits by the same memory count the projection reports."""
from __future__ import annotations

import pytest

from oracle.validate import validate_rows

BASE = {"group": "t", "quality": "A", "measured_tokens_per_s_per_gpu": "1000", "seq_len": "4096", "mbs": "1"}


def _row(**cells: str) -> dict[str, str]:
    return {**BASE, **cells}


@pytest.mark.parametrize("cells, key, value", [
    ({"precision": "MXFP8"}, "precision", "fp8"),
    ({"precision": "fp8-cs"}, "precision", "fp8"),
    ({"precision": "bf16-mixed"}, "precision", "bf16"),
    ({"precision": "FP16"}, "precision", "bf16"),
    ({"precision": "NVFP4"}, "precision", "nvfp4"),
    ({"recompute": "block", "recompute_num_layers": "1"}, "recompute", "full"),
    ({"moe_a2a_backend": "hybridep"}, "moe_a2a_backend", "deepep"),
    ({"moe_a2a_backend": "flex"}, "moe_a2a_backend", "deepep"),
])
def test_published_spellings_map_and_are_reported(cells, key, value):
    moe = key == "moe_a2a_backend"
    row = _row(id="r", model="qwen3-30b-a3b" if moe else "llama3-8b", hardware="GB200" if "NVFP4" in cells.values()
               else "b200", num_gpus="8", gbs="64", tp="1", pp="1", ep="8" if moe else "1",
               **({} if "precision" in cells else {"precision": "bf16"}), **cells)
    [res] = validate_rows([row])
    assert res.skipped is None, res.skipped
    assert res.projection.config["training"][key] == value
    published = cells[key]
    if published.lower() != value:
        assert any(a.startswith(f"{key}={value} (published {published!r}") for a in res.assumed), res.assumed


def test_an_unknown_spelling_is_refused_naming_the_valid_values():
    [res] = validate_rows([_row(id="r", model="llama3-8b", hardware="b200", num_gpus="8", gbs="64", precision="int4")])
    assert res.projected is None
    assert "'int4'" in res.skipped and "bf16 | fp8 | nvfp4" in res.skipped


def test_assumed_memory_setting_fits_by_the_projections_own_count():
    """The closed-form in-flight count said this interleaved DeepSeek-V3 row fits with module recompute
    of layernorm alone; the schedule simulator's count (the one the projection reports) puts it over the
    cap, so the assumption must pick a setting that fits by that count."""
    [res] = validate_rows([_row(id="r", model="deepseek-v3", hardware="gb200-nvl72", num_gpus="512", gbs="8192",
                                tp="1", pp="8", vpp="4", ep="64", precision="bf16", moe_a2a_backend="flex")])
    assert res.skipped is None, res.skipped
    assert res.fits, (res.projected_peak_gib, res.assumed)
    assert any("the fastest memory setting that fits" in a for a in res.assumed)


def test_a_row_the_closed_form_passes_but_the_schedule_does_not_gets_a_setting():
    # 462B at TP8 PP16 VP3 (uneven recipe layout): 70.8 GiB by the schedule's count against a 70.2 cap
    [res] = validate_rows([_row(id="r", model="megatron-gpt-462b", hardware="h100-sxm", num_gpus="6144", gbs="1536",
                                tp="8", pp="16", vpp="3", precision="bf16")])
    assert res.skipped is None, res.skipped
    assert res.fits
    assert any(a.startswith("recompute=full") for a in res.assumed), res.assumed

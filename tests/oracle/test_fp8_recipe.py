"""FP8 recipes (Megatron-Core --fp8-recipe): what each quantise cast moves, MXFP8's block-scaled GEMMs at their
own efficiency, where each recipe runs, and how validate reads a published row's recipe."""
import pytest

from oracle.compute import LayerModel
from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.gemm import ELEM_BYTES, gemm_time_s
from oracle.layout import Layout
from oracle.opgraph import CAST_BYTES, Shapes, layer_ops
from oracle.projector import comm_model, project
from oracle.validate import row_to_run

BASE = dict(seq_len=8192, gbs=128, mbs=2, precision="fp8")


def run_of(model="llama3-8b", hw="b200", n=8, **t):
    return RunConfig.from_dict({"model": model, "cluster": {"hardware": hw, "num_gpus": n}, "training": {**BASE, **t}})


def _ops(run):
    return {op.name: op for op in layer_ops(run.model, Shapes.of(run), "dense")}


def test_cast_bytes_follow_the_recipe_hand_count():
    """delayed / tensorwise: read bf16, write fp8 (3 B); mxfp8: read once, write row- and column-wise fp8 with an
    e8m0 scale per 32 values (2 + 2 x 1.03125 B); blockwise: fp32 scales per 128 (the same bytes)."""
    assert CAST_BYTES["delayed"] == CAST_BYTES["tensorwise"] == 3.0
    assert CAST_BYTES["mxfp8"] == pytest.approx(2 + 2 * (1 + 1 / 32))
    assert CAST_BYTES["blockwise"] == pytest.approx(2 + 2 * (1 + 4 / 128))
    d, m = _ops(run_of(fp8_recipe="delayed")), _ops(run_of(fp8_recipe="mxfp8"))
    for name in ("attn_quant", "mlp_quant"):
        assert m[name].bytes_f == pytest.approx(d[name].bytes_f * CAST_BYTES["mxfp8"] / 3.0)
    assert {o.dtype for o in m.values() if o.kind == "gemm" and o.name != "router"} == {"mxfp8"}


def test_mxfp8_gemms_run_at_the_fp8_peak_times_their_own_efficiency():
    h = run_of().cluster.hardware
    assert h.mxfp8_gemms and h.efficiency.gemm_mxfp8 > 0
    big = (16384, 16384, 16384)
    ratio = gemm_time_s(h, *big, "fp8") / gemm_time_s(h, *big, "mxfp8")
    assert ratio == pytest.approx(h.efficiency.gemm_mxfp8 / h.efficiency.gemm_fp8, rel=1e-6)
    assert ELEM_BYTES["mxfp8"] == pytest.approx(1 + 1 / 32)


def test_recipes_cost_what_their_casts_and_gemms_cost():
    lm = lambda r: LayerModel(Layout(r), comm_model(r.cluster.hardware, 8)).layer("dense")  # noqa: E731
    delayed, tensorwise, mx = (lm(run_of(fp8_recipe=x)) for x in ("delayed", "tensorwise", "mxfp8"))
    assert (tensorwise.f_s, tensorwise.b_s) == (delayed.f_s, delayed.b_s)
    assert mx.f_s > delayed.f_s  # the block-scaled casts write two copies
    p = {x: project(run_of(fp8_recipe=x)) for x in ("delayed", "mxfp8")}
    assert p["mxfp8"].memory.peak_bytes > p["delayed"].memory.peak_bytes  # the weight copies carry scales


@pytest.mark.parametrize("hw, training, named", [
    ("h100-sxm", dict(fp8_recipe="mxfp8"), "fp8_recipe=mxfp8 needs block-scaled FP8 tensor cores"),
    ("b200", dict(precision="bf16", fp8_recipe="mxfp8"), "it needs precision=fp8"),
    ("b200", dict(fp8_recipe="sometimes"), "fp8_recipe"),
    ("b200", dict(framework="torchtitan", fp8_recipe="blockwise"), "fp8_recipe=blockwise with framework=torchtitan"),
])
def test_a_recipe_the_part_or_precision_cannot_run_is_named(hw, training, named):
    with pytest.raises(InvalidConfigError, match=named):
        run_of(hw=hw, **training)


def test_hopper_runs_blockwise_and_tensorwise():
    assert run_of(hw="h100-sxm", fp8_recipe="blockwise").training.fp8_recipe == "blockwise"
    assert run_of(hw="h100-sxm", fp8_recipe="tensorwise").training.gemm_kernel == "fp8"


ROW = {"id": "r", "model": "llama3-8b", "hardware": "B200", "num_gpus": "8", "seq_len": "8192", "gbs": "128",
       "mbs": "2", "tp": "1", "pp": "1", "precision": "fp8"}


@pytest.mark.parametrize("cells, recipe, said", [
    ({"notes": "fp8_recipe=mxfp8;moe_force_balanced=true"}, "mxfp8", "the row's notes"),
    ({"notes": "fp8_recipe=mxfp8(32x32 per table note)"}, "mxfp8", "the row's notes"),
    ({"notes": "fp8_recipe=current_scaling(per-tensor);ga=8"}, "tensorwise", "the row's notes"),
    ({"notes": "fp8_recipe=not_specified('FP8' label)"}, "delayed", "Megatron-Core's default"),
    ({"notes": ""}, "delayed", "Megatron-Core's default"),
    ({"precision": "MXFP8"}, "mxfp8", "published precision 'MXFP8'"),
    ({"precision": "fp8-cs"}, "tensorwise", "published precision 'fp8-cs'"),
    ({"precision": "fp8", "fp8_recipe": "tensorwise", "notes": "fp8_recipe=mxfp8"}, "tensorwise", None),
])
def test_validate_reads_the_published_recipe(cells, recipe, said):
    run, assumed, skip = row_to_run({**ROW, **cells})
    assert skip is None and run.training.fp8_recipe == recipe
    notes = [a for a in assumed if a.startswith("fp8_recipe=")]
    if said is None:  # a recipe column is taken as written
        assert notes == []
    else:
        assert len(notes) == 1 and said in notes[0]

"""Uneven pipeline layouts (Megatron's decoder_first/last_pipeline_num_layers, account_for_*_in_pipeline_split,
pipeline_model_parallel_layout): they tile the layers exactly, and memory and pipeline costs follow the stage sizes."""
import csv
import dataclasses

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.layout import Layout
from oracle.memory import project_memory, rank_param_counts
from oracle.pipeline import StageCosts, run_schedule
from oracle.pipeline_layout import (StageWeights, assign, balanced_layout, card_weights, format_layout, parse_layout,
                                    recipe_layout, uneven_options)
from oracle.projector import project
from oracle.validate import row_to_run
from tests.conftest import SHARED


def run_of(model="llama3.1-70b", hw="h100-sxm", n=64, **t):
    t.setdefault("seq_len", 4096)
    t.setdefault("gbs", 128)
    return RunConfig.from_dict({"model": model, "cluster": {"hardware": hw, "num_gpus": n}, "training": t})


# ------------------------------------------------------------------ the string form
def test_megatron_layout_strings_parse():
    stages = parse_layout("Et*3|(tt|)*29,m|L")  # Megatron-LM's DeepSeek-V3 example, 32 virtual stages
    assert len(stages) == 32
    assert stages[0] == "Ettt" and set(stages[1:30]) == {"tt"} and stages[30:] == ("m", "L")
    assert parse_layout("E, t*2 | t t |tL") == ("Ett", "tt", "tL")  # commas and spaces are ignored
    assert parse_layout("E|((t|)*2)*3tL") == ("E",) + ("t",) * 6 + ("tL",)  # nested groups
    assert parse_layout("Et*4|(t*4|)*14,tmL") == ("Etttt",) + ("tttt",) * 14 + ("tmL",)


@pytest.mark.parametrize("text,needle", [
    ("Et*3|(tt|*29,m|L", "'(' without a matching ')'"),
    ("Ett|tt)|L", "unmatched ')' at position 6"),
    ("Et*3|x|L", "unknown character 'x' at position 5"),
    ("Et*0|L", "must be followed by a positive repeat count"),
    ("", "must be a non-empty string"),
    ("Et*99999999999|L", "expands past 1000000 items"),
])
def test_bad_layout_strings_say_where(text, needle):
    with pytest.raises(InvalidConfigError, match=needle.replace("(", "\\(").replace(")", "\\)").replace("*", "\\*")):
        parse_layout(text)


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 6), st.integers(0, 1), st.booleans()), min_size=1,
                max_size=12))
def test_format_round_trips(parts):
    stages = tuple("E" * e + "t" * n + "m" * m + "L" * lo for e, n, m, lo in parts)
    assume(any(stages))  # a layout holds at least the embedding and the loss
    assert parse_layout(format_layout(stages)) == stages


@pytest.mark.parametrize("layout,needle", [
    ("Et*30|t*30L", "places 60 decoder layers \\(t\\); model has num_layers=61"),
    ("Et*30|t*31mL|L", "has 3 virtual stages; pp\\*vpp = 2\\*1 = 2 needs exactly that many"),
    ("tE*1t*29|t*31mL", "the embedding E must appear exactly once, first in the first stage"),
    ("Et*30|t*31Lm", "the loss L must appear exactly once, last in the last stage"),
    ("Et*30|mt*31L", "must follow every decoder layer"),
    ("Et*30|t*31L", "places 0 MTP modules \\(m\\); model has 1"),
])
def test_layouts_that_do_not_place_the_model_are_refused(layout, needle):
    with pytest.raises(InvalidConfigError, match=needle):
        assign(61, 2, 1, mtp_layers=1, layout=layout)


def test_layout_excludes_the_other_keys_and_first_last_excludes_account_for():
    with pytest.raises(InvalidConfigError, match="cannot be combined with decoder_first_pipeline_num_layers"):
        assign(61, 2, 1, mtp_layers=1, layout="Et*30|t*31mL", first=30)
    with pytest.raises(InvalidConfigError, match="cannot be combined with account_for_loss_in_pipeline_split"):
        assign(60, 2, 1, last=30, account_for_loss=True)


# ------------------------------------------------------------------ tiling
def _check_tiles(a, num_layers: int, mtp: int) -> None:
    flat = [i for s in a.stages for i in s.layers]
    assert flat == list(range(num_layers))  # every layer once, contiguous, in forward order
    assert [s.embedding for s in a.stages] == [True] + [False] * (len(a.stages) - 1)
    assert [s.loss for s in a.stages] == [False] * (len(a.stages) - 1) + [True]
    assert sum(s.mtp for s in a.stages) == mtp
    assert len(a.stages) == a.pp * a.vpp


@settings(max_examples=300, deadline=None)
@given(num_layers=st.integers(1, 130), pp=st.integers(1, 16), vpp=st.integers(1, 4),
       first=st.none() | st.integers(0, 40), last=st.none() | st.integers(0, 40), mtp=st.integers(0, 2))
def test_first_last_tile_the_layers_exactly_or_are_refused_naming_the_values(num_layers, pp, vpp, first, last, mtp):
    try:
        a = assign(num_layers, pp, vpp, mtp_layers=mtp, first=first, last=last)
    except InvalidConfigError as exc:
        msg = str(exc)
        assert "\n" not in msg and (str(num_layers) in msg or str(first) in msg or "pp > 1" in msg)
        return
    _check_tiles(a, num_layers, mtp)
    ranks = a.rank_layer_counts()
    if first is not None:
        assert ranks[0] == first
    if last is not None:
        assert ranks[-1] == last
    middle = ranks[1 if first is not None else 0: pp - 1 if last is not None else pp]
    assert len(set(middle)) <= 1  # the rest splits evenly
    # each rank's layers split evenly over its chunks (Megatron)
    for r in range(pp):
        assert len({len(a.stages[c * pp + r].layers) for c in range(vpp)}) == 1


@settings(max_examples=200, deadline=None)
@given(num_layers=st.integers(1, 130), pp=st.integers(2, 16), vpp=st.integers(1, 4), mtp=st.integers(0, 1))
def test_every_suggested_uneven_layout_tiles(num_layers, pp, vpp, mtp):
    opts = uneven_options(num_layers, pp, vpp, mtp)
    assert opts  # a layout string always exists for pp > 1
    for o in opts:
        a = assign(num_layers, pp, vpp, mtp_layers=mtp,
                   first=o.get("decoder_first_pipeline_num_layers"), last=o.get("decoder_last_pipeline_num_layers"),
                   layout=o.get("pipeline_model_parallel_layout"),
                   account_for_embedding=bool(o.get("account_for_embedding_in_pipeline_split")),
                   account_for_loss=bool(o.get("account_for_loss_in_pipeline_split")))
        _check_tiles(a, num_layers, mtp)
    found = recipe_layout(num_layers, pp, vpp, mtp)
    if num_layers % (pp * vpp) == 0:
        assert found is None
    elif found is not None:
        keys, _ = found
        a = assign(num_layers, pp, vpp, mtp_layers=mtp, layout=keys.get("pipeline_model_parallel_layout"),
                   account_for_embedding=bool(keys.get("account_for_embedding_in_pipeline_split")),
                   account_for_loss=bool(keys.get("account_for_loss_in_pipeline_split")))
        _check_tiles(a, num_layers, mtp)


def test_account_for_embedding_and_loss_counts_them_as_layers():
    a = assign(126, 16, 8, account_for_embedding=True, account_for_loss=True)  # Llama 3.1 405B: 126 + 2 = 128
    assert a.layer_counts[0] == 0 and a.layer_counts[-1] == 0 and set(a.layer_counts[1:-1]) == {1}
    a = assign(94, 4, 2, account_for_embedding=True, account_for_loss=True)
    assert a.layer_counts == (11, 12, 12, 12, 12, 12, 12, 11)
    with pytest.raises(InvalidConfigError, match="num_layers \\+ 1 \\(embedding\\) = 95 does not split evenly"):
        assign(94, 4, 2, account_for_embedding=True)


def test_recipe_rules_reproduce_the_published_layouts():
    # Megatron-Bridge DeepSeek-V3 layout map: E + ceil(61/V) layers on each stage, remainder + MTP + loss last
    assert recipe_layout(61, 8, 1, 1)[0] == {"pipeline_model_parallel_layout": "Et*8|(t*8|)*6,t*5mL"}
    assert recipe_layout(61, 4, 4, 1)[0] == {"pipeline_model_parallel_layout": "Et*4|(t*4|)*14,tmL"}
    assert recipe_layout(61, 16, 1, 1) == recipe_layout(61, 2, 8, 1)  # the rule depends on pp*vpp only
    # V = 32 (Megatron-LM's DeepSeek-V3 example string)
    assert parse_layout(recipe_layout(61, 8, 4, 1)[0]["pipeline_model_parallel_layout"]) == \
        parse_layout("Et*3|(tt|)*29,m|L")
    assert recipe_layout(126, 16, 8)[0] == {"account_for_embedding_in_pipeline_split": True,
                                            "account_for_loss_in_pipeline_split": True}
    assert recipe_layout(80, 8, 2) is None


def _stage_loads(stages, w):
    loads, start = [], 0
    for s in stages:
        n = s.count("t")
        loads.append(sum(w.layers[start:start + n]) + w.embedding * ("E" in s) + w.loss * ("L" in s)
                     + w.mtp * s.count("m"))
        start += n
    assert start == len(w.layers)
    return loads


@settings(max_examples=150, deadline=None)
@given(layers=st.lists(st.floats(0.2, 3.0), min_size=1, max_size=10), n_virtual=st.integers(2, 5),
       emb=st.floats(0, 2), loss=st.floats(0, 3), mtp=st.integers(0, 1))
def test_balanced_layout_is_a_min_max_partition(layers, n_virtual, emb, loss, mtp):
    """Its heaviest stage is as light as the best contiguous split found by brute force."""
    import itertools
    w = StageWeights(layers=tuple(layers), embedding=emb, loss=loss, mtp=2.5)
    stages = parse_layout(balanced_layout(len(layers), n_virtual, 1, mtp, w))
    got = max(_stage_loads(stages, w))
    best = float("inf")
    n = len(layers)
    for cuts in itertools.combinations_with_replacement(range(n + 1), n_virtual - 1):
        bounds = (0, *cuts, n)
        counts = [bounds[i + 1] - bounds[i] for i in range(n_virtual)]
        trial = ["E" * (v == 0) + "t" * c + ("m" * mtp + "L" if v == n_virtual - 1 else "")
                 for v, c in enumerate(counts)]
        best = min(best, max(_stage_loads(trial, w)))
    assert got <= best + 1e-6


def test_card_weights_price_the_parts_by_their_work():
    card = RunConfig.from_dict({"model": "deepseek-v3", "cluster": {"hardware": "h100-sxm", "num_gpus": 16},
                                "training": {"seq_len": 4096, "gbs": 64, "pp": 1}}).model
    w = card_weights(card)
    assert w.embedding == 0 and w.loss > 1 and w.mtp > 1 + w.loss  # output GEMM > a layer; MTP = a layer + a head
    assert sum(w.layers) / len(w.layers) == pytest.approx(1.0)
    # the balanced layout never puts more work on a stage than the MTP and loss stage needs, plus a layer
    loads = _stage_loads(parse_layout(balanced_layout(61, 16, 2, 1, w)), w)
    assert max(loads) <= w.loss + w.mtp + max(w.layers) + 1e-9


# ------------------------------------------------------------------ config, legality, CLI
def test_not_divisible_is_refused_with_keys_that_work():
    with pytest.raises(InvalidConfigError) as exc:
        run_of("deepseek-v3", "h100-sxm", 256, pp=16, ep=16)
    msg = str(exc.value)
    assert "num_layers=61 is not divisible by pp*vpp = 16*1 = 16" in msg
    assert "decoder_first_pipeline_num_layers=" in msg and "pipeline_model_parallel_layout=" in msg
    # what it suggests is legal
    for o in uneven_options(61, 16, 1, 1, card_weights(run_of("deepseek-v3", "h100-sxm", 16, ep=16).model)):
        assert run_of("deepseek-v3", "h100-sxm", 256, pp=16, ep=16, **o).training.pp == 16


def test_layout_keys_round_trip():
    run = run_of("deepseek-v3", "h100-sxm", 256, pp=16, ep=16, pipeline_model_parallel_layout="Et*4|(t*4|)*14,tmL")
    again = RunConfig.from_dict(run.to_dict())
    assert again.training == run.training and again.key() == run.key()


def test_cli_refuses_a_bad_layout_with_exit_2(capsys, tmp_path):
    from raytune_primus.cli import main
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: deepseek-v3\ncluster: {hardware: h100-sxm, num_gpus: 256}\n"
                   "training: {seq_len: 4096, gbs: 256, pp: 16, ep: 16, "
                   "pipeline_model_parallel_layout: 'Et*4|(t*4|)*14,ttL'}\n")
    code = main(["project", str(cfg)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "places 62 decoder layers (t); deepseek-v3 has num_layers=61" in err
    assert "places 0 MTP modules (m); deepseek-v3 has 1" in err
    code = main(["project", str(cfg), "--set", "pipeline_model_parallel_layout=null", "--set",
                 "decoder_first_pipeline_num_layers=4", "--set", "decoder_last_pipeline_num_layers=4"])
    err = capsys.readouterr().err
    assert code == 2 and "the 53 decoder layers left after decoder_first/last_pipeline_num_layers" in err


# ------------------------------------------------------------------ memory and time follow the stage sizes
def test_a_bigger_first_stage_costs_more_memory_and_time_on_that_rank():
    even = run_of(tp=8, pp=4, gbs=64)  # Llama 3.1 70B, 80 layers: 20 per rank
    big = run_of(tp=8, pp=4, gbs=64, decoder_first_pipeline_num_layers=26, decoder_last_pipeline_num_layers=14)
    assert [len(c[0]) for c in Layout(big).stage_layers] == [26, 20, 20, 14]
    me, mb = project_memory(even, trees="none"), project_memory(big, trees="none")
    for field in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes"):
        assert getattr(mb.stages[0], field) > getattr(me.stages[0], field), field
        assert getattr(mb.stages[3], field) < getattr(me.stages[3], field), field
        assert getattr(mb.stages[1], field) == pytest.approx(getattr(me.stages[1], field)), field
    assert mb.peak_bytes > me.peak_bytes  # the worst stage decides
    # weights scale with the rank's layers: 6 more layers on rank 0
    layer = (rank_param_counts(even, 1)[0] - 0) / 20
    assert rank_param_counts(big, 0)[0] - rank_param_counts(even, 0)[0] == pytest.approx(6 * layer, rel=1e-9)
    pe, pb = project(even), project(big)
    f = [row[0]["f"] for row in pb.details["stage_times_s"]]
    fe = [row[0]["f"] for row in pe.details["stage_times_s"]]
    assert f[0] > fe[0] and f[3] < fe[3] and f[1] == pytest.approx(fe[1])
    assert pb.details["critical_rank"] == 0
    assert pb.iteration_time_s > pe.iteration_time_s  # the slowest stage sets the pace


@pytest.mark.parametrize("schedule,vpp", [("1f1b", 1), ("interleaved", 2), ("zero_bubble", 1), ("zbv", 2),
                                          ("zbv_greedy", 2), ("v_half", 2), ("v_min", 2)])
def test_simulator_follows_the_slowest_stage(schedule, vpp):
    """Every schedule replays its order with per-(rank, chunk) costs (tests/oracle/test_pipeline_properties.py
    checks random unequal costs against the critical-path bound); a slower stage slows the pipeline."""
    pp, m = 4, 8
    base = StageCosts.uniform(pp=pp, vpp=vpp, f_s=1.0, b_s=1.0, w_s=1.0)
    heavy = dataclasses.replace(base, f_s=tuple(tuple(2.0 if r == 1 else 1.0 for _ in range(vpp)) for r in range(pp)))
    r0, r1 = run_schedule(schedule, pp, vpp, m, base), run_schedule(schedule, pp, vpp, m, heavy)
    assert r1.busy_s[1] > r1.busy_s[0] and r1.makespan_s > r0.makespan_s
    assert r1.makespan_s >= max(r1.busy_s)
    assert r1.bubble_s[0] > r0.bubble_s[0]  # the others wait on the slow stage


def test_uneven_chunks_weigh_the_in_flight_activations_by_their_size():
    # 4 x 2 virtual stages; rank 3's last chunk holds 1 layer + MTP + loss, its first 4 layers
    run = run_of("deepseek-v3", "h100-sxm", 256, pp=4, vpp=2, ep=32, gbs=256, mbs=1,
                 pipeline_model_parallel_layout="Et*8|(t*8|)*6,t*5mL")
    from oracle.memory import chunk_activation_shares
    shares = chunk_activation_shares(run)
    assert all(sum(row) == pytest.approx(1.0) for row in shares)
    assert shares[3][1] < shares[3][0]  # 5 layers (the MTP is with the loss) vs 8
    assert shares[1] == pytest.approx((0.5, 0.5))


def test_a_standalone_mtp_stage_holds_the_mtp_and_its_weight_copies():
    with_loss = run_of("deepseek-v3", "h100-sxm", 256, pp=16, ep=16,
                       pipeline_model_parallel_layout="Et*4|(t*4|)*13,t*5|mL")
    alone = run_of("deepseek-v3", "h100-sxm", 256, pp=16, ep=16,
                   pipeline_model_parallel_layout="Et*4|(t*4|)*13,t*5m|L")
    L = Layout(alone)
    assert L.mtp_modules(14, 0) == 1 and L.mtp_modules(15, 0) == 0 and L.has_output(15, 0)
    d14, e14 = rank_param_counts(alone, 14)
    d14_ref, e14_ref = rank_param_counts(with_loss, 14)
    card = alone.model
    assert e14 > e14_ref  # the MTP's experts moved onto rank 14
    # rank 14 also holds an embedding copy and an output-weight copy for the MTP (V x H / tp each)
    assert d14 - d14_ref > 2 * card.padded_vocab() * card.hidden_size
    pa = project(alone)
    pl = project(with_loss)
    f = [row[0]["f"] for row in pa.details["stage_times_s"]]
    fl = [row[0]["f"] for row in pl.details["stage_times_s"]]
    assert f[14] > fl[14] and f[15] < fl[15]  # the MTP (a layer and a head) moved from rank 15 to 14
    assert f[13] == pytest.approx(fl[13])
    m14, m14_ref = (project_memory(r, trees="none").stages[14] for r in (alone, with_loss))
    assert m14.activations_bytes > m14_ref.activations_bytes and m14.params_bytes > m14_ref.params_bytes


# ------------------------------------------------------------------ end to end
def test_deepseek_v3_61_layers_at_pp16_projects():
    for keys in ({"decoder_first_pipeline_num_layers": 5, "decoder_last_pipeline_num_layers": 0},
                 {"pipeline_model_parallel_layout": "Et*4|(t*4|)*14,tmL"}):
        run = run_of("deepseek-v3", "h100-sxm", 1024, pp=16, ep=64, gbs=4096, mbs=1, precision="fp8", **keys)
        p = project(run)
        assert p.tokens_per_s_per_gpu > 0 and len(p.memory.stages) == 16
        assert sum(len(c[0]) for c in Layout(run).stage_layers) == 61


def test_search_space_reaches_pp_that_does_not_divide_the_layers():
    from searchers.space import SearchSpace
    base = run_of("deepseek-v3", "h100-sxm", 256, pp=8, ep=8, gbs=256, mbs=1, precision="fp8",
                  decoder_first_pipeline_num_layers=9, decoder_last_pipeline_num_layers=4)
    sp = SearchSpace(base, restrict={"pp": [8, 16], "vpp": [1, 2]}, pins={"tp": 1, "cp": 1, "ep": 8, "mbs": 1,
                                                                        "recompute": "none"})
    seen = {(p["pp"], p.get("vpp", 1)) for p in sp.iter_points()}
    assert {(8, 1), (16, 1), (16, 2), (8, 2)} <= seen
    for p in sp.iter_points():
        run = sp.run_of(p)
        assert sum(len(c) for chunks in Layout(run).stage_layers for c in chunks) == 61
        if (run.training.pp, run.training.vpp) == (8, 1):  # the baseline's own layout is kept there
            assert run.training.decoder_first_pipeline_num_layers == 9
    point = next(p for p in sp.iter_points() if p["pp"] == 16 and p.get("vpp", 1) == 1)
    run, problems = sp.validate(point)
    assert not problems and project(run).tokens_per_s_per_gpu > 0


def test_a_scorer_given_values_of_builds_the_run_the_space_runs():
    """A Ray scorer knows the baseline only (``build_run``): ``values_of`` carries each point's derived layout
    (a pp that does not split the layers, and a pp away from the baseline's own uneven layout), where the bare
    axes made the pool score another run (or fail it: 'num_layers=61 is not divisible')."""
    from raytune_primus.pool import score_in_process
    from raytune_primus.trainable import build_run
    from searchers.evaluator import OracleEvaluator, score_results
    from searchers.space import SearchSpace
    base = run_of("deepseek-v3", "h100-sxm", 256, pp=8, ep=8, gbs=256, mbs=1, precision="fp8",
                  decoder_first_pipeline_num_layers=9, decoder_last_pipeline_num_layers=4)
    sp = SearchSpace(base, restrict={"pp": [4, 8, 16], "vpp": [1, 2], "pp_schedule": ["1f1b", "interleaved"]},
                     pins={"tp": 1, "cp": 1, "ep": 8, "mbs": 1, "recompute": "none"})
    assert {p["pp"] for p in sp.iter_points()} == {4, 8, 16}
    for p in sp.points:
        assert build_run(base, sp.values_of(p)).training == sp.run_of(p).training
    bare = [dict(zip(sp.axes, p)) for p in sp.points]
    assert any(build_run(base, v).training != sp.run_of(p).training for v, p in zip(bare, sp.points))
    sample = list(sp.points[::max(1, len(sp.points) // 12)])
    runs = [sp.run_of(p) for p in sample]
    ev = OracleEvaluator("simulate")
    got = score_in_process(ev, base, [sp.values_of(p) for p in sample])
    assert got == score_results(ev, runs, [r.key() for r in runs])
    assert all(r.status in ("ok", "rejected") for r in got)  # projected (none fails), fits or not


NVIDIA = SHARED / "validation" / "published-nvidia.csv"


@pytest.mark.skipif(not NVIDIA.exists(), reason="shared/validation/published-nvidia.csv not present")
def test_published_rows_without_a_layout_get_the_recipe_layout():
    """A row that states no layout (its recipe cell emptied here) takes the framework recipe's uneven rule; a row
    whose recipe states the layout (pipeline_model_parallel_layout) is priced with that layout, assumed nothing."""
    rows = [r for r in csv.DictReader(NVIDIA.open()) if r["model"] in ("deepseek-v3", "llama3.1-405b")
            and r["precision"] != "nvfp4"]
    assert len(rows) >= 40
    stated = 0
    for r in rows:
        if "pipeline_model_parallel_layout=" in r.get("recipe", ""):
            run, assumed, skip = row_to_run(r)
            if skip is None and not any("recipe rule" in a for a in assumed):
                assert run.training.pipeline_model_parallel_layout in r["recipe"], r["id"]
                stated += 1
    assert stated >= 10
    for r in rows:
        run, assumed, skip = row_to_run(dict(r, recipe=""))
        if skip is not None:  # a row may be refused for another reason, never for its layout
            assert "pp*vpp" not in skip and "pipeline" not in skip, (r["id"], skip)
            continue
        t = run.training
        if run.model.num_layers % (t.pp * t.vpp):
            note = [a for a in assumed if "recipe rule" in a]
            assert len(note) == 1, r["id"]
            keys = ("pipeline_model_parallel_layout" if run.model.name.startswith("deepseek-v3")
                    else "account_for_embedding_in_pipeline_split")
            assert keys in note[0]


def test_recipe_layout_never_piles_a_large_remainder_on_the_first_stage():
    """61 layers over 32 virtual stages without MTP (31 body stages + loss): 2 layers on the first 30
    stages and 1 on the 31st, not 31 layers on the first."""
    keys, rule = recipe_layout(61, 8, 4, 0)
    stages = parse_layout(keys["pipeline_model_parallel_layout"])
    counts = [s.count("t") for s in stages]
    assert sum(counts) == 61 and max(counts) == 2 and "take one more" in rule

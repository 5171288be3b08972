"""The batch memory pre-filter (``memory_peaks``: numpy over configurations) agrees bit for bit with the scalar
projection (``project_memory``, the same formula on one rank's floats), over random legal configurations
(hypothesis), and the searchers' batch verdicts equal the one-by-one ones."""
from __future__ import annotations

from functools import lru_cache

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from oracle import memory
from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.memory import chunk_activation_shares, memory_peaks, project_memory
from searchers.evaluator import OracleEvaluator, memory_result, memory_results
from searchers.space import SearchSpace
from tests.oracle.test_memory_properties import configs

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
EXTRAS = st.fixed_dictionaries({}, optional={
    "grad_reduce_in_fp32": st.booleans(),
    "loss_fusion": st.booleans(),
    "fp8_param_gather": st.booleans(),
    "fp8_recipe": st.sampled_from(["delayed", "mxfp8", "blockwise"]),
    "optimizer": st.sampled_from(["adam", "muon"]),
    "cuda_graph_impl": st.sampled_from(["none", "transformer_engine", "local", "full_iteration"]),
    "moe_a2a_backend": st.sampled_from(["alltoall", "deepep", "hybridep"]),
    "cpu_offloading": st.booleans(),
    "cpu_offloading_num_layers": st.integers(0, 2),
    "first_last_layers_bf16": st.booleans(),
    "precision": st.sampled_from(["bf16", "fp8", "nvfp4"]),
})


def _legal(cfg: dict, extra: dict) -> RunConfig | None:
    t = {**cfg["training"], **extra}
    try:
        return RunConfig.from_dict({"model": cfg["model"], "cluster": {"hardware": "b200", "num_gpus": cfg["num_gpus"]},
                                    "training": t})
    except InvalidConfigError:
        return None


@SETTINGS
@given(st.lists(st.tuples(configs(), EXTRAS), min_size=1, max_size=8))
def test_memory_peaks_are_the_scalar_peaks(cases):
    runs = [r for r in (_legal(c, e) for c, e in cases) if r is not None]
    assume(runs)
    memory.clear_caches()  # each path below computes the per-rank sums itself, or reads what another kept
    one = [project_memory(r, trees="none") for r in runs]  # the formula on floats
    scalar = [m.peak_bytes for m in one]
    shares = [chunk_activation_shares(r) for r in runs]
    assert memory_peaks(runs)[0].tolist() == scalar  # the batch reads the scalar path's sums
    memory.clear_caches()
    peaks, caps = memory_peaks(runs)  # the formula over arrays
    assert peaks.tolist() == scalar  # exact: the same operations in the same order
    assert caps.tolist() == [m.cap_bytes for m in one]
    assert memory_peaks(runs)[0].tolist() == scalar  # rows of the earlier batch's arrays
    assert [project_memory(r, trees="none") for r in runs] == one  # the scalar path made from those rows
    assert [chunk_activation_shares(r) for r in runs] == shares
    # the closed-form pre-filter and a projection's memory (simulator in-flight counts) run the same formula
    for r, m in zip(runs, one):
        assert project_memory(r, in_flight=[s.in_flight_microbatches for s in m.stages], trees="none") == m


def test_runs_of_one_placement_and_different_shapes_share_one_formula_but_not_their_shape_values():
    """The batch computes runs of one placement and policies together: what differs with the shape (tokens, the
    tensor-parallel vocabulary share of an unfused loss's scratch) is each run's own."""
    base = {"pp": 1, "mbs": 1, "seq_len": 128, "gbs": 4, "loss_fusion": False}
    runs = [RunConfig.from_dict({"model": "tiny-dense", "cluster": {"hardware": "b200", "num_gpus": 2},
                                 "training": {**base, **t}}) for t in ({"tp": 1}, {"tp": 2}, {"tp": 2, "mbs": 2})]
    memory.clear_caches()
    scalar = [project_memory(r, trees="none").peak_bytes for r in runs]
    memory.clear_caches()
    assert memory_peaks(runs)[0].tolist() == scalar
    assert len(set(scalar)) == 3


@lru_cache(maxsize=1)
def _space() -> SearchSpace:
    """Mixtral 8x22B on 32 MI355X (the benchmark's space, gbs smaller): a mix of pipeline depths in one batch."""
    return SearchSpace(RunConfig.from_dict({"model": "mixtral-8x22b", "cluster": {"hardware": "mi355x", "num_gpus": 32},
                                            "training": {"seq_len": 8192, "gbs": 128, "pp": 4, "vpp": 2, "ep": 8}}))


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False))
def test_batch_verdicts_are_the_one_by_one_verdicts(rnd):
    space, ev = _space(), OracleEvaluator()
    runs = [space.run_of(p) for p in rnd.sample(space.points, 60)]
    keys = [r.key() for r in runs]
    batch = memory_results(ev, runs, keys)
    assert batch == [memory_result(ev, r, k) for r, k in zip(runs, keys)]
    assert any(v is None for v in batch) and any(v is not None for v in batch)  # fits and rejections both met


def test_batch_verdicts_fall_back_one_by_one_when_the_batch_fails():
    space, ev = _space(), OracleEvaluator()
    runs = [space.run_of(p) for p in space.points[:5]]

    class Broken(OracleEvaluator):
        def memory_peaks(self, runs):
            raise RuntimeError("boom")
    assert memory_results(Broken(), runs, [""] * 5) == [memory_result(ev, r, "") for r in runs]


def test_a_real_mtp_model_on_an_uneven_layout_batches_as_it_projects_one_by_one():
    """DeepSeek-V3 (MTP, dense first layers, an uneven layout with the MTP stage) over shapes and settings that
    change every term of the sums: the batch's arrays and rows give the scalar path's peaks and shares."""
    layout = "Et*9|(t*8|)*6,t*4mL"
    runs = []
    for tp, mbs, rc, extra in ((1, 1, "selective", {}), (2, 1, "selective", {"fsdp": True}),
                               (1, 2, "full", {"recompute_num_layers": 1}), (4, 1, "none", {"loss_fusion": False}),
                               (1, 1, "selective", {"precision": "fp8", "fp8_param_gather": True,
                                                    "use_distributed_optimizer": True}),
                               (2, 2, "selective", {"moe_expert_capacity_factor": 1.0}),
                               (1, 1, "selective", {"optimizer": "muon"})):
        t = {"seq_len": 4096, "gbs": 1024, "mbs": mbs, "tp": tp, "pp": 4, "vpp": 2, "ep": 8, "recompute": rc,
             "pipeline_model_parallel_layout": layout, **extra}
        runs.append(RunConfig.from_dict({"model": "deepseek-v3", "cluster": {"hardware": "b200", "num_gpus": 256},
                                         "training": t}))
    memory.clear_caches()
    one = [project_memory(r, trees="none") for r in runs]
    shares = [chunk_activation_shares(r) for r in runs]
    memory.clear_caches()
    assert memory_peaks(runs)[0].tolist() == [m.peak_bytes for m in one]
    assert [project_memory(r, trees="none") for r in runs] == one
    assert [chunk_activation_shares(r) for r in runs] == shares
    assert len({m.peak_bytes for m in one}) == len(runs)

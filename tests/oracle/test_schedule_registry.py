"""A pipeline schedule is one module: registering it is all the config, legality, memory model,
projector, search space and synthetic oracle need (they read the registered spec, not a name list)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from oracle.config import RunConfig
from oracle.errors import InvalidConfigError
from oracle.memory import project_memory
from oracle.pipeline.schedules import SCHEDULES, register, unregister
from oracle.pipeline.schedules.one_f_one_b import fb_sequence
from oracle.projector import project

BASE = {"model": "tiny-moe", "cluster": {"hardware": "h100-sxm", "num_gpus": 8},
        "training": {"seq_len": 2048, "gbs": 64, "pp": 2, "ep": 2, "recompute": "full"}}


@pytest.fixture
def toy() -> Iterator[str]:
    """What a module ``oracle/pipeline/schedules/toy.py`` would hold: 1F1B's order under a memory rule
    of its own (half of 1F1B in flight) and at least 4 micro-batches."""
    @register("toy", layout="interleaved", splits_bw=False, vpp_rule="one", searched_by_default=True, blocking_p2p=True,
              in_flight=lambda pp, vpp, m, r: max(1.0, min(pp - r, m) / 2), min_microbatches=lambda pp, vpp: 4)
    def build(pp: int, vpp: int, num_microbatches: int):
        return [fb_sequence(pp, r, num_microbatches) for r in range(pp)]
    try:
        yield "toy"
    finally:
        unregister("toy")


def _run(**training) -> RunConfig:
    return RunConfig.from_dict({**BASE, "training": {**BASE["training"], **training}})


def test_a_registered_toy_schedule_is_accepted_everywhere(toy):
    run = _run(pp_schedule=toy)
    assert run.training.schedule == "toy"
    # memory: the toy's own in-flight formula, not 1F1B's
    ref = _run(pp_schedule="1f1b")
    assert project_memory(run).stages[0].in_flight_microbatches == pytest.approx(
        project_memory(ref).stages[0].in_flight_microbatches / 2)
    # projector: same order as 1F1B, so the same step time
    assert project(run).iteration_time_s == pytest.approx(project(ref).iteration_time_s)
    # legality: its VPP rule and least micro-batches, named in the message
    with pytest.raises(InvalidConfigError, match="schedule toy runs one chunk per rank and needs vpp=1"):
        _run(pp_schedule=toy, vpp=2)
    with pytest.raises(InvalidConfigError, match="schedule toy needs num_microbatches >= 4"):
        _run(pp_schedule=toy, gbs=8, mbs=2)  # dp = 8/2 = 4 -> 8 / (2*4) = 1 micro-batch


def test_the_search_space_and_synthetic_oracle_pick_it_up(toy):
    from searchers.space import SearchSpace
    from searchers.testing import SyntheticEvaluator
    space = SearchSpace(_run(), pins={"cp": 1, "vpp": 1, "tp": 1, "ep": 2, "mbs": 1})
    assert toy in space.values["pp_schedule"]  # searched_by_default
    points = [p for p in space.iter_points() if p["pp_schedule"] == toy]
    assert points
    score = SyntheticEvaluator().score(space.run_of(points[0]))
    assert score.tokens_per_s_per_gpu > 0


def test_unknown_names_list_the_registry(toy):
    with pytest.raises(InvalidConfigError, match=r"training.pp_schedule='nope' is not one of auto \| 1f1b .*\| toy"):
        _run(pp_schedule="nope")
    assert "toy" not in SCHEDULES or SCHEDULES["toy"].in_flight_microbatches(8, 1, 16, 0) == 4.0

"""Every point a bundled experiment's space calls legal is one the projector accepts.

The space enumerates with the oracle's legality check, and the projector applies each schedule's own
rules (oracle.pipeline.schedules): both read the same registered spec, so they cannot disagree. A
seeded sample of each space (and every point of the small ones) is projected here; none may raise.
"""
from __future__ import annotations

import random
from functools import lru_cache

import pytest

from oracle.pipeline.schedules import get_schedule, ilp
from oracle.projector import project
from searchers.experiment import bundled, load_experiment
from searchers.space import SearchSpace

SAMPLE = 40
SCHEDULE_AXES = ("tp", "pp", "vpp", "cp", "mbs", "gbs", "pp_schedule")
"""What a schedule's rules read: the degrees, and the batch that sets the micro-batch count."""
# the MILP's answer does not matter here, only that the projector accepts the point: no solve
_NO_SOLVE = ilp.IlpBudget(max_ops=0, node_limit=0, safety_time_limit_s=1.0)


@lru_cache(maxsize=None)
def _spec_space(name: str) -> SearchSpace:
    """The bundled experiment's own space, enumerated once for this module."""
    return load_experiment(name).space


def _unrestricted(name: str) -> SearchSpace:
    """The experiment's space with its default value lists (every registered default schedule)."""
    exp = load_experiment(name)
    return SearchSpace(exp.baseline, pins=exp.pins)


# each bundled spec's own space, and its default value lists (every default schedule, ILP included) where
# enumerating them stays short: DeepSeek-V3 on 1024 GPUs has ~790k default points (a minute to list)
CASES = [(n, True) for n in bundled()] + [(n, False) for n in bundled() if not n.startswith("deepseek")]


@pytest.mark.parametrize(("name", "restricted"), CASES, ids=[f"{n}-{'spec' if r else 'defaults'}" for n, r in CASES])
def test_every_sampled_legal_point_projects(name, restricted):
    space = _spec_space(name) if restricted else _unrestricted(name)
    n = space.size
    idx = range(n) if n <= SAMPLE else random.Random(f"{name}/{restricted}").sample(range(n), SAMPLE)
    errors = []
    with ilp.work_budget(_NO_SOLVE):
        for i in idx:
            run = space.run_of(space.point(i))
            try:
                project(run, memory_tree=False)
            except Exception as exc:  # noqa: BLE001 - the assertion lists what raised
                errors.append(f"{space.point(i)}: {type(exc).__name__}: {exc}")
    assert not errors, f"{len(errors)} of {len(idx)} legal points raised, e.g.\n" + "\n".join(errors[:5])


@pytest.mark.parametrize("name", bundled())
def test_every_enumerated_point_passes_its_schedules_own_rules(name):
    """Every point, not a sample: the check the projector's pipeline runs first (ScheduleSpec.check)."""
    space = _spec_space(name)
    base = space.baseline.training
    bad = []
    for p in space.iter_points():
        t = base.replace(**{k: v for k, v in p.items() if k in SCHEDULE_AXES})
        if t.pp > 1:
            n = space.baseline.cluster.num_gpus // (t.tp * t.pp * t.cp)
            problems = get_schedule(t.schedule).problems(t.pp, t.vpp, t.gbs // (t.mbs * n))
            if problems:
                bad.append(f"{p}: {problems[0]}")
    assert not bad, f"{len(bad)} of {space.size} points break their schedule's rules, e.g.\n" + "\n".join(bad[:5])


def test_interleaved_needs_as_many_microbatches_as_stages():
    # the bug this file guards: pp=2, vpp=5 interleaved with one micro-batch was 'legal' in the space
    exp = load_experiment("llama3.1-70b-h100-64")
    # 64 GPUs / (tp*pp*cp = 1*2*2) = dp 16; gbs 128 / (mbs 8 * dp 16) = 1 micro-batch
    run, problems = exp.space.validate({"pp": 2, "vpp": 5, "pp_schedule": "interleaved", "tp": 1, "cp": 2,
                                        "mbs": 8})
    assert any("needs num_microbatches >= 2 for pp=2, vpp=5, got 1" in p for p in problems), problems

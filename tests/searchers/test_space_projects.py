"""Every point a bundled experiment's space calls legal is one the projector accepts.

The space enumerates with the oracle's legality check, and the projector applies each schedule's own
rules (oracle.pipeline.schedules): both read the same registered spec, so they cannot disagree. A
seeded sample of each space (and every point of the small ones) is projected here; none may raise.
"""
from __future__ import annotations

import random

import pytest

from oracle.pipeline.schedules import ilp
from oracle.projector import project
from searchers.experiment import bundled, load_experiment
from searchers.space import SearchSpace

SAMPLE = 40
# the MILP's answer does not matter here, only that the projector accepts the point: no solve
_NO_SOLVE = ilp.IlpBudget(max_ops=0, node_limit=0, safety_time_limit_s=1.0)


def _unrestricted(name: str) -> SearchSpace:
    """The experiment's space with its default value lists (every registered default schedule)."""
    exp = load_experiment(name)
    return SearchSpace(exp.baseline, pins=exp.pins)


# each bundled spec's own space, and its default value lists (every default schedule, ILP included) where
# enumerating them stays short: DeepSeek-V3 on 1024 GPUs has ~790k default points (a minute to list)
CASES = [(n, True) for n in bundled()] + [(n, False) for n in bundled() if not n.startswith("deepseek")]


@pytest.mark.parametrize(("name", "restricted"), CASES, ids=[f"{n}-{'spec' if r else 'defaults'}" for n, r in CASES])
def test_every_sampled_legal_point_projects(name, restricted):
    space = load_experiment(name).space if restricted else _unrestricted(name)
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


def test_interleaved_needs_as_many_microbatches_as_stages():
    # the bug this file guards: pp=2, vpp=5 interleaved with one micro-batch was 'legal' in the space
    exp = load_experiment("llama3.1-70b-h100-64")
    # 64 GPUs / (tp*pp*cp = 1*2*2) = dp 16; gbs 128 / (mbs 8 * dp 16) = 1 micro-batch
    run, problems = exp.space.validate({"pp": 2, "vpp": 5, "pp_schedule": "interleaved", "tp": 1, "cp": 2,
                                        "mbs": 8})
    assert any("needs num_microbatches >= 2 for pp=2, vpp=5, got 1" in p for p in problems), problems

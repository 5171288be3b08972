"""A digest of many projections, to check that a speed change leaves every number alone.

    python benchmarks/projection_digest.py [--n 150] [--seed 1] [--out digest.json]

Projects ``--n`` random legal points of each benchmark space (benchmarks/bench_projection.py's
SPACES), in search mode (``fast_schedules=True``, no memory tree) and in exact mode (with the memory
tree), plus the memory-only projection (with and without trees) of each, and prints one SHA-1 per
space and kind over the full JSON of every result (``repr`` of the floats: bit-identical or not).
``--out`` writes every result's digest, so two runs can be diffed point by point.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_projection import COST_AWARE, SPACES  # noqa: E402
from oracle.config import RunConfig  # noqa: E402
from oracle.memory import project_memory  # noqa: E402
from oracle.projector import project  # noqa: E402
from searchers.space import SearchSpace  # noqa: E402


def _h(obj) -> str:
    return hashlib.sha1(json.dumps(_without_new_defaults(obj), sort_keys=True, default=repr).encode()).hexdigest()[:16]


NEW_TRAINING_KEYS = {"attention_backend": "auto", "mtp_use_repeated_layer": None, "cp_comm_type": "p2p",
                     "offload_modules": None}
"""Training keys added since digests were first recorded, with their defaults: a result's echoed config leaves them
out at the default, so a tree that adds a setting digests like the tree before it wherever the setting is unused."""


def _without_new_defaults(obj):
    training = obj.get("config", {}).get("training") if isinstance(obj, dict) else None
    if not isinstance(training, dict):
        return obj
    kept = {k: v for k, v in training.items() if NEW_TRAINING_KEYS.get(k, object()) != v}
    return {**obj, "config": {**obj["config"], "training": kept}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=150)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--cost-aware", type=int, default=4, help="cost-aware points kept per space (slow: default 4)")
    args = ap.parse_args()
    per_point: dict[str, dict[str, str]] = {}
    for name, spec in SPACES.items():
        space = SearchSpace(RunConfig.from_dict(spec))
        rng = random.Random(args.seed)
        pts = rng.sample(space.points, args.n)
        runs = [space.run_of(p) for p in pts]
        aware = [r for r in runs if r.training.schedule in COST_AWARE][:args.cost_aware]
        runs = [r for r in runs if r.training.schedule not in COST_AWARE] + aware
        kinds: dict[str, list[str]] = {"search": [], "exact": [], "memory": [], "memory_tree": []}
        for r in runs:
            key = r.key()
            d = {"search": _h(project(r, fast_schedules=True, memory_tree=False).to_dict()),
                 "exact": _h(project(r).to_dict()) if r.training.schedule not in COST_AWARE else "",
                 "memory": _h(project_memory(r, trees="none").to_dict()),
                 "memory_tree": _h(project_memory(r).to_dict())}
            per_point[f"{name}/{key}"] = d
            for k, v in d.items():
                kinds[k].append(v)
        for k, vs in kinds.items():
            print(f"{name:32s} {k:12s} {len(vs):4d} {hashlib.sha1(''.join(vs).encode()).hexdigest()[:16]}")
    if args.out:
        Path(args.out).write_text(json.dumps(per_point, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

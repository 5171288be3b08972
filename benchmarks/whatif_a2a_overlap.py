"""What-if: the published MoE rows projected with and without the EP all-to-all overlap.

    python benchmarks/whatif_a2a_overlap.py [../shared/validation/published-nvidia.csv]

NVIDIA's tables do not say whether a run overlapped its all-to-all (Megatron-Core
``--overlap-moe-expert-parallel-comm``), so ``validate`` never assumes it. This script projects the
newest-release MoE rows both ways, where Megatron allows it (EP > 1, PP 1 or interleaved, no full
recompute), and prints the signed errors grouped by release. It assumes nothing; it measures how far
the overlap would move the projection. docs/accuracy.md quotes its output.
"""
from __future__ import annotations

import dataclasses
import statistics

from whatif_rows import newest_moe_rows

from oracle.legality import check
from oracle.projector import project
from oracle.validate import row_to_run, validate_rows


def _overlapped(run):
    """``run`` with the all-to-all overlap on, or (None, why) where Megatron refuses it."""
    t = run.training
    if not run.model.is_moe or t.ep <= 1:
        return None, "no EP all-to-all"
    on = dataclasses.replace(run, training=t.replace(moe_a2a_overlap=True))
    problems = check(on)
    return (None, problems[0]) if problems else (on, "")


def main() -> int:
    path, rows, off, moe = newest_moe_rows(__doc__.splitlines()[0])

    def project_on(run):
        on, _ = _overlapped(run)
        return project(run if on is None else on)

    on = {r.id: r for r in validate_rows(rows, project_fn=project_on, base_dir=path.parent)}
    print(f"{'row':48s} {'measured':>9s} {'off':>8s} {'on':>8s}  note")
    by_era: dict[str, list[tuple[float, float]]] = {}
    for r in moe:
        a, b = off[r["id"]], on[r["id"]]
        _, why = _overlapped(row_to_run(r, path.parent)[0])
        note = f"not legal with overlap: {why}" if why else ("host-bound: nothing to gain" if a.projected == b.projected else "")
        print(f"{r['id']:48s} {a.measured:9,.0f} {100 * a.error:+7.1f}% {100 * b.error:+7.1f}%  {note}")
        if not why:
            era = "26.06 and later" if (a.release or "") >= "26.06" else "before 26.06"
            by_era.setdefault(era, []).append((a.error, b.error))
    print()
    for era, errs in sorted(by_era.items()):
        offs, ons = [e[0] for e in errs], [e[1] for e in errs]
        print(f"{era:16s} n={len(errs):2d}  median signed error off {100 * statistics.median(offs):+.1f}%  "
              f"on {100 * statistics.median(ons):+.1f}%   median |error| off "
              f"{100 * statistics.median(map(abs, offs)):.1f}%  on {100 * statistics.median(map(abs, ons)):.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

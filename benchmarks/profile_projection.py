"""cProfile of the oracle's hot paths on the benchmark spaces (issue 27): where a projection's time goes.

    python benchmarks/profile_projection.py [--space mixtral] [--n 400] [--warm 1500] [--what prefilter,cold,steady]
                                            [--out-dir benchmarks/profiles] [--tag now]

For each ``--what`` phase, profiles ``--n`` random legal points of the space (bench_projection.py's SPACES, the
same sampling) and writes ``<space>-<phase>-<tag>.txt``: the profile sorted by cumulative and by own time.
Phases: ``prefilter`` (``project_memory(trees='none')`` one by one, and the batch ``memory_peaks`` where the tree
has it), ``cold`` (search-mode projections of first points), ``steady`` (new points after ``--warm`` others),
``validate`` (``validate_rows`` of ``--n`` + 1 fresh rows of the Mixtral space, benchmarks/bench_validate.py's,
after its first row; written as ``validate-fresh-<tag>.txt``).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_projection import SPACES, draw, set_allocator, set_collector  # noqa: E402


def _dump(prof: cProfile.Profile, path: Path, title: str) -> None:
    s = io.StringIO()
    s.write(title + "\n")
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("cumulative").print_stats(45)
    st.sort_stats("tottime").print_stats(30)
    path.write_text(s.getvalue())
    print(f"wrote {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default="mixtral")
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--warm", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--what", default="prefilter,cold,steady")
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "profiles"))
    ap.add_argument("--tag", default="now")
    ap.add_argument("--gc", choices=("bulk", "default"), default="bulk",
                    help="the collector's thresholds: the command line's (bulk) or Python's (bench_projection.py --gc)")
    ap.add_argument("--malloc", choices=("bulk", "default"), default="bulk",
                    help="the C allocator's thresholds: the command line's (bulk) or glibc's (bench_projection.py)")
    args = ap.parse_args()
    print(set_collector(args.gc))
    print(set_allocator(args.malloc))
    from oracle.config import RunConfig
    from oracle.memory import project_memory
    from oracle.projector import project
    from searchers.space import SearchSpace
    name = next(k for k in SPACES if k.startswith(args.space))
    space = SearchSpace(RunConfig.from_dict(SPACES[name]))
    _, sample, plain, fresh, warm = draw(space, space.points, n=args.n, warm=args.warm, seed=args.seed)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    short = args.space.split("-")[0]
    whats = [w.strip() for w in args.what.split(",")]

    def one(r):
        return project(r, fast_schedules=True, memory_tree=False)
    if "prefilter" in whats:
        prof = cProfile.Profile()
        prof.enable()
        for r in sample:
            project_memory(r, trees="none")
        prof.disable()
        _dump(prof, out / f"{short}-prefilter-{args.tag}.txt", f"project_memory(trees='none') of {len(sample)} points")
    if "cold" in whats:
        prof = cProfile.Profile()
        prof.enable()
        for r in plain:
            one(r)
        prof.disable()
        _dump(prof, out / f"{short}-cold-{args.tag}.txt", f"search-mode projections, {len(plain)} first points")
    if "validate" in whats:
        from benchmarks.bench_validate import rows_of
        from oracle.validate import validate_rows
        rows = rows_of(args.n + 1, args.seed)
        validate_rows(rows[:1])  # start-up: imports, model card, hardware profile
        prof = cProfile.Profile()
        prof.enable()
        validate_rows(rows[1:])
        prof.disable()
        _dump(prof, out / f"validate-fresh-{args.tag}.txt", f"validate_rows of {args.n} fresh Mixtral rows")
    if "steady" in whats:
        for r in warm:
            one(r)
        prof = cProfile.Profile()
        prof.enable()
        for r in fresh:
            one(r)
        prof.disable()
        _dump(prof, out / f"{short}-steady-{args.tag}.txt",
              f"search-mode projections, {len(fresh)} new points after {len(warm)} others")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

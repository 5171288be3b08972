"""The cyclic garbage collector of a process that runs many projections (issue 27).

A projection allocates tens of thousands of short-lived objects (op graphs, plans, results) while the oracle's
caches hold a few hundred thousand long-lived ones. With CPython's default thresholds (700, 10, 10) the
collector runs a young collection every 700 net allocations and walks the middle generation every tenth:
`validate` of 401 fresh Mixtral rows spent 17 % of its CPU time in 192 collections (measured with
``gc.callbacks``; 0.081 of 0.483 s), a long search ~8 %. Nothing the oracle allocates relies on the collector
to free it promptly (reference counting frees it; cycles are rare and small), so processes that project in
bulk collect less often: (50,000, 20, 20) made the same run 6 collections, 0.017 of 0.402 s (998 rows/s against
831). The command line and the Ray scorer actors call :func:`tune_collector`; a library user may call it, and
``RAYTUNE_PRIMUS_GC=default`` keeps Python's own thresholds (what was measured before, for A/B runs).
"""
from __future__ import annotations

import gc
import os

THRESHOLDS: tuple[int, int, int] = (50_000, 20, 20)
"""(young-generation allocations, young collections per middle one, middle ones per full one): see above."""
ENV = "RAYTUNE_PRIMUS_GC"


def tune_collector() -> tuple[int, int, int]:
    """Set this process's collector thresholds to :data:`THRESHOLDS` (``RAYTUNE_PRIMUS_GC=default``: leave
    Python's); returns the thresholds in force afterwards. Idempotent."""
    choice = os.environ.get(ENV, "").strip().lower()
    if choice not in ("", "bulk", "default"):
        from oracle.errors import InvalidConfigError
        raise InvalidConfigError(f"{ENV}={choice!r} must be 'bulk' (the default: fewer collections) or 'default' "
                                 f"(Python's own thresholds)")
    if choice != "default":
        gc.set_threshold(*THRESHOLDS)
    return gc.get_threshold()

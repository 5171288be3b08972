"""The cyclic garbage collector of a process that runs many projections (issue 27).

A projection allocates tens of thousands of short-lived objects (op graphs, plans, results) while the oracle's
caches hold a few hundred thousand long-lived ones. With CPython's default thresholds (700, 10, 10) the
collector runs a young collection every 700 net allocations and walks the middle generation every tenth:
`validate` of 401 fresh Mixtral rows spent 17 % of its CPU time in 192 collections (measured with
``gc.callbacks``; 0.081 of 0.483 s), a long search ~8 %. Nothing the oracle allocates relies on the collector
to free it promptly (reference counting frees it; cycles are rare and small), so processes that project in
bulk collect less often: (50,000, 20, 20) made the same run 6 collections, 0.017 of 0.402 s (998 rows/s against
831). The command line and the Ray scorer actors call :func:`tune_bulk_process`; a library user may call it, and
``RAYTUNE_PRIMUS_GC=default`` keeps Python's own thresholds (what was measured before, for A/B runs).
Within such a process, ``validate`` reads and projects its rows in a :func:`bulk_pass`: no collection inside, and
the cache entries it leaves go to the oldest generation unwalked (401 fresh rows: x1.07 rows per CPU second).

The same processes set the C allocator (glibc) to keep the memory numpy's temporaries use (:func:`tune_allocator`):
a new pipeline plan makes ~100 arrays of a few hundred kB (one int64 per op: 33k ops for 1F1B at pp 32 x 512
micro-batches). By default glibc serves each from a fresh ``mmap`` above its dynamic threshold or trims the
heap's top back to the system once more than twice that threshold is free, so every array's pages fault in
again: compiling that plan took 8.9-9.8 ms, and 4.6-4.9 ms with the threshold for ``mmap`` at 32 MiB and for
trimming at 128 MiB (either alone: 10-14 ms, since setting one fixes the other at its default). The resident
memory of a long run does not move (``benchmarks/bench_memory.py --n 10000``: 828 MiB both ways). In
``bench_projection.py`` (``--malloc bulk`` against ``default``) the cold Mixtral phase, which compiles 80 plans,
reads 3-5 % faster; phases that compile few plans do not move.
``RAYTUNE_PRIMUS_MALLOC=default`` leaves glibc's behaviour; other C libraries are left alone.
"""
from __future__ import annotations

import ctypes
import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

THRESHOLDS: tuple[int, int, int] = (50_000, 20, 20)
"""(young-generation allocations, young collections per middle one, middle ones per full one): see above."""
ENV = "RAYTUNE_PRIMUS_GC"


def tune_bulk_process() -> None:
    """What a process that projects in bulk sets (the command line, the Ray scorer actors): the collector's and the
    C allocator's thresholds (:func:`tune_collector`, :func:`tune_allocator`)."""
    tune_collector()
    tune_allocator()


def _wants_default(env: str, bulk: str, default: str) -> bool:
    """Whether ``env`` asks for the library's own behaviour ('default') rather than the bulk tuning ('bulk' or
    unset); any other value is an InvalidConfigError naming both choices (``bulk`` / ``default``: what each does)."""
    choice = os.environ.get(env, "").strip().lower()
    if choice not in ("", "bulk", "default"):
        from oracle.errors import InvalidConfigError
        raise InvalidConfigError(f"{env}={choice!r} must be 'bulk' (the default: {bulk}) or 'default' ({default})")
    return choice == "default"


_BULK = {"on": False}
"""Whether this process tuned its collector for bulk work (:func:`tune_collector`): :func:`bulk_pass` acts only then."""


def tune_collector() -> tuple[int, int, int]:
    """Set this process's collector thresholds to :data:`THRESHOLDS` (``RAYTUNE_PRIMUS_GC=default``: leave
    Python's); returns the thresholds in force afterwards. Idempotent."""
    if not _wants_default(ENV, "fewer collections", "Python's own thresholds"):
        gc.set_threshold(*THRESHOLDS)
        _BULK["on"] = True
    else:
        _BULK["on"] = False
    return gc.get_threshold()


@contextmanager
def bulk_pass() -> Iterator[None]:
    """A stretch of bulk projection (``validate``'s rows) in a process tuned for it
    (:func:`tune_collector`; elsewhere this does nothing): no collection runs inside it, and what survives it is moved
    to the oldest generation without being walked (``gc.freeze()`` then ``gc.unfreeze()``: two list splices, and the
    young count starts again from 0). What survives such a stretch is the oracle's cache entries (shapes, op
    graphs, priced layers, plans, memory sums) and the results, which reference counting frees; a young
    collection would walk each cache entry once on its way to the oldest generation, to find nothing: 401 fresh
    Mixtral rows left 0 unreachable objects of ~77k tracked (``gc.collect()`` after the run), and their two young
    collections took 17-22 ms of 0.21-0.24 s. A cycle made inside would wait for the next full collection
    instead of a young one (the oracle makes none there)."""
    if not _BULK["on"] or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        gc.enable()


MALLOC_ENV = "RAYTUNE_PRIMUS_MALLOC"
MMAP_THRESHOLD_BYTES = 32 << 20
"""Allocations at least this large come from ``mmap`` (glibc's own ceiling for its dynamic threshold, 64-bit)."""
TRIM_THRESHOLD_BYTES = 128 << 20
"""Free memory at the heap's top kept before returning it to the system."""
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h> mallopt parameters


def tune_allocator() -> bool:
    """Set glibc's ``mmap`` and trim thresholds to :data:`MMAP_THRESHOLD_BYTES` and :data:`TRIM_THRESHOLD_BYTES`
    (see the module doc); True when set. False, changing nothing, with ``RAYTUNE_PRIMUS_MALLOC=default`` or where
    the C library is not glibc (speed only). Idempotent."""
    if (_wants_default(MALLOC_ENV, "numpy's temporaries reuse the heap", "the C allocator's own thresholds")
            or not sys.platform.startswith("linux")):
        return False
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):  # musl and others: their own allocators
            return False
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    mmap_set = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1  # mallopt returns 1 on success
    trim_set = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    return mmap_set and trim_set

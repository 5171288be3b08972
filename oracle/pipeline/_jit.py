"""The pipeline replay's inner loop compiled to machine code (numba), switched on once it pays for itself.

The replay is a chain of scalar steps (``fin[key] = max(fin[prev] + cost[fold], fin[dep] + lat[b]) +
cost[ci]``, :func:`oracle.pipeline.simulator._replay_chain`): 0.17-0.28 us a step in CPython, 20-50x less
compiled (measured on this 2-core AVX2 machine: 1F1B pp 8 x 64 micro-batches 284 -> 12 us, interleaved
pp 8 vpp 4 x 128 1,361 -> 27 us, ZBV pp 16 x 256 2,517 -> 49 us). Loading the compiled function costs a
process 0.7-1.6 s (importing numba 0.2-0.75 s and reading its on-disk cache 0.5-0.9 s, measured here beside
other sessions' load; ~2 s the first time, compiling),
so a one-off ``project`` never loads it: the replay stays in Python until the process has replayed
:data:`JIT_AFTER_STEPS` steps, about what loading costs, then switches (a long search pays at most twice
the better of the two choices: the ski-rental bound). The compiled loop does the same float additions and
comparisons in the same order (no fast-math), so the two give bit-identical makespans (tested).

``RAYTUNE_PRIMUS_JIT``: ``auto`` (default, as above), ``on`` (from the first replay) or ``off`` (never;
also the behaviour where numba is not installed or cannot load: nothing but speed depends on it). A process that
knows it will replay in bulk loads it at its start with :func:`load_now` (the Ray scorer actors do, unless ``off``).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from oracle.errors import InvalidConfigError

JIT_AFTER_STEPS = 5_000_000
"""Python chain steps (0.17-0.28 us each: ~0.9-1.4 s) a process replays before it loads the compiled loop
(0.7-1.6 s to load)."""
MODES = ("auto", "on", "off")

_state: dict[str, Any] = {"steps": 0, "fn": None, "tried": False}


def mode() -> str:
    """``RAYTUNE_PRIMUS_JIT``, checked."""
    value = os.environ.get("RAYTUNE_PRIMUS_JIT", "auto").strip().lower() or "auto"
    if value not in MODES:
        raise InvalidConfigError(f"RAYTUNE_PRIMUS_JIT={value!r} is not one of {', '.join(MODES)}")
    return value


def _load() -> Callable[..., float] | None:
    """The compiled chain replay, or None where numba is missing or fails (the Python loop then stays)."""
    try:
        import numba
    except Exception:  # noqa: BLE001 - not installed, or a broken install: speed only
        return None

    # cache=True: the machine code is kept beside this module (or in numba's user cache dir when that is
    # read-only) and reloaded by later processes; numba keys it on the CPU, so an AVX2 and an AMX machine
    # each compile their own. A numba that cannot compile or cache here (no writable cache location, an
    # unsupported CPU) leaves the Python loop in place: speed only.
    try:
        @numba.njit("float64(int64[:, ::1], int64[:, ::1], float64[::1], float64[::1], int64)", cache=True,
                    nogil=True)
        def chain_span(chain, tails, cost, lat, n_keys):  # pragma: no cover - runs as machine code
            fin = np.zeros(n_keys + 1)  # key -1: no dependency, finished at 0
            for i in range(chain.shape[0]):
                s = fin[chain[i, 1]] + cost[chain[i, 2]]
                f = fin[chain[i, 3]] + lat[chain[i, 4]]
                fin[chain[i, 0]] = (f if f > s else s) + cost[chain[i, 5]]
            span = fin[tails[0, 0]] + cost[tails[0, 1]]
            for j in range(1, tails.shape[0]):
                v = fin[tails[j, 0]] + cost[tails[j, 1]]
                if v > span:
                    span = v
            return span

        chain_span(np.zeros((1, 6), dtype=np.int64), np.zeros((1, 2), dtype=np.int64), np.zeros(1),
                   np.zeros(1), 0)
    except Exception:  # noqa: BLE001
        return None
    return chain_span


def compiled(steps: int) -> Callable[..., float] | None:
    """The compiled replay if this process uses it for a replay of ``steps`` chain steps; else None, and
    the steps are counted towards the switch."""
    fn = _state["fn"]
    if fn is not None:
        return fn
    if _state["tried"]:
        return None
    m = mode()
    if m == "off":
        return None
    if m == "auto" and _state["steps"] < JIT_AFTER_STEPS:
        _state["steps"] += steps
        return None
    _state["tried"] = True
    _state["fn"] = fn = _load()
    return fn


def load_now() -> bool:
    """Load the compiled replay now, unless ``RAYTUNE_PRIMUS_JIT=off``: a process that will replay in bulk (a
    Ray scorer actor at start-up, ``raytune_primus.actors.Scorer.warm_up``) pays the load where nothing waits on
    it instead of at the switch, in the middle of its work. True when the compiled replay is in use."""
    if mode() == "off":
        return False
    if not _state["tried"]:
        _state["tried"] = True
        _state["fn"] = _load()
    return _state["fn"] is not None


def reset(steps: int = 0) -> None:
    """Forget the switch (tests): back to the Python loop with ``steps`` already counted."""
    _state.update(steps=steps, fn=None, tried=False)

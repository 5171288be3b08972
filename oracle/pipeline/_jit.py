"""The pipeline replay's inner loop compiled to machine code: a C extension built at install, else numba once it pays.

The replay is a chain of scalar steps (``fin[key] = max(fin[prev] + cost[fold], fin[dep] + lat[b]) +
cost[ci]``, :func:`oracle.pipeline.simulator._replay_chain`): 0.17-0.28 us a step in CPython, 20-50x less
compiled (measured on this 2-core AVX2 machine: 1F1B pp 8 x 64 micro-batches 284 -> 12 us, interleaved
pp 8 vpp 4 x 128 1,361 -> 27 us, ZBV pp 16 x 256 2,517 -> 49 us). Two compiled forms of the same loop:

- ``oracle.pipeline._native`` (``_native.c``), an optional C extension ``pip install`` builds where a C compiler
  is found (setup.py). Importing it costs ~0.1 ms, so it replays from the first step: a plan's chain is checked
  and copied once (``chain_prepare``), then each replay (``prepared_span``, ~1 us of call overhead; it reads the
  cost lists as they are) runs without a check per index, 1.4-2x quicker than numba. It is plain C with no
  CPU-specific flags: a build runs on any machine of its architecture (AVX2 or AMX alike). It also runs a new
  plan's compile, its memory samples' frontier and two schedules' orders (:func:`kernels`: what numpy does in
  ``oracle.pipeline.fast_compile``, ``simulator._frontier`` and the ZB-V / ZB-H1 builders).
- numba, where the extension was not built (no compiler at install): loading it costs a process 0.4-1.6 s
  (importing numba 0.2-0.75 s and reading its on-disk cache, measured here beside other sessions' load; ~2 s
  the first time, compiling), so a one-off ``project`` never loads it: the replay stays in Python until the
  process has replayed :data:`JIT_AFTER_STEPS` steps, about what loading costs, then switches (a long search
  pays at most twice the better of the two choices: the ski-rental bound).

Both do the same float additions and comparisons in the same order (no fast-math; no multiplication a compiler
could fuse), so every backend gives bit-identical makespans (tested).

``RAYTUNE_PRIMUS_JIT``: ``auto`` (default: the C extension from the first replay, else numba as above), ``on``
(the C extension, else numba, from the first replay), ``numba`` (numba from the first replay, even where the C
extension is built: to compare the two) or ``off`` (the Python loop; also the behaviour where neither is
available: nothing but speed depends on them). A process that knows it will replay in bulk loads the compiled
replay at its start with :func:`load_now` (the Ray scorer actors do, unless ``off``).
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from oracle.errors import InvalidConfigError

JIT_AFTER_STEPS = 5_000_000
"""Python chain steps (0.17-0.28 us each: ~0.9-1.4 s) a process replays before it loads numba (0.4-1.6 s to
load) where the C extension is not built."""
MODES = ("auto", "on", "numba", "off")


class Replay(NamedTuple):
    """A compiled replay: ``prepare(chain, tails, n_keys)`` once per plan (the chain's ``(steps, 6)`` and the
    tails' ``(n, 2)`` int64 arrays and the number of keys) gives a handle, or None where this replay does not
    take the chain (the Python loop then replays it); ``span(handle, cost, lat)`` is the makespan for the flat
    cost table and the boundary latencies (lists of floats)."""

    prepare: Callable[[np.ndarray, np.ndarray, int], Any]
    span: Callable[[Any, Sequence[float], Sequence[float]], float]


_state: dict[str, Any] = {"steps": 0, "fn": None, "tried": False, "backend": "python"}
_NATIVE: dict[str, ModuleType | None] = {}  # the extension once probed (None: not built here)


def mode() -> str:
    """``RAYTUNE_PRIMUS_JIT``, checked."""
    value = os.environ.get("RAYTUNE_PRIMUS_JIT", "auto").strip().lower() or "auto"
    if value not in MODES:
        raise InvalidConfigError(f"RAYTUNE_PRIMUS_JIT={value!r} is not one of {', '.join(MODES)}")
    return value


def extension() -> ModuleType | None:
    """The C extension ``oracle.pipeline._native``, or None where it was not built, or was built from another
    ``_native.c`` than the one beside this module (its ``SOURCE_SHA256``, recorded by setup.py: reinstall to
    rebuild it). Probed once per process."""
    if "ext" not in _NATIVE:
        try:
            from oracle.pipeline import _native  # type: ignore[attr-defined]
        except ImportError:
            _NATIVE["ext"] = None
        else:
            _NATIVE["ext"] = _native if getattr(_native, "SOURCE_SHA256", None) == source_sha256() else None
    return _NATIVE["ext"]


def source_sha256() -> str | None:
    """SHA-256 of the ``_native.c`` beside this module (None where it is missing)."""
    try:
        return hashlib.sha256(Path(__file__).with_name("_native.c").read_bytes()).hexdigest()
    except OSError:
        return None


def native() -> Replay | None:
    """The C extension's replay (``chain_prepare``, ``prepared_span``), or None where the extension is not
    available (:func:`extension`)."""
    ext = extension()
    if ext is None:
        return None

    def prepare(chain: np.ndarray, tails: np.ndarray, n_keys: int) -> Any:
        # the compiler keeps a chain as a read-only array over an immutable bytes object: read in place
        base = chain.base
        return ext.chain_prepare(base if type(base) is bytes and len(base) == chain.nbytes else chain, tails, n_keys)
    return Replay(prepare, ext.prepared_span)


def kernels() -> ModuleType | None:
    """The C extension for the plan compiler's loops (``compile_core``, ``tick_order``, ``fold_chain``), the
    memory samples' frontier (``frontier``) and two schedules' order builders (``zbv_order``, ``zb_h1_order``),
    where it is built and the mode runs it (``auto``, ``on``); None: numpy (``off``, ``numba``: the code as it ran
    before the extension)."""
    return extension() if mode() in ("auto", "on") else None


def _load_numba() -> Replay | None:
    """The chain replay compiled by numba, or None where numba is missing or fails (the Python loop then stays)."""
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

    def span(handle: tuple[np.ndarray, np.ndarray, int], cost: Sequence[float], lat: Sequence[float]) -> float:
        chain, tails, n_keys = handle
        return chain_span(chain, tails, np.asarray(cost, dtype=np.float64), np.asarray(lat, dtype=np.float64),
                          n_keys)
    def prepare(chain: np.ndarray, tails: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray, int]:
        # the signature takes writable arrays; the C compile keeps a chain read-only (over bytes): a copy, once
        return (chain if chain.flags.writeable else chain.copy(), tails, n_keys)
    return Replay(prepare, span)


def _use(fn: Replay | None, backend: str) -> Replay | None:
    _state.update(tried=True, fn=fn, backend=backend if fn is not None else "python")
    return fn


def _select(m: str, *, now: bool) -> Replay | None:
    """The C extension unless ``numba`` is asked for, else numba if ``now`` (or not ``auto``); None (the Python
    loop, for now) otherwise."""
    replay = native() if m != "numba" else None
    if replay is not None:
        return _use(replay, "native")
    if m == "auto" and not now:
        return None
    return _use(_load_numba(), "numba")


def compiled(steps: int) -> Replay | None:
    """The compiled replay (:class:`Replay`) if this process uses it for a replay of ``steps`` chain steps;
    else None, and the steps are counted towards the switch to numba."""
    fn = _state["fn"]
    if fn is not None:
        return fn
    if _state["tried"]:
        return None
    m = mode()
    if m == "off":
        return None
    fn = _select(m, now=_state["steps"] >= JIT_AFTER_STEPS)
    if fn is None:
        _state["steps"] += steps
    return fn


def load_now() -> bool:
    """Load the compiled replay now, unless ``RAYTUNE_PRIMUS_JIT=off``: a process that will replay in bulk (a
    Ray scorer actor at start-up, ``raytune_primus.actors.Scorer.warm_up``) pays numba's load where nothing waits
    on it instead of at the switch, in the middle of its work (the C extension costs nothing to load). True when
    the compiled replay is in use."""
    m = mode()
    if m == "off":
        return False
    if not _state["tried"]:
        _select(m, now=True)
    return _state["fn"] is not None


def backend() -> str:
    """Which replay this process runs now: ``native`` (the C extension), ``numba`` or ``python``."""
    return _state["backend"]


def reset(steps: int = 0) -> None:
    """Forget the switch (tests): back to the Python loop with ``steps`` already counted."""
    _state.update(steps=steps, fn=None, tried=False, backend="python")

"""Long-lived oracle actors: CPU scorers (simulate mode) and device owners (benchmark mode).

A scorer holds an evaluator (:class:`searchers.evaluator.OracleEvaluator` or any object with
``memory(run)`` / ``score(run)``) and the search baseline, and turns candidate *training dicts*
into result dicts with the very helpers the in-process driver uses
(:func:`searchers.evaluator.memory_result` / :func:`~searchers.evaluator.score_result`), so a
candidate scores the same on an actor as in-process. Only plain dicts cross the actor boundary.

Benchmark mode:

* a :class:`DeviceScorer` actor holds ``num_gpus`` devices for its lifetime and asks a pluggable
  :class:`LayerTimer` which layer shapes a run needs and how long each takes on its device;
* one :class:`TimingCache` actor per experiment keeps every measured shape; a shape is *claimed*
  by the first device that needs it and everyone else waits for that measurement, so no shape is
  measured twice across trials or devices (a claim older than ``stale_s`` is handed over: the
  claimer probably died);
* :class:`OracleService` (one named actor per experiment) leases scorers to trials: exclusively in
  benchmark mode (one trial per device at a time), round-robin in simulate mode. A scorer that died
  with its node is dropped and the request retried on another one.

Actors that live as long as an experiment take ``num_cpus=0`` (``../shared/NOTES-toolchain.md``:
actors holding a CPU on a 2-CPU cluster starve Tune's trials forever).
"""
from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray

from oracle.collector import tune_bulk_process
from oracle.config import RunConfig
from oracle.projector import LayerTimeSource
from raytune_primus.trainable import build_run, pack_result, result_to_dict
from searchers.base import TrialResult
from searchers.evaluator import memory_result, score_result, score_results


def _where() -> dict[str, Any]:
    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}


# ---------------------------------------------------------------------------------- CPU scorer
TIMELINE_CALLS = 4096
"""Batch calls a scorer remembers for :meth:`Scorer.timeline` (two clock reads each)."""


class Scorer:
    """Scores candidates of one search against one evaluator (a Ray actor; also usable in-process)."""

    def __init__(self, evaluator: Any, baseline: RunConfig) -> None:
        tune_bulk_process()  # a scorer's process projects in bulk (oracle/collector.py)
        self.evaluator = evaluator
        self.baseline = baseline
        self.calls = 0
        self._timeline: collections.deque[tuple[float, float, int]] = collections.deque(maxlen=TIMELINE_CALLS)

    def _run(self, values: Mapping[str, Any]) -> tuple[RunConfig | None, str, TrialResult | None]:
        try:
            run = build_run(self.baseline, values)
        except Exception as exc:  # a malformed config is a failed trial, not a dead actor
            return None, "", TrialResult(status="failed", reason=f"cannot build the run: {type(exc).__name__}: {exc}")
        return run, run.key(), None

    def _memory_evaluator(self) -> Any:
        """What the memory pre-filter asks (the evaluator itself here)."""
        return self.evaluator

    def _prepare(self, values: Mapping[str, Any], prefilter: bool
                 ) -> tuple[RunConfig | None, str, dict[str, Any] | None]:
        """(run, key, early result): the early result is set when the candidate cannot be built or,
        with ``prefilter``, is over the memory cap; None means it goes on to scoring."""
        self.calls += 1
        run, key, bad = self._run(values)
        if bad is not None:
            return None, key, result_to_dict(bad)
        assert run is not None
        if prefilter:
            rejected = memory_result(self._memory_evaluator(), run, key)
            if rejected is not None:
                return run, key, result_to_dict(rejected)
        return run, key, None

    def score(self, values: Mapping[str, Any], *, prefilter: bool = False) -> dict[str, Any]:
        """Result dict of one candidate (memory pre-filter first when ``prefilter``)."""
        run, key, done = self._prepare(values, prefilter)
        if done is not None:
            return done
        return result_to_dict(score_result(self.evaluator, run, key))

    def score_batch(self, batch: Sequence[Mapping[str, Any]], prefilter: bool = False) -> list[dict[str, Any]]:
        """Result dicts of a batch, in order (one actor call per batch amortises Ray's overhead); the candidates
        that reach scoring are scored together (``score_results``: the oracle's ``project_many``); a subclass
        with its own :meth:`score` (device scorers) scores one by one."""
        if type(self).score is not Scorer.score:
            return [self.score(v, prefilter=prefilter) for v in batch]
        out: list[dict[str, Any] | None] = []
        todo: list[tuple[int, RunConfig, str]] = []
        for v in batch:
            run, key, done = self._prepare(v, prefilter)
            if done is None:
                assert run is not None
                todo.append((len(out), run, key))
            out.append(done)
        for (i, _, _), res in zip(todo, score_results(self.evaluator, [t[1] for t in todo], [t[2] for t in todo])):
            out[i] = result_to_dict(res)
        return out  # type: ignore[return-value]

    def memory_batch(self, batch: Sequence[Mapping[str, Any]]) -> list[dict[str, Any] | None]:
        """Pre-filter verdicts of a batch: None where the candidate fits, else its result dict."""
        return [self._prepare(v, True)[2] for v in batch]

    @functools.cached_property
    def _base_training(self) -> dict[str, Any]:
        """The baseline's training section (what a packed result's training is built on)."""
        return self.baseline.to_dict()["training"]

    def score_packed(self, batch: Sequence[Mapping[str, Any]], prefilter: bool = False) -> list[tuple | None]:
        """:meth:`score_batch` packed for the wire (:func:`~raytune_primus.trainable.pack_result`): what the
        pool calls."""
        t0 = time.monotonic()
        return self._packed(t0, self.score_batch(batch, prefilter), batch)

    def memory_packed(self, batch: Sequence[Mapping[str, Any]]) -> list[tuple | None]:
        """:meth:`memory_batch` packed for the wire."""
        t0 = time.monotonic()
        return self._packed(t0, self.memory_batch(batch), batch)

    def _packed(self, t0: float, dicts: Sequence[Mapping[str, Any] | None], batch: Sequence[Mapping[str, Any]]
                ) -> list[tuple | None]:
        """A batch's result dicts packed for the wire, the batch's start (``t0``) and end kept for :meth:`timeline`."""
        base = self._base_training
        out = [pack_result(d, v, base) for d, v in zip(dicts, batch)]
        self._timeline.append((t0, time.monotonic(), len(batch)))
        return out

    def timeline(self) -> list[tuple[float, float, int]]:
        """(start s, end s, candidates) of each batch scored (:meth:`score_packed`, :meth:`memory_packed`) since
        the last read, oldest first (at most :data:`TIMELINE_CALLS`), on ``time.monotonic()``: one clock for every
        process of a machine, so ``benchmarks/bench_ray.py`` sets them against the driver's to find where actors
        waited (before their first batch, between batches, after their last)."""
        out = list(self._timeline)
        self._timeline.clear()
        return out

    def bounds_batch(self, batch: Sequence[Mapping[str, Any]]) -> list[float | None]:
        """The first phase of a branch-and-bound sweep over a batch (``searchers.driver.memory_and_bounds``): per
        candidate None where it cannot be built or does not fit, else its throughput bound (``math.inf`` where
        there is none). A float per candidate crosses the wire, not a result."""
        from searchers.driver import memory_and_bounds

        self.calls += len(batch)
        out: list[float | None] = [None] * len(batch)
        runs, where = [], []
        for i, v in enumerate(batch):
            run = self._run(v)[0]
            if run is not None:
                runs.append(run)
                where.append(i)
        for i, b in zip(where, memory_and_bounds(self._memory_evaluator(), self.evaluator.throughput_bound, runs)):
            out[i] = b
        return out

    def serve(self, values: Mapping[str, Any], prefilter: bool = False) -> dict[str, Any]:
        """:meth:`score` plus 'worker': where it ran (node, pid, GPU ids), for the trial's metrics."""
        out = self.score(values, prefilter=prefilter)
        out["worker"] = _where()
        return out

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run any picklable function here (whole searches of a multi-seed comparison)."""
        self.calls += 1
        return fn(*args, **kwargs)

    def where(self) -> dict[str, Any]:
        """Node id, process id and GPU ids of this actor (placement tests)."""
        return {**_where(), "calls": self.calls}

    def warm_up(self) -> float:
        """Score the baseline once, uncounted (the oracle's imports and the baseline's layer shapes), and load the
        compiled pipeline replay (``oracle.pipeline._jit.load_now``), so a fresh actor's first batch does not pay
        them; returns :meth:`cpu_s`."""
        try:
            key = self.baseline.key()
            if memory_result(self._memory_evaluator(), self.baseline, key) is None:
                score_result(self.evaluator, self.baseline, key)
            import scipy.optimize  # noqa: F401  (the ILP schedule's solver: ~1 s of imports without bytecode)
        except Exception:  # a baseline that cannot be scored is scored (and reported) with the candidates
            pass
        try:
            from oracle.pipeline import _jit
            _jit.load_now()  # a scorer replays in bulk: the compiled replay now, not at the switch mid-batch
        except Exception:  # a bad RAYTUNE_PRIMUS_JIT is reported by the first replay, with the candidates
            pass
        return self.cpu_s()

    def cpu_s(self) -> float:
        """CPU seconds this actor's process has used (benchmarks add them up across actors)."""
        return time.process_time()

    def ping(self) -> bool:
        return True


# ---------------------------------------------------------------------------------- benchmark mode
LayerTimer = LayerTimeSource
"""The pluggable part of benchmark mode is the oracle's layer-time source (one abstraction for the
projector and the device actors): ``shapes(run)`` names the layer shapes a run needs (canonical strings;
the cache never looks inside them), ``measure(shape, gpu_ids)`` times one on this actor's devices (a
float or a plain dict; raises BenchmarkError when it cannot), ``memory(run)`` and ``project(run, timings)``
score a run. :class:`oracle.benchmark.source.BenchmarkSource` is the real one; implementations must be
picklable (they travel to device actors)."""


class TimingCache:
    """Every measured layer shape of one experiment (an async Ray actor; see the module doc)."""

    def __init__(self, stale_s: float = 600.0) -> None:
        self.stale_s = float(stale_s)
        self.timings: dict[str, float] = {}
        self.measured_by: dict[str, str] = {}
        self.measurements: Counter[str] = Counter()
        self.hits = 0
        self._claims: dict[str, tuple[str, float]] = {}
        self._events: dict[str, asyncio.Event] = {}

    def _event(self, key: str) -> asyncio.Event:
        ev = self._events.get(key)
        if ev is None:
            ev = self._events[key] = asyncio.Event()
        return ev

    async def claim(self, keys: Sequence[str], owner: str) -> dict[str, Any]:
        """Split ``keys`` into {'have': {key: s}, 'measure': [keys this owner must measure], 'wait': [...]}."""
        have, measure, wait = {}, [], []
        now = time.monotonic()
        for k in dict.fromkeys(keys):
            if k in self.timings:
                have[k] = self.timings[k]
                self.hits += 1
            elif k in self._claims and self._claims[k][0] != owner and now - self._claims[k][1] < self.stale_s:
                wait.append(k)
            else:
                self._claims[k] = (owner, now)
                measure.append(k)
        return {"have": have, "measure": measure, "wait": wait}

    async def put(self, timings: Mapping[str, float], owner: str) -> None:
        """Store measurements (the first one of a shape wins; later ones count as repeats)."""
        for k, v in timings.items():
            self.measurements[k] += 1
            if k not in self.timings:
                self.timings[k] = v  # seconds, or a measurement dict (oracle.benchmark.measurement)
                self.measured_by[k] = owner
            self._claims.pop(k, None)
            self._event(k).set()

    async def release(self, keys: Sequence[str], owner: str) -> None:
        """Give up claims (the measurement failed) so another device may try."""
        for k in keys:
            if self._claims.get(k, ("",))[0] == owner:
                del self._claims[k]
                self._event(k).set()  # wake waiters; they will find it unclaimed and claim it

    async def wait(self, keys: Sequence[str], timeout_s: float) -> dict[str, float]:
        """Timings of ``keys`` once measured elsewhere (those still missing after the timeout are left out)."""
        deadline = time.monotonic() + timeout_s
        for k in keys:
            while k not in self.timings:
                left = deadline - time.monotonic()
                if left <= 0 or (k not in self._claims):
                    break
                ev = self._event(k)
                try:
                    await asyncio.wait_for(ev.wait(), timeout=left)
                except asyncio.TimeoutError:
                    break
                if k not in self.timings:  # released, not measured
                    ev.clear()
                    break
        return {k: self.timings[k] for k in keys if k in self.timings}

    async def stats(self) -> dict[str, Any]:
        return {"shapes": len(self.timings), "measurements": dict(self.measurements), "hits": self.hits,
                "repeats": sum(n - 1 for n in self.measurements.values() if n > 1),
                "measured_by": dict(self.measured_by)}


class _Timed:
    """Evaluator view of a LayerTimer with a fixed set of timings (for score_result/memory_result)."""

    def __init__(self, timer: LayerTimer, timings: Mapping[str, float]) -> None:
        self.timer, self.timings, self.mode = timer, timings, timer.mode

    def memory(self, run: RunConfig) -> Any:
        return self.timer.memory(run)

    def score(self, run: RunConfig) -> Any:
        return self.timer.project(run, self.timings)


class DeviceScorer(Scorer):
    """Benchmark-mode scorer: owns its devices for life and measures through the shared TimingCache."""

    def __init__(self, timer: LayerTimer, baseline: RunConfig, cache: Any, *, wait_s: float = 600.0) -> None:
        super().__init__(None, baseline)
        self.timer, self.cache, self.wait_s = timer, cache, float(wait_s)
        self.local: dict[str, float] = {}
        """Timings this actor already knows (its own and fetched), so repeats skip the cache actor."""
        w = _where()
        self.gpu_ids: list[str] = w["gpu_ids"]
        self.owner = f"{w['node_id'][:8]}:{w['pid']}:{','.join(self.gpu_ids)}"
        self.measured: list[str] = []

    def _timings(self, run: RunConfig) -> dict[str, float]:
        need = [s for s in dict.fromkeys(self.timer.shapes(run)) if s not in self.local]
        while need:
            plan = ray.get(self.cache.claim.remote(need, self.owner))
            self.local.update(plan["have"])
            done: dict[str, float] = {}
            try:
                for s in plan["measure"]:
                    done[s] = self.timer.measure(s, self.gpu_ids)
                    self.measured.append(s)
            except BaseException:
                ray.get(self.cache.release.remote([s for s in plan["measure"] if s not in done], self.owner))
                if done:
                    ray.get(self.cache.put.remote(done, self.owner))
                raise
            if done:
                ray.get(self.cache.put.remote(done, self.owner))
                self.local.update(done)
            if plan["wait"]:
                self.local.update(ray.get(self.cache.wait.remote(plan["wait"], self.wait_s)))
            need = [s for s in need if s not in self.local]
        return self.local

    def _memory_evaluator(self) -> Any:
        return _Timed(self.timer, {})  # memory needs no timings

    def score(self, values: Mapping[str, Any], *, prefilter: bool = False) -> dict[str, Any]:
        run, key, done = self._prepare(values, prefilter)
        if done is not None:
            return done
        try:
            timings = self._timings(run)
        except Exception as exc:  # a device that cannot measure fails the trial, not the search
            return result_to_dict(TrialResult(status="failed", key=key, training=run.to_dict()["training"],
                                              reason=f"benchmark failed: {type(exc).__name__}: {exc}"[:500]))
        return result_to_dict(score_result(_Timed(self.timer, timings), run, key))

    def where(self) -> dict[str, Any]:
        return {**super().where(), "measured": list(self.measured)}


# ---------------------------------------------------------------------------------- the lease desk
class OracleService:
    """Hands scorers to trials (async Ray actor, one named instance per experiment)."""

    def __init__(self, scorers: Sequence[Any], *, exclusive: bool, retries: int = 2) -> None:
        if not scorers:
            raise ValueError("OracleService needs at least one scorer actor")
        self.scorers = list(scorers)
        self.exclusive = exclusive
        self.retries = int(retries)
        self._rr = itertools.count()
        self._free: asyncio.Queue | None = None
        self.served = 0
        self.dropped = 0
        self.busy = 0
        self.max_busy = 0

    def _queue(self) -> asyncio.Queue:
        if self._free is None:  # created inside the actor's event loop
            self._free = asyncio.Queue()
            for i in range(len(self.scorers)):
                self._free.put_nowait(i)
        return self._free

    async def score(self, values: Mapping[str, Any], prefilter: bool = False) -> dict[str, Any]:
        """Score one candidate on a leased scorer; the result dict carries 'worker' (where it ran)."""
        from ray.exceptions import RayActorError

        last: BaseException | None = None
        for _ in range(self.retries + 1):
            if self.exclusive:
                i = await self._queue().get()
            else:
                alive = [j for j, s in enumerate(self.scorers) if s is not None]
                if not alive:
                    break
                i = alive[next(self._rr) % len(alive)]
            actor = self.scorers[i]
            if actor is None:
                continue
            self.busy += 1
            self.max_busy = max(self.max_busy, self.busy)
            start = time.time()
            dead = False
            try:
                out = await actor.serve.remote(values, prefilter=prefilter)
                self.served += 1
                out["worker"].update({"index": i, "leased_at": start, "returned_at": time.time()})
                return out
            except RayActorError as exc:
                dead, last = True, exc
                self.scorers[i] = None
                self.dropped += 1
            finally:
                self.busy -= 1
                if self.exclusive and not dead:
                    self._queue().put_nowait(i)
        raise RuntimeError(f"no live oracle actor could score the candidate "
                           f"({self.dropped} of {len(self.scorers)} dropped): {last}")

    async def stats(self) -> dict[str, Any]:
        return {"scorers": len(self.scorers), "alive": sum(s is not None for s in self.scorers),
                "served": self.served, "dropped": self.dropped, "max_busy": self.max_busy,
                "exclusive": self.exclusive}

    async def ping(self) -> bool:
        return True


# ---------------------------------------------------------------------------------- starting them
def node_slots(count: int) -> list[str]:
    """``count`` node ids of the alive nodes, spread round-robin and weighted by their CPUs (every node
    first once, then the ones with CPUs left), cycling when ``count`` exceeds the cluster's CPUs."""
    nodes = sorted(((n["NodeID"], int(n["Resources"].get("CPU", 0))) for n in ray.nodes() if n.get("Alive")),
                   key=lambda x: (-x[1], x[0]))
    slots: list[str] = []
    left = {nid: max(1, cpus) for nid, cpus in nodes}
    while any(left.values()):
        for nid, _ in nodes:
            if left[nid]:
                slots.append(nid)
                left[nid] -= 1
    return [slots[i % len(slots)] for i in range(count)]


def start_scorers(evaluator: Any, baseline: RunConfig, count: int, *, num_cpus: float = 0,
                  strategy: str = "SPREAD") -> list[Any]:
    """``count`` CPU scorer actors spread over the nodes (``num_cpus=0``: they never block trials).

    Ray's own SPREAD strategy ignores actors that hold no resources (measured: 3 zero-CPU actors on a
    3-node cluster landed on 2 nodes; a *soft* node affinity did the same), so zero-CPU scorers are
    spread by hand: a hard node affinity per actor, round-robin over the alive nodes weighted by their
    CPUs (:func:`node_slots`).
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    count = max(1, int(count))
    cls = ray.remote(Scorer)
    if strategy == "SPREAD" and not num_cpus:
        strategies: list[Any] = [NodeAffinitySchedulingStrategy(node_id=nid, soft=False) for nid in node_slots(count)]
    else:
        strategies = [strategy] * count
    actors = [cls.options(num_cpus=num_cpus, scheduling_strategy=st).remote(evaluator, baseline) for st in strategies]
    from raytune_primus.runtime import wait_for_actors
    wait_for_actors(actors, "oracle scorer actor(s)")
    ray.get([a.warm_up.remote() for a in actors])  # all at once: start-up work off the first batches
    return actors


def start_device_scorers(timer: LayerTimer, baseline: RunConfig, count: int, *, gpus_per_scorer: float = 1,
                         cache: Any = None, wait_s: float = 600.0) -> tuple[list[Any], Any]:
    """``count`` benchmark scorers, each holding ``gpus_per_scorer`` GPUs, sharing one TimingCache.

    Returns (scorers, cache). Creation blocks until every scorer holds its devices, so asking for
    more devices than the cluster has fails here (with the numbers) instead of hanging a trial.
    """
    from raytune_primus.runtime import cluster_gpus

    have = cluster_gpus()
    want = count * gpus_per_scorer
    if want > have:
        from oracle.errors import BenchmarkError
        raise BenchmarkError(f"{count} benchmark scorers x {gpus_per_scorer} GPUs = {want:g} GPUs, but the Ray "
                             f"cluster has {have}")
    if cache is None:
        cache = ray.remote(TimingCache).options(num_cpus=0, scheduling_strategy=_on_this_node()).remote()
    cls = ray.remote(DeviceScorer)
    actors = [cls.options(num_cpus=0, num_gpus=gpus_per_scorer, scheduling_strategy="SPREAD")
              .remote(timer, baseline, cache, wait_s=wait_s) for _ in range(max(1, int(count)))]
    from raytune_primus.runtime import wait_for_actors
    wait_for_actors(actors, f"benchmark scorer actor(s) with {gpus_per_scorer:g} GPU(s) each")
    return actors, cache


def _on_this_node() -> Any:
    """Scheduling strategy: the driver's node (it lives as long as the experiment does)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)


def start_service(name: str, scorers: Sequence[Any], *, exclusive: bool) -> Any:
    """The named :class:`OracleService` trials look up with ``ray.get_actor(name)``.

    It is pinned to the driver's node: left to the scheduler, a zero-CPU actor may land on any node,
    and a lost worker node would then take the whole experiment's lease desk with it (measured).
    """
    from raytune_primus.runtime import NAMESPACE

    svc = ray.remote(OracleService).options(name=name, namespace=NAMESPACE, num_cpus=0,
                                            scheduling_strategy=_on_this_node()).remote(scorers, exclusive=exclusive)
    from raytune_primus.runtime import wait_for_actors
    wait_for_actors([svc], "oracle service actor")
    return svc


def kill_all(*handles: Any) -> None:
    """Kill actors (ignoring ones already dead)."""
    for h in handles:
        if h is None:
            continue
        for a in (h if isinstance(h, (list, tuple)) else [h]):
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass

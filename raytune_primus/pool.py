"""Bulk scoring over every node of a Ray cluster: exhaustive sweeps, pre-filtering, multi-seed runs.

A simulate-mode projection costs 0.1-1 ms; a Tune trial costs tens of milliseconds to seconds
(``docs/ray.md``). Bulk work therefore goes to a :class:`ScoringPool`: ``num_actors``
:class:`~raytune_primus.actors.Scorer` actors placed with the SPREAD strategy (so every node gets
some) and fed *batches* of candidates (at most ``batch_size``, default 500, and at least two batches per
actor and call it holds), one actor call per batch, ``in_flight`` (2) calls queued on each actor at once
so that it never waits for the driver between batches. Each candidate has a preferred actor (:func:`shards`:
deterministic, candidates with the same layer shapes together), so a second pass over the same candidates
finds that actor's caches warm; an actor with nothing queued and none of its own left takes another's last
batch (the last batches of each actor are cut in quarters, :func:`tail_chunks`, and the last items of a call
wait on the driver for the actor that frees first, so the actors end together).
Results cross back packed (:func:`~raytune_primus.trainable.pack_result`: the training a candidate was sent
is not sent back) and are read as they arrive, while the actors score the next batches.

Results are exactly what the in-process path computes (the same ``memory_result`` /
``score_result`` helpers, in input order)::

    with ScoringPool(OracleEvaluator(), space.baseline) as pool:
        results = pool.evaluate(list(space.iter_values()))      # pre-filter, then score
        best = pool.optimum(space)                              # the exhaustive optimum (branch and bound)

Faults (issue 13): an actor that dies in the middle of a batch (its process killed, its node lost)
is dropped and replaced by a fresh one (up to ``max_replacements``), and its batch goes back in the
queue: the first time whole, then cut in halves, so a candidate that kills every actor that scores it
ends up alone and, after ``max_retries`` more deaths, is returned as a ``failed`` result with the
reason; every other candidate is scored normally (an item held against once runs again alone on an idle actor,
so a death is only ever held against the call that ran into it). ``map`` retries a whole call the same way (a
search of a comparison resumes from its own ledger). A call that has not answered after
``call_timeout_s`` counts as a death too (its actor is killed), so no batch can hang the pool.
"""
from __future__ import annotations

import collections
import functools
import math
import operator
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from oracle.config import RunConfig
from oracle.errors import PrimusError
from searchers.base import TrialResult

DEFAULT_BATCH = 500
DEFAULT_IN_FLIGHT = 2
"""Scoring calls queued on each actor at once: the next batch waits on the actor while it scores one, so it
never idles while the driver collects a result and sends more (``benchmarks/bench_ray.py``)."""
ANSWER_WAIT_S = 10.0
"""Longest the pool waits, once an actor is found dead, for the answer of the oldest call it holds (a call that
ended before the death has its answer on the way; one that did not raises at once)."""
DEFAULT_CALL_TIMEOUT_S = 3600.0
"""Longest one actor call may take before its actor is taken for hung (a batch of 500 simulate-mode
projections takes about a second; a whole search of a comparison, minutes)."""


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    """``items`` cut into consecutive pieces of at most ``size``."""
    size = max(1, int(size))
    return [items[i:i + size] for i in range(0, len(items), size)]


def tail_chunks(items: Sequence[Any], size: int, tail_batches: int) -> list[Sequence[Any]]:
    """``items`` cut into consecutive pieces of ``size``, but the last ``tail_batches`` such pieces' worth into
    pieces of a quarter of that (at least 1): the same items, in order."""
    size = max(1, int(size))
    cut = max(0, math.ceil(len(items) / size) - max(0, int(tail_batches))) * size
    return chunks(items[:cut], size) + chunks(items[cut:], max(1, size // 4))


PLAN_AXES = frozenset({"pp", "vpp", "pp_schedule", "use_distributed_optimizer", "fsdp"})
"""Axes that change a candidate's pipeline plan or optimizer, not the layer shapes the oracle prices (and
caches per process): candidates that differ only in these go to the same actor (:func:`shards`)."""


def affinity_key(candidate: Any) -> Any:
    """What decides which actor's caches a candidate can reuse: its values without :data:`PLAN_AXES` (a set of
    items; their reprs where a value cannot be hashed; () for a candidate that is not a mapping: no affinity)."""
    if not isinstance(candidate, Mapping):
        return ()
    rest = dict(candidate)
    for k in PLAN_AXES:
        rest.pop(k, None)
    try:
        return frozenset(rest.items())
    except TypeError:
        return tuple(sorted((k, repr(v)) for k, v in candidate.items() if k not in PLAN_AXES))


def shards(candidates: Sequence[Any], n: int) -> list[list[int]]:
    """Candidate indices per actor (each in input order): all candidates of one :func:`affinity_key` on one
    actor, the largest groups first, each to the least-loaded actor. Deterministic: a second call over the
    same candidates (a memory pass, then scoring) sends each to the actor whose caches already hold it
    (scoring a candidate again in the same process costs about half as much), and shapes stay together."""
    groups = _affinity_groups(candidates)
    load = [0] * max(1, n)
    out: list[list[int]] = [[] for _ in load]
    for idx in sorted(groups.values(), key=lambda g: (-len(g), g[0])):
        a = min(range(len(load)), key=lambda j: (load[j], j))
        out[a].extend(idx)
        load[a] += len(idx)
    return [sorted(x) for x in out]


def _affinity_groups(candidates: Sequence[Any]) -> dict[Any, list[int]]:
    """Candidate indices by :func:`affinity_key`, each list ascending. A space's candidates share the first one's
    keys: those are read by one itemgetter over its other-than-plan keys and grouped on the values, each group's
    affinity key made once (~0.4 us a candidate instead of ~1.3: the driver does this before the actors start)."""
    first = candidates[0] if len(candidates) else None
    if type(first) is not dict:
        out: dict[Any, list[int]] = {}
        for i, c in enumerate(candidates):
            out.setdefault(affinity_key(c), []).append(i)
        return out
    names = tuple(k for k in first if k not in PLAN_AXES)
    keyset = first.keys()
    get = operator.itemgetter(*names) if names else (lambda c: ())
    fast: dict[Any, list[int]] = {}
    rest: list[int] = []
    for i, c in enumerate(candidates):
        if type(c) is dict and c.keys() == keyset:
            try:
                fast.setdefault(get(c), []).append(i)
                continue
            except TypeError:  # a value that cannot be hashed: affinity_key's rule
                pass
        rest.append(i)
    out = {}
    for vals, idx in fast.items():
        key = frozenset(zip(names, vals if len(names) != 1 else (vals,)))
        out.setdefault(key, []).extend(idx)
    for i in rest:
        out.setdefault(affinity_key(candidates[i]), []).append(i)
    if rest:  # a key shared by both kinds of candidate: its indices from both, in order again
        for idx in out.values():
            idx.sort()
    return out


class PoolError(PrimusError, RuntimeError):
    """A pool call could not be completed on any actor (every retry and replacement spent)."""


class ScoringPool:
    """Scorer actors over the cluster, fed in batches (see the module doc). Use as a context manager."""

    def __init__(self, evaluator: Any, baseline: RunConfig, *, num_actors: int | None = None,
                 batch_size: int = DEFAULT_BATCH, num_cpus: float = 0, strategy: str = "SPREAD",
                 max_retries: int = 2, max_replacements: int | None = None,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S, in_flight: int = DEFAULT_IN_FLIGHT) -> None:
        from raytune_primus.actors import start_scorers
        from raytune_primus.runtime import cluster_cpus

        self.evaluator, self.baseline = evaluator, baseline
        self.batch_size = max(1, int(batch_size))
        self.num_actors = int(num_actors) if num_actors else cluster_cpus()
        """Actors in the pool (default: one per logical CPU of the cluster)."""
        self.num_cpus, self.strategy = num_cpus, strategy
        self.max_retries = max(0, int(max_retries))
        """Re-runs of a single candidate (or ``map`` item) after the actor scoring it died."""
        self.max_replacements = (max(8, 2 * self.num_actors) if max_replacements is None
                                 else max(0, int(max_replacements)))
        """Fresh actors started, over the pool's life, in place of dead ones."""
        self.call_timeout_s = float(call_timeout_s)
        self.in_flight = max(1, int(in_flight))
        """Scoring calls queued on one actor at once (:meth:`_dispatch`'s ``depth``; ``map`` sends one)."""
        self.actors = start_scorers(evaluator, baseline, self.num_actors, num_cpus=num_cpus, strategy=strategy)
        self.calls = 0
        self.dropped = 0
        """Actors found dead (or hung) and dropped."""
        self.replaced = 0
        self.retried = 0
        """Work items put back in the queue after their actor died running them (the calls queued behind them
        on it go back too, not counted here)."""
        self.failures: list[str] = []
        """One line per item given up on (its actor died ``max_retries`` + 1 times)."""

    # ------------------------------------------------------------------ generic
    def batch_for(self, n: int) -> int:
        """Candidates per actor call for ``n`` candidates: ``batch_size``, but small enough that every
        actor gets at least two batches per call it holds at once (a single big batch would leave the others
        idle, and an actor whose batches were all sent at the start could not take over another's)."""
        return max(1, min(self.batch_size, math.ceil(n / (2 * self.in_flight * len(self.actors) or 1))))

    def _replace(self, dead: Any) -> Any | None:
        """Drop ``dead``; start a fresh actor in its place while replacements are left (None otherwise)."""
        from raytune_primus.actors import kill_all, start_scorers

        kill_all(dead)
        self.actors = [a for a in self.actors if a is not dead]
        self.dropped += 1
        if self.replaced >= self.max_replacements:
            return None
        try:
            (fresh,) = start_scorers(self.evaluator, self.baseline, 1, num_cpus=self.num_cpus,
                                     strategy=self.strategy)
        except Exception:  # no node can take it: carry on with the survivors
            return None
        self.replaced += 1
        self.actors.append(fresh)
        return fresh

    def _dispatch(self, submit: Callable[[Any, Any], Any], items: list[Any], *, splittable: bool,
                  on_failure: Callable[[Any, str], Any], prefer: Sequence[int] | None = None,
                  depth: int = 1, convert: Callable[[int, Any], Any] | None = None) -> list[Any]:
        """Run ``submit(actor, item)`` for every item on the live actors; results in input order.

        ``prefer[i]``: the actor (index into ``self.actors``) item i should go to (:func:`shards`); an actor
        with nothing in flight and none of its own left takes the last queued item of the actor with the most
        left. Without it, items go first come, first served.
        ``depth``: calls queued on an actor at once (an actor runs them in order): at 2 its next batch is
        already there when one ends, so it never waits for this driver to collect a result and send more. A call
        is queued behind another only while this queue holds at least one item per actor: the last items wait
        here for whichever actor ends its call first (in a 1.4 s 2-worker pass of ``benchmarks/bench_ray.py``, the
        actors' last batches ended 34 ms apart on average, over twelve passes, while two calls could be left on one;
        13 ms with this, read from the actors' timelines).
        An item whose actor dies is queued again (whole once, then - ``splittable`` sequences - cut in
        halves; a replacement actor takes over the dead one's items); one that cannot be cut and has seen
        ``max_retries`` + 1 deaths becomes ``on_failure(item, reason)`` (a list of results for a sequence,
        one result otherwise). Only the call the actor was running when it died is held against its item;
        the calls queued behind it go back as they were. An item held against once runs again alone on an actor
        (nothing in flight before or after it), so a death while it runs is its own, and its answer cannot race
        another call's death: a healthy item blamed in a race is retried, never recorded failed.
        ``convert(offset, answer)``: applied to each answer (or ``on_failure``'s) as it comes in, while the actors
        work on the next ones.
        """
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        # work: (offset into the output, item, deaths seen, preferred actor slot); results keyed by offset
        queue: collections.deque[tuple[int, Any, int, int | None]] = collections.deque()
        offset = 0
        for i, item in enumerate(items):
            queue.append((offset, item, 0, None if prefer is None else prefer[i]))
            offset += len(item) if splittable else 1
        depth = max(1, int(depth))
        out: dict[int, Any] = {}

        def keep(off: int, answer: Any) -> None:
            out[off] = answer if convert is None else convert(off, answer)

        slot = {id(a): i for i, a in enumerate(self.actors)}
        # calls in flight per actor, oldest (the one it runs) first; the clock of a call starts when the
        # call ahead of it on its actor ends
        flight: dict[int, collections.deque[Any]] = {id(a): collections.deque() for a in self.actors}
        running: dict[Any, tuple[int, Any, int, Any, int | None]] = {}
        started: dict[Any, float] = {}

        def fill() -> None:
            for actor in list(self.actors):
                calls = flight.setdefault(id(actor), collections.deque())
                # behind a running call only while the queue holds an item for every actor: the last ones go to
                # the actor that frees first, not behind a call on one whose end nobody knows yet
                while (queue and len(calls) < depth and not (calls and running[calls[-1]][2])  # a suspect: alone
                       and not (calls and len(queue) < len(self.actors))):
                    entry = self._take(queue, slot.get(id(actor)), steal=not calls, suspects=not calls)
                    if entry is None:
                        break
                    off, item, deaths, pref = entry
                    self.calls += 1
                    ref = submit(actor, item)
                    running[ref] = (off, item, deaths, actor, pref)
                    if not calls:
                        started[ref] = time.monotonic()
                    calls.append(ref)

        def finish(ref: Any) -> None:
            actor = running.pop(ref)[3]
            calls = flight[id(actor)]
            calls.remove(ref)
            if calls and calls[0] not in started:
                started[calls[0]] = time.monotonic()
            started.pop(ref, None)

        def died(ref: Any, why: str, hung: bool) -> None:
            """The actor of ``ref`` is dead or hung: collect what it answered, blame the call it was running,
            queue the others again as they were, replace it."""
            actor = running[ref][3]
            blamed, back = None, []
            for r in list(flight.pop(id(actor))):
                off, item, deaths, _, pref = running.pop(r)
                started.pop(r, None)
                if blamed is None:
                    try:
                        # it answered before it died: the answer of a call that ended just before the death may
                        # reach this process after the news of the death, so wait for it (a call the dead actor
                        # never ended raises RayActorError as soon as the death is known; a hung one is still
                        # running: no wait)
                        keep(off, ray.get(r, timeout=0 if hung else ANSWER_WAIT_S))
                        continue
                    except (RayActorError, GetTimeoutError):
                        blamed = (off, item, deaths, pref)
                        continue
                back.append((off, item, deaths, pref))
            queue.extendleft(reversed(back))
            fresh = self._replace(actor)
            if fresh is not None:
                if id(actor) in slot:
                    slot[id(fresh)] = slot[id(actor)]
                flight[id(fresh)] = collections.deque()
            # the other actors handed out before may have died with it (a lost node): they are
            # found out when their own calls fail, and replaced then
            if blamed is None:
                return
            off, item, deaths, pref = blamed
            self.retried += 1
            if splittable and deaths >= 1 and len(item) > 1:
                half = len(item) // 2
                queue.extendleft([(off + half, item[half:], deaths, pref), (off, item[:half], deaths, pref)])
            elif deaths < self.max_retries:
                queue.appendleft((off, item, deaths + 1, pref))
            else:
                reason = (f"the oracle actor scoring it died {deaths + 1} times (last: {why}); "
                          f"given up after {self.max_retries} retries")
                self.failures.append(reason)
                keep(off, on_failure(item, reason))

        while queue or running:
            fill()
            if not running:  # work left, no actor left
                for off, item, *_ in queue:
                    keep(off, on_failure(item, "no live oracle actor is left to score it"))
                queue.clear()
                break
            ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
            now = time.monotonic()
            hung = [r for r, t in started.items() if r not in ready and now - t > self.call_timeout_s]
            for ref in ready + hung:
                if ref not in running:  # went with its dead actor
                    continue
                try:
                    if ref in hung:
                        raise GetTimeoutError(f"no answer in {self.call_timeout_s:g} s")
                    keep(running[ref][0], ray.get(ref))
                    finish(ref)
                    continue
                except (RayActorError, GetTimeoutError) as exc:
                    why = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
                died(ref, why, hung=ref in hung)
        result: list[Any] = []
        for off in sorted(out):
            part = out[off]
            if splittable:
                result.extend(part)
            else:
                result.append(part)
        return result

    @staticmethod
    def _take(queue: collections.deque, slot: int | None, *, steal: bool = True, suspects: bool = True
              ) -> tuple[int, Any, int, int | None] | None:
        """The next work item for the actor in ``slot``: the first one it is preferred for (or that has no
        preference), else (``steal``) the last one of the actor with the most items queued (stealing from the
        end keeps the other actor's next items, and their warm caches, for it), else None. ``suspects=False``
        passes over items that were on an actor when it died (the caller has calls queued on this actor: a suspect
        runs first on an idle one, so a death while it runs is its own)."""
        for i, entry in enumerate(queue):
            if (entry[3] is None or entry[3] == slot) and (suspects or not entry[2]):
                del queue[i]
                return entry
        if not steal:
            return None
        left = collections.Counter(e[3] for e in queue if suspects or not e[2])
        if not left:
            return None
        most = max(left, key=lambda p: (left[p], -p))
        i = max(i for i, e in enumerate(queue) if e[3] == most and (suspects or not e[2]))
        entry = queue[i]
        del queue[i]
        return entry

    def plan(self, candidates: Sequence[Any]) -> tuple[list[int], list[list[Any]], list[int]]:
        """(input index of each candidate in dispatch order, batches in that order, preferred actor per batch):
        each actor's :func:`shards` cut into batches of :meth:`batch_for` the whole call, the last ``in_flight``
        batches' worth of each shard in quarter batches (:func:`tail_chunks`): an actor's queue holds at most that
        many at the end, and the actor that ends first takes over the rest of another's in small pieces (batches
        already on an actor's queue are its own; only those still here can move, and :meth:`_dispatch` keeps the
        last ones here for the actor that frees first)."""
        size = self.batch_for(len(candidates))
        order: list[int] = []
        batches: list[list[Any]] = []
        prefer: list[int] = []
        for a, idx in enumerate(shards(candidates, len(self.actors))):
            order.extend(idx)
            for part in tail_chunks(idx, size, self.in_flight):
                batches.append([candidates[i] for i in part])
                prefer.append(a)
        return order, batches, prefer

    def _failed_dicts(self, candidates: Sequence[Mapping[str, Any]], reason: str) -> list[dict[str, Any]]:
        from raytune_primus.trainable import build_run, result_to_dict

        out = []
        for values in candidates:
            key, training = "", None
            try:
                run = build_run(self.baseline, values)
                key, training = run.key(), run.to_dict()["training"]
            except Exception:
                pass
            out.append(result_to_dict(TrialResult(status="failed", key=key, training=training, reason=reason)))
        return out

    def _planned(self, method: str, candidates: Sequence[Any], *extra: Any,
                 on_failure: Callable[[Any, str], list[Any]],
                 read: Callable[[Sequence[int], Sequence[Any]], list[Any]] | None = None) -> list[Any]:
        """The actors' ``method`` over every candidate, batched and sharded by :meth:`plan`: one answer per candidate,
        in input order. ``read(indices, answers)``: applied to each batch's answers (with the input indices of its
        candidates) as it comes in; ``on_failure(batch, reason)``: the answers of a batch given up on."""
        order, batches, prefer = self.plan(candidates)
        convert = None if read is None else (lambda off, rows: read(order[off:off + len(rows)], rows))
        flat = self._dispatch(lambda a, b: getattr(a, method).remote(list(b), *extra), batches,
                              splittable=True, on_failure=on_failure, prefer=prefer, depth=self.in_flight,
                              convert=convert)
        out: list[Any] = [None] * len(candidates)
        for i, r in zip(order, flat):
            out[i] = r
        return out

    def _scored(self, method: str, candidates: Sequence[Any], *extra: Any) -> list[TrialResult | None]:
        """``method`` (a packed one: :func:`~raytune_primus.trainable.pack_result`) over every candidate
        (:meth:`_planned`): one result (or None) per candidate, in order, each batch read as it comes in."""
        from raytune_primus.trainable import unpack_many

        base = self._base_training
        return self._planned(method, candidates, *extra, on_failure=self._failed_dicts,
                             read=lambda idx, rows: unpack_many(rows, map(candidates.__getitem__, idx), base))

    @functools.cached_property
    def _base_training(self) -> dict[str, Any]:
        return self.baseline.to_dict()["training"]

    def map(self, fn: Callable[..., Any], items: Iterable[Any]) -> list[Any]:
        """``[fn(item) for item in items]`` with every call on some pool actor (in input order);
        ``fn`` must be picklable. Used for whole searches of a multi-seed comparison: a call whose
        actor dies is run again on another (a search resumes from its ledger); PoolError when one
        cannot be completed."""
        def give_up(item: Any, reason: str) -> Any:
            raise PoolError(f"{getattr(fn, '__name__', 'call')}: {reason}")

        return self._dispatch(lambda a, x: a.call.remote(fn, x), list(items), splittable=False,
                              on_failure=give_up)

    # ------------------------------------------------------------------ scoring
    def score(self, candidates: Sequence[Mapping[str, Any]], *, prefilter: bool = False) -> list[TrialResult]:
        """Score every candidate (training dicts or points), in order; no pre-filter unless asked."""
        return self._scored("score_packed", list(candidates), prefilter)  # type: ignore[return-value]

    def evaluate(self, candidates: Sequence[Mapping[str, Any]]) -> list[TrialResult]:
        """Memory pre-filter then score, per candidate (what a driver does with a legal new candidate)."""
        return self.score(candidates, prefilter=True)

    def memory(self, candidates: Sequence[Mapping[str, Any]]) -> list[TrialResult | None]:
        """Pre-filter verdicts: None where a candidate fits under the memory cap, else its result."""
        return self._scored("memory_packed", list(candidates))

    def bounds(self, candidates: Sequence[Mapping[str, Any]]) -> list[float | None]:
        """Per candidate: None where it does not fit (or cannot be built), else the evaluator's throughput bound
        (``math.inf`` where it has none, or where the actors scoring it kept dying: it is then projected, and
        fails there as it would): the first phase of :func:`sweep_optimum`'s branch
        and bound, batched and sharded as :meth:`score` is."""
        return self._planned("bounds_batch", list(candidates),
                             on_failure=lambda batch, reason: [math.inf] * len(batch))

    def optimum(self, space: Any) -> tuple[TrialResult | None, int]:
        """(the best scored result over every legal point of ``space``, the points that fit):
        :func:`sweep_optimum` on this pool (a branch and bound where the evaluator has a
        throughput bound), its best point's result scored again here."""
        out = sweep_optimum(self, space)
        if out["point"] is None:
            return None, out["scored"]
        (best,) = self.score([space.values_of(out["point"])])
        return best, out["scored"]

    # ------------------------------------------------------------------ placement and lifetime
    def placement(self) -> list[dict[str, Any]]:
        """Where each actor runs: node id, pid, calls served."""
        import ray

        return ray.get([a.where.remote() for a in self.actors])

    def close(self) -> None:
        from raytune_primus.actors import kill_all

        kill_all(self.actors)
        self.actors = []

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def score_in_process(evaluator: Any, baseline: RunConfig, candidates: Sequence[Mapping[str, Any]], *,
                     prefilter: bool = False) -> list[TrialResult]:
    """The reference the pool must equal: the same scoring, in this process, one by one."""
    from raytune_primus.actors import Scorer
    from raytune_primus.trainable import result_from_dict

    s = Scorer(evaluator, baseline)
    return [result_from_dict(d) for d in s.score_batch(candidates, prefilter)]


def sweep_optimum(pool: Any, space: Any) -> dict[str, Any]:
    """The exhaustive optimum of ``space`` scored on a ScoringPool, in the shape of
    :func:`searchers.driver.exhaustive_optimum` (first point wins ties, as there). An evaluator with
    ``throughput_bound`` (the real oracle) is swept by the same branch and bound, its memory checks and bounds
    (the bulk of the work) on the pool's actors and its projections, best bound first, too
    (``searchers.driver.best_by_bound``): the same optimum, candidate count and bound as in-process; else
    every point is scored."""
    from searchers.driver import BNB_BATCH, best_by_bound, optimum_record

    t0 = time.perf_counter()
    points = space.points
    values = [space.values_of(p) for p in points]  # with each point's derived layout
    if callable(getattr(pool.evaluator, "throughput_bound", None)):
        bounds = pool.bounds(values)
        t1 = time.perf_counter()

        def project(block: list[int]) -> list[float | None]:
            return [r.value for r in pool.score([values[i] for i in block])]

        # a block per round that keeps every actor busy: the result does not depend on it
        best, best_i, fitting, projected, top = best_by_bound(bounds, project, max(BNB_BATCH, len(pool.actors)))
        extra: dict[str, Any] = {
            "method": "branch-and-bound", "projected": projected, "actors": len(pool.actors),
            "phase_wall_s": {"memory_and_bounds": t1 - t0, "projections": time.perf_counter() - t1},
            "upper_bound_tokens_per_s_per_gpu": top}
    else:
        results = pool.evaluate(values)
        best, best_i, fitting = None, None, 0
        for i, r in enumerate(results):
            v = r.value
            if v is None:
                continue
            fitting += 1
            if best is None or v > best:
                best, best_i = v, i
        extra = {"method": "sweep"}
    return optimum_record(space, best, points[best_i] if best_i is not None else None, fitting,
                          time.perf_counter() - t0, extra)

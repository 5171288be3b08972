"""The oracle as a Ray Tune trainable: one trial scores one candidate on a leased oracle actor.

The trial function is tiny: it looks up the experiment's named
:class:`~raytune_primus.actors.OracleService`, sends it the candidate's training dict, and reports
the result as flat Tune metrics (:func:`tune_metrics`). The projection runs on a long-lived actor
(simulate: CPU scorers with ``num_cpus=0``; benchmark: device scorers holding GPUs), so the trial
process never imports the oracle's heavy parts and every trial reuses the actors' warm caches.

Metrics (every trial reports all of them; :data:`METRIC` is the objective, maximised). The first
block is :func:`searchers.evaluator.trial_metrics`, shared with the searchers' own Tune code:

============================  =======================================================================
``tokens_per_s_per_gpu``      projected throughput; 0.0 unless status is 'ok' (so Tune ranks every trial)
``status`` / ``reason``       'ok' | 'rejected' | 'illegal' | 'failed', and why
``fits``, ``config_key``      peak <= cap (None when unknown); ``RunConfig.key()`` of the candidate
``peak_gib`` / ``cap_gib``    peak memory of the worst stage and the cap (None when not projected)
``iteration_time_s``, ``mfu``
``memory_gib``, ``legal``     = peak_gib; status != 'illegal'
``training_json``             the full training section evaluated, as JSON
``worker_*``, ``leased_at``   node id, pid and GPU ids of the actor that scored it, and when
============================  =======================================================================
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from oracle.config import RunConfig
from oracle.dataclass_copy import slot_setter
from searchers.base import TrialResult

METRIC = "tokens_per_s_per_gpu"
MODE = "max"


def tune_metrics(out: Mapping[str, Any]) -> dict[str, Any]:
    """Flat Tune metrics of a scorer's result dict: :func:`searchers.evaluator.trial_metrics` (the
    vocabulary the searchers' Tune code reads back with ``result_from_metrics``) plus the extras of
    the module doc."""
    from searchers.evaluator import trial_metrics

    r = result_from_dict(out)
    w = out.get("worker") or {}
    m = trial_metrics(r)
    m.update({
        "memory_gib": m["peak_gib"], "legal": r.legal,
        "training_json": json.dumps(r.training, sort_keys=True, default=str),
        "worker_node": str(w.get("node_id", "")), "worker_pid": int(w.get("pid", -1)),
        "worker_gpus": ",".join(w.get("gpu_ids", [])),
        "leased_at": w.get("leased_at"), "returned_at": w.get("returned_at"),
    })
    return m


def result_from_metrics(m: Mapping[str, Any], training: Mapping[str, Any] | None = None) -> TrialResult:
    """The TrialResult behind a (flat) Tune result of :func:`tune_metrics`."""
    from searchers.evaluator import result_from_metrics as from_metrics

    if training is None and m.get("training_json"):
        training = json.loads(m["training_json"])
    return from_metrics(m, key=str(m.get("config_key") or ""), training=training)


# ---------------------------------------------------------------------------------- plain dicts
RESULT_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrialResult))


def result_to_dict(r: TrialResult) -> dict[str, Any]:
    """A TrialResult as a plain dict (what crosses actors and Tune)."""
    d = {f: getattr(r, f) for f in RESULT_FIELDS}
    if d["training"] is not None:
        d["training"] = dict(d["training"])
    return d


def result_from_dict(d: Mapping[str, Any]) -> TrialResult:
    """Inverse of :func:`result_to_dict` (extra keys such as 'worker' are ignored)."""
    return TrialResult(**{f: d[f] for f in RESULT_FIELDS if f in d})


AS_SENT = True
"""The training slot of a packed result (:func:`pack_result`) whose training is the baseline's with the
candidate's values: the receiver, which sent those values, builds it again."""
_TRAINING = RESULT_FIELDS.index("training")


def pack_result(d: Mapping[str, Any] | None, values: Mapping[str, Any], base_training: Mapping[str, Any]
                ) -> tuple[Any, ...] | None:
    """A scorer's result dict (:func:`result_to_dict`; None stays None) as a tuple in :data:`RESULT_FIELDS` order,
    for the wire from a scorer actor to the pool: its training is :data:`AS_SENT` where it is
    ``{**base_training, **training_of(values)}`` key for key, value for value and type for type (so
    :func:`unpack_result` gives back an equal dict in the same order), and is sent whole otherwise. A bulk result
    then pickles in half the bytes and the pool's process, which shares two cores with the scorers, reads it in a
    third of the time (``benchmarks/bench_ray.py``)."""
    if d is None:
        return None
    row = [d[f] for f in RESULT_FIELDS]
    t = row[_TRAINING]
    if t is not None:
        expect = sent_training(base_training, values)
        if (t == expect and list(t) == list(expect)
                and list(map(type, t.values())) == list(map(type, expect.values()))):
            row[_TRAINING] = AS_SENT
    return tuple(row)


def unpack_result(row: tuple[Any, ...] | Mapping[str, Any] | None, values: Mapping[str, Any],
                  base_training: Mapping[str, Any]) -> TrialResult | None:
    """Inverse of :func:`pack_result` for the candidate ``values`` it was packed with (a result dict is read with
    :func:`result_from_dict`; None stays None)."""
    if row is None:
        return None
    if row.__class__ is not tuple:
        if isinstance(row, Mapping):
            return result_from_dict(row)
        row = tuple(row)
    r = _trial_result(row)
    if row[_TRAINING] is AS_SENT:
        _SETTERS[_TRAINING](r, sent_training(base_training, values))  # before anyone has seen r
    return r


def unpack_many(rows: Sequence[Any], values: Iterable[Mapping[str, Any]], base_training: Mapping[str, Any]
                ) -> list[TrialResult | None]:
    """``[unpack_result(r, v, base_training) for r, v in zip(rows, values)]``, quicker for what the pool's driver
    receives (a batch of full rows for candidates that share one set of plain keys): the training of such a
    candidate is ``base_training`` copied and updated with it (:func:`sent_training`'s plain case; the keys
    checked once per key set) and the result is built by straight-line code (:func:`_straight_line_build`);
    every other row goes through :func:`unpack_result`. ~1.6 instead of ~2.2 us a result."""
    out: list[TrialResult | None] = []
    plain_keys: Any = None  # the key set of a candidate found plain: another with the same keys is plain too
    base = base_training if type(base_training) is dict else dict(base_training)
    n = len(RESULT_FIELDS)
    for row, v in zip(rows, values):
        if row.__class__ is tuple and len(row) == n and type(v) is dict:
            t = row[_TRAINING]
            if t is AS_SENT:
                if plain_keys is None or v.keys() != plain_keys:
                    if not _plain(v):
                        out.append(unpack_result(row, v, base_training))
                        continue
                    plain_keys = v.keys()
                t = base.copy()
                t.update(v)
            out.append(_build_row(row, t))
        else:
            out.append(unpack_result(row, v, base_training))
    return out


def _plain(values: Mapping[str, Any]) -> bool:
    """A plain candidate: str keys, none private, no 'training' section (every bulk candidate): its training is the
    base updated with it (:func:`sent_training`)."""
    for k in values:
        if k.__class__ is not str or k[:1] == "_" or k == "training":
            return False
    return True


def sent_training(base_training: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """``{**base_training, **training_of(values)}``: the training a candidate ``values`` is scored with. A plain
    candidate (str keys, none private, no 'training' section: every bulk candidate) in one copy and one update
    (62 keys: 0.3 instead of 1.6 us; the pool builds one per result it receives)."""
    if not _plain(values):
        return {**base_training, **training_of(values)}
    t = dict(base_training)
    t.update(values)
    return t


_NEW = object.__new__
_SETTERS = tuple(slot_setter(TrialResult, f) for f in RESULT_FIELDS)
"""The slot setters of TrialResult's fields, in :data:`RESULT_FIELDS` order (``oracle.dataclass_copy.slot_setter``:
what its frozen ``__init__`` sets, past the frozen guard)."""


def _straight_line_build() -> Callable[[tuple[Any, ...], Any], TrialResult]:
    """``build(row, training)``: the TrialResult of a row of every field with ``training`` in its training slot, as
    straight-line code generated once from the field list (as ``dataclasses`` generates ``__init__``): each slot set
    without a loop (:func:`unpack_many`)."""
    env: dict[str, Any] = {"_new": _NEW, "_cls": TrialResult}
    lines = ["def build(row, training):", "    r = _new(_cls)"]
    for i, setter in enumerate(_SETTERS):
        env[f"_s{i}"] = setter
        lines.append(f"    _s{i}(r, training)" if i == _TRAINING else f"    _s{i}(r, row[{i}])")
    lines.append("    return r")
    exec("\n".join(lines), env)  # noqa: S102 (generated from the class's own field names' positions)
    return env["build"]


def _trial_result(row: tuple[Any, ...]) -> TrialResult:
    """``TrialResult(**dict(zip(RESULT_FIELDS, row)))`` for a row of every field, without building the keywords: its
    slots set as its own ``__init__`` sets them, by :func:`_straight_line_build`'s code (0.4 instead of 1.3 us each)."""
    if len(row) != len(_SETTERS):
        return TrialResult(**dict(zip(RESULT_FIELDS, row)))
    return _build_row(row, row[_TRAINING])


assert not hasattr(TrialResult, "__post_init__") and None not in _SETTERS, "_trial_result skips TrialResult.__init__"
_build_row = _straight_line_build()


def training_of(values: Mapping[str, Any]) -> dict[str, Any]:
    """Training values of a Tune config or a candidate: ``config['training']`` if present, else the
    mapping itself without private keys (those starting with '_')."""
    if "training" in values and isinstance(values["training"], Mapping):
        return dict(values["training"])
    out = dict(values)
    for k in values:
        if k.__class__ is not str or k[:1] == "_":  # rare: filter (a bulk candidate has plain keys)
            return {k: v for k, v in values.items() if not str(k).startswith("_")}
    return out


def build_run(baseline: RunConfig, values: Mapping[str, Any]) -> RunConfig:
    """``baseline`` with the training ``values`` set (the same RunConfig the pre-filter built when
    ``values`` is its full training section, hence the same ``key()``)."""
    return dataclasses.replace(baseline, training=baseline.training.replace(**training_of(values)))


_SERVICES: dict[str, Any] = {}
TRIAL_TIMEOUT_S = 1800.0
"""Longest a trial waits for the oracle's answer (a simulate-mode projection takes milliseconds, a
benchmark-mode one the layer measurements it needs); past it the trial errors and Tune retries it."""


def _service(name: str) -> Any:
    import ray

    from raytune_primus.runtime import NAMESPACE

    svc = _SERVICES.get(name)
    if svc is None:
        svc = _SERVICES[name] = ray.get_actor(name, namespace=NAMESPACE)
    return svc


def make_trainable(service_name: str, *, hook: Callable[[Mapping[str, Any]], None] | None = None
                   ) -> Callable[[dict[str, Any]], None]:
    """The function trainable of an experiment whose OracleService is named ``service_name``.

    ``hook(config)`` runs first in the trial process (fault injection in tests: a hook that kills
    the process exercises Tune's FailureConfig retries).
    """

    def primus_trial(config: dict[str, Any]) -> None:
        import ray
        from ray import tune

        if hook is not None:
            hook(config)
        try:
            out = ray.get(_service(service_name).score.remote(training_of(config)), timeout=TRIAL_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"the oracle did not answer this trial within {TRIAL_TIMEOUT_S:g} s") from None
        except ray.exceptions.RayActorError:
            _SERVICES.pop(service_name, None)  # a restored experiment has a new service of that name
            raise
        tune.report(tune_metrics(out))

    primus_trial.__name__ = "primus_trial"
    primus_trial.__qualname__ = "primus_trial"
    return primus_trial

"""The CPU scorer (raytune_primus.actors.Scorer) run in-process: what its warm-up leaves loaded."""
from __future__ import annotations

import pytest

from oracle.config import RunConfig
from oracle.pipeline import _jit
from tests.oracle.test_pipeline_jit import jit


def test_a_scorer_loads_the_compiled_replay_at_warm_up_unless_off():
    """A scorer replays in bulk, so its warm-up loads the compiled replay (``_jit.load_now``) instead of leaving
    ``auto`` to switch in the middle of a batch; ``RAYTUNE_PRIMUS_JIT=off`` keeps the Python replay."""
    pytest.importorskip("numba")
    from raytune_primus.actors import Scorer
    from searchers.evaluator import OracleEvaluator
    base = RunConfig.from_dict({"model": "llama3.1-8b", "cluster": {"hardware": "h100-sxm", "num_gpus": 8},
                                "training": {"seq_len": 4096, "gbs": 64, "pp": 2}})
    with jit("auto"):
        Scorer(OracleEvaluator(), base).warm_up()  # in-process here; a Ray actor runs the same method
        assert _jit._state["fn"] is not None
    with jit("off"):
        Scorer(OracleEvaluator(), base).warm_up()
        assert _jit._state["fn"] is None


def test_packed_results_come_back_equal_and_in_order(tiny):
    """What a scorer sends the pool (``score_packed`` / ``memory_packed``, :func:`pack_result`) reads back
    (:func:`unpack_result`) as the very results ``score_batch`` / ``memory_batch`` give: every status, the training
    dict equal, in the same key order, value types included; the training travels as AS_SENT only when it is the
    baseline's with the candidate's values, and whole otherwise (a value the run coerced, a key the candidate
    did not set that the run changed)."""
    import pickle

    from raytune_primus.actors import Scorer
    from raytune_primus.trainable import (AS_SENT, RESULT_FIELDS, pack_result, result_from_dict, unpack_many,
                                          unpack_result)
    from searchers.evaluator import OracleEvaluator
    from tests.raytune_primus.conftest import SmallCapEvaluator

    base = tiny.space.baseline
    cands = [tiny.space.values_of(p) for p in tiny.space.points[::7]]
    cands += [{"tp": 3}, {"pp": "two"}, {"_private": 1, "mbs": 2}]  # illegal, unbuildable, a private key
    base_t = base.to_dict()["training"]
    for ev in (OracleEvaluator("simulate"), SmallCapEvaluator()):
        s = Scorer(ev, base)
        for path, plain, packed in (("score", s.score_batch(cands, True), s.score_packed(cands, True)),
                                    ("memory", s.memory_batch(cands), s.memory_packed(cands))):
            packed = pickle.loads(pickle.dumps(packed))  # as it crosses to the pool
            assert len(packed) == len(plain) == len(cands)
            many = unpack_many(packed, cands, base_t)  # the pool's batch reader: the same results, key order, types
            one = [unpack_result(row, v, base_t) for row, v in zip(packed, cands)]
            assert many == one and [r is None or r.training is None or list(r.training) for r in many] == [
                r is None or r.training is None or list(r.training) for r in one]
            assert [r is None or r.training is None or [type(x) for x in r.training.values()] for r in many] == [
                r is None or r.training is None or [type(x) for x in r.training.values()] for r in one]
            for d, row, v in zip(plain, packed, cands):
                got = unpack_result(row, v, base_t)
                if d is None:
                    assert row is None and got is None
                    continue
                want = result_from_dict(d)
                assert got == want
                if want.training is not None:
                    assert list(got.training) == list(want.training)
                    assert [type(x) for x in got.training.values()] == [type(x) for x in want.training.values()]
            statuses = {r[0] for r in packed if r is not None}
            assert statuses & {"illegal", "failed"}
            assert statuses & {"ok", "rejected"} if path == "score" else None in packed  # memory: None fits
            assert sum(r is not None and r[RESULT_FIELDS.index("training")] is AS_SENT for r in packed) >= (
                3 if path == "score" else 1)
    # sent whole where the rebuilt dict would differ: a coerced value (1 for True), or a key the run changed
    d = {f: None for f in RESULT_FIELDS}
    d.update(status="ok", key="k", training={**base_t, "tp": 2, "fsdp": True})
    for values in ({"tp": 2, "fsdp": 1}, {"tp": 2}):
        row = pack_result(d, values, base_t)
        assert row[RESULT_FIELDS.index("training")] == d["training"]
        assert unpack_result(row, values, base_t) == result_from_dict(d)
    assert pack_result(d, {"tp": 2, "fsdp": True}, base_t)[RESULT_FIELDS.index("training")] is AS_SENT


def test_sent_training_and_fast_results_equal_the_plain_constructions():
    """:func:`sent_training` is ``{**base, **training_of(values)}`` (keys, order, values) for plain candidates and for
    those it hands to training_of (private keys, a non-str key, a 'training' section, a 'training' value that is not
    a mapping); ``_trial_result`` equals ``TrialResult(**...)`` field for field, also for a row of
    another length."""
    from raytune_primus.trainable import RESULT_FIELDS, _trial_result, sent_training, training_of
    from searchers.base import TrialResult

    base = {"tp": 1, "pp": 1, "mbs": 1, "recompute": "none", "fsdp": False}
    for values in ({"tp": 2, "extra": 3}, {}, {"_seed": 1, "mbs": 4}, {1: "x", "tp": 8},
                   {"training": {"pp": 2}, "tp": 9}, {"training": 5, "tp": 2}, {"pp": True, "fsdp": 1}):
        want = {**base, **training_of(values)}
        got = sent_training(base, values)
        assert got == want and list(got) == list(want) and [type(v) for v in got.values()] == [
            type(v) for v in want.values()]
        assert got is not base and base == {"tp": 1, "pp": 1, "mbs": 1, "recompute": "none", "fsdp": False}
    row = tuple(range(len(RESULT_FIELDS)))
    fast, slow = _trial_result(row), TrialResult(**dict(zip(RESULT_FIELDS, row)))
    assert fast == slow and all(getattr(fast, f) == getattr(slow, f) for f in RESULT_FIELDS)
    for other in (row[:-1], (*row, 1)):  # the constructor's defaults, the extra value dropped
        assert _trial_result(other) == TrialResult(**dict(zip(RESULT_FIELDS, other)))


def test_unpack_many_equals_unpack_result_row_by_row():
    """The pool's batch reader gives :func:`unpack_result`'s results for every kind of row and candidate a batch can
    mix: full rows sent AS_SENT or whole, None, result dicts, rows of another length, candidates with plain keys
    (one key set, then another), private keys, a 'training' section, and a base that is not a dict."""
    from types import MappingProxyType

    from raytune_primus.trainable import AS_SENT, RESULT_FIELDS, unpack_many, unpack_result

    base = {"tp": 1, "pp": 1, "mbs": 1, "recompute": "none", "fsdp": False}
    n = len(RESULT_FIELDS)
    t = RESULT_FIELDS.index("training")

    def row(training, status="ok"):
        r = [None] * n
        r[0], r[1], r[t] = status, "k", training
        return tuple(r)

    pairs = [(row(AS_SENT), {"tp": 2, "mbs": 4}), (row(AS_SENT), {"tp": 8, "mbs": 1}),
             (row(AS_SENT), {"pp": 2}), (row(AS_SENT), {"tp": 4, "mbs": 2}),
             (row({**base, "tp": 2}), {"tp": 2, "fsdp": 1}), (None, {"tp": 1}),
             (row(AS_SENT), {"_seed": 3, "tp": 2}), (row(AS_SENT), {"training": {"pp": 4}, "tp": 9}),
             ({f: None for f in RESULT_FIELDS} | {"status": "failed", "key": "x"}, {"tp": 3}),
             (row(AS_SENT)[:-1], {"tp": 2}), (row(None, "illegal"), {"tp": 3}), (row(AS_SENT), {"tp": 2, "mbs": 8})]
    for b in (base, MappingProxyType(base)):
        rows, values = zip(*pairs)
        many = unpack_many(list(rows), iter(values), b)
        one = [unpack_result(r, v, b) for r, v in pairs]
        assert many == one
        assert [None if r is None or r.training is None else list(r.training) for r in many] == [
            None if r is None or r.training is None else list(r.training) for r in one]
        assert all(r.training is not b for r in many if r is not None)
    assert base == {"tp": 1, "pp": 1, "mbs": 1, "recompute": "none", "fsdp": False}

"""The parquet ledger: schema, atomic durable rewrite, secrets scrubbed, resume."""
from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest

from searchers.base import Candidate, TrialResult
from searchers.book import TrialBook, result_from_row
from searchers.ledger import COLUMN_NAMES, Ledger, LedgerError, read_rows, register_secret, scrub


def _ok(key="k1", tps=1234.5):
    return TrialResult(status="ok", key=key, training={"tp": 2, "seq_len": 2048}, tokens_per_s_per_gpu=tps,
                       peak_bytes=40 * 2**30, cap_bytes=70 * 2**30)


def test_rows_round_trip_with_every_column(tmp_path):
    path = tmp_path / "sub" / "ledger.parquet"
    book = TrialBook(budget=5, run_id="exp/x/seed0", searcher="x", seed=0, oracle_mode="simulate",
                     experiment="exp", ledger=Ledger(path))
    c = Candidate(values={"tp": 2}, phase="seed", round=0, proposer="seed-planner", note="baseline")
    assert book.record(c, _ok()) == 0
    assert book.record(c, TrialResult(status="illegal", key="k2", training={"tp": 3}, reason="tp=3 bad")) == -1
    book.event(status="llm_timeout", reason="planner: timed out", phase="llm", round=1, proposer="llm:x")
    table = pq.read_table(path)
    assert tuple(table.column_names) == COLUMN_NAMES
    rows = read_rows(path)
    assert [r["status"] for r in rows] == ["ok", "illegal", "llm_timeout"]
    r0 = rows[0]
    assert r0["config_key"] == "k1" and r0["tokens_per_s_per_gpu"] == 1234.5 and r0["memory_gib"] == 40.0
    assert r0["cap_gib"] == 70.0 and r0["fits"] is True and r0["legal"] is True and r0["trial_index"] == 0
    assert r0["phase"] == "seed" and r0["proposer"] == "seed-planner" and r0["oracle_mode"] == "simulate"
    assert r0["started_at"].tzinfo is not None
    back = result_from_row(r0)
    assert back.value == 1234.5 and back.fits and back.key == "k1" and back.training == {"seq_len": 2048, "tp": 2}
    assert rows[1]["legal"] is False and rows[1]["reason"] == "tp=3 bad" and rows[1]["trial_index"] == -1


def test_flush_is_atomic_and_leaves_no_temporary_files(tmp_path):
    path = tmp_path / "ledger.parquet"
    led = Ledger(path)
    for i in range(5):
        led.append({"run_id": "r", "row": i, "trial_index": i, "status": "ok", "config_key": f"k{i}"})
    assert len(read_rows(path)) == 5
    assert sorted(os.listdir(tmp_path)) == ["ledger.parquet", "ledger.parquet.lock"]
    led.close()
    # a second writer opening the same file continues it
    led2 = Ledger(path)
    assert led2.next_row("r") == 5
    led2.close()


def test_buffered_flush(tmp_path):
    path = tmp_path / "ledger.parquet"
    led = Ledger(path, flush_every=10)
    led.append({"run_id": "r", "row": 0, "status": "ok"})
    assert not path.exists()
    led.close()
    assert len(read_rows(path)) == 1


def test_unknown_columns_and_bad_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown ledger columns: bogus"):
        Ledger(tmp_path / "l.parquet").append({"bogus": 1})
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(LedgerError, match="is not a parquet file"):
        read_rows(bad)


def test_secrets_never_reach_the_ledger(tmp_path):
    register_secret("sk-test-SECRET-123456")
    assert scrub("error with key sk-test-SECRET-123456 in it") == "error with key *** in it"
    led = Ledger(tmp_path / "l.parquet")
    led.append({"run_id": "r", "row": 0, "status": "llm_endpoint_error",
                "reason": "401: bad key sk-test-SECRET-123456"})
    assert b"sk-test-SECRET" not in (tmp_path / "l.parquet").read_bytes()
    assert read_rows(tmp_path / "l.parquet")[0]["reason"] == "401: bad key ***"


def test_book_resumes_counts_and_known_results(tmp_path):
    path = tmp_path / "l.parquet"
    b1 = TrialBook(budget=5, run_id="r", searcher="x", seed=0, oracle_mode="m", ledger=Ledger(path))
    c = Candidate(values={})
    b1.record(c, _ok("a", 10.0))
    b1.record(c, TrialResult(status="rejected", key="b", training={"tp": 1}, peak_bytes=90 * 2**30,
                             cap_bytes=70 * 2**30, reason="over"))
    b2 = TrialBook(budget=5, run_id="r", searcher="x", seed=0, oracle_mode="m", ledger=Ledger(path))
    assert b2.used == 2 and b2.resumed == 2 and set(b2.known) == {"a", "b"}
    assert b2.known["b"].status == "rejected" and b2.known["b"].fits is False
    assert b2.best.value == 10.0 and b2.best_so_far() == [10.0, 10.0]
    other = TrialBook(budget=5, run_id="other", searcher="x", seed=0, oracle_mode="m", ledger=Ledger(path))
    assert other.used == 0


def test_resume_refuses_rows_scored_by_another_oracle(tmp_path):
    path = tmp_path / "l.parquet"
    b1 = TrialBook(budget=5, run_id="r", searcher="x", seed=0, oracle_mode="m", ledger=Ledger(path),
                   oracle_version="aaaa")
    b1.record(Candidate(values={}), _ok("a", 10.0))
    assert read_rows(path)[0]["oracle_version"] == "aaaa"
    same = TrialBook(budget=5, run_id="r", searcher="x", seed=0, oracle_mode="m", ledger=Ledger(path),
                     oracle_version="aaaa")
    assert same.used == 1
    with pytest.raises(LedgerError, match=r"scored by oracle aaaa, and this oracle is bbbb.*--fresh"):
        TrialBook(budget=5, run_id="r", searcher="x", seed=0, oracle_mode="m", ledger=Ledger(path),
                  oracle_version="bbbb")
    # an unversioned evaluator (a synthetic test oracle) does not check
    assert TrialBook(budget=5, run_id="r", searcher="x", seed=0, oracle_mode="m", ledger=Ledger(path)).used == 1


def test_ledgers_written_before_the_oracle_version_column_still_read(tmp_path):
    path = tmp_path / "old.parquet"
    Ledger(path).extend([{"run_id": "r", "row": 0, "trial_index": 0, "status": "ok", "config_key": "a",
                          "tokens_per_s_per_gpu": 5.0}])
    table = pq.read_table(path).drop(["oracle_version"])
    pq.write_table(table, path)
    assert "oracle_version" not in pq.read_table(path).column_names
    rows = read_rows(path)
    assert rows[0]["oracle_version"] is None and rows[0]["tokens_per_s_per_gpu"] == 5.0
    book = TrialBook(budget=5, run_id="r", searcher="x", seed=0, oracle_mode="m", ledger=Ledger(path),
                     oracle_version="cccc")
    assert book.used == 1   # rows of unknown version are kept (nothing to compare them with)


def test_the_log_scrubber_is_installed_only_while_a_secret_is_registered(caplog, monkeypatch):
    import logging
    from collections import Counter

    from searchers import ledger
    monkeypatch.setattr(ledger, "_SECRETS", Counter())  # no secret left over from other tests
    monkeypatch.setattr(ledger, "_SCRUBBER", None)
    original = logging.getLogRecordFactory()
    fresh = logging.LogRecord  # what the process had before anyone wrapped it
    logging.setLogRecordFactory(fresh)
    try:
        register_secret("sk-scoped-secret")
        register_secret("sk-scoped-secret")  # a second holder of the same key
        assert logging.getLogRecordFactory() is not fresh
        with caplog.at_level(logging.INFO):
            logging.getLogger("x").info("key sk-scoped-secret")
        assert "sk-scoped-secret" not in caplog.text and "***" in caplog.text
        ledger.forget_secret("sk-scoped-secret")
        assert logging.getLogRecordFactory() is not fresh and scrub("sk-scoped-secret") == "***"  # still held
        ledger.forget_secret("sk-scoped-secret")
        assert logging.getLogRecordFactory() is fresh and scrub("sk-scoped-secret") == "sk-scoped-secret"
    finally:
        logging.setLogRecordFactory(original)


def test_the_time_breakdown_survives_the_ledger_and_the_trial_metrics(tmp_path):
    from searchers.evaluator import read_breakdown, result_from_metrics, trial_metrics
    bd = {"compute_s": 0.25, "bubble_s": 0.03, "ep_a2a_total_s": 0.04, "ep_a2a_exposed_s": 0.01}
    res = TrialResult(status="ok", key="k1", training={"tp": 2}, tokens_per_s_per_gpu=10.0, peak_bytes=1.0,
                      cap_bytes=2.0, breakdown=bd)
    path = tmp_path / "l.parquet"
    book = TrialBook(budget=3, run_id="r", searcher="x", seed=0, oracle_mode="m", ledger=Ledger(path))
    book.record(Candidate(values={"tp": 2}), res)
    book.record(Candidate(values={"tp": 1}), _ok("k2"))  # scored without a breakdown: the column stays empty
    rows = read_rows(path)
    assert result_from_row(rows[0]).breakdown == bd and result_from_row(rows[1]).breakdown is None
    assert result_from_metrics(trial_metrics(res)).breakdown == bd  # what a Ray Tune trial reports and is read back
    # Ray Tune hands its searchers the result flattened (``breakdown/compute_s``, ...): read the same
    from ray.tune.utils import flatten_dict
    assert result_from_metrics(flatten_dict(trial_metrics(res))).breakdown == bd
    assert read_breakdown("not json") is None and read_breakdown({"compute_s": "x"}) is None

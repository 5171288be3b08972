"""The trial ledger: every candidate a search touched, appended durably to one parquet file.

One row per candidate (scored, rejected by the pre-filter, illegal, failed) and per proposer event
(an LLM timeout, a malformed answer). Several runs may share a file; ``run_id`` tells them apart
(``EXPERIMENT/SEARCHER/seedN``) and is what a resumed search reads back.

Durability: :meth:`Ledger.flush` rewrites the whole file atomically (temporary file in the same
directory, fsync, ``os.replace``, fsync of the directory), so a reader or a crash sees either the
previous or the new ledger, never half of one. Ledgers are small (one row per trial); a driver
flushes after every trial by default.

Secrets never reach the ledger or the logs: once registered (:func:`register_secret`), a secret is
scrubbed out of every string column a row has, and out of every log record.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from oracle.errors import PrimusError

COLUMNS: tuple[tuple[str, str], ...] = (
    ("run_id", "string"), ("experiment", "string"), ("searcher", "string"), ("seed", "int64"),
    ("row", "int64"), ("trial_index", "int64"), ("status", "string"), ("legal", "bool"),
    ("fits", "bool"), ("reason", "string"), ("config", "string"), ("config_key", "string"),
    ("tokens_per_s_per_gpu", "float64"), ("memory_gib", "float64"), ("cap_gib", "float64"),
    ("iteration_time_s", "float64"), ("mfu", "float64"), ("phase", "string"), ("round", "int64"),
    ("proposer", "string"), ("note", "string"), ("oracle_mode", "string"),
    ("started_at", "timestamp"), ("finished_at", "timestamp"), ("wall_s", "float64"),
    ("oracle_version", "string"),
)
"""Ledger columns and their types (``config`` is the training section as JSON; GiB = 2^30 bytes)."""
COLUMN_NAMES: tuple[str, ...] = tuple(c for c, _ in COLUMNS)
OPTIONAL_COLUMNS = frozenset({"oracle_version"})
"""Columns added after the first ledgers were written: read back as None when a file lacks them."""

_SECRETS: set[str] = set()
_SECRETS_LOCK = threading.Lock()


def register_secret(value: str | None) -> None:
    """Remember a secret (an API key): ledger rows and every log record are scrubbed of it."""
    if value and len(value) >= 4:
        with _SECRETS_LOCK:
            _SECRETS.add(value)
        _install_log_scrubber()


_SCRUBBER_INSTALLED = False


def _install_log_scrubber() -> None:
    """Wrap the log-record factory once so no logger (ours, DSPy's, LiteLLM's) can emit a secret."""
    global _SCRUBBER_INSTALLED
    if _SCRUBBER_INSTALLED:
        return
    import logging
    import traceback
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            msg = record.getMessage()
        except Exception:  # a bad format string is the caller's problem; leave it to the handler
            return record
        clean = scrub(msg)
        if clean != msg:
            record.msg, record.args = clean, ()
        if record.exc_info and record.exc_info[1] is not None:
            text = "".join(traceback.format_exception(*record.exc_info))
            if scrub(text) != text:
                record.exc_text, record.exc_info = scrub(text), None
        return record

    logging.setLogRecordFactory(factory)
    _SCRUBBER_INSTALLED = True


def scrub(text: str) -> str:
    """``text`` with every registered secret replaced by '***'."""
    with _SECRETS_LOCK:
        secrets = sorted(_SECRETS, key=len, reverse=True)
    for s in secrets:
        if s in text:
            text = text.replace(s, "***")
    return text


class LedgerError(PrimusError):
    """A ledger file exists but cannot be read as a ledger, or its run cannot be resumed."""


def _schema():
    import pyarrow as pa
    types = {"string": pa.string(), "int64": pa.int64(), "bool": pa.bool_(), "float64": pa.float64(),
             "timestamp": pa.timestamp("us", tz="UTC")}
    return pa.schema([(name, types[t]) for name, t in COLUMNS])


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def normalise_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """Fill missing columns with None, reject unknown ones, scrub secrets from strings."""
    unknown = sorted(set(row) - set(COLUMN_NAMES))
    if unknown:
        raise ValueError(f"unknown ledger columns: {', '.join(unknown)}")
    out: dict[str, Any] = {}
    for name, typ in COLUMNS:
        v = row.get(name)
        if typ == "string" and v is not None:
            v = scrub(v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str))
        out[name] = v
    return out


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All rows of a ledger file as dicts (empty list if the file does not exist)."""
    p = Path(path)
    if not p.exists():
        return []
    import pyarrow.parquet as pq
    try:
        table = pq.read_table(p)
    except Exception as exc:
        raise LedgerError(f"ledger {p} is not a readable parquet file: {exc}") from exc
    missing = [c for c in COLUMN_NAMES if c not in table.column_names and c not in OPTIONAL_COLUMNS]
    if missing:
        raise LedgerError(f"ledger {p} lacks columns {', '.join(missing)}; is it a search ledger?")
    present = [c for c in COLUMN_NAMES if c in table.column_names]
    return [{c: r.get(c) for c in COLUMN_NAMES} for r in table.select(present).to_pylist()]


class Ledger:
    """Append-only view of one parquet ledger file (rows kept in memory, flushed atomically)."""

    def __init__(self, path: str | os.PathLike, *, flush_every: int = 1) -> None:
        self.path = Path(path)
        self.flush_every = max(1, int(flush_every))
        self._rows: list[dict[str, Any]] = read_rows(self.path)
        self._dirty = 0
        self._lock = threading.Lock()

    @property
    def rows(self) -> list[dict[str, Any]]:
        return list(self._rows)

    def rows_of(self, run_id: str) -> list[dict[str, Any]]:
        """The rows of one run, in the order they were written."""
        return sorted((r for r in self._rows if r["run_id"] == run_id), key=lambda r: r["row"])

    def next_row(self, run_id: str) -> int:
        return 1 + max((r["row"] for r in self._rows if r["run_id"] == run_id), default=-1)

    def append(self, row: Mapping[str, Any]) -> None:
        with self._lock:
            self._rows.append(normalise_row(row))
            self._dirty += 1
            if self._dirty >= self.flush_every:
                self._flush_locked()

    def extend(self, rows: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            for r in rows:
                self._rows.append(normalise_row(r))
                self._dirty += 1
            self._flush_locked()

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq
        self.path.parent.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist(self._rows, schema=_schema())
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                pq.write_table(table, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        try:
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:  # some filesystems refuse fsync on directories
            pass
        self._dirty = 0

    def close(self) -> None:
        if self._dirty:
            self.flush()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

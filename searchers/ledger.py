"""The trial ledger: every candidate a search touched, appended durably to one parquet file.

One row per candidate (scored, rejected by the pre-filter, illegal, failed) and per proposer event
(an LLM timeout, a malformed answer). Several runs may share a file; ``run_id`` tells them apart
(``EXPERIMENT/SEARCHER/seedN``) and is what a resumed search reads back.

Durability: :meth:`Ledger.flush` rewrites the whole file atomically (temporary file in the same
directory, fsync, ``os.replace``, fsync of the directory), so a reader or a crash sees either the
previous or the new ledger, never half of one. Ledgers are small (one row per trial); a driver
flushes after every trial by default.

Never lost (issue 13): a file that is empty, truncated, not parquet, of another schema or of another
experiment is refused with a :class:`LedgerError` naming it and is never written over; a flush that
cannot be written (read-only folder, full disk) raises a LedgerError and leaves the last good
ledger in place (a resumed run re-scores only the trials after it). One writer per ledger: a
:class:`Ledger` holds an exclusive ``fcntl`` lock on ``ledger.parquet.lock`` (which records the
holder's pid, host and command) from opening to :meth:`Ledger.close`; a second process is refused
with a message naming the first. The kernel drops the lock when its holder dies, so a killed run
never blocks its own resume.

Secrets never reach the ledger or the logs: once registered (:func:`register_secret`), a secret is
scrubbed out of every string column a row has, and out of every log record.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import sys
import tempfile
import threading
from collections import Counter
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
    ("oracle_version", "string"), ("breakdown", "string"),
)
"""Ledger columns and their types (``config`` is the training section as JSON; GiB = 2^30 bytes)."""
COLUMN_NAMES: tuple[str, ...] = tuple(c for c, _ in COLUMNS)
OPTIONAL_COLUMNS = frozenset({"oracle_version", "breakdown"})
"""Columns added after the first ledgers were written: read back as None when a file lacks them."""

_SECRETS: Counter[str] = Counter()
"""Registered secrets and how many holders still use each."""
_SECRETS_LOCK = threading.Lock()


def register_secret(value: str | None) -> None:
    """Remember a secret (an API key) until :func:`forget_secret`: ledger rows and every log record are
    scrubbed of it meanwhile."""
    if value and len(value) >= 4:
        with _SECRETS_LOCK:
            _SECRETS[value] += 1
        _install_log_scrubber()


def forget_secret(value: str | None) -> None:
    """One holder of ``value`` is done with it; when no secret is left, the log-record factory the
    scrubber wrapped is put back (the scrubber changes process-wide state only while it is needed)."""
    if not value or len(value) < 4:
        return
    with _SECRETS_LOCK:
        if _SECRETS[value] > 1:
            _SECRETS[value] -= 1
        else:
            _SECRETS.pop(value, None)
        empty = not _SECRETS
    if empty:
        _uninstall_log_scrubber()


_SCRUBBER: tuple[Any, Any] | None = None
"""(our factory, the one it wraps) while installed."""


def _install_log_scrubber() -> None:
    """Wrap the log-record factory once so no logger (ours, DSPy's, LiteLLM's) can emit a secret."""
    global _SCRUBBER
    if _SCRUBBER is not None:
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
    _SCRUBBER = (factory, previous)


def _uninstall_log_scrubber() -> None:
    """Put back the factory the scrubber wrapped, unless someone wrapped ours since (then ours stays,
    scrubbing nothing once no secret is registered)."""
    global _SCRUBBER
    import logging
    if _SCRUBBER is not None and logging.getLogRecordFactory() is _SCRUBBER[0]:
        logging.setLogRecordFactory(_SCRUBBER[1])
        _SCRUBBER = None


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


PARQUET_MAGIC = b"PAR1"
"""First and last four bytes of every parquet file (a file cut short lacks the trailing one)."""


_WHAT_TO_DO = "it is left as it is: move it aside to start a new ledger there, or use another --results folder"
"""What a user does about a ledger that cannot be used (the same advice everywhere)."""


def read_rows(path: str | os.PathLike, *, experiment: str | None = None) -> list[dict[str, Any]]:
    """All rows of a ledger file as dicts (empty list if the file does not exist).

    LedgerError (one line naming the file and what to do) when it exists but is empty, truncated,
    not parquet, of another schema, or (``experiment`` given) holds rows of another experiment.
    """
    p = Path(path)
    try:
        if not p.exists():
            return []
        size_bytes = p.stat().st_size
        with open(p, "rb") as fh:
            head = fh.read(4)
            fh.seek(max(0, size_bytes - 4))
            tail = fh.read(4)
    except OSError as exc:
        raise LedgerError(f"ledger {p} cannot be read: {exc.strerror or exc}") from None
    if size_bytes == 0:
        raise LedgerError(f"ledger {p} is empty (0 bytes), not a ledger a completed write leaves; {_WHAT_TO_DO}")
    if head != PARQUET_MAGIC:
        raise LedgerError(f"ledger {p} is not a parquet file ({size_bytes:,} bytes starting {head!r}); "
                          f"{_WHAT_TO_DO}")
    if tail != PARQUET_MAGIC:
        raise LedgerError(f"ledger {p} is truncated ({size_bytes:,} bytes, no parquet footer); {_WHAT_TO_DO}")
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        table = pq.read_table(p)
    except Exception as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise LedgerError(f"ledger {p} is not a readable parquet file ({first}); {_WHAT_TO_DO}") from None
    missing = [c for c in COLUMN_NAMES if c not in table.column_names and c not in OPTIONAL_COLUMNS]
    if missing:
        raise LedgerError(f"ledger {p} lacks columns {', '.join(missing)}: it is not a search ledger; "
                          f"{_WHAT_TO_DO}")
    present = [c for c in COLUMN_NAMES if c in table.column_names]
    schema = _schema()
    table = table.select(present)
    for name in present:
        want = schema.field(name).type
        if table.schema.field(name).type != want:
            try:
                table = table.set_column(present.index(name), name, table.column(name).cast(want))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise LedgerError(f"ledger {p}: column {name} holds {table.schema.field(name).type}, a search "
                                  f"ledger's holds {want}; {_WHAT_TO_DO}") from None
    rows = [{c: r.get(c) for c in COLUMN_NAMES} for r in table.to_pylist()]
    if experiment is not None:
        others = sorted({r["experiment"] for r in rows if r["experiment"] not in (None, experiment)})
        if others:
            n = sum(r["experiment"] in others for r in rows)
            raise LedgerError(f"ledger {p} holds {n} rows of experiment {others[0]!r}"
                              + (f" (and {len(others) - 1} more)" if len(others) > 1 else "")
                              + f", not {experiment!r}: use another --results folder for {experiment!r} "
                              f"(the ledger is left as it is)")
    return rows


# ---------------------------------------------------------------------------------- one writer per ledger
class LedgerBusyError(LedgerError):
    """Another process holds the ledger's lock."""


_HELD: dict[str, tuple[Any, int]] = {}
"""Locks this process holds: lock path -> (open file, number of Ledger objects sharing it)."""
_HELD_LOCK = threading.Lock()


def lock_path(path: str | os.PathLike) -> Path:
    """The lock file of a ledger (next to it)."""
    p = Path(path)
    return p.with_name(p.name + ".lock")


def _holder_text() -> str:
    cmd = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:300]
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": cmd,
                       "since": now_utc().isoformat(timespec="seconds")})


def _holder_of(lp: Path) -> str:
    try:
        info = json.loads(lp.read_text() or "{}")
        return (f"process {info['pid']} on {info.get('host', '?')} ({info.get('command', '?')}, "
                f"since {info.get('since', '?')})")
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def acquire_lock(path: str | os.PathLike) -> str | None:
    """Take (or share, within this process) the exclusive lock of the ledger at ``path``.

    Returns the key to :func:`release_lock`, or None where no lock file can be created (a read-only
    folder: nothing can be written there either, which the first flush reports). LedgerBusyError
    names the holder when another process has it.
    """
    import fcntl

    lp = lock_path(path)
    key = str(lp.resolve())
    with _HELD_LOCK:
        if key in _HELD:
            fh, n = _HELD[key]
            _HELD[key] = (fh, n + 1)
            return key
        try:
            lp.parent.mkdir(parents=True, exist_ok=True)
            fh = open(lp, "a+")
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT):
                return None
            raise LedgerError(f"cannot create the ledger lock {lp}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            fh.close()
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise LedgerBusyError(
                    f"ledger {Path(path)} is in use by {_holder_of(lp)}: one run per results folder; wait for "
                    f"it to finish (or stop it), or use another --results folder") from None
            raise LedgerError(f"cannot lock the ledger {Path(path)}: {exc.strerror or exc}") from None
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(_holder_text())
            fh.flush()
        except OSError:  # the lock holds; only the holder's description is missing
            pass
        _HELD[key] = (fh, 1)
        return key


def release_lock(key: str | None) -> None:
    """Give back one share of a lock taken with :func:`acquire_lock` (closed with the last one)."""
    if key is None:
        return
    with _HELD_LOCK:
        if key not in _HELD:
            return
        fh, n = _HELD[key]
        if n > 1:
            _HELD[key] = (fh, n - 1)
            return
        del _HELD[key]
        try:
            fh.seek(0)
            fh.truncate()
        except OSError:
            pass
        fh.close()  # drops the flock; the file stays (unlinking a lock file races with the next opener)


class Ledger:
    """Append-only view of one parquet ledger file (rows kept in memory, flushed atomically)."""

    def __init__(self, path: str | os.PathLike, *, flush_every: int = 1, experiment: str | None = None,
                 lock: bool = True) -> None:
        """Open (and lock, unless ``lock=False``) the ledger at ``path``; ``experiment`` refuses a file
        holding rows of another experiment. Nothing is written until a row is added."""
        self.path = Path(path)
        self.flush_every = max(1, int(flush_every))
        self._lock_key = acquire_lock(self.path) if lock else None
        try:
            self._rows: list[dict[str, Any]] = read_rows(self.path, experiment=experiment)
            if lock:
                self._remove_stale_temporaries()
        except BaseException:
            release_lock(self._lock_key)
            self._lock_key = None
            raise
        self._dirty = 0
        self._lock = threading.Lock()

    def _remove_stale_temporaries(self) -> None:
        """Temporary files of writers that died between write and rename (we hold the lock: none is live)."""
        for tmp in self.path.parent.glob(f".{self.path.name}.*.tmp"):
            try:
                tmp.unlink()
            except OSError:
                pass

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
        table = pa.Table.from_pylist(self._rows, schema=_schema())
        tmp: str | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
            with os.fdopen(fd, "wb") as fh:
                pq.write_table(table, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException as exc:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            if isinstance(exc, OSError):
                kept = "the last good ledger is kept" if self.path.exists() else "nothing was written"
                raise LedgerError(f"cannot write ledger {self.path}: {exc.strerror or exc} ({kept}; the "
                                  f"{self._dirty} newest row(s) are not saved and a resume scores them again)"
                                  ) from None
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
        """Flush what is left and give back the lock (the ledger may be opened again)."""
        try:
            if self._dirty:
                self.flush()
        finally:
            release_lock(self._lock_key)
            self._lock_key = None

    def __del__(self) -> None:  # a Ledger dropped without close() must not keep its folder locked
        try:
            release_lock(self._lock_key)
        except Exception:
            pass

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

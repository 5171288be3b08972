"""A ledger is never lost (issue 13, item 3): bad files refused and left alone, a crash between write and
rename, a read-only folder, a full disk, two processes on one folder. After each, a resume ends with the
same trials as an uninterrupted run (compared by config key, status and score).

The in-process driver (``searchers.driver.run_search``) with the synthetic oracle keeps these fast; Tune
writes through the same :class:`searchers.ledger.Ledger` (tests/raytune_primus/test_faults.py).
"""
from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from searchers.driver import run_search
from searchers.ledger import Ledger, LedgerBusyError, LedgerError, read_rows
from searchers.testing import SyntheticEvaluator
from tests.conftest import ROOT
from tests.searchers.conftest import CAP_BYTES, small_experiment

BUDGET, SEED = 12, 3


class After:
    """Runs ``action`` once, when the ``n``-th candidate reaches the oracle's memory pre-filter (the
    fault is what ``action`` does to the file system; the trials themselves are untouched)."""

    def __init__(self, n: int, action: Callable[[], None]) -> None:
        self.n, self.action, self.calls = n, action, 0

    def tick(self) -> None:
        self.calls += 1
        if self.calls == self.n:
            self.action()


class FaultyEvaluator(SyntheticEvaluator):
    """The synthetic oracle, with a fault injected between two trials."""

    def __init__(self, fault: After | None = None) -> None:
        super().__init__(cap_bytes=CAP_BYTES)
        self.fault = fault

    def memory(self, run):
        if self.fault is not None:
            self.fault.tick()
        return super().memory(run)


def _search(ledger: Path, fault: After | None = None):
    return run_search(small_experiment(), "random", BUDGET, SEED, ledger, evaluator=FaultyEvaluator(fault))


def trials(path: Path) -> list[tuple]:
    """The counted trials of a ledger, by config key (status and score with them)."""
    rows = [r for r in read_rows(path) if r["trial_index"] is not None and r["trial_index"] >= 0]
    assert len({r["trial_index"] for r in rows}) == len(rows), "no trial counted twice"
    return sorted((r["config_key"], r["status"], r["tokens_per_s_per_gpu"]) for r in rows)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[tuple]:
    """What an uninterrupted run leaves in its ledger."""
    path = tmp_path_factory.mktemp("ref") / "ledger.parquet"
    _search(path)
    out = trials(path)
    assert len(out) == BUDGET
    return out


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------- bad files
def _good_ledger(path: Path, experiment: str = "tiny-small") -> None:
    with Ledger(path) as led:
        for i in range(3):
            led.append({"run_id": f"{experiment}/random/seed0", "experiment": experiment, "row": i,
                        "trial_index": i, "status": "ok", "config_key": f"k{i}", "tokens_per_s_per_gpu": 1.0})


def _make_bad(kind: str, path: Path) -> str:
    """Write a bad ledger of ``kind``; return the message it must be refused with."""
    if kind == "empty":
        path.write_bytes(b"")
        return "is empty (0 bytes)"
    if kind == "truncated":
        _good_ledger(path)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return "is truncated"
    if kind == "not parquet":
        path.write_text("config_key,tokens\nabc,1\n")
        return "is not a parquet file"
    if kind == "foreign schema":
        pq.write_table(pa.table({"id": [1, 2], "loss": [0.5, 0.4]}), path)
        return "lacks columns run_id, experiment"
    if kind == "wrong types":
        _good_ledger(path)
        t = pq.read_table(path)
        i = t.column_names.index("seed")
        pq.write_table(t.set_column(i, "seed", pa.array([[1], [2], [3]])), path)
        return "column seed holds list<element: int64>, a search ledger's holds int64"
    if kind == "other experiment":
        _good_ledger(path, experiment="llama3.1-70b-h100-64")
        return "holds 3 rows of experiment 'llama3.1-70b-h100-64', not 'tiny-small'"
    raise AssertionError(kind)


KINDS = ["empty", "truncated", "not parquet", "foreign schema", "wrong types", "other experiment"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_ledger_is_refused_clearly_and_never_written_over(tmp_path, kind):
    path = tmp_path / "ledger.parquet"
    expected = _make_bad(kind, path)
    before = _sha(path)
    with pytest.raises(LedgerError) as e:
        _search(path)
    msg = str(e.value)
    assert expected in msg and str(path) in msg and "\n" not in msg, msg
    assert _sha(path) == before, "the file is left exactly as it was"
    assert not list(tmp_path.glob(".ledger.parquet.*.tmp"))
    with pytest.raises(LedgerError):  # and the lock was given back: the next try says the same
        _search(path)


@pytest.mark.parametrize("kind", ["truncated", "other experiment"])
def test_the_cli_refuses_a_bad_ledger_in_one_line_with_exit_code_2(tmp_path, capsys, kind):
    from raytune_primus.cli import main

    path = tmp_path / "ledger.parquet"
    _make_bad(kind, path)
    if kind == "other experiment":  # the CLI's run is the bundled tiny experiment
        path.unlink()
        _good_ledger(path, experiment="llama3.1-70b-h100-64")
    before = _sha(path)
    code = main(["tune", "tiny-moe-h100-8", "--driver", "inprocess", "--budget", "3", "--results", str(tmp_path),
                 "--quiet"])
    out, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith(f"error: ledger {path}"), err
    assert _sha(path) == before


def test_a_ledger_moved_aside_starts_over(tmp_path, reference):
    path = tmp_path / "ledger.parquet"
    _make_bad("truncated", path)
    path.rename(tmp_path / "ledger.parquet.bad")
    _search(path)
    assert trials(path) == reference


# ---------------------------------------------------------------------------------- a crash mid-write
CRASHER = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
real_replace, calls = os.replace, [0]

def replace_then_die(src, dst):
    calls[0] += 1
    if calls[0] == int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)  # the new ledger is written and fsynced, not yet renamed
    return real_replace(src, dst)

os.replace = replace_then_die
from tests.searchers.test_ledger_faults import _search
from pathlib import Path
_search(Path(sys.argv[2]))
"""


def test_a_writer_killed_between_write_and_rename_keeps_the_last_good_ledger(tmp_path, reference):
    path = tmp_path / "ledger.parquet"
    script = tmp_path / "crash.py"
    script.write_text(CRASHER)
    kill_at = 8  # the 8th flush (a row per candidate: scored, rejected or illegal)
    p = subprocess.run([sys.executable, str(script), str(ROOT), str(path), str(kill_at)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    rows = read_rows(path)
    assert len(rows) == kill_at - 1, "exactly the rows of the last completed flush"
    leftovers = list(tmp_path.glob(".ledger.parquet.*.tmp"))
    assert len(leftovers) == 1 and len(pq.read_table(leftovers[0])) == kill_at, "the unrenamed new ledger"
    partial = trials(path)
    assert set(partial) <= set(reference) and 0 < len(partial) < BUDGET

    r = _search(path)  # resume
    assert r.resumed == len(partial)
    assert trials(path) == reference, "nothing lost, nothing scored twice"
    assert not list(tmp_path.glob(".ledger.parquet.*.tmp")), "the dead writer's temporary file is cleaned up"
    assert read_rows(path)[: kill_at - 1] == rows, "rows written before the crash are kept as they were"


# ---------------------------------------------------------------------------------- read-only folder, full disk
def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    try:
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                           capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A 2 MiB tmpfs of our own (root only; skipped elsewhere: the monkeypatched tests below still run)."""
    mnt = tmp_path / "disk"
    if sys.platform != "linux" or not _mount_tmpfs(mnt, "2m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def _remount(mnt: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mnt)], check=True, capture_output=True, timeout=30)


def _fill(mnt: Path) -> None:
    with open(mnt / "filler", "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def _interrupted_then_resumed(path: Path, fault: After, expected: str, undo: Callable[[], None],
                              reference: list[tuple]) -> None:
    with pytest.raises(LedgerError) as e:
        _search(path, fault)
    msg = str(e.value)
    assert f"cannot write ledger {path}: {expected}" in msg and "the last good ledger is kept" in msg, msg
    kept, partial = read_rows(path), trials(path)
    assert kept and 0 < len(partial) < BUDGET and set(partial) <= set(reference), "the last good ledger is intact"
    assert not list(path.parent.glob(".ledger.parquet.*.tmp"))
    undo()
    r = _search(path)
    assert r.resumed == len(partial)
    assert trials(path) == reference
    assert read_rows(path)[: len(kept)] == kept


def _interrupt() -> None:
    raise KeyboardInterrupt  # Ctrl-C between two trials


def test_a_read_only_folder_is_a_clear_error_and_keeps_the_ledger(small_disk, reference):
    """A run stopped half-way, its folder then made read-only (Linux will not remount a file system
    read-only while a file on it is open for writing, so not mid-run): resuming there is refused
    at the first write, the ledger is kept, and the resume after the folder is writable again ends
    like an uninterrupted run."""
    path = small_disk / "ledger.parquet"
    with pytest.raises(KeyboardInterrupt):
        _search(path, After(6, _interrupt))
    kept, partial = read_rows(path), trials(path)
    assert 0 < len(partial) < BUDGET
    _remount(small_disk, "ro")
    try:
        with pytest.raises(LedgerError) as e:
            _search(path)
        msg = str(e.value)
        assert f"cannot write ledger {path}: Read-only file system" in msg and "the last good ledger is kept" in msg
        assert read_rows(path) == kept
    finally:
        _remount(small_disk, "rw")
    r = _search(path)
    assert r.resumed == len(partial) and trials(path) == reference
    assert read_rows(path)[: len(kept)] == kept


def test_a_disk_filled_mid_run_keeps_the_ledger_and_resumes(small_disk, reference):
    path = small_disk / "ledger.parquet"
    fault = After(5, lambda: _fill(small_disk))
    _interrupted_then_resumed(path, fault, "No space left on device", lambda: (small_disk / "filler").unlink(),
                              reference)


class _Failing:
    """Makes ``tempfile.mkstemp`` or ``pq.write_table`` fail with ``err`` while ``on`` is set."""

    def __init__(self, err: int) -> None:
        self.err, self.on = err, False

    def wrap(self, fn):
        def inner(*a, **k):
            if self.on:
                raise OSError(self.err, os.strerror(self.err))
            return fn(*a, **k)
        return inner


@pytest.mark.parametrize("err, where", [(errno.EACCES, "mkstemp"), (errno.EROFS, "mkstemp"),
                                        (errno.ENOSPC, "write_table"), (errno.EDQUOT, "write_table")])
def test_write_errors_anywhere_in_a_flush_keep_the_ledger(tmp_path, monkeypatch, reference, err, where):
    """The same without a tmpfs: the error is injected where the file system would raise it."""
    import searchers.ledger as ledger_mod

    failing = _Failing(err)
    if where == "mkstemp":
        monkeypatch.setattr(ledger_mod.tempfile, "mkstemp", failing.wrap(ledger_mod.tempfile.mkstemp))
    else:
        monkeypatch.setattr(pq, "write_table", failing.wrap(pq.write_table))
    path = tmp_path / "ledger.parquet"
    fault = After(6, lambda: setattr(failing, "on", True))
    _interrupted_then_resumed(path, fault, os.strerror(err), lambda: setattr(failing, "on", False), reference)


# ---------------------------------------------------------------------------------- two processes, one folder
SLOW_HOLDER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from tests.searchers import test_ledger_faults as t
from searchers.testing import SyntheticEvaluator
real = SyntheticEvaluator.score
def slow(self, run):
    time.sleep(0.3)
    return real(self, run)
SyntheticEvaluator.score = slow
t._search(Path(sys.argv[2]))
"""


def test_a_second_process_on_the_same_folder_is_refused_naming_the_first(tmp_path, capsys, reference):
    from raytune_primus.cli import main

    path = tmp_path / "ledger.parquet"
    script = tmp_path / "holder.py"
    script.write_text(SLOW_HOLDER)
    proc = subprocess.Popen([sys.executable, str(script), str(ROOT), str(path)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            try:
                if len(trials(path)) >= 3:
                    break
            except LedgerError:  # a reader racing the atomic replace
                pass
            time.sleep(0.1)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
        with pytest.raises(LedgerBusyError) as e:
            _search(path)
        msg = str(e.value)
        assert f"ledger {path} is in use by process {proc.pid} on " in msg and "holder.py" in msg, msg
        assert "use another --results folder" in msg
        code = main(["tune", "tiny-moe-h100-8", "--driver", "inprocess", "--budget", "3", "--results",
                     str(tmp_path), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and f"in use by process {proc.pid}" in err and len(err.strip().splitlines()) == 1
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # our own holder's process group only
        proc.wait(30)
    # the kernel dropped the dead holder's lock: resuming needs no clean-up and loses nothing
    partial = trials(path)
    assert 3 <= len(partial) < BUDGET and set(partial) <= set(reference)
    r = _search(path)
    assert r.resumed == len(partial) and trials(path) == reference


OPEN_AND_CLOSE = ("import sys; sys.path.insert(0, sys.argv[1]); from searchers.ledger import Ledger; "
                  "Ledger(sys.argv[2]).close()")


def test_one_process_may_open_its_own_ledger_twice_and_the_lock_is_given_back(tmp_path):
    path = tmp_path / "ledger.parquet"
    a = Ledger(path)
    b = Ledger(path)  # e.g. Tune's searcher and the compare merge in one driver
    a.append({"run_id": "r", "row": 0, "status": "ok"})
    a.close()
    b.append({"run_id": "r", "row": 1, "status": "ok"})
    b.close()
    script = OPEN_AND_CLOSE
    p = subprocess.run([sys.executable, "-c", script, str(ROOT), str(path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]


def test_a_dropped_ledger_releases_its_lock(tmp_path):
    path = tmp_path / "ledger.parquet"
    Ledger(path).extend([{"run_id": "r", "row": 0, "status": "ok"}])  # never closed, dropped at once
    script = OPEN_AND_CLOSE
    p = subprocess.run([sys.executable, "-c", script, str(ROOT), str(path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]

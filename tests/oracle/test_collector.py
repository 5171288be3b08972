"""oracle.collector: the thresholds a bulk-projecting process sets (collector, C allocator), the opt-outs, and clear errors."""
from __future__ import annotations

import gc

import pytest

from oracle.collector import ENV, THRESHOLDS, tune_collector
from oracle.errors import InvalidConfigError


@pytest.fixture(autouse=True)
def _restore_thresholds():
    from oracle import collector
    before, bulk = gc.get_threshold(), dict(collector._BULK)
    yield
    gc.set_threshold(*before)
    collector._BULK.update(bulk)


def test_bulk_thresholds_are_set_and_setting_them_again_changes_nothing(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    gc.set_threshold(700, 10, 10)
    assert tune_collector() == THRESHOLDS == gc.get_threshold()
    assert tune_collector() == THRESHOLDS


def test_default_keeps_pythons_thresholds(monkeypatch):
    monkeypatch.setenv(ENV, "default")
    gc.set_threshold(700, 10, 10)
    assert tune_collector() == (700, 10, 10) == gc.get_threshold()


def test_an_unknown_choice_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(ENV, "fast")
    with pytest.raises(InvalidConfigError, match=r"RAYTUNE_PRIMUS_GC='fast' must be 'bulk'.*'default'"):
        tune_collector()


def test_the_command_line_reports_a_bad_choice_without_a_traceback(monkeypatch, capsys):
    from raytune_primus.cli import main
    monkeypatch.setenv(ENV, "fast")
    assert main(["hardware", "list"]) != 0
    err = capsys.readouterr().err
    assert "RAYTUNE_PRIMUS_GC" in err and "Traceback" not in err


def test_the_allocator_is_tuned_on_glibc_and_left_alone_on_request(monkeypatch):
    import ctypes
    import sys

    from oracle.collector import MALLOC_ENV, tune_allocator
    monkeypatch.delenv(MALLOC_ENV, raising=False)
    glibc = sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")
    assert tune_allocator() is glibc  # mallopt accepted both thresholds (where the C library is glibc)
    assert tune_allocator() is glibc  # idempotent
    monkeypatch.setenv(MALLOC_ENV, "default")
    assert tune_allocator() is False


def test_an_unknown_allocator_choice_is_a_clear_error(monkeypatch):
    from oracle.collector import MALLOC_ENV, tune_allocator
    monkeypatch.setenv(MALLOC_ENV, "huge")
    with pytest.raises(InvalidConfigError, match=r"RAYTUNE_PRIMUS_MALLOC='huge' must be 'bulk'.*'default'"):
        tune_allocator()
    from raytune_primus.cli import main
    assert main(["hardware", "list"]) != 0


class _Node:
    """A tracked object (instances of a class with a __dict__ are)."""


def test_a_bulk_pass_collects_nothing_inside_and_moves_its_survivors_to_the_oldest_generation(monkeypatch):
    from oracle.collector import bulk_pass
    monkeypatch.delenv(ENV, raising=False)
    tune_collector()
    assert gc.isenabled()
    with bulk_pass():
        assert not gc.isenabled()
        kept = [_Node() for _ in range(1000)]
    assert gc.isenabled() and gc.get_freeze_count() == 0  # frozen, then thawed into the oldest generation
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(o) in oldest for o in kept) and gc.get_count()[0] < 100
    with pytest.raises(ValueError), bulk_pass():  # an error inside leaves the collector as it found it
        raise ValueError
    assert gc.isenabled()
    gc.disable()  # a caller that turned the collector off keeps it off
    try:
        with bulk_pass():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_outside_a_bulk_process_a_bulk_pass_changes_nothing(monkeypatch):
    from oracle.collector import bulk_pass
    monkeypatch.setenv(ENV, "default")
    tune_collector()
    with bulk_pass():
        assert gc.isenabled()
        made = _Node()
    assert id(made) not in {id(o) for o in gc.get_objects(generation=2)}  # still young

"""oracle.collector: the thresholds a bulk-projecting process sets, the opt-out, and a clear error."""
from __future__ import annotations

import gc

import pytest

from oracle.collector import ENV, THRESHOLDS, tune_collector
from oracle.errors import InvalidConfigError


@pytest.fixture(autouse=True)
def _restore_thresholds():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


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

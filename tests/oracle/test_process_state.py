"""Library calls that need a process-wide setting put it back."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_calibrate_puts_torchs_thread_count_back(monkeypatch):
    from oracle.benchmark import calibrate as cal

    def inner(**kwargs):
        torch.set_num_threads(1)  # what the measurement does on a CPU
        return {}, {}
    monkeypatch.setattr(cal, "_calibrate", inner)
    before = torch.get_num_threads()
    torch.set_num_threads(max(2, before))
    try:
        want = torch.get_num_threads()
        cal.calibrate(base="cpu-host", name="x", threads=1)
        assert torch.get_num_threads() == want
    finally:
        torch.set_num_threads(before)

"""Others' load from CPU accounting (oracle.benchmark.load): the arithmetic on made-up /proc/stat samples, the
wait for quiet, and a real interval (no torch)."""
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oracle.benchmark import load
from oracle.benchmark.load import CpuSample, LoadMonitor, LoadSeen, load_between

STAT = """cpu  {t} 0 0 0 0 0 0 0 0 0
cpu0 {u0} {n0} {s0} 500 1 {i0} {q0} {st0} 0 0
cpu1 {u1} 0 {s1} 500 1 0 0 0 0 0
intr 1 2 3
"""


def _stat(tmp_path, name, **v):
    vals = dict(t=0, u0=0, n0=0, s0=0, i0=0, q0=0, st0=0, u1=0, s1=0)
    vals.update(v)
    p = tmp_path / name
    p.write_text(STAT.format(**vals))
    return str(p)


def test_sample_sums_busy_and_steal_over_the_watched_cpus_only(tmp_path):
    path = _stat(tmp_path, "a", u0=100, n0=50, s0=30, i0=10, q0=10, st0=20, u1=1000, s1=100)
    tick = load.os.sysconf("SC_CLK_TCK")
    both = load.sample([0, 1], stat_path=path)
    first = load.sample([0], stat_path=path)
    assert both.cpus == 2 and first.cpus == 1
    assert first.busy_s == pytest.approx(200 / tick) and first.steal_s == pytest.approx(20 / tick)
    assert both.busy_s == pytest.approx(1300 / tick)
    assert load.sample([0], stat_path=str(tmp_path / "missing")) is None


def _s(wall, busy, steal=0.0, own=0.0, cpus=2):
    return CpuSample(wall_s=wall, busy_s=busy, steal_s=steal, own_s=own, cpus=cpus)


def test_others_load_is_busy_time_less_our_own_plus_steal_per_second():
    seen = load_between(_s(0, 0), _s(10, busy=15, steal=1, own=9))
    assert seen.other_cores == pytest.approx((15 - 9 + 1) / 10)
    assert seen.own_cores == pytest.approx(0.9) and seen.steal_cores == pytest.approx(0.1)
    assert seen.busy and "others used 0.70 of 2 core(s), steal 0.10 over 10.0 s" in seen.text()
    quiet = load_between(_s(0, 0), _s(10, busy=9.5, own=9))
    assert quiet.other_cores == pytest.approx(0.05) and not quiet.busy
    assert load_between(None, _s(1, 0)) is None and load_between(_s(1, 0), _s(1, 0)) is None


def test_a_measurement_on_fewer_cores_than_the_machine_tolerates_others_on_the_rest():
    seen = LoadSeen(wall_s=1, other_cores=1.0, own_cores=1, steal_cores=0, cpus=8, need_cores=2)
    assert seen.allowed_cores == pytest.approx(6.15) and not seen.busy
    assert LoadSeen(wall_s=1, other_cores=1.0, own_cores=1, steal_cores=0, cpus=2, need_cores=2).busy


@given(busy=st.floats(0, 100), own=st.floats(0, 100), steal=st.floats(0, 10), wall=st.floats(0.1, 100))
def test_others_load_is_never_negative(busy, own, steal, wall):
    seen = load_between(_s(0, 0), _s(wall, busy=busy, steal=steal, own=own))
    assert seen.other_cores >= 0 and seen.other_cores >= seen.steal_cores - 1e-12


class _Scripted(LoadMonitor):
    """Idle windows with a scripted load, no sleeping."""

    def __init__(self, loads):
        super().__init__(cpus=[0, 1])
        self.loads = list(loads)

    def idle(self, window_s=3.0):
        return LoadSeen(wall_s=window_s, other_cores=self.loads.pop(0), own_cores=0, steal_cores=0, cpus=2)


def test_waiting_for_quiet_stops_at_the_first_quiet_window(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(load, "_now", lambda: clock.__setitem__(0, clock[0] + 3.0) or clock[0])
    lines = []
    mon = _Scripted([1.5, 0.9, 0.02, 2.0])
    seen, waited = mon.wait_for_quiet(60, log=lines.append, window_s=3.0)
    assert not seen.busy and seen.other_cores == 0.02 and len(lines) == 2 and "machine busy" in lines[0]
    assert waited > 0


def test_waiting_for_quiet_gives_up_after_its_budget(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(load, "_now", lambda: clock.__setitem__(0, clock[0] + 1.0) or clock[0])
    mon = _Scripted([1.0] * 100)
    seen, waited = mon.wait_for_quiet(10, log=lambda *a: None, window_s=3.0)
    assert seen.busy and waited <= 13


def test_a_real_interval_counts_our_own_work_as_ours():
    mon = LoadMonitor()
    if load.sample() is None:
        pytest.skip("no /proc/stat here")
    cpu0 = time.process_time()
    _, seen = mon.measure(lambda: sum(i * i for i in range(2_000_000)))
    used_s = time.process_time() - cpu0
    # what the interval counts as ours is this process's CPU time over it (however busy the machine is)
    assert seen is not None and seen.own_cores > 0 and seen.other_cores >= 0
    assert seen.own_cores * seen.wall_s == pytest.approx(used_s, rel=0.25, abs=0.05)
    assert mon.summary()["intervals"] == 1
